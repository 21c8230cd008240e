"""The Anthropic Messages wire: /v1/messages to and from the neutral form.

Requests become a neutral `GenerationRequest` whose messages are in the OpenAI
chat shape (assistant `tool_calls`, `role: tool` results), so every chat
template sees one format. Output events become content blocks (thinking, text,
tool_use) through `MessageStream`, which both the SSE stream and the whole
response are built from, so the two always agree.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from mlxbun_cli.engine.types import Usage
from mlxbun_cli.prep.events import Done, ReasoningDelta, TextDelta, ToolCallEvent
from mlxbun_cli.prep.request import GenerationRequest
from mlxbun_cli.protocols import WireError, is_int, typed_fields

# Adjacent text blocks are separate pieces of text (a reminder, then the
# question): a blank line between them keeps them apart for the model.
BLOCK_JOINER = "\n\n"

_ANTHROPIC_ERROR_TYPES = {
    "invalid_request_error",
    "authentication_error",
    "permission_error",
    "not_found_error",
    "request_too_large",
    "rate_limit_error",
    "api_error",
    "overloaded_error",
}
# The server's own error types, as the nearest Anthropic one.
_ERROR_TYPE_MAP = {
    "server_error": "api_error",
    "engine_unavailable": "overloaded_error",
    "server_shutdown": "overloaded_error",
    "memory_admission": "invalid_request_error",
}


def error_body(
    message: str,
    type: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
) -> dict[str, Any]:
    """Anthropic's error object; the field, when known, leads the message."""
    kind = type if type in _ANTHROPIC_ERROR_TYPES else _ERROR_TYPE_MAP.get(type, "api_error")
    if param and param not in message:
        message = f"{param}: {message}"
    return {"type": "error", "error": {"type": kind, "message": message}}


# -- requests ----------------------------------------------------------------


@dataclass
class MessagesRequest:
    model: str | None
    request: GenerationRequest
    stream: bool
    omit_thinking: bool = False  # thinking.display == "omitted": blocks stay, text goes


