"""Turning CLI input into a backend and a neutral request."""

from __future__ import annotations

import sys
from typing import Any

from mlxbun_cli.client.backend import Backend, LocalBackend
from mlxbun_cli.client.remote import RemoteBackend
from mlxbun_cli.config import Settings
from mlxbun_cli.errors import InputError
from mlxbun_cli.prep.request import GenerationRequest, validate


def read_prompt(prompt: str | None) -> str:
    if prompt is None:
        raise InputError("no prompt given", hint="pass one, or `-` to read it from stdin")
    if prompt == "-":
        prompt = sys.stdin.read()
    if not prompt.strip():
        raise InputError("the prompt is empty")
    return prompt


def build_request(
    prompt: str | None,
    *,
    system: str | None = None,
    raw: bool = False,
    logprobs: int = 0,
    fields: dict[str, Any],
    history: list[dict[str, Any]] | None = None,
) -> GenerationRequest:
    if raw:
        req = GenerationRequest(prompt=prompt, **fields)
    else:
        messages = [{"role": "system", "content": system}] if system else []
        messages += history or []
        if prompt is not None:
            messages.append({"role": "user", "content": prompt})
        req = GenerationRequest(messages=messages, **fields)
    if logprobs:
        req.logprobs, req.top_logprobs = True, logprobs
    validate(req)  # bad flags fail before the model loads
    return req


def open_backend(
    model: str | None,
    *,
    adapter: str | None = None,
    local: bool = False,
    remote: str | None = None,
    settings: Settings | None = None,
) -> Backend:
    """The daemon when one runs (or is asked for), this process otherwise."""
    settings = settings or Settings()
    if local and remote:
        raise InputError("--local and --remote cannot be used together")
    if remote:
        return RemoteBackend(remote, model=model, api_key=settings.api_key)
    if not local and adapter is None:
        from mlxbun_cli.client import daemon

        running = daemon.find_running()
        if running is not None and _same_model(model, settings.default_model, running.model):
            return RemoteBackend(running.url, model=running.model, api_key=settings.api_key)
    return LocalBackend(
        model,
        adapter=adapter,
        default_model=settings.default_model,
        server_thinking=settings.enable_thinking,
        default_max_tokens=settings.max_tokens,
        cache_bytes=settings.prompt_cache_bytes,
        cache_entries=settings.prompt_cache_entries,
        constrained_decoding=settings.constrained_decoding,
    )


def _same_model(name: str | None, default: str | None, daemon_model: str) -> bool:
    """Whether the model asked for is the one the daemon serves."""
    if not (name or default):
        return True
    from mlxbun_cli.catalog import resolve

    try:
        return resolve(name, default).id == daemon_model
    except InputError:
        return False
