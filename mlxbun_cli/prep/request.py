"""The protocol-neutral request every wire and the CLI build, and its validation."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mlxbun_cli.errors import OptionError

# A chat_template_kwargs.enable_thinking that was not given at all (distinct
# from an explicit null, which means "the template's own default").
UNSET: Any = type("Unset", (), {"__repr__": lambda self: "UNSET"})()

REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")


@dataclass
class GenerationRequest:
    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None  # a raw completion: no chat template
    tools: list[dict[str, Any]] | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    xtc_probability: float | None = None
    xtc_threshold: float | None = None
    repetition_penalty: float | None = None
    repetition_context_size: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[Any, float] | None = None
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    logprobs: bool = False
    top_logprobs: int = 0
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    reasoning_effort: str | None = None
    thinking_budget: int | None = None  # most tokens a reply may spend thinking
    session_id: str | None = None
    tool_choice: Any = None  # "auto" | "none" | "required" | {"type": "function", ...}
    response_format: dict[str, Any] | None = None  # OpenAI chat response_format
    grammar: Any = None  # a Lark string or {"type": lark|regex|json_schema, "value": ...}

    @property
    def explicit_thinking(self) -> Any:
        return self.chat_template_kwargs.get("enable_thinking", UNSET)


def _check_range(name: str, value: Any, low: float | None, high: float | None, kind=float) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise OptionError(name, f"must be a number, got {value!r}")
    if kind is int and not float(value).is_integer():
        raise OptionError(name, f"must be an integer, got {value!r}")
    if low is not None and value < low:
        raise OptionError(name, f"must be >= {low}, got {value}")
    if high is not None and value > high:
        raise OptionError(name, f"must be <= {high}, got {value}")


def validate(req: GenerationRequest) -> None:
    """Raise an OptionError naming the first field that is out of range."""
    if req.messages is None and req.prompt is None:
        raise OptionError("messages", "a request needs messages or a prompt")
    if req.messages is not None:
        if not isinstance(req.messages, list) or not req.messages:
            raise OptionError("messages", "must be a non-empty list")
        if all(not _message_text(m) and not m.get("tool_calls") for m in req.messages):
            raise OptionError("messages", "every message is empty")
    if req.prompt is not None and not req.prompt.strip():
        raise OptionError("prompt", "must not be empty")
    _check_range("max_tokens", req.max_tokens, 1, None, int)
    _check_range("temperature", req.temperature, 0, None)
    if req.top_p is not None and (req.top_p <= 0 or req.top_p > 1):
        raise OptionError("top_p", f"must be in (0, 1], got {req.top_p}")
    _check_range("top_p", req.top_p, 0, 1)
    _check_range("top_k", req.top_k, 0, None, int)
    _check_range("min_p", req.min_p, 0, 1)
    _check_range("xtc_probability", req.xtc_probability, 0, 1)
    _check_range("xtc_threshold", req.xtc_threshold, 0, 0.5)
    _check_range("repetition_penalty", req.repetition_penalty, 0, None)
    if req.repetition_penalty is not None and req.repetition_penalty <= 0:
        raise OptionError("repetition_penalty", "must be > 0")
    _check_range("repetition_context_size", req.repetition_context_size, 1, None, int)
    _check_range("presence_penalty", req.presence_penalty, -2, 2)
    _check_range("frequency_penalty", req.frequency_penalty, -2, 2)
    _check_range("seed", req.seed, None, None, int)
    _check_range("top_logprobs", req.top_logprobs, 0, 20, int)
    _check_range("thinking_budget", req.thinking_budget, 1, None, int)
    if req.reasoning_effort is not None and req.reasoning_effort not in REASONING_EFFORTS:
        raise OptionError("reasoning_effort", f"must be one of {', '.join(REASONING_EFFORTS)}")
    explicit = req.explicit_thinking
    if explicit is not UNSET and explicit is not None and not isinstance(explicit, bool):
        raise OptionError("chat_template_kwargs.enable_thinking", "must be true, false or null")
    for stop in req.stop:
        if not isinstance(stop, str):
            raise OptionError("stop", f"must be strings, got {stop!r}")


def _message_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""
