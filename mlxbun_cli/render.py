"""Rendering generation output to the terminal (plain streams, JSON, stats)."""

from __future__ import annotations

import sys
from collections.abc import Iterable

from mlxbun_cli import ui
from mlxbun_cli.client.backend import ModelInfo
from mlxbun_cli.client.results import Collected
from mlxbun_cli.prep.events import Done, OutputEvent, ReasoningDelta, TextDelta, ToolCallEvent

DEMO_NOTE = "demo model: random weights, for trying mlxbun offline — its text is gibberish"


def human_bytes(n: int | float | None) -> str:
    if not n:
        return "0 B"
    size = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1024 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TB"


def model_banner(info: ModelInfo) -> None:
    if ui.is_quiet():
        return
    parts = [f"{info.id} ({info.where})"]
    if info.load_seconds is not None:
        parts.append(f"loaded in {info.load_seconds:.2f}s")
    if info.weights_bytes:
        parts.append(human_bytes(info.weights_bytes))
    ui.note(" · ".join(parts))
    if info.is_demo:
        ui.err_console().print(f"[warn]{DEMO_NOTE}[/warn]")


def stats_line(done: Done) -> str:
    u = done.usage
    parts = [f"{u.completion_tokens} tokens", f"{u.generation_tps:.1f} tok/s"]
    cached = f", {u.cached_tokens} cached" if u.cached_tokens else ""
    parts.append(f"prompt {u.prompt_tokens} tok{cached} at {u.prompt_tps:.1f} tok/s")
    if u.peak_memory_bytes:
        parts.append(f"peak {human_bytes(u.peak_memory_bytes)}")
    parts.append(f"finish: {done.finish_reason}")
    if done.seed is not None:
        parts.append(f"seed {done.seed}")
    return " · ".join(parts)


def stream_plain(events: Iterable[OutputEvent], *, show_stats: bool = True) -> Collected:
    """Answer to stdout as it comes; thinking dimmed on stderr; stats at the end."""
    err = ui.err_console()
    result = Collected()
    in_reasoning = False
    out = sys.stdout
    for event in events:
        result.add(event)
        if isinstance(event, ReasoningDelta):
            if not in_reasoning:
                err.print("[thinking]thinking: [/thinking]", end="")
                in_reasoning = True
            err.print(f"[thinking]{ui.escape(event.text)}[/thinking]", end="")
        elif isinstance(event, TextDelta):
            if in_reasoning:
                err.print()
                in_reasoning = False
            out.write(event.text)
            out.flush()
        elif isinstance(event, ToolCallEvent):
            call = event.call
            err.print(f"\n[accent]tool call[/accent] {call.name}({ui.escape(call.arguments)})")
    if in_reasoning:
        err.print()
    if result.text and not result.text.endswith("\n"):
        out.write("\n")
        out.flush()
    for warning in getattr(events, "warnings", ()):
        ui.warn(warning)
    done = result.done
    if done and done.finish_reason == "error":
        from mlxbun_cli.errors import GenerationError

        raise GenerationError(done.error or "generation failed")
    if show_stats and done and not ui.is_quiet():
        ui.note(stats_line(done))
    return result


def print_result_json(info: ModelInfo, events: Iterable[OutputEvent]) -> None:
    result = Collected()
    for event in events:
        result.add(event)
    data = result.as_dict(info.id)
    data["demo"] = info.is_demo
    warnings = list(getattr(events, "warnings", ()))
    if warnings:
        data["warnings"] = warnings
    ui.print_json(data)
