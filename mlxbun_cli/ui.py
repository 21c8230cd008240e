"""All terminal styling: one cached rich Console per stream and named styles."""

from __future__ import annotations

import os
import sys
from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

STYLES = {
    "muted": "dim",
    "good": "green",
    "warn": "yellow",
    "bad": "bold red",
    "accent": "cyan",
    "thinking": "dim italic",
}


def color_enabled(stream=None) -> bool:
    stream = stream or sys.stdout
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return hasattr(stream, "isatty") and stream.isatty()


@lru_cache(maxsize=2)
def console(stderr: bool = False) -> Console:
    from rich.console import Console
    from rich.theme import Theme

    stream = sys.stderr if stderr else sys.stdout
    return Console(
        theme=Theme(STYLES),
        stderr=stderr,
        no_color=not color_enabled(stream),
        highlight=False,
        soft_wrap=True,
    )


def err_console() -> Console:
    return console(stderr=True)


def print_error(message: str, hint: str | None = None) -> None:
    out = err_console()
    out.print(f"[bad]error:[/bad] {escape(message)}")
    if hint:
        out.print(f"[muted]hint: {escape(hint)}[/muted]")


_QUIET = False


def configure(verbose: bool = False, quiet: bool = False) -> None:
    """Root flags: -v logs what happens underneath; -q keeps only results and errors."""
    global _QUIET
    _QUIET = quiet
    if verbose:
        import logging

        logging.basicConfig(level=logging.DEBUG, format="%(levelname)s %(name)s: %(message)s")
        for noisy in ("httpcore", "httpx", "urllib3", "filelock", "asyncio"):
            logging.getLogger(noisy).setLevel(logging.WARNING)


def is_quiet() -> bool:
    return _QUIET


def note(message: str) -> None:
    """A muted status line on stderr, so stdout stays clean for pipes."""
    if not _QUIET:
        err_console().print(f"[muted]{escape(message)}[/muted]")


def warn(message: str) -> None:
    """A warning on stderr: the run goes on, but not quite as asked."""
    err_console().print(f"[warn]warning:[/warn] {escape(message)}")


def escape(text: str) -> str:
    from rich.markup import escape as rich_escape

    return rich_escape(text)


def print_json(data: object) -> None:
    import json

    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    sys.stdout.flush()
