"""Protocol-neutral output events: what every wire and the CLI render."""

from __future__ import annotations

from dataclasses import dataclass, field

from mlxbun_cli.engine.types import Usage
from mlxbun_cli.prep.tools import ToolCall


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True)
class ToolCallEvent:
    index: int
    call: ToolCall


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    text: str
    logprob: float
    top: list[tuple[str, float]] | None = None


@dataclass(frozen=True)
class Done:
    finish_reason: str  # "stop", "length", "tool_calls", "cancelled", "error"
    usage: Usage
    tool_calls: list[ToolCall] = field(default_factory=list)
    error: str | None = None
    seed: int | None = None
    stop_sequence: str | None = None  # the stop string that ended it, if one did


OutputEvent = TextDelta | ReasoningDelta | ToolCallEvent | TokenLogprob | Done
