"""The command tree and the one boundary where errors become a clear line.

Command modules import only typer and light helpers at import time, so
`mlxbun --help` and completion never load mlx, mlx-lm or the server stack.
"""

from __future__ import annotations

import sys

import typer

from mlxbun_cli import __version__
from mlxbun_cli.commands import chat, config_cmd, daemon_cmd, generate, serve

app = typer.Typer(
    name="mlxbun",
    help="Local language models on MLX: chat, generate, serve, jobs, publish.\n\n"
    "Try it offline with the built-in random-weight demo model:\n\n"
    "    mlxbun generate demo 'Hello there'",
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"mlxbun {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Show the version and exit."
    ),
) -> None:
    """Local language models on MLX."""


app.command("generate")(generate.generate)
app.command("chat")(chat.chat)
app.command("serve")(serve.serve)
app.add_typer(daemon_cmd.app, name="daemon")
app.add_typer(config_cmd.app, name="config")


def main() -> None:
    from mlxbun_cli.errors import MlxbunError

    try:
        app()
    except MlxbunError as exc:
        from mlxbun_cli import ui

        ui.print_error(exc.message, exc.hint)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        sys.stderr.close()
        sys.exit(0)


if __name__ == "__main__":
    main()
