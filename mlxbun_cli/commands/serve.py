"""`mlxbun serve`: the OpenAI-compatible server, in the foreground or as a daemon."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from mlxbun_cli.commands import _options as o


def serve(
    model: Annotated[
        Optional[str],
        typer.Argument(
            help="Model to serve (default: the default_model setting).", show_default=False
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
    )
    if detach:
        from mlxbun_cli.client import daemon
        from mlxbun_cli.services.serve import detached_args

        with ui.err_console().status("starting the daemon…"):
            secrets = {"MLXBUN_API_KEY": options.api_key} if options.api_key else None
            info = daemon.start_detached(detached_args(options), secrets=secrets)
        ui.console().print(
            f"[good]daemon running[/good] at {info.url} (pid {info.pid}, model {info.model})"
        )
        ui.note(f"log: {info.log} · stop: mlxbun daemon stop")
        return
    from mlxbun_cli.server.run import serve as run_server

    def ready(url: str, ref) -> None:
        ui.note(f"serving {ref.id} at {url} (OpenAI base_url {url}/v1) · Ctrl-C stops")

    run_server(options, settings.default_model, on_ready=ready)
