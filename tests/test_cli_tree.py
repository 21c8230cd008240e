"""The command tree as a whole: every command teaches with an example, help stays light."""

from __future__ import annotations

import subprocess
import sys

import typer

from mlxbun_cli.app import app


def walk(command, path):
    subcommands = getattr(command, "commands", None)
    if subcommands:
        for name, sub in subcommands.items():
            yield from walk(sub, [*path, name])
    else:
        yield " ".join(path), command


def test_every_command_help_has_an_example():
    missing = [
        path
        for path, cmd in walk(typer.main.get_command(app), ["mlxbun"])
        if "xample" not in (cmd.help or "")
    ]
    assert missing == []


def test_help_and_completion_never_import_the_heavy_stack():
    code = (
        "import sys, runpy\n"
        "sys.argv = ['mlxbun', '--help']\n"
        "try:\n    runpy.run_module('mlxbun_cli', run_name='__main__')\n"
        "except SystemExit:\n    pass\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & "
        "{'mlx', 'mlx_lm', 'transformers', 'fastapi', 'uvicorn', 'huggingface_hub', 'numpy', 'llguidance'})\n"
        "print('HEAVY', heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "HEAVY []" in out.stdout
