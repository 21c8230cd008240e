"""The OpenAI wire: chat/completions and completions, to and from the neutral form."""

from __future__ import annotations

import base64
import struct
import time
import uuid
from dataclasses import dataclass
from typing import Any

from mlxbun_cli.engine.types import Usage
from mlxbun_cli.prep.events import Done, TokenLogprob
from mlxbun_cli.prep.request import GenerationRequest
from mlxbun_cli.protocols import WireError, is_int, typed_fields

_NUMBER_FIELDS = (
    "temperature",
    "top_p",
    "min_p",
    "xtc_probability",
    "xtc_threshold",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
)
_INT_FIELDS = ("top_k", "seed", "repetition_context_size")


def _require_object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise WireError("the request body must be a JSON object")
    return body


def _stops(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value] if value else []
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        if len(value) > 16:
            raise WireError("at most 16 stop sequences", "stop")
        return [s for s in value if s]
    raise WireError("stop must be a string or a list of strings", "stop")


def _common(body: dict[str, Any]) -> dict[str, Any]:
    """Fields chat and completions share, type-checked with the field named."""
    fields = typed_fields(body, _NUMBER_FIELDS, _INT_FIELDS)
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if value is not None:
            if not is_int(value):
                raise WireError(f"{name} must be an integer", name)
            if value < 1:
                raise WireError(f"{name} must be at least 1", name)
            fields.setdefault("max_tokens", None)
            fields["max_tokens"] = fields["max_tokens"] or value
    n = body.get("n")
    if n is not None and n != 1:
        raise WireError("only n=1 is supported", "n")
    bias = body.get("logit_bias")
    if bias is not None:
        if not isinstance(bias, dict):
            raise WireError("logit_bias must be an object of token id → bias", "logit_bias")
        fields["logit_bias"] = bias
    fields["stop"] = _stops(body.get("stop"))
    for name in ("session_id", "prompt_cache_key"):
        value = body.get(name)
        if value is not None and not isinstance(value, str):
            raise WireError(f"{name} must be a string", name)
    fields["session_id"] = body.get("session_id") or body.get("prompt_cache_key")
    if body.get("stream") is not None and not isinstance(body.get("stream"), bool):
        raise WireError("stream must be a boolean", "stream")
    return fields


def _model(body: dict[str, Any]) -> str | None:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise WireError("model must be a string", "model")
    return model


def _messages(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise WireError("messages must be a list", "messages")
    if not value:
        raise WireError("messages must not be empty", "messages")
    for i, message in enumerate(value):
        if not isinstance(message, dict):
            raise WireError("each message must be an object", f"messages[{i}]")
        role = message.get("role")
        if role not in ("system", "developer", "user", "assistant", "tool"):
            raise WireError(f"unknown role {role!r}", f"messages[{i}].role")
        content = message.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise WireError("content must be a string or a list of parts", f"messages[{i}].content")
        if role == "developer":
            value[i] = {**message, "role": "system"}
    return value


def parse_chat(body: Any) -> tuple[str | None, GenerationRequest, bool, bool]:
    """→ (model, request, stream, include_usage)."""
    body = _require_object(body)
    fields = _common(body)
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise WireError("chat_template_kwargs must be an object", "chat_template_kwargs")
    effort = body.get("reasoning_effort")
    if effort is not None and not isinstance(effort, str):
        raise WireError("reasoning_effort must be a string", "reasoning_effort")
    tools = body.get("tools")
    tool_choice = body.get("tool_choice")
    fmt = body.get("response_format")
    if fmt is not None and not isinstance(fmt, dict):
        raise WireError("response_format must be an object", "response_format")
    logprobs = body.get("logprobs")
    if logprobs is not None and not isinstance(logprobs, bool):
        raise WireError("logprobs must be a boolean", "logprobs")
    top = body.get("top_logprobs")
    if top is not None and not is_int(top):
        raise WireError("top_logprobs must be an integer", "top_logprobs")
    budget = body.get("thinking_budget")  # an mlxbun extension, as Anthropic's budget_tokens
    if budget is not None and not (is_int(budget) and budget >= 1):
        raise WireError("thinking_budget must be a positive integer", "thinking_budget")
    req = GenerationRequest(
        messages=_messages(body.get("messages")),
        thinking_budget=budget,
        tools=tools,
        chat_template_kwargs=dict(kwargs or {}),
        reasoning_effort=effort,
        logprobs=bool(logprobs),
        top_logprobs=int(top or 0) if logprobs else 0,
        tool_choice=tool_choice,
        response_format=fmt,
        grammar=body.get("grammar"),
        **fields,
    )
    return _model(body), req, bool(body.get("stream")), _include_usage(body)


def parse_completion(body: Any) -> tuple[str | None, GenerationRequest, bool, bool]:
    body = _require_object(body)
    fields = _common(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise WireError("prompt must be a string", "prompt")
    logprobs = body.get("logprobs")
    if logprobs is not None and not (is_int(logprobs) and 0 <= logprobs <= 20):
        raise WireError("logprobs must be an integer from 0 to 20", "logprobs")
    req = GenerationRequest(
        prompt=prompt,
        grammar=body.get("grammar"),
        response_format=body.get("response_format"),
        logprobs=logprobs is not None,
        top_logprobs=int(logprobs or 0),
        **fields,
    )
    return _model(body), req, bool(body.get("stream")), _include_usage(body)


def _include_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict):
        raise WireError("stream_options must be an object", "stream_options")
    return bool(options.get("include_usage"))


# -- responses ---------------------------------------------------------------


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage_dict(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        # mlxbun's own timings, for clients that want them
        "timings": {
            "time_to_first_token_s": round(usage.queued_seconds + usage.prompt_seconds, 4),
            "prompt_tps": round(usage.prompt_tps, 2),
            "generation_tps": round(usage.generation_tps, 2),
            "peak_memory_bytes": usage.peak_memory_bytes,
        },
    }


def finish_reason(done: Done) -> str:
    return done.finish_reason if done.finish_reason in ("stop", "length", "tool_calls") else "stop"


def chat_logprob(event: TokenLogprob) -> dict[str, Any]:
    return {
        "token": event.text,
        "logprob": event.logprob,
        "bytes": list(event.text.encode("utf-8")),
        "top_logprobs": [
            {"token": t, "logprob": lp, "bytes": list(t.encode("utf-8"))}
            for t, lp in (event.top or [])
        ],
    }


def chat_response(
    rid: str,
    model: str,
    text: str,
    reasoning: str,
    tool_calls: list[dict[str, Any]],
    logprobs: list[TokenLogprob] | None,
    done: Done,
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text or (None if tool_calls else "")}
    if reasoning:
        message["reasoning_content"] = reasoning
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "id": rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": seed_fingerprint(done.seed),
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": {"content": [chat_logprob(e) for e in logprobs]}
                if logprobs is not None
                else None,
                "finish_reason": finish_reason(done),
            }
        ],
        "usage": usage_dict(done.usage),
    }


