"""The daemon's residency admin routes, for `mlxbun models ps|load|unload`."""

from __future__ import annotations

from typing import Any

from mlxbun_cli.client import daemon
from mlxbun_cli.errors import BackendUnavailableError, InputError


def _call(
    method: str, path: str, body: dict[str, Any] | None = None, timeout: float = 300.0
) -> Any:
    import httpx

    from mlxbun_cli.config import Settings

    info = daemon.require_running()
    key = Settings().api_key
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        response = httpx.request(
            method, info.url + path, json=body, headers=headers, timeout=timeout
        )
    except httpx.HTTPError as exc:
        raise BackendUnavailableError(
            f"the daemon at {info.url} does not answer ({type(exc).__name__})"
        ) from exc
    if response.status_code == 404 and path == "/api/models/ps":
        raise InputError(
            "the daemon runs in-process (one model); start it without --in-process for residency"
        )
    data = response.json()
    if response.status_code >= 400:
        message = (data.get("error") or {}).get("message") or response.text
        raise (InputError if response.status_code < 500 else BackendUnavailableError)(message)
    return data


def resident_models() -> dict[str, Any]:
    return _call("GET", "/api/models/ps", timeout=10.0)


def load(model: str, pin: bool = False) -> dict[str, Any]:
    return _call("POST", "/api/models/load", {"model": model, "pin": pin})


def unload(model: str) -> dict[str, Any]:
    return _call("POST", "/api/models/unload", {"model": model})
