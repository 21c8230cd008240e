"""`mlxbun serve`: the OpenAI-compatible server, in the foreground or as a daemon."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from mlxbun_cli.commands import _options as o
from mlxbun_cli.completion import complete_model


def serve(
    model: Annotated[
        Optional[str],
        typer.Argument(
            autocompletion=complete_model,
            help="Model to serve (default: the default_model setting).",
            show_default=False,
        ),
    ] = None,
    host: Annotated[
        Optional[str],
        typer.Option("--host", help="Address to bind. Default 127.0.0.1 (this machine only)."),
    ] = None,
    port: Annotated[
        Optional[int], typer.Option("--port", "-p", help="Port (0 picks a free one). Default 8080.")
    ] = None,
    detach: Annotated[
        bool,
        typer.Option("--detach", "-d", help="Run in the background; returns once /health answers."),
    ] = False,
    api_key: Annotated[
        Optional[str],
        typer.Option(
            "--api-key",
            help="Require `Authorization: Bearer KEY` on every route but /health (env MLXBUN_API_KEY).",
            show_default=False,
        ),
    ] = None,
    cors_origin: Annotated[
        Optional[list[str]],
        typer.Option(
            "--cors-origin",
            help="Allowed CORS origin, repeatable (default: *). `none` turns CORS off.",
        ),
    ] = None,
    max_tokens: o.MaxTokens = None,
    think: o.Think = None,
    adapter: o.Adapter = None,
    max_body_mb: Annotated[
        float, typer.Option("--max-body-mb", help="Largest request body accepted, in MB.")
    ] = 16.0,
    log_level: Annotated[
        str, typer.Option("--log-level", help="debug|info|warning|error.")
    ] = "info",
    shutdown_grace: Annotated[
        float,
        typer.Option(
            "--shutdown-grace",
            help="On SIGTERM/SIGINT, seconds in-flight streams get before they are cancelled.",
        ),
    ] = 5.0,
    in_process: Annotated[
        bool,
        typer.Option(
            "--in-process",
            help="Load the model in this process instead of isolated worker processes.",
        ),
    ] = False,
    standby: Annotated[
        bool,
        typer.Option(
            "--standby/--no-standby",
            help="Keep a spare, pre-imported worker process (~100 MB) so a crashed worker "
            "or a newly requested model is up in a fraction of a second.",
        ),
    ] = True,
    memory_budget: Annotated[
        Optional[str],
        typer.Option(
            "--memory-budget",
            help="Memory for resident models, e.g. 12GB (default: 75% of RAM).",
            show_default=False,
        ),
    ] = None,
    max_models: Annotated[
        int, typer.Option("--max-models", help="Most models resident at once.", min=1)
    ] = 2,
    pin: Annotated[
        Optional[list[str]],
        typer.Option("--pin", help="Keep this model resident (repeatable).", show_default=False),
    ] = None,
    keep_alive: Annotated[
        Optional[str],
        typer.Option(
            "--keep-alive",
            help="Unload a model idle this long (e.g. 5m, 300, -1 = never). Default: never.",
            show_default=False,
        ),
    ] = None,
    json_out: Annotated[
        bool, typer.Option("--json", help="With --detach: print the daemon's details as JSON.")
    ] = False,
) -> None:
    """Serve a model over the OpenAI API on 127.0.0.1.

    Clients such as the official `openai` SDK work unchanged with
    base_url=http://127.0.0.1:8080/v1. While a server runs, `chat` and
    `generate` use it instead of loading the model themselves.

    Examples:

        mlxbun serve demo

        mlxbun serve demo -d --port 9000 && mlxbun daemon status
    """
    from mlxbun_cli import ui
    from mlxbun_cli.config import Settings
    from mlxbun_cli.server.state import ServeOptions
    from mlxbun_cli.sizes import parse_size

    settings = Settings(
        {
            "host": host,
            "port": port,
            "api_key": api_key,
            "max_tokens": max_tokens,
            "enable_thinking": think,
        }
    )
    origins = [] if cors_origin == ["none"] else (cors_origin or ["*"])
    options = ServeOptions(
        model=model,
        adapter=adapter,
        host=settings.host,
        port=settings.port,
        api_key=settings.api_key,
        cors_origins=origins,
        max_body_bytes=int(max_body_mb * 1024 * 1024),
        enable_thinking=settings.enable_thinking,
        default_max_tokens=settings.max_tokens,
        cache_bytes=settings.prompt_cache_bytes,
        cache_entries=settings.prompt_cache_entries,
        log_level=log_level,
        shutdown_grace=shutdown_grace,
        constrained_decoding=settings.constrained_decoding,
        compiled_decode=settings.compiled_decode,
        isolated=not in_process,
        standby=standby,
        memory_budget=parse_size(memory_budget, "--memory-budget") if memory_budget else None,
        memory_ceiling=parse_size(memory_budget, "--memory-budget")
        if memory_budget and in_process
        else None,
        max_models=max_models,
        pinned=list(pin or []),
        keep_alive=_keep_alive(keep_alive),
    )
    if detach:
        from mlxbun_cli.client import daemon
        from mlxbun_cli.services.serve import detached_args

        with ui.err_console().status("starting the daemon…"):
            secrets = {"MLXBUN_API_KEY": options.api_key} if options.api_key else None
            info = daemon.start_detached(detached_args(options), secrets=secrets)
        if json_out:
            from dataclasses import asdict

            ui.print_json({"running": True, **asdict(info)})
            return
        ui.console().print(
            f"[good]daemon running[/good] at {info.url} (pid {info.pid}, model {info.model})"
        )
        ui.note(f"log: {info.log} · stop: mlxbun daemon stop")
        return
    from mlxbun_cli.server.run import serve as run_server

    def ready(url: str, ref) -> None:
        ui.note(f"serving {ref.id} at {url} (OpenAI base_url {url}/v1) · Ctrl-C stops")

    run_server(options, settings.default_model, on_ready=ready)


def _keep_alive(value: str | None) -> float | None:
    if value is None:
        return None
    from mlxbun_cli.server.residency import parse_keep_alive

    seconds = parse_keep_alive(value)
    return None if seconds is None or seconds < 0 else seconds
