"""`mlxbun daemon`: status, stop and logs of the background server."""

from __future__ import annotations

from typing import Annotated

import typer

app = typer.Typer(
    help="The background server started with `mlxbun serve -d`.", no_args_is_help=True
)


@app.command("status")
def status(
    json_out: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Show whether the daemon runs: url, pid, uptime, model, memory.

    Exit code 0 when it runs, 1 when it does not.

    Example: mlxbun daemon status --json
    """
    from mlxbun_cli import ui
    from mlxbun_cli.services.daemon_status import daemon_status

    report = daemon_status()
    if json_out:
        ui.print_json(report)
    elif not report["running"]:
        ui.console().print(
            "[warn]no daemon running[/warn]"
            + (" (removed a stale state file)" if report.get("stale_cleaned") else "")
        )
    else:
        from mlxbun_cli.render import human_bytes

        out = ui.console()
        out.print(
            f"[good]running[/good] at {report['url']} · pid {report['pid']} · up {report['uptime_s']:.0f}s"
        )
        out.print(f"model {report['model']} · status {report['health']}")
        memory = report.get("memory") or {}
        if memory:
            out.print(
                f"memory active {human_bytes(memory.get('active_bytes'))} · peak {human_bytes(memory.get('peak_bytes'))}"
            )
    raise typer.Exit(0 if report["running"] else 1)


@app.command("stop")
def stop(
    timeout: Annotated[
        float, typer.Option("--timeout", help="Seconds to wait before SIGKILL.")
    ] = 15.0,
    json_out: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Stop the daemon (SIGTERM, wait, then SIGKILL) and say what happened.

    Example: mlxbun daemon stop
    """
    from mlxbun_cli import ui
    from mlxbun_cli.client import daemon

    result = daemon.stop(timeout)
    if json_out:
        ui.print_json(
            {"pid": result.pid or None, "result": result.how, "seconds": round(result.seconds, 2)}
        )
        return
    if result.how == "not-running":
        ui.console().print("[warn]no daemon running[/warn]")
    elif result.how == "stopped":
        ui.console().print(f"[good]stopped[/good] pid {result.pid} in {result.seconds:.1f}s")
    else:
        ui.console().print(
            f"[bad]killed[/bad] pid {result.pid}: it did not stop within {timeout:.0f}s"
        )


@app.command("logs")
def logs(
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new lines (Ctrl-C stops).")
    ] = False,
    lines: Annotated[
        int, typer.Option("--lines", "-n", help="How many recent lines to show.")
    ] = 50,
) -> None:
    """Show (or follow) the daemon's log.

    Example: mlxbun daemon logs -f
    """
    import sys
    import time

    from mlxbun_cli.client import daemon
    from mlxbun_cli.errors import InputError

    path = daemon.log_file()
    if not path.exists():
        raise InputError(
            f"no daemon log yet at {path}", hint="start the daemon with `mlxbun serve -d`"
        )
    sys.stdout.write(daemon.log_tail(lines) + "\n")
    sys.stdout.flush()
    if not follow:
        return
    with open(path, encoding="utf-8", errors="replace") as fh:
        fh.seek(0, 2)
        try:
            while True:
                line = fh.readline()
                if line:
                    sys.stdout.write(line)
                    sys.stdout.flush()
                else:
                    time.sleep(0.2)
        except KeyboardInterrupt:
            return
