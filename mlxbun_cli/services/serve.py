"""Helpers for starting the server as a daemon."""

from __future__ import annotations

from mlxbun_cli.server.state import ServeOptions


def detached_args(options: ServeOptions) -> list[str]:
    """The foreground `serve` arguments that reproduce these options."""
    args: list[str] = []
    if options.model:
        args.append(options.model)
    args += [
        "--host",
        options.host,
        "--port",
        str(options.port),
        "--log-level",
        options.log_level,
        "--max-body-mb",
        str(options.max_body_bytes / (1024 * 1024)),
        "--shutdown-grace",
        str(options.shutdown_grace),
    ]
    if not options.isolated:
        args.append("--in-process")
    if not options.standby:
        args.append("--no-standby")
    if options.memory_budget:
        args += ["--memory-budget", str(options.memory_budget)]
    args += ["--max-models", str(options.max_models)]
    for model in options.pinned:
        args += ["--pin", model]
    if options.keep_alive is not None:
        args += ["--keep-alive", str(options.keep_alive)]
    if options.adapter:
        args += ["--adapter", options.adapter]
    if options.default_max_tokens:
        args += ["--max-tokens", str(options.default_max_tokens)]
    if options.enable_thinking is not None:
        args.append("--think" if options.enable_thinking else "--no-think")
    for origin in options.cors_origins or ["none"]:
        args += ["--cors-origin", origin]
    return args
