"""Shell completion: the committed scripts are current, and the app answers each shell.

The scripts in completions/ are shims that, at <TAB>, re-run `mlxbun` with
`_MLXBUN_COMPLETE=complete_<shell>` plus the completion context in the environment.
These tests drive that entry point in a subprocess exactly as each script does
(see typer/_completion_shared.py and typer/_completion_classes.py):

    bash: COMP_WORDS="<words joined by newline>" COMP_CWORD=<index>   (IFS=$'\\n')
    zsh:  _TYPER_COMPLETE_ARGS="${words[1,$CURRENT]}"                  (space-joined)
    fish: _TYPER_COMPLETE_ARGS="$(commandline -cp)" _TYPER_COMPLETE_FISH_ACTION=get-args|is-args

The program must be started as `mlxbun` (the console script): Typer derives the
program name, and so the env var name, from argv[0]. Under `python -m mlxbun_cli`
it would listen on `_PYTHON -M MLXBUN_CLI_COMPLETE` instead and just run the app.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
GENERATOR = REPO / "scripts" / "gen_completions.py"
COMPLETIONS = REPO / "completions"
PROG = "mlxbun"
COMPLETE_VAR = "_MLXBUN_COMPLETE"
SCRIPT_FILES = {"bash": "mlxbun.bash", "zsh": "_mlxbun", "fish": "mlxbun.fish"}
SHELLS = list(SCRIPT_FILES)

# Leftovers from an outer shell's completion must not leak into the child.
_COMPLETION_ENV = (
    COMPLETE_VAR,
    "COMP_WORDS",
    "COMP_CWORD",
    "_TYPER_COMPLETE_ARGS",
    "_TYPER_COMPLETE_FISH_ACTION",
    "_TYPER_COMPLETE_WORD_TO_COMPLETE",
    "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION",
)


def _console_script() -> str | None:
    """The installed `mlxbun` console script next to this interpreter, or on PATH."""
    for candidate in (
        Path(sys.executable).parent / PROG,
        Path(sys.executable).parent / f"{PROG}.exe",
    ):
        if candidate.is_file():
            return str(candidate)
    return shutil.which(PROG)


def _mlxbun_cmd() -> list[str]:
    script = _console_script()
    if script:
        return [script]
    # Not installed with scripts: do what the console script does, argv[0] == "mlxbun".
    return [
        sys.executable,
        "-c",
        "import sys; sys.argv[0] = 'mlxbun'; from mlxbun_cli.app import main; main()",
    ]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _COMPLETION_ENV}
    env.update(extra)
    return env


def _run(cmd: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=60)


def complete(shell: str, line: str) -> list[str]:
    """Candidates the app offers for the command line `line` (cursor at its end)."""
    words = line.split(" ")  # a trailing space means "a new, empty word"
    if shell == "bash":
        env = _env(
            **{
                COMPLETE_VAR: "complete_bash",
                "COMP_WORDS": "\n".join(words),
                "COMP_CWORD": str(len(words) - 1),
            }
        )
    elif shell == "zsh":
        env = _env(**{COMPLETE_VAR: "complete_zsh", "_TYPER_COMPLETE_ARGS": line})
    elif shell == "fish":
        env = _env(
            **{
                COMPLETE_VAR: "complete_fish",
                "_TYPER_COMPLETE_ARGS": line,
                "_TYPER_COMPLETE_FISH_ACTION": "get-args",
            }
        )
    else:  # pragma: no cover
        raise ValueError(shell)
    proc = _run(_mlxbun_cmd(), env)
    assert proc.returncode == 0, f"{shell} completion of {line!r} failed:\n{proc.stderr}"
    return parse_candidates(shell, proc.stdout)


def parse_candidates(shell: str, out: str) -> list[str]:
    if shell == "bash":
        return [line for line in out.splitlines() if line]
    if shell == "zsh":
        # _arguments '*: :(("value":"help"\n"value2"))'  -- or `_files` for no candidates
        if out.strip() == "_files":
            return []
        assert out.startswith("_arguments '*: :(("), f"unexpected zsh answer: {out!r}"
        body = out[len("_arguments '*: :((") :]
        values = re.findall(r'(?m)^"((?:[^"]|"")*)"', body)
        return [v.replace('""', '"').replace("''", "'").replace(r"\\:", ":") for v in values]
    if shell == "fish":
        return [line.split("\t", 1)[0] for line in out.splitlines() if line]
    raise ValueError(shell)  # pragma: no cover


# --- (a) the committed scripts are current ---------------------------------------


def test_completion_scripts_are_up_to_date():
    proc = _run([sys.executable, str(GENERATOR), "--check"], _env())
    assert proc.returncode == 0, (
        "Shell completion scripts in completions/ are stale.\n"
        f"{proc.stdout}{proc.stderr}\n"
        "Regenerate them with:  python scripts/gen_completions.py"
    )


@pytest.mark.parametrize("shell", SHELLS)
def test_scripts_match_what_the_cli_shows(shell):
    """Each file is byte-for-byte what `mlxbun --show-completion SHELL` prints."""
    # Typer's switch that makes --show-completion take the shell as a value
    # instead of detecting it from the parent process.
    env = _env(_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION="1")
    proc = _run([*_mlxbun_cmd(), "--show-completion", shell], env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    committed = (COMPLETIONS / SCRIPT_FILES[shell]).read_text(encoding="utf-8")
    assert proc.stdout == committed, (
        f"completions/{SCRIPT_FILES[shell]} differs from `mlxbun --show-completion {shell}`; "
        "run `python scripts/gen_completions.py`"
    )


def test_scripts_are_portable():
    for name in SCRIPT_FILES.values():
        text = (COMPLETIONS / name).read_text(encoding="utf-8")
        assert str(REPO) not in text and "/home/" not in text and "/Users/" not in text, name
        assert COMPLETE_VAR in text, name


# --- (b) the completion entry point, driven as each shell drives it ----------------


@pytest.mark.parametrize("shell", SHELLS)
def test_top_level_commands(shell):
    got = complete(shell, "mlxbun ")
    assert {"generate", "chat", "config"} <= set(got), got


@pytest.mark.parametrize("shell", SHELLS)
def test_command_prefix(shell):
    assert complete(shell, "mlxbun gen") == ["generate"]


@pytest.mark.parametrize("shell", SHELLS)
def test_config_subcommands(shell):
    got = complete(shell, "mlxbun config ")
    assert {"show", "set"} <= set(got), got


@pytest.mark.parametrize("shell", SHELLS)
def test_option_prefix(shell):
    got = complete(shell, "mlxbun generate --te")
    assert "--temperature" in got, got
    assert all(c.startswith("--te") for c in got), got


def test_fish_is_args_condition():
    """fish's --condition: exit 0 when the app has candidates (no file completion)."""

    def is_args(line: str) -> int:
        env = _env(
            **{
                COMPLETE_VAR: "complete_fish",
                "_TYPER_COMPLETE_ARGS": line,
                "_TYPER_COMPLETE_FISH_ACTION": "is-args",
            }
        )
        return _run(_mlxbun_cmd(), env).returncode

    assert is_args("mlxbun config ") == 0
    assert is_args("mlxbun zzz-no-such-thing") == 1


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash not installed")
@pytest.mark.skipif(_console_script() is None, reason="`mlxbun` console script not installed")
def test_real_bash_uses_the_committed_script():
    """Source completions/mlxbun.bash in bash and call its function as <TAB> would
    (arguments: command, current word, previous word)."""
    bin_dir = str(Path(_console_script()).parent)
    script = (
        "source completions/mlxbun.bash\n"
        "complete -p mlxbun\n"
        'COMP_WORDS=(mlxbun config ""); COMP_CWORD=2\n'
        '_mlxbun_completion mlxbun "" config\n'
        'printf "C:%s\\n" "${COMPREPLY[@]}"\n'
        "COMP_WORDS=(mlxbun generate --te); COMP_CWORD=2\n"
        "_mlxbun_completion mlxbun --te generate\n"
        'printf "C:%s\\n" "${COMPREPLY[@]}"\n'
    )
    env = _env(PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""))
    proc = _run(["bash", "--norc", "--noprofile", "-c", script], env)
    assert proc.returncode == 0, proc.stderr
    assert "_mlxbun_completion" in proc.stdout.splitlines()[0]
    got = [line[2:] for line in proc.stdout.splitlines() if line.startswith("C:")]
    assert {"show", "set", "--temperature"} <= set(got), proc.stdout
