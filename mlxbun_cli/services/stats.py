"""Fetching and summarising the daemon's /stats for `mlxbun stats`."""

from __future__ import annotations

from typing import Any

from mlxbun_cli.client import daemon
from mlxbun_cli.errors import BackendUnavailableError


def fetch_stats(url: str | None = None) -> dict[str, Any]:
    import httpx

    from mlxbun_cli.config import Settings

    if url is None:
        url = daemon.require_running().url
    key = Settings().api_key
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        response = httpx.get(f"{url}/stats", headers=headers, timeout=5.0)
    except httpx.HTTPError as exc:
        raise BackendUnavailableError(
            f"the server at {url} does not answer ({type(exc).__name__})"
        ) from exc
    if response.status_code == 401:
        raise BackendUnavailableError("the server wants an API key", hint="set MLXBUN_API_KEY")
    data = response.json()
    data["url"] = url
    return data


def model_rows(stats: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per resident model, for either server mode."""
    if stats.get("mode") == "isolated":
        rows = []
        for model in stats["residency"]["models"]:
            worker = (stats.get("workers") or {}).get(model["model"]) or {}
            rows.append(_row(model["model"], model["state"], worker, model))
        return rows
    return [_row(stats.get("model", "?"), stats.get("status", "?"), stats, {})]


def _row(
    model: str, state: str, worker: dict[str, Any], residency: dict[str, Any]
) -> dict[str, Any]:
    engine = worker.get("engine") or {}
    cache = worker.get("prompt_cache") or {}
    memory = worker.get("memory") or {}
    return {
        "model": model,
        "state": state,
        "requests": engine.get("requests", 0),
        "active": engine.get("active", 0),
        "queue": engine.get("queue_depth", 0),
        "generated_tokens": engine.get("generated_tokens", 0),
        "tok_s": engine.get("tokens_per_busy_second", 0.0),
        "cache_hits": engine.get("cache_hits", 0),
        "cache_bytes": cache.get("bytes", 0),
        "memory_bytes": memory.get("active_bytes", 0),
        "peak_bytes": memory.get("peak_bytes", 0),
        "leases": residency.get("leases", 0),
        "restarts": residency.get("restarts", 0),
        "pinned": residency.get("pinned", False),
    }
