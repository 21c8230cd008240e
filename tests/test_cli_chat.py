"""`mlxbun chat` end to end: piped stdin, and a real pseudo-terminal through pexpect."""

from __future__ import annotations

import io
import json
import os
import re
import sys

import pexpect
import pytest
from conftest import REPO, run_cli

# The tiny model writes this token every step when `--logit-bias` pins it, so a
# reply is recognisable on screen and never ends early on EOS.
PINNED = "ountain"


def bias_flags(no_eos_bias: dict) -> list[str]:
    return [f"--logit-bias={token}={bias}" for token, bias in no_eos_bias.items()]


def last_prompt_tokens(stderr: str) -> list[int]:
    return [int(n) for n in re.findall(r"last prompt (\d+) tokens", stderr)]


def test_piped_chat_replies_per_line_and_save_load(tiny_model_dir, no_eos_bias, tmp_path):
    saved, resaved = tmp_path / "conv.json", tmp_path / "conv2.json"
    flags = ["-n", "12", "--temperature", "0", *bias_flags(no_eos_bias)]
    script = f"/system be brief\nhello there\n/stats\n\nhow are you\n/stats\n/save {saved}\n"
    first = run_cli("chat", str(tiny_model_dir), *flags, input=script)
    assert "Traceback" not in first.stderr and first.returncode == 0, first.stderr

    data = json.loads(saved.read_text(encoding="utf-8"))
    assert data["system"] == "be brief"
    roles = [(m["role"], m["content"]) for m in data["messages"]]
    assert [r for r, _ in roles] == ["user", "assistant", "user", "assistant"]
    assert roles[0][1] == "hello there" and roles[2][1] == "how are you"
    replies = [roles[1][1], roles[3][1]]
    # stdout is exactly the two plain replies, one after the other; the blank line got none.
    assert first.stdout == "".join(r + "\n" for r in replies)
    assert "1 replies · 12 tokens generated" in first.stderr
    assert "2 replies · 24 tokens generated" in first.stderr
    turn1, turn2 = last_prompt_tokens(first.stderr)
    assert turn2 > turn1  # the second prompt carried the first turn
    assert f"saved 4 messages to {saved}" in first.stderr

    # A new process: /load restores the conversation, /exit stops reading stdin.
    script = f"/load {saved}\n/stats\nand now\n/stats\n/save {resaved}\n/exit\nnever answered\n"
    second = run_cli("chat", str(tiny_model_dir), *flags, input=script)
    assert "Traceback" not in second.stderr and second.returncode == 0, second.stderr
    assert f"loaded 4 messages from {saved}" in second.stderr
    assert "no replies yet" in second.stderr
    again = json.loads(resaved.read_text(encoding="utf-8"))
    assert again["system"] == "be brief"
    assert again["messages"][:4] == data["messages"]
    assert [m["content"] for m in again["messages"][4:5]] == ["and now"]
    assert second.stdout == again["messages"][5]["content"] + "\n"  # one reply only
    (turn3,) = last_prompt_tokens(second.stderr)
    assert turn3 > turn2  # the loaded turns were in the prompt


class Chat:
    """`mlxbun chat` in a pseudo-terminal, with its whole transcript kept for messages."""

    def __init__(self, model_dir, *args: str) -> None:
        env = {
            **os.environ,
            "TERM": "xterm",
            # pexpect answers no cursor-position requests; without this prompt_toolkit
            # waits for them and keeps the terminal raw for a moment after each Enter.
            "PROMPT_TOOLKIT_NO_CPR": "1",
        }
        self.transcript = io.StringIO()
        self.child = pexpect.spawn(
            sys.executable,
            ["-m", "mlxbun_cli", "chat", str(model_dir), *args],
            env=env,
            cwd=str(REPO),
            encoding="utf-8",
            timeout=30,
            dimensions=(40, 120),
        )
        self.child.logfile_read = self.transcript

    def expect(self, pattern, **kwargs) -> int:
        try:
            return self.child.expect(pattern, **kwargs)
        except (pexpect.TIMEOUT, pexpect.EOF) as exc:
            tail = self.transcript.getvalue()[-3000:]
            raise AssertionError(f"waiting for {pattern!r}: {type(exc).__name__}\n{tail}") from None

    def prompt(self) -> None:
        self.expect(">>>")

    def send(self, line: str) -> None:
        self.child.sendline(line)

    def close(self) -> None:
        if self.child.isalive():
            self.child.terminate(force=True)


@pytest.fixture
def pinned_flags(tiny_model_dir, no_eos_bias) -> list[str]:
    vocab = json.loads((tiny_model_dir / "tokenizer.json").read_text())["model"]["vocab"]
    return ["--temp", "0", f"--logit-bias={vocab[PINNED]}=100", *bias_flags(no_eos_bias)]


def test_interactive_chat_in_a_terminal(tiny_model_dir, pinned_flags, isolated_home, tmp_path):
    saved = tmp_path / "after-stop.json"
    chat = Chat(tiny_model_dir, "-n", "400", *pinned_flags)
    try:
        chat.prompt()
        chat.send("hello there")
        chat.expect(r"(\d+) tokens · [\d.]+ tok/s · prompt \d+ tokens")
        assert chat.child.match.group(1) == "400"  # a full reply, then its stats line
        chat.prompt()

        chat.send("/help")
        chat.expect(r"/save FILE\s+save the conversation as JSON")
        chat.expect(r"/exit\s+leave")
        chat.prompt()

        # Ctrl-C while the reply streams: the reply stops, the chat stays.
        chat.send("tell me a long story")
        chat.expect(PINNED * 2)
        chat.child.sendintr()
        chat.prompt()
        assert chat.child.isalive()
        chat.send(f"/save {saved}")
        chat.expect("saved 4 messages")
        chat.prompt()
        stopped = json.loads(saved.read_text(encoding="utf-8"))["messages"][3]["content"]
        assert stopped.startswith(PINNED) and len(stopped) < 400 * len(PINNED)

        chat.send("/exit")
        chat.expect(pexpect.EOF)
    finally:
        chat.close()
    chat.child.close()
    assert chat.child.exitstatus == 0, chat.transcript.getvalue()[-3000:]
    assert "Traceback" not in chat.transcript.getvalue()

    history = (isolated_home / "data" / "chat_history").read_text(encoding="utf-8")
    typed = [line[1:] for line in history.splitlines() if line.startswith("+")]
    assert typed == ["hello there", "/help", "tell me a long story", f"/save {saved}", "/exit"]


def test_ctrl_c_reports_stopped_with_token_count(tiny_model_dir, pinned_flags):
    chat = Chat(tiny_model_dir, "-n", "400", *pinned_flags)
    try:
        chat.prompt()
        # Several tries, since where the interrupt lands is a matter of timing;
        # every stopped reply must say so.
        for i in range(4):
            chat.send(f"story {i}")
            chat.expect(PINNED * 2)
            chat.child.sendintr()
            found = chat.expect([r"stopped · (\d+) tokens", ">>>"])
            assert found == 0, f"try {i}: no `stopped` line\n{chat.transcript.getvalue()[-2000:]}"
            assert int(chat.child.match.group(1)) < 400
            chat.prompt()
            chat.send("/clear")
            chat.expect("conversation cleared")
            chat.prompt()
        chat.send("/stats")
        chat.expect("4 replies")
    finally:
        chat.close()
