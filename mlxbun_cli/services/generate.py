"""Turning CLI input into a backend and a neutral request."""

from __future__ import annotations

import json
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


def load_json_file(path: str, option: str) -> Any:
    from pathlib import Path

    file = Path(path).expanduser()
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{option}: no such file {file}") from None
    except OSError as exc:
        raise InputError(f"{option}: cannot read {file}: {exc.strerror}") from None
    except ValueError as exc:
        raise InputError(f"{option}: {file} is not valid JSON: {exc}") from None


def structure_fields(
    json_schema: str | None, tools: str | None, tool_choice: str | None
) -> dict[str, Any]:
    """--json-schema / --tools / --tool-choice → request fields."""
    from mlxbun_cli.prep.grammar import from_response_format
    from mlxbun_cli.prep.tools import validate_tools

    out: dict[str, Any] = {}
    if json_schema:
        schema = load_json_file(json_schema, "--json-schema")
        out["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": schema},
        }
        from_response_format(out["response_format"])  # a bad schema fails before the model loads
    if tools:
        listed = load_json_file(tools, "--tools")
        if isinstance(listed, dict) and "tools" in listed:
            listed = listed["tools"]
        out["tools"] = validate_tools(listed)
    if tool_choice:
        if tool_choice in ("auto", "none", "required"):
            out["tool_choice"] = tool_choice
        else:
            out["tool_choice"] = {"type": "function", "function": {"name": tool_choice}}
        if not tools:
            raise InputError("--tool-choice needs --tools")
    return out


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
    return local_backend(model, adapter, settings)


def local_backend(
    model: str | None, adapter: str | None, settings: Settings, **options: Any
) -> LocalBackend:
    """The in-process backend, configured from the settings in force."""
    return LocalBackend(
        model,
        adapter=adapter,
        default_model=settings.default_model,
        server_thinking=settings.enable_thinking,
        default_max_tokens=settings.max_tokens,
        cache_bytes=settings.prompt_cache_bytes,
        cache_entries=settings.prompt_cache_entries,
        constrained_decoding=settings.constrained_decoding,
        compiled_decode=settings.compiled_decode,
        **options,
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
