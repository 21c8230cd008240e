"""Protocol-neutral request options and events the engine deals in (no mlx import)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class SamplingOptions:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    seed: int | None = None


@dataclass(frozen=True)
class PenaltyOptions:
    repetition_penalty: float | None = None
    repetition_context_size: int = 20
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[int, float] | None = None

    @property
    def active(self) -> bool:
        return any(
            (
                self.repetition_penalty not in (None, 1.0),
                self.presence_penalty not in (None, 0.0),
                self.frequency_penalty not in (None, 0.0),
                bool(self.logit_bias),
            )
        )


@dataclass
class EngineRequest:
    """What the scheduler needs: tokens in, limits, sampling."""

    prompt_tokens: list[int]
    max_tokens: int
    sampling: SamplingOptions = field(default_factory=SamplingOptions)
    penalties: PenaltyOptions = field(default_factory=PenaltyOptions)
    top_logprobs: int = 0  # 0: none; >0: that many alternatives per token
    want_logprobs: bool = False
    cache_key: Any = None  # prompt-cache namespace (adapter, session)
    logits_processors: list[Any] = field(default_factory=list)  # extra, e.g. grammar


@dataclass(frozen=True)
class TokenStep:
    """One generated token as the scheduler saw it."""

    token: int
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None
    finish_reason: str | None = None  # "stop" (eos), "length", or None


@dataclass
class Usage:
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    queued_seconds: float = 0.0
    prompt_seconds: float = 0.0  # admission to first token
    generation_seconds: float = 0.0  # first token to last
    peak_memory_bytes: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def prompt_tps(self) -> float:
        fresh = self.prompt_tokens - self.cached_tokens
        return fresh / self.prompt_seconds if self.prompt_seconds > 0 else 0.0

    @property
    def generation_tps(self) -> float:
        if self.generation_seconds <= 0 or self.completion_tokens < 2:
            return 0.0
        return (self.completion_tokens - 1) / self.generation_seconds

    def as_dict(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
            "time_to_first_token_s": round(self.queued_seconds + self.prompt_seconds, 4),
            "prompt_tps": round(self.prompt_tps, 2),
            "generation_tps": round(self.generation_tps, 2),
            "peak_memory_bytes": self.peak_memory_bytes,
        }


@dataclass(frozen=True)
class Finished:
    """The last event of a sequence."""

    finish_reason: str  # "stop", "length", "cancelled", "error"
    usage: Usage
    error: str | None = None
