"""What `mlxbun daemon status` reports."""

from __future__ import annotations

from typing import Any

from mlxbun_cli.client import daemon


def daemon_status() -> dict[str, Any]:
    stale = daemon.state_file().exists()
    info = daemon.read_state()
    if info is None:
        return {"running": False, "stale_cleaned": stale and not daemon.state_file().exists()}
    report: dict[str, Any] = {
        "running": True,
        "pid": info.pid,
        "url": info.url,
        "model": info.model,
        "started_at": info.started_at,
        "uptime_s": round(info.uptime_s, 1),
        "log": info.log,
    }
    health = daemon.health(info.url)
    report["health"] = health.get("status") if health else "not answering"
    if health and health.get("status") == "ok":
        import httpx

        try:
            stats = httpx.get(f"{info.url}/stats", timeout=2.0, headers=_auth_headers()).json()
            report["memory"] = stats.get("memory")
            report["requests"] = stats.get("requests")
        except (httpx.HTTPError, ValueError):
            pass
    return report


def _auth_headers() -> dict[str, str]:
    from mlxbun_cli.config import Settings

    key = Settings().api_key
    return {"Authorization": f"Bearer {key}"} if key else {}
