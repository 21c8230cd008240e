"""Request → generation options: model defaults folded under request fields."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlxbun_cli.engine.types import PenaltyOptions, SamplingOptions
from mlxbun_cli.errors import OptionError
from mlxbun_cli.prep.request import UNSET, GenerationRequest

FALLBACK_TEMPERATURE = 0.7
NO_THINK_TEMPERATURE_CAP = 0.7


@dataclass(frozen=True)
class GenerationDefaults:
    """What the model's generation_config.json declares."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    enable_thinking: bool | None = None
    no_think_temperature_cap: float = NO_THINK_TEMPERATURE_CAP

    @classmethod
    def from_model_dir(cls, path: Path) -> GenerationDefaults:
        try:
            data = json.loads((path / "generation_config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return cls()
        if not isinstance(data, dict):
            return cls()

        def num(key: str) -> Any:
            value = data.get(key)
            return (
                value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
            )

        thinking = data.get("enable_thinking")
        cap = num("no_think_temperature")
        return cls(
            temperature=num("temperature") if data.get("do_sample", True) else 0.0,
            top_p=num("top_p"),
            top_k=num("top_k"),
            min_p=num("min_p"),
            repetition_penalty=num("repetition_penalty"),
            enable_thinking=thinking if isinstance(thinking, bool) else None,
            no_think_temperature_cap=cap if cap is not None else NO_THINK_TEMPERATURE_CAP,
        )


def resolve_enable_thinking(
    req: GenerationRequest, defaults: GenerationDefaults, server_default: bool | None = None
) -> bool | None:
    """explicit kwarg (null = template default) → reasoning_effort → server → model.

    None means "leave the template's own default".
    """
    explicit = req.explicit_thinking
    if explicit is None:
        return None
    if isinstance(explicit, bool):
        return explicit
    assert explicit is UNSET
    if req.reasoning_effort is not None:
        return req.reasoning_effort != "none"
    if server_default is not None:
        return server_default
    return defaults.enable_thinking


def template_reasoning_effort(effort: str | None) -> str | None:
    """OpenAI effort levels onto the depth set templates that read it accept."""
    return {
        "minimal": "low",
        "low": "low",
        "medium": "medium",
        "high": "xhigh",
        "xhigh": "xhigh",
    }.get(effort or "")


def _pick(value: Any, default: Any, fallback: Any) -> Any:
    """The request's value, else the model's default, else ours."""
    if value is not None:
        return value
    return default if default is not None else fallback


def sampling_for(
    req: GenerationRequest, defaults: GenerationDefaults, enable_thinking: bool | None
) -> SamplingOptions:
    if req.temperature is not None:
        temperature = float(req.temperature)
    else:
        model_temp = (
            defaults.temperature if defaults.temperature is not None else FALLBACK_TEMPERATURE
        )
        temperature = (
            min(model_temp, defaults.no_think_temperature_cap)
            if enable_thinking is False
            else model_temp
        )
    return SamplingOptions(
        temperature=temperature,
        top_p=float(_pick(req.top_p, defaults.top_p, 1.0)),
        top_k=int(_pick(req.top_k, defaults.top_k, 0)),
        min_p=float(_pick(req.min_p, defaults.min_p, 0.0)),
        xtc_probability=float(req.xtc_probability or 0.0),
        xtc_threshold=float(req.xtc_threshold if req.xtc_threshold is not None else 0.1),
        seed=int(req.seed) if req.seed is not None else None,
    )


def penalties_for(
    req: GenerationRequest, defaults: GenerationDefaults, vocab_size: int
) -> PenaltyOptions:
    bias = None
    if req.logit_bias:
        bias = {}
        for key, value in req.logit_bias.items():
            try:
                token = int(key)
            except (TypeError, ValueError):
                raise OptionError("logit_bias", f"keys must be token ids, got {key!r}") from None
            if not 0 <= token < vocab_size:
                raise OptionError("logit_bias", f"token id {token} is outside the vocabulary")
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise OptionError("logit_bias", f"bias for {token} must be a number")
            bias[token] = max(-100.0, min(100.0, float(value)))
    return PenaltyOptions(
        repetition_penalty=req.repetition_penalty
        if req.repetition_penalty is not None
        else defaults.repetition_penalty,
        repetition_context_size=req.repetition_context_size or 20,
        presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty,
        logit_bias=bias,
    )