def seed_fingerprint(seed: int | None) -> str:
    # The seed used, so a sampled reply can be replayed with `seed`.
    return f"mlxbun-seed-{seed}" if seed is not None else "mlxbun"


def chat_chunk(
    rid: str,
    model: str,
    created: int,
    delta: dict[str, Any],
    finish: str | None = None,
    logprobs: list[TokenLogprob] | None = None,
) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
    if logprobs is not None:
        choice["logprobs"] = {"content": [chat_logprob(e) for e in logprobs]}
    return {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "system_fingerprint": "mlxbun",
        "choices": [choice],
    }


def usage_chunk(rid: str, model: str, created: int, done: Done) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "system_fingerprint": seed_fingerprint(done.seed),
        "choices": [],
        "usage": usage_dict(done.usage),
    }


def completion_logprobs(events: list[TokenLogprob]) -> dict[str, Any]:
    offsets, pos = [], 0
    for e in events:
        offsets.append(pos)
        pos += len(e.text)
    return {
        "tokens": [e.text for e in events],
        "token_logprobs": [e.logprob for e in events],
        "top_logprobs": [dict(e.top or []) for e in events],
        "text_offset": offsets,
    }


def completion_response(
    rid: str, model: str, text: str, logprobs: list[TokenLogprob] | None, done: Done
) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": seed_fingerprint(done.seed),
        "choices": [
            {
                "index": 0,
                "text": text,
                "logprobs": completion_logprobs(logprobs) if logprobs is not None else None,
                "finish_reason": finish_reason(done),
            }
        ],
        "usage": usage_dict(done.usage),
    }


def completion_chunk(
    rid: str,
    model: str,
    created: int,
    text: str,
    finish: str | None = None,
    logprobs: list[TokenLogprob] | None = None,
) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "text": text,
                "finish_reason": finish,
                "logprobs": completion_logprobs(logprobs) if logprobs else None,
            }
        ],
    }


MAX_EMBEDDING_INPUTS = 2048
ENCODING_FORMATS = ("float", "base64")


@dataclass
class EmbeddingsRequest:
    model: str | None
    inputs: list[str | list[int]]  # texts, or token-id arrays
    encoding_format: str
    dimensions: int | None


def parse_embeddings(body: Any) -> EmbeddingsRequest:
    body = _require_object(body)
    raw = body.get("input")
    if isinstance(raw, str) or (isinstance(raw, list) and raw and all(is_int(t) for t in raw)):
        items: list[Any] = [raw]  # one text, or one array of token ids
    elif isinstance(raw, list):
        items = raw
    else:
        raise WireError(
            "input must be a string, an array of strings, or an array of token-id arrays", "input"
        )
    if not items:
        raise WireError("input must not be empty", "input")
    if len(items) > MAX_EMBEDDING_INPUTS:
        raise WireError(f"input has {len(items)} items; at most {MAX_EMBEDDING_INPUTS}", "input")
    for i, item in enumerate(items):
        text = isinstance(item, str) and item != ""
        ids = isinstance(item, list) and item and all(is_int(t) for t in item)
        if not (text or ids):
            raise WireError(
                f"input[{i}] must be a non-empty string or a non-empty array of token ids", "input"
            )
    fmt = body.get("encoding_format")
    fmt = "float" if fmt is None else fmt
    if fmt not in ENCODING_FORMATS:
        raise WireError("encoding_format must be float or base64", "encoding_format")
    dims = body.get("dimensions")
    if dims is not None and not (is_int(dims) and dims >= 1):
        raise WireError("dimensions must be a positive integer", "dimensions")
    return EmbeddingsRequest(_model(body), items, fmt, dims)


def embeddings_response(
    model: str, vectors: list[list[float]], prompt_tokens: int, encoding_format: str
) -> dict[str, Any]:
    def encode(vector: list[float]) -> Any:
        if encoding_format == "base64":  # little-endian float32, as OpenAI sends it
            return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
        return vector

    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": encode(v)}
            for i, v in enumerate(vectors)
        ],
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }


def error_body(
    message: str,
    type: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}
