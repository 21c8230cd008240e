"""The command tree and the one boundary where errors become a clear line.

Command modules import only typer and light helpers at import time, so
`mlxbun --help` and completion never load mlx, mlx-lm or the server stack.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn

import typer

from mlxbun_cli import __version__
from mlxbun_cli.commands import (
    chat,
    config_cmd,
    daemon_cmd,
    generate,
    jobs,
    models,
    push,
    serve,
    stats,
)

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
    verbose: bool = typer.Option(
        False, "--verbose", "-v", help="Log what happens underneath (to stderr)."
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Only results and errors."),
) -> None:
    """Local language models on MLX."""
    from mlxbun_cli import ui

    ui.configure(verbose=verbose, quiet=quiet)


app.command("generate")(generate.generate)
app.command("chat")(chat.chat)
app.command("serve")(serve.serve)
app.command("stats")(stats.stats)
app.add_typer(daemon_cmd.app, name="daemon")
app.add_typer(config_cmd.app, name="config")
app.add_typer(models.app, name="models")
app.add_typer(jobs.app, name="jobs")
app.add_typer(push.app, name="push")


def _click_exceptions():
    try:  # typer >= 0.20 vendors click
        from typer._click import exceptions
    except ImportError:  # pragma: no cover
        from click import exceptions
    return exceptions


def _exit(code: int) -> NoReturn:
    """Exit with `code`. Once mlx is loaded, skip the interpreter's teardown.

    Tearing down mlx, transformers and friends takes ~0.15 s after the work is
    done (and mlx's own teardown is what aborts when streams are left). The
    exit handlers still run and the standard streams are flushed; every file
    mlxbun writes is flushed (and fsync'd, for results) as it goes.
    """
    if "mlx.core" not in sys.modules:
        sys.exit(code)
    import atexit
    import logging

    atexit._run_exitfuncs()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more to say
            pass
    os._exit(code)


def main() -> None:
    from mlxbun_cli.errors import MlxbunError

    cx = _click_exceptions()

    try:
        code = app(standalone_mode=False)
    except MlxbunError as exc:
        from mlxbun_cli import ui

        ui.print_error(exc.message, exc.hint)
        _exit(exc.exit_code)
    except cx.NoArgsIsHelpError:  # help was shown: nothing failed
        _exit(0)
    except cx.UsageError as exc:  # bad flags and values: one line, exit 2
        from mlxbun_cli import ui

        path = exc.ctx.command_path if exc.ctx is not None else "mlxbun"
        ui.print_error(exc.format_message(), f"`{path} --help` shows the options")
        _exit(2)
    except cx.ClickException as exc:
        from mlxbun_cli import ui

        ui.print_error(exc.format_message())
        _exit(exc.exit_code)
    except (KeyboardInterrupt, typer.Abort):
        _exit(130)
    except BrokenPipeError:
        sys.stderr.close()
        _exit(0)
    _exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