def _object(value: Any, name: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise WireError(f"{name} must be an object", name)
    return value


def _string(value: Any, name: str, *, empty: bool = True) -> str:
    if not isinstance(value, str) or (not empty and not value):
        raise WireError(f"{name} must be a {'' if empty else 'non-empty '}string", name)
    return value


def _block_type(block: Any, name: str) -> str:
    block = _object(block, name)
    kind = block.get("type")
    if not isinstance(kind, str):
        raise WireError(f"{name}.type must be a string", f"{name}.type")
    return kind


def _unsupported(kind: str, name: str) -> WireError:
    if kind == "image":
        return WireError(f"{name}: this model is text-only: images are not supported", name)
    if kind == "document":
        return WireError(f"{name}: documents are not supported", name)
    return WireError(f"{name}: content block type {kind!r} is not supported here", name)


def _text_blocks(value: Any, name: str) -> str:
    """A string, or a list of text blocks joined (system, tool_result content)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise WireError(f"{name} must be a string or a list of text blocks", name)
    texts = []
    for j, block in enumerate(value):
        where = f"{name}[{j}]"
        kind = _block_type(block, where)
        if kind != "text":
            raise _unsupported(kind, where)
        texts.append(_string(block.get("text"), f"{where}.text"))
    return BLOCK_JOINER.join(texts)


class _History:
    """Anthropic turns → OpenAI-style messages, checking each block where it sits."""

    def __init__(self) -> None:
        self.out: list[dict[str, Any]] = []
        self.open_calls: dict[str, str] = {}  # the last assistant turn's unanswered tool_use ids
        self.answered: set[str] = set()

    def add(self, i: int, message: Any) -> None:
        name = f"messages[{i}]"
        message = _object(message, name)
        role = message.get("role")
        content = message.get("content")
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        elif not isinstance(content, list):
            raise WireError(
                f"{name}.content must be a string or a list of content blocks", f"{name}.content"
            )
        if role == "user":
            self._user(name, content)
        elif role == "assistant":
            self._assistant(name, content)
        else:
            hint = (
                " (the system prompt is the top-level `system` field)" if role == "system" else ""
            )
            raise WireError(
                f"{name}.role must be 'user' or 'assistant', got {role!r}{hint}", f"{name}.role"
            )

    def _user(self, name: str, blocks: list[Any]) -> None:
        texts: list[str] = []
        for j, block in enumerate(blocks):
            where = f"{name}.content[{j}]"
            kind = _block_type(block, where)
            if kind == "text":
                texts.append(_string(block.get("text"), f"{where}.text"))
            elif kind == "tool_result":
                if texts:
                    raise WireError(
                        f"{where}: tool_result blocks must come before any text in a user message",
                        where,
                    )
                self.out.append(self._tool_result(where, block))
            elif kind == "tool_use":
                raise WireError(f"{where}: tool_use blocks belong in assistant messages", where)
            else:
                raise _unsupported(kind, where)
        if texts or not blocks:
            self.out.append({"role": "user", "content": BLOCK_JOINER.join(texts)})

    def _tool_result(self, where: str, block: dict[str, Any]) -> dict[str, Any]:
        call_id = _string(block.get("tool_use_id"), f"{where}.tool_use_id", empty=False)
        if call_id not in self.open_calls:
            said = "already has a result" if call_id in self.answered else "matches no tool_use"
            raise WireError(
                f"{where}.tool_use_id {call_id!r} {said} in the previous assistant message",
                f"{where}.tool_use_id",
            )
        tool_name = self.open_calls.pop(call_id)
        self.answered.add(call_id)
        text = _text_blocks(block.get("content"), f"{where}.content")
        is_error = block.get("is_error")
        if is_error is not None and not isinstance(is_error, bool):
            raise WireError(f"{where}.is_error must be a boolean", f"{where}.is_error")
        if is_error:
            # The neutral tool message has no error flag: say it in the text.
            text = f"Error: {text}" if text else "Error"
        return {"role": "tool", "tool_call_id": call_id, "name": tool_name, "content": text}

    def _assistant(self, name: str, blocks: list[Any]) -> None:
        texts, thinking, calls = [], [], []
        self.open_calls, self.answered = {}, set()
        for j, block in enumerate(blocks):
            where = f"{name}.content[{j}]"
            kind = _block_type(block, where)
            if kind == "text":
                texts.append(_string(block.get("text"), f"{where}.text"))
            elif kind == "thinking":
                thinking.append(_string(block.get("thinking"), f"{where}.thinking"))
            elif kind == "redacted_thinking":
                continue  # opaque to anyone but its issuer
            elif kind == "tool_use":
                call_id = _string(block.get("id"), f"{where}.id", empty=False)
                if call_id in self.open_calls:
                    raise WireError(f"{where}.id {call_id!r} is used twice", f"{where}.id")
                tool_name = _string(block.get("name"), f"{where}.name", empty=False)
                arguments = _object(block.get("input"), f"{where}.input")
                self.open_calls[call_id] = tool_name
                calls.append(
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {
                            "name": tool_name,
                            "arguments": json.dumps(arguments, ensure_ascii=False),
                        },
                    }
                )
            elif kind == "tool_result":
                raise WireError(f"{where}: tool_result blocks belong in user messages", where)
            else:
                raise _unsupported(kind, where)
        message: dict[str, Any] = {"role": "assistant", "content": BLOCK_JOINER.join(texts)}
        if thinking:
            message["reasoning_content"] = BLOCK_JOINER.join(thinking)
        if calls:
            message["tool_calls"] = calls
        self.out.append(message)


def _messages(value: Any, system: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise WireError("messages must be a list", "messages")
    if not value:
        raise WireError("messages must not be empty", "messages")
    history = _History()
    prompt = _text_blocks(system, "system")
    if prompt:
        history.out.append({"role": "system", "content": prompt})
    for i, message in enumerate(value):
        history.add(i, message)
    return history.out


def _tools(value: Any) -> list[dict[str, Any]] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise WireError("tools must be a list", "tools")
    out, names = [], set()
    for i, tool in enumerate(value):
        where = f"tools[{i}]"
        tool = _object(tool, where)
        kind = tool.get("type")
        if kind not in (None, "custom"):
            raise WireError(
                f"{where}.type {kind!r} is not supported: only custom tools with an "
                "input_schema run locally",
                f"{where}.type",
            )
        name = _string(tool.get("name"), f"{where}.name", empty=False)
        if name in names:
            raise WireError(f"{where}.name {name!r} is used by two tools", f"{where}.name")
        names.add(name)
        schema = tool.get("input_schema")
        if not isinstance(schema, dict):
            raise WireError(
                f"{where}.input_schema is required and must be a JSON-schema object",
                f"{where}.input_schema",
            )
        function: dict[str, Any] = {"name": name, "parameters": schema}
        description = tool.get("description")
        if description is not None:
            function["description"] = _string(description, f"{where}.description")
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(value: Any, tools: list[dict[str, Any]] | None) -> tuple[Any, Any]:
    """→ (the tools offered, the neutral tool_choice)."""
    if value is None:
        return tools, None
    choice = _object(value, "tool_choice")
    kind = choice.get("type")
    if kind not in ("auto", "any", "tool", "none"):
        raise WireError("tool_choice.type must be one of auto, any, tool, none", "tool_choice.type")
    parallel = choice.get("disable_parallel_tool_use")
    if parallel is not None and not isinstance(parallel, bool):
        raise WireError(
            "tool_choice.disable_parallel_tool_use must be a boolean",
            "tool_choice.disable_parallel_tool_use",
        )
    if kind == "none":
        return None, "none"
    if kind == "auto":
        return tools, "auto"
    if not tools:
        raise WireError(f"tool_choice.type {kind!r} needs tools", "tool_choice")
    # "any" and "tool" force a call: prep turns the neutral choice into
    # constrained decoding (prep/grammar.py), this wire only names it.
    if kind == "any":
        return tools, "required"
    name = _string(choice.get("name"), "tool_choice.name", empty=False)
    if name not in {t["function"]["name"] for t in tools}:
        raise WireError(f"tool_choice.name {name!r} names no tool in tools", "tool_choice.name")
    return tools, {"type": "function", "function": {"name": name}}


def _thinking(value: Any) -> tuple[dict[str, Any], bool, int | None]:
    """→ (chat_template_kwargs, omit_thinking, thinking budget)."""
    if value is None:
        return {}, False, None
    config = _object(value, "thinking")
    kind = config.get("type")
    display = config.get("display")
    if display not in (None, "summarized", "omitted"):
        raise WireError("thinking.display must be summarized or omitted", "thinking.display")
    if kind == "enabled":
        budget = config.get("budget_tokens")
        if not is_int(budget) or budget < 1:
            raise WireError(
                "thinking.budget_tokens must be a positive integer", "thinking.budget_tokens"
            )
        return {"enable_thinking": True}, display == "omitted", int(budget)
    if kind == "disabled":
        return {"enable_thinking": False}, False, None
    if kind == "adaptive":
        return {}, display == "omitted", None  # the model decides: its own default
    raise WireError("thinking.type must be enabled, disabled or adaptive", "thinking.type")


def _stop_sequences(value: Any) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise WireError("stop_sequences must be a list of strings", "stop_sequences")
    return [s for s in value if s]


def _sampling(body: dict[str, Any]) -> dict[str, Any]:
    return typed_fields(body, ("temperature", "top_p"), ("top_k",))


def _max_tokens(body: dict[str, Any], required: bool) -> int | None:
    value = body.get("max_tokens")
    if value is None:
        if required:
            raise WireError("max_tokens is required", "max_tokens")
        return None
    if not is_int(value):
        raise WireError("max_tokens must be an integer", "max_tokens")
    if value < 1:
        raise WireError("max_tokens must be at least 1", "max_tokens")
    return value


def _output_format(value: Any) -> dict[str, Any] | None:
    """output_config.format (structured outputs) → the neutral response_format."""
    if value is None:
        return None
    fmt = _object(value, "output_config").get("format")
    if fmt is None:
        return None  # `effort` alone: a hint for hosted models, ignored
    fmt = _object(fmt, "output_config.format")
    if fmt.get("type") != "json_schema":
        raise WireError(
            "output_config.format.type must be json_schema", "output_config.format.type"
        )
    schema = _object(fmt.get("schema"), "output_config.format.schema")
    return {"type": "json_schema", "json_schema": {"schema": schema}}


# prep names the neutral fields; this wire's clients know them by these names.
NEUTRAL_FIELDS = {
    "response_format.json_schema.schema": "output_config.format.schema",
    "response_format": "output_config.format",
}


def wire_field(field: str | None) -> str | None:
    for neutral, ours in NEUTRAL_FIELDS.items():
        if field and field.startswith(neutral):
            return ours + field[len(neutral) :]
    return field


def parse_messages(body: Any, *, count_only: bool = False) -> MessagesRequest:
    """A /v1/messages body (or a count_tokens one, where max_tokens is optional)."""
    if not isinstance(body, dict):
        raise WireError("the request body must be a JSON object")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise WireError("model must be a string", "model")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise WireError("stream must be a boolean", "stream")
    kwargs, omit_thinking, budget = _thinking(body.get("thinking"))
    tools, tool_choice = _tool_choice(body.get("tool_choice"), _tools(body.get("tools")))
    # `metadata` (user_id) and the hosted-service fields are accepted and ignored.
    request = GenerationRequest(
        messages=_messages(body.get("messages"), body.get("system")),
        tools=tools,
        max_tokens=_max_tokens(body, required=not count_only),
        stop=_stop_sequences(body.get("stop_sequences")),
        chat_template_kwargs=kwargs,
        thinking_budget=budget,
        tool_choice=tool_choice,
        response_format=_output_format(body.get("output_config")),
        **_sampling(body),
    )
    return MessagesRequest(model, request, bool(stream), omit_thinking)


# -- responses ---------------------------------------------------------------


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def tool_use_id(call_id: str) -> str:
    return "toolu_" + call_id.removeprefix("call_")


def usage_dict(usage: Usage) -> dict[str, Any]:
    # Anthropic counts cache reads apart from input_tokens; their sum is the prompt.
    return {
        "input_tokens": usage.prompt_tokens - usage.cached_tokens,
        "output_tokens": usage.completion_tokens,
        "cache_read_input_tokens": usage.cached_tokens,
        "cache_creation_input_tokens": 0,
    }


def stop_reason(done: Done, stop_sequence: str | None) -> str:
    if done.finish_reason == "length":
        return "max_tokens"
    if done.finish_reason == "tool_calls":
        return "tool_use"
    return "stop_sequence" if stop_sequence is not None else "end_turn"


def tool_input(arguments: str) -> dict[str, Any]:
    """Tool arguments (JSON text) as the `input` object Anthropic carries."""
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


Frame = tuple[str, dict[str, Any]]  # (SSE event name, data)


@dataclass
class MessageStream:
    """Neutral events → Anthropic stream events, keeping the content blocks built.

    Consecutive deltas of one kind share a block; a change of kind closes it
    and opens the next, so blocks keep the order the model wrote them in.
    """

    id: str
    model: str
    omit_thinking: bool = False
    content: list[dict[str, Any]] = field(default_factory=list)
    _open: str | None = field(default=None, init=False)  # the type of the block still open

    def start(self, input_tokens: int) -> list[Frame]:
        usage = {"input_tokens": input_tokens, "output_tokens": 0}
        message = self._message([], None, None, usage)
        return [("message_start", {"type": "message_start", "message": message}), _ping()]

    def feed(self, event: Any) -> list[Frame]:
        if isinstance(event, ReasoningDelta):
            text = "" if self.omit_thinking else event.text
            return self._delta("thinking", "thinking_delta", "thinking", text)
        if isinstance(event, TextDelta):
            return self._delta("text", "text_delta", "text", event.text)
        if isinstance(event, ToolCallEvent):
            return self._tool_use(event)
        return []  # logprobs and Done are not content

    def finish(self, done: Done, stop_sequence: str | None) -> list[Frame]:
        frames = self._close()
        delta = {"stop_reason": stop_reason(done, stop_sequence), "stop_sequence": stop_sequence}
        frames.append(
            (
                "message_delta",
                {"type": "message_delta", "delta": delta, "usage": usage_dict(done.usage)},
            )
        )
        frames.append(("message_stop", {"type": "message_stop"}))
        return frames

    def message(self, done: Done, stop_sequence: str | None) -> dict[str, Any]:
        self._close()
        reason = stop_reason(done, stop_sequence)
        return self._message(self.content, reason, stop_sequence, usage_dict(done.usage))

    def _message(
        self,
        content: list[dict[str, Any]],
        reason: str | None,
        stop_sequence: str | None,
        usage: dict[str, Any],
    ) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [dict(b) for b in content],
            "stop_reason": reason,
            "stop_sequence": stop_sequence,
            "usage": usage,
        }

    def _delta(self, kind: str, delta_type: str, key: str, text: str) -> list[Frame]:
        if not text and self._open == kind:
            return []
        frames = []
        if self._open != kind:
            frames = self._close()
            block = {"type": kind, kind: ""}
            if kind == "thinking":
                block["signature"] = ""  # nothing to sign: a local model's own thoughts
            frames.append(self._start(block))
        if text:
            index = len(self.content) - 1
            self.content[index][key] += text
            frames.append(_block_delta(index, {"type": delta_type, key: text}))
        return frames

    def _tool_use(self, event: ToolCallEvent) -> list[Frame]:
        frames = self._close()
        call = event.call
        arguments = tool_input(call.arguments)
        frames.append(
            self._start(
                {"type": "tool_use", "id": tool_use_id(call.id), "name": call.name, "input": {}}
            )
        )
        index = len(self.content) - 1
        self.content[index]["input"] = arguments
        partial = json.dumps(arguments, ensure_ascii=False)
        frames.append(_block_delta(index, {"type": "input_json_delta", "partial_json": partial}))
        frames.extend(self._close())
        return frames

    def _start(self, block: dict[str, Any]) -> Frame:
        self.content.append(block)
        self._open = block["type"]
        start = {
            "type": "content_block_start",
            "index": len(self.content) - 1,
            "content_block": dict(block),
        }
        return ("content_block_start", start)

    def _close(self) -> list[Frame]:
        if self._open is None:
            return []
        self._open = None
        index = len(self.content) - 1
        return [("content_block_stop", {"type": "content_block_stop", "index": index})]


def _ping() -> Frame:
    return ("ping", {"type": "ping"})


def _block_delta(index: int, delta: dict[str, Any]) -> Frame:
    return ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})


def error_event(message: str, type: str = "api_error") -> Frame:
    return ("error", error_body(message, type))


def sse(frame: Frame) -> bytes:
    name, data = frame
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


# -- the OpenAPI document (request bodies; the routes parse them themselves) --------

_TEXT_BLOCK = {
    "type": "object",
    "required": ["type", "text"],
    "properties": {"type": {"type": "string", "enum": ["text"]}, "text": {"type": "string"}},
}
_TEXT_OR_BLOCKS = {"oneOf": [{"type": "string"}, {"type": "array", "items": _TEXT_BLOCK}]}
_CONTENT_BLOCK = {
    "type": "object",
    "required": ["type"],
    "properties": {
        "type": {
            "type": "string",
            "enum": ["text", "thinking", "redacted_thinking", "tool_use", "tool_result"],
        },
        "text": {"type": "string"},
        "thinking": {"type": "string"},
        "signature": {"type": "string"},
        "id": {"type": "string"},
        "name": {"type": "string"},
        "input": {"type": "object"},
        "tool_use_id": {"type": "string"},
        "content": _TEXT_OR_BLOCKS,
        "is_error": {"type": "boolean"},
    },
}
_MESSAGE = {
    "type": "object",
    "required": ["role", "content"],
    "properties": {
        "role": {"type": "string", "enum": ["user", "assistant"]},
        "content": {"oneOf": [{"type": "string"}, {"type": "array", "items": _CONTENT_BLOCK}]},
    },
}
_TOOL = {
    "type": "object",
    "required": ["name", "input_schema"],
    "properties": {
        "type": {"type": "string", "enum": ["custom"]},
        "name": {"type": "string"},
        "description": {"type": "string"},
        "input_schema": {"type": "object"},
    },
}
_PROMPT: dict[str, Any] = {
    "model": {"type": "string"},
    "messages": {"type": "array", "minItems": 1, "items": _MESSAGE},
    "system": _TEXT_OR_BLOCKS,
    "tools": {"type": "array", "items": _TOOL},
    "tool_choice": {
        "type": "object",
        "required": ["type"],
        "properties": {
            "type": {"type": "string", "enum": ["auto", "any", "tool", "none"]},
            "name": {"type": "string"},
            "disable_parallel_tool_use": {"type": "boolean"},
        },
    },
    "thinking": {
        "type": "object",
        "required": ["type"],
        "properties": {
            "type": {"type": "string", "enum": ["enabled", "disabled", "adaptive"]},
            "budget_tokens": {"type": "integer", "minimum": 1},
            "display": {"type": "string", "enum": ["summarized", "omitted"]},
        },
    },
    "output_config": {
        "type": "object",
        "properties": {
            "effort": {"type": "string"},
            "format": {
                "type": "object",
                "required": ["type", "schema"],
                "properties": {
                    "type": {"type": "string", "enum": ["json_schema"]},
                    "schema": {"type": "object"},
                },
            },
        },
    },
}


def _schema_body(required: list[str], properties: dict[str, Any]) -> dict[str, Any]:
    schema = {"type": "object", "required": required, "properties": properties}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


MESSAGES_BODY = _schema_body(
    ["max_tokens", "messages"],
    {
        **_PROMPT,
        "max_tokens": {"type": "integer", "minimum": 1},
        "stop_sequences": {"type": "array", "items": {"type": "string"}},
        "temperature": {"type": "number", "minimum": 0},
        "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "top_k": {"type": "integer", "minimum": 0},
        "stream": {"type": "boolean"},
        "metadata": {"type": "object"},
    },
)
COUNT_TOKENS_BODY = _schema_body(["messages"], _PROMPT)
