"""`mlxbun stats`: what the running server is doing."""

from __future__ import annotations

from typing import Annotated, Optional

import typer


def stats(
    json_out: Annotated[
        bool, typer.Option("--json", help="The server's full /stats as JSON.")
    ] = False,
    watch: Annotated[
        bool, typer.Option("--watch", "-w", help="Refresh in place until Ctrl-C.")
    ] = False,
    interval: Annotated[float, typer.Option("--interval", help="Seconds between refreshes.")] = 1.0,
    remote: Annotated[
        Optional[str],
        typer.Option("--remote", help="A server URL (default: the daemon).", show_default=False),
    ] = None,
) -> None:
    """Requests, tokens, speed, cache and memory of the running server.

    Examples:

        mlxbun stats

        mlxbun stats --watch
    """
    import time

    from mlxbun_cli import ui
    from mlxbun_cli.services.stats import fetch_stats

    if json_out:
        ui.print_json(fetch_stats(remote))
        return
    if not watch:
        ui.console().print(_table(fetch_stats(remote)))
        return
    from rich.live import Live

    with Live(_table(fetch_stats(remote)), console=ui.console(), refresh_per_second=4) as live:
        try:
            while True:
                time.sleep(interval)
                live.update(_table(fetch_stats(remote)))
        except KeyboardInterrupt:
            return


def _table(data: dict):
    from rich.table import Table

    from mlxbun_cli.render import human_bytes
    from mlxbun_cli.services.stats import model_rows

    up = data.get("uptime_s", 0)
    title = f"{data['url']} · {data.get('mode', 'in-process')} · up {up:.0f}s · {data.get('requests', 0)} requests"
    table = Table(title=title, title_justify="left")
    columns = ("model", "state", "reqs", "active", "queue", "tokens", "tok/s", "cache", "memory")
    for column in columns:
        table.add_column(
            column,
            justify="left" if column in ("model", "state") else "right",
            no_wrap=column == "model",
        )
    for row in model_rows(data):
        table.add_row(
            row["model"] + (" (pinned)" if row["pinned"] else ""),
            row["state"],
            str(row["requests"]),
            str(row["active"]),
            str(row["queue"]),
            str(row["generated_tokens"]),
            f"{row['tok_s']:.0f}",
            f"{human_bytes(row['cache_bytes'])} / {row['cache_hits']} hits",
            human_bytes(row["memory_bytes"]),
        )
    return table
