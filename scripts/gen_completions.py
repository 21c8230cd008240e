#!/usr/bin/env python3
"""Regenerate the shell completion scripts in completions/ from Typer's own templates.

    python scripts/gen_completions.py            # (re)write completions/*
    python scripts/gen_completions.py --check    # exit 1 and list stale files

Each file is exactly what `mlxbun --show-completion SHELL` prints (Typer renders it
with `get_completion_script`, the same function `--show-completion` and
`--install-completion` use), rendered in-process so the result does not depend on
$SHELL, the parent process, or where the package is installed.

The scripts are thin shims: at <TAB> the shell re-runs `mlxbun` with
`_MLXBUN_COMPLETE=complete_<shell>` and the completion context in the environment
(bash: COMP_WORDS/COMP_CWORD; zsh and fish: _TYPER_COMPLETE_ARGS, plus
_TYPER_COMPLETE_FISH_ACTION for fish), and the app answers with candidates. New
commands and options are therefore picked up without regenerating; the files only
change when the program name or Typer's templates change (e.g. a Typer upgrade).

Installing them:
    bash: source completions/mlxbun.bash       (e.g. from ~/.bashrc, or copy it to
          ~/.local/share/bash-completion/completions/mlxbun)
    zsh:  copy completions/_mlxbun into a directory on $fpath, before `compinit`
    fish: copy completions/mlxbun.fish to ~/.config/fish/completions/
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT_DIR = REPO / "completions"
if str(REPO) not in sys.path:  # importable without an install too
    sys.path.insert(0, str(REPO))

# The console script name from pyproject's [project.scripts]. Typer derives both the
# program name the shell completes and the env var it listens on from argv[0] at run
# time, so these must match how users invoke the tool.
PROG_NAME = "mlxbun"
COMPLETE_VAR = "_{}_COMPLETE".format(PROG_NAME.replace("-", "_").upper())  # as Typer does

# shell -> file name under completions/ (the names each shell's loader expects)
FILES = {
    "bash": f"{PROG_NAME}.bash",
    "zsh": f"_{PROG_NAME}",
    "fish": f"{PROG_NAME}.fish",
}


def _check_app_has_completion() -> None:
    """Fail loudly if the app stopped exposing Typer's completion support."""
    from mlxbun_cli.app import app

    if not getattr(app, "_add_completion", True):
        raise SystemExit(
            "mlxbun_cli.app.app was created with add_completion=False; "
            "the completion scripts would not work."
        )


def render() -> dict[str, str]:
    """Return {file name: content} for every shell, deterministic."""
    from typer.completion import get_completion_script

    _check_app_has_completion()
    out: dict[str, str] = {}
    for shell, name in FILES.items():
        script = get_completion_script(prog_name=PROG_NAME, complete_var=COMPLETE_VAR, shell=shell)
        # `--show-completion` prints the script with click.echo, i.e. plus one newline.
        out[name] = script.rstrip("\n") + "\n"
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--check",
        action="store_true",
        help="Do not write; exit 1 and list the files that are missing or out of date.",
    )
    args = parser.parse_args(argv)

    wanted = render()
    stale = []
    for name, content in wanted.items():
        path = OUT_DIR / name
        current = path.read_bytes().decode("utf-8") if path.is_file() else None
        if current != content:
            stale.append(path)

    rel = [str(p.relative_to(REPO)) for p in stale]
    if args.check:
        if stale:
            print(
                "Stale shell completion files (missing or out of date):\n"
                + "".join(f"  {r}\n" for r in rel)
                + "Run `python scripts/gen_completions.py` to regenerate them.",
                file=sys.stderr,
            )
            return 1
        print("completions/ is up to date.")
        return 0

    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for path in stale:
        # newline="\n": identical bytes on every platform.
        with path.open("w", encoding="utf-8", newline="\n") as f:
            f.write(wanted[path.name])
    if rel:
        print("wrote " + ", ".join(rel))
    else:
        print("completions/ already up to date.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
