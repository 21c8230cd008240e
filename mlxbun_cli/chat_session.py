"""A chat conversation and its slash commands, independent of any terminal."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlxbun_cli.client.results import Collected
from mlxbun_cli.errors import InputError
from mlxbun_cli.prep.request import GenerationRequest, validate

HELP = """\
/help              this list
/clear             forget the conversation (keeps the system prompt)
/system TEXT       set the system prompt (empty: remove it)
/think on|off      turn the model's thinking on or off
/thoughts on|off   show or collapse thinking in replies
/save FILE         save the conversation as JSON
/load FILE         load a conversation saved with /save
/stats             tokens and speed so far
/exit              leave (Ctrl-D works too)
Multi-line input: end a line with \\ to continue, or wrap text in triple quotes.
Ctrl-C stops a reply without leaving the chat."""


@dataclass
class TurnStats:
    prompt_tokens: int
    completion_tokens: int
    generation_tps: float
    seconds: float


@dataclass
class CommandResult:
    message: str = ""
    exit: bool = False


@dataclass
class ChatSession:
    fields: dict[str, Any]
    system: str | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)
    show_thinking: bool = True
    turns: list[TurnStats] = field(default_factory=list)
    warned: set[str] = field(default_factory=set)  # warnings already shown this session

    def new_warnings(self, warnings: list[str]) -> list[str]:
        """The ones not shown yet: the same flags earn the same warning every turn."""
        fresh = [w for w in warnings if w not in self.warned]
        self.warned.update(fresh)
        return fresh

    def request_for(self, user_text: str) -> GenerationRequest:
        messages = [{"role": "system", "content": self.system}] if self.system else []
        messages += self.messages + [{"role": "user", "content": user_text}]
        req = GenerationRequest(messages=messages, **self.fields)
        validate(req)
        return req

    def record(self, user_text: str, result: Collected) -> None:
        """Keep the turn; a reply stopped early is kept as far as it went."""
        self.messages.append({"role": "user", "content": user_text})
        reply: dict[str, Any] = {"role": "assistant", "content": result.text}
        if result.tool_calls:
            reply["tool_calls"] = result.tool_calls
        self.messages.append(reply)
        if result.done is not None:
            u = result.done.usage
            self.turns.append(
                TurnStats(
                    u.prompt_tokens,
                    u.completion_tokens,
                    u.generation_tps,
                    u.queued_seconds + u.prompt_seconds + u.generation_seconds,
                )
            )

    # -- slash commands -------------------------------------------------------

    def handle(self, line: str) -> CommandResult:
        name, _, arg = line.strip().partition(" ")
        arg = arg.strip()
        handler = {
            "/help": lambda: CommandResult(HELP),
            "/?": lambda: CommandResult(HELP),
            "/clear": self._clear,
            "/system": lambda: self._system(arg),
            "/think": lambda: self._think(arg),
            "/thoughts": lambda: self._thoughts(arg),
            "/save": lambda: self._save(arg),
            "/load": lambda: self._load(arg),
            "/stats": self._stats,
            "/exit": lambda: CommandResult(exit=True),
            "/quit": lambda: CommandResult(exit=True),
            "/bye": lambda: CommandResult(exit=True),
        }.get(name.lower())
        if handler is None:
            return CommandResult(f"unknown command {name} — /help lists them")
        return handler()

    def _clear(self) -> CommandResult:
        self.messages.clear()
        return CommandResult("conversation cleared")

    def _system(self, text: str) -> CommandResult:
        self.system = text or None
        return CommandResult("system prompt set" if text else "system prompt removed")

    @staticmethod
    def _on_off(arg: str, command: str) -> bool:
        if arg.lower() in ("on", "true", "yes", "1"):
            return True
        if arg.lower() in ("off", "false", "no", "0"):
            return False
        raise InputError(f"{command} takes on or off")

    def _think(self, arg: str) -> CommandResult:
        on = self._on_off(arg, "/think")
        kwargs = dict(self.fields.get("chat_template_kwargs") or {})
        kwargs["enable_thinking"] = on
        self.fields = {**self.fields, "chat_template_kwargs": kwargs, "reasoning_effort": None}
        return CommandResult(f"thinking {'on' if on else 'off'}")

    def _thoughts(self, arg: str) -> CommandResult:
        self.show_thinking = self._on_off(arg, "/thoughts")
        return CommandResult(f"thinking {'shown' if self.show_thinking else 'collapsed'}")

    def _save(self, arg: str) -> CommandResult:
        if not arg:
            raise InputError("/save needs a file name")
        path = Path(arg).expanduser()
        data = {"system": self.system, "messages": self.messages}
        try:
            path.write_text(json.dumps(data, indent=2, ensure_ascii=False), encoding="utf-8")
        except OSError as exc:
            raise InputError(f"cannot write {path}: {exc.strerror}") from exc
        return CommandResult(f"saved {len(self.messages)} messages to {path}")

    def _load(self, arg: str) -> CommandResult:
        if not arg:
            raise InputError("/load needs a file name")
        path = Path(arg).expanduser()
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise InputError(f"cannot read {path}: {exc.strerror}") from exc
        except ValueError as exc:
            raise InputError(f"{path} is not a saved conversation: {exc}") from exc
        messages = data.get("messages") if isinstance(data, dict) else None
        if not isinstance(messages, list) or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages
        ):
            raise InputError(f"{path} is not a saved conversation (no messages list)")
        self.messages = messages
        self.system = data.get("system") if isinstance(data.get("system"), str) else None
        return CommandResult(f"loaded {len(messages)} messages from {path}")

    def _stats(self) -> CommandResult:
        if not self.turns:
            return CommandResult("no replies yet")
        total = sum(t.completion_tokens for t in self.turns)
        speeds = [t.generation_tps for t in self.turns if t.generation_tps]
        avg = sum(speeds) / len(speeds) if speeds else 0.0
        last = self.turns[-1]
        return CommandResult(
            f"{len(self.turns)} replies · {total} tokens generated · {avg:.1f} tok/s average · "
            f"last prompt {last.prompt_tokens} tokens"
        )
