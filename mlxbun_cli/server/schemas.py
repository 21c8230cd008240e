"""Request-body schemas for the OpenAPI document (the routes parse bodies themselves)."""

from __future__ import annotations

from typing import Any

_SAMPLING: dict[str, Any] = {
    "model": {"type": "string"},
    "max_tokens": {"type": "integer", "minimum": 1},
    "max_completion_tokens": {"type": "integer", "minimum": 1},
    "temperature": {"type": "number", "minimum": 0},
    "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    "top_k": {"type": "integer", "minimum": 0},
    "min_p": {"type": "number", "minimum": 0, "maximum": 1},
    "seed": {"type": "integer"},
    "stop": {
        "oneOf": [
            {"type": "string"},
            {"type": "array", "items": {"type": "string"}, "maxItems": 16},
        ]
    },
    "stream": {"type": "boolean"},
    "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
    "presence_penalty": {"type": "number", "minimum": -2, "maximum": 2},
    "frequency_penalty": {"type": "number", "minimum": -2, "maximum": 2},
    "repetition_penalty": {"type": "number", "exclusiveMinimum": 0},
    "logit_bias": {"type": "object", "additionalProperties": {"type": "number"}},
    "n": {"type": "integer", "enum": [1]},
    "session_id": {"type": "string"},
    "prompt_cache_key": {"type": "string"},
}

_MESSAGE = {
    "type": "object",
    "required": ["role"],
    "properties": {
        "role": {"type": "string", "enum": ["system", "developer", "user", "assistant", "tool"]},
        "content": {
            "oneOf": [
                {"type": "string"},
                {"type": "array", "items": {"type": "object"}},
                {"type": "null"},
            ]
        },
        "tool_calls": {"type": "array", "items": {"type": "object"}},
        "tool_call_id": {"type": "string"},
        "reasoning_content": {"type": "string"},
    },
}

_TOOL = {
    "type": "object",
    "required": ["type", "function"],
    "properties": {
        "type": {"type": "string", "enum": ["function"]},
        "function": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string"},
                "description": {"type": "string"},
                "parameters": {"type": "object"},
            },
        },
    },
}


def _body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


CHAT_BODY = _body(
    {
        "type": "object",
        "required": ["messages"],
        "properties": {
            **_SAMPLING,
            "messages": {"type": "array", "minItems": 1, "items": _MESSAGE},
            "tools": {"type": "array", "items": _TOOL},
            "tool_choice": {"oneOf": [{"type": "string"}, {"type": "object"}]},
            "logprobs": {"type": "boolean"},
            "top_logprobs": {"type": "integer", "minimum": 0, "maximum": 20},
            "reasoning_effort": {
                "type": "string",
                "enum": ["none", "minimal", "low", "medium", "high", "xhigh"],
            },
            "chat_template_kwargs": {"type": "object"},
            "thinking_budget": {
                "type": "integer",
                "minimum": 1,
                "description": "mlxbun extension: most tokens the reply may spend thinking",
            },
        },
    }
)

COMPLETION_BODY = _body(
    {
        "type": "object",
        "required": ["prompt"],
        "properties": {
            **_SAMPLING,
            "prompt": {"type": "string"},
            "logprobs": {"type": "integer", "minimum": 0, "maximum": 20},
        },
    }
)

EMBEDDINGS_BODY = _body(
    {
        "type": "object",
        "required": ["input"],
        "properties": {
            "model": {"type": "string"},
            "input": {
                "oneOf": [
                    {"type": "string", "minLength": 1},
                    {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}},
                    {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}},
                    {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "array",
                            "minItems": 1,
                            "items": {"type": "integer", "minimum": 0},
                        },
                    },
                ]
            },
            "encoding_format": {"type": "string", "enum": ["float", "base64"]},
            "dimensions": {"type": "integer", "minimum": 1},
            "user": {"type": "string"},
        },
    }
)
