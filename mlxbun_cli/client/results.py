"""Collecting a stream of output events into one result (for --json and tests)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from mlxbun_cli.prep.events import (
    Done,
    OutputEvent,
    ReasoningDelta,
    TextDelta,
    TokenLogprob,
    ToolCallEvent,
)


@dataclass
class Collected:
    text: str = ""
    reasoning: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    logprobs: list[dict[str, Any]] = field(default_factory=list)
    done: Done | None = None

    def add(self, event: OutputEvent) -> None:
        if isinstance(event, TextDelta):
            self.text += event.text
        elif isinstance(event, ReasoningDelta):
            self.reasoning += event.text
        elif isinstance(event, ToolCallEvent):
            self.tool_calls.append(event.call.as_openai())
        elif isinstance(event, TokenLogprob):
            entry: dict[str, Any] = {"token": event.text, "logprob": event.logprob}
            if event.top is not None:
                entry["top_logprobs"] = [{"token": t, "logprob": lp} for t, lp in event.top]
            self.logprobs.append(entry)
        elif isinstance(event, Done):
            self.done = event

    def as_dict(self, model: str) -> dict[str, Any]:
        done = self.done
        out: dict[str, Any] = {
            "model": model,
            "text": self.text,
            "reasoning": self.reasoning or None,
            "tool_calls": self.tool_calls,
            "finish_reason": done.finish_reason if done else None,
            "seed": done.seed if done else None,
            "usage": done.usage.as_dict() if done else None,
        }
        if self.logprobs:
            out["logprobs"] = self.logprobs
        if done and done.error:
            out["error"] = done.error
        return out


def collect(events: Iterable[OutputEvent]) -> Collected:
    result = Collected()
    for event in events:
        result.add(event)
    return result
