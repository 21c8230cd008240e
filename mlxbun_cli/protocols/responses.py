"""The OpenAI Responses wire: `/v1/responses` bodies to the neutral form, events back.

A request's `input` (a string or a list of items) is normalized to a list of
items, so a stored conversation can be replayed as items; `items_to_messages`
turns items into the neutral OpenAI-chat messages prep renders. `OutputBuilder`
turns neutral output events into Responses output items and stream events.
"""

from __future__ import annotations

import copy
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from mlxbun_cli.prep.events import Done, ReasoningDelta, TextDelta, TokenLogprob, ToolCallEvent
from mlxbun_cli.prep.request import REASONING_EFFORTS, GenerationRequest
from mlxbun_cli.protocols import WireError, is_int, typed_fields

RESPONSE_PREFIX = "resp_"

_NUMBER_FIELDS = (
    "temperature",
    "top_p",
    # mlxbun extensions (the chat wire's sampling knobs)
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
)
_INT_FIELDS = ("top_k", "seed")
_TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text")
_IMAGE_PARTS = ("input_image", "input_file", "input_audio", "image_url")
_ROLES = ("user", "assistant", "system", "developer")
_UNSUPPORTED_FIELDS = ("background", "conversation", "prompt")


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(24)}"


# -- the request ---------------------------------------------------------------


@dataclass
class ResponsesRequest:
    model: str | None
    items: list[dict[str, Any]]  # this request's input, normalized
    instructions: str | None
    previous_response_id: str | None
    store: bool
    stream: bool
    generation: GenerationRequest  # everything but messages
    echo: dict[str, Any] = field(default_factory=dict)  # request fields the response repeats


def check_container(body: Any) -> dict[str, Any]:
    """What must hold before `previous_response_id` is looked up (400s, never 404)."""
    if not isinstance(body, dict):
        raise WireError("the request body must be a JSON object")
    value = body.get("input")
    if value is not None and not isinstance(value, (str, list)):
        raise WireError("input must be a string or a list of items", "input")
    previous = body.get("previous_response_id")
    if previous is not None:
        if not isinstance(previous, str):
            raise WireError("previous_response_id must be a string", "previous_response_id")
        if not previous.startswith(RESPONSE_PREFIX) or len(previous) <= len(RESPONSE_PREFIX):
            raise WireError(
                f"previous_response_id must be a response id ('{RESPONSE_PREFIX}…'), "
                f"got {previous[:40]!r}",
                "previous_response_id",
            )
    return body


def parse_request(body: Any) -> ResponsesRequest:
    body = check_container(body)
    for name in _UNSUPPORTED_FIELDS:
        if body.get(name) not in (None, False):
            raise WireError(f"{name} is not supported by this server", name)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise WireError("model must be a string", "model")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise WireError("instructions must be a string", "instructions")
    if body.get("input") is None:
        raise WireError("input is required", "input")
    items = normalize_input(body["input"])
    for name in ("store", "stream", "parallel_tool_calls"):
        if body.get(name) is not None and not isinstance(body[name], bool):
            raise WireError(f"{name} must be a boolean", name)
    fields = typed_fields(body, _NUMBER_FIELDS, _INT_FIELDS)
    max_out = body.get("max_output_tokens")
    if max_out is not None and (not is_int(max_out) or max_out < 1):
        raise WireError("max_output_tokens must be an integer of at least 1", "max_output_tokens")
    bias = body.get("logit_bias")
    if bias is not None and not isinstance(bias, dict):
        raise WireError("logit_bias must be an object of token id → bias", "logit_bias")
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise WireError("metadata must be an object", "metadata")
    key = body.get("prompt_cache_key")
    if key is not None and not isinstance(key, str):
        raise WireError("prompt_cache_key must be a string", "prompt_cache_key")
    truncation = body.get("truncation")
    if truncation not in (None, "disabled", "auto"):
        raise WireError("truncation must be 'disabled' or 'auto'", "truncation")
    effort = _reasoning_effort(body.get("reasoning"))
    _text_format(body.get("text"))
    tools = _tools(body.get("tools"))
    tool_choice = _tool_choice(body.get("tool_choice"))
    logprobs, top = _logprobs(body)
    generation = GenerationRequest(
        tools=tools,
        max_tokens=max_out,
        reasoning_effort=effort,
        tool_choice=tool_choice,
        logit_bias=bias,
        logprobs=logprobs,
        top_logprobs=top,
        session_id=key,
        **fields,
    )
    echo = {
        "tools": body.get("tools") or [],
        "tool_choice": body.get("tool_choice") or "auto",
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "max_output_tokens": max_out,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "reasoning": {"effort": effort, "summary": None},
        "text": body.get("text") or {"format": {"type": "text"}},
        "truncation": truncation or "disabled",
        "metadata": metadata or {},
        "user": body.get("user") if isinstance(body.get("user"), str) else None,
        "prompt_cache_key": key,
        "top_logprobs": top if logprobs else None,
    }
    return ResponsesRequest(
        model=model,
        items=items,
        instructions=instructions,
        previous_response_id=body.get("previous_response_id"),
        store=body.get("store") is not False,
        stream=bool(body.get("stream")),
        generation=generation,
        echo=echo,
    )


def _reasoning_effort(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise WireError("reasoning must be an object", "reasoning")
    effort = value.get("effort")
    if effort is not None and effort not in REASONING_EFFORTS:
        raise WireError(
            f"reasoning.effort must be one of {', '.join(REASONING_EFFORTS)}", "reasoning.effort"
        )
    return effort


def _text_format(value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, dict):
        raise WireError("text must be an object", "text")
    fmt = value.get("format")
    if fmt is None:
        return
    if not isinstance(fmt, dict) or not isinstance(fmt.get("type"), str):
        raise WireError("text.format must be an object with a type", "text.format")
    if fmt["type"] != "text":
        raise WireError(
            f"text.format {fmt['type']!r} is not supported yet (only 'text')", "text.format"
        )


def _tools(value: Any) -> list[dict[str, Any]] | None:
    """Responses' flat function tools → the chat wire's nested ones prep takes."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise WireError("tools must be a list", "tools")
    out = []
    for i, tool in enumerate(value):
        if not isinstance(tool, dict):
            raise WireError("each tool must be an object", f"tools[{i}]")
        if tool.get("type") != "function":
            raise WireError(
                f"tool type {tool.get('type')!r} is not supported (only 'function')",
                f"tools[{i}].type",
            )
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise WireError("a function tool needs a name", f"tools[{i}].name")
        params = tool.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise WireError("parameters must be a JSON schema object", f"tools[{i}].parameters")
        description = tool.get("description")
        if description is not None and not isinstance(description, str):
            raise WireError("description must be a string", f"tools[{i}].description")
        function: dict[str, Any] = {"name": name}
        if description:
            function["description"] = description
        function["parameters"] = params or {"type": "object", "properties": {}}
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(value: Any) -> Any:
    if value is None or value in ("auto", "none", "required"):
        return value
    if isinstance(value, dict) and value.get("type") == "function":
        name = value.get("name")
        if not isinstance(name, str) or not name:
            raise WireError("tool_choice needs the function's name", "tool_choice.name")
        return {"type": "function", "function": {"name": name}}
    raise WireError(
        "tool_choice must be none, auto, required or {type: function, name}", "tool_choice"
    )


def _logprobs(body: dict[str, Any]) -> tuple[bool, int]:
    include = body.get("include")
    if include is not None and (
        not isinstance(include, list) or not all(isinstance(x, str) for x in include)
    ):
        raise WireError("include must be a list of strings", "include")
    top = body.get("top_logprobs")
    if top is not None and (not is_int(top) or not 0 <= top <= 20):
        raise WireError("top_logprobs must be an integer from 0 to 20", "top_logprobs")
    wanted = "message.output_text.logprobs" in (include or []) or bool(top)
    return wanted, int(top or 0) if wanted else 0


# -- input items ---------------------------------------------------------------


def normalize_input(value: Any) -> list[dict[str, Any]]:
    """A string or a list of items → a list of typed items, errors naming `input[i]…`."""
    if isinstance(value, str):
        return [_message("user", [{"type": "input_text", "text": value}])]
    if not isinstance(value, list):
        raise WireError("input must be a string or a list of items", "input")
    if not value:
        raise WireError("input must not be empty", "input")
    return [_item(item, f"input[{i}]") for i, item in enumerate(value)]


def _message(role: str, content: list[dict[str, Any]], item_id: str | None = None) -> dict:
    return {"type": "message", "id": item_id or new_id("msg"), "role": role, "content": content}


def _text_of(value: Any, where: str, kinds: tuple[str, ...] = _TEXT_PARTS) -> str:
    """A string, or a list of text parts joined."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise WireError(f"{where} must be a string or a list of content parts", where)
    texts = []
    for j, part in enumerate(value):
        if not isinstance(part, dict):
            raise WireError("each content part must be an object", f"{where}[{j}]")
        kind = part.get("type")
        if kind in _IMAGE_PARTS:
            raise WireError(
                f"this model is text-only: {kind} parts are not supported", f"{where}[{j}].type"
            )
        if kind == "refusal":
            text = part.get("refusal")
        elif kind in kinds:
            text = part.get("text")
        else:
            raise WireError(f"unsupported content part type {kind!r}", f"{where}[{j}].type")
        if not isinstance(text, str):
            raise WireError("a text part needs a string text", f"{where}[{j}].text")
        texts.append(text)
    return "".join(texts)


def _string(item: dict[str, Any], name: str, where: str) -> str:
    value = item.get(name)
    if not isinstance(value, str) or not value:
        raise WireError(f"{name} must be a non-empty string", f"{where}.{name}")
    return value


def _item(item: Any, where: str) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise WireError("each input item must be an object", where)
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "message":
        role = item.get("role")
        if role not in _ROLES:
            raise WireError(f"unknown role {role!r}", f"{where}.role")
        text = _text_of(item.get("content"), f"{where}.content")
        part = "output_text" if role == "assistant" else "input_text"
        content: dict[str, Any] = {"type": part, "text": text}
        if part == "output_text":
            content["annotations"] = []
        out = _message(role, [content], item.get("id") if isinstance(item.get("id"), str) else None)
        if role == "assistant":
            out["status"] = "completed"
        return out
    if kind == "function_call":
        arguments = item.get("arguments", "{}")
        if not isinstance(arguments, str):
            raise WireError("arguments must be a JSON string", f"{where}.arguments")
        return {
            "type": "function_call",
            "id": item.get("id") if isinstance(item.get("id"), str) else new_id("fc"),
            "call_id": _string(item, "call_id", where),
            "name": _string(item, "name", where),
            "arguments": arguments,
            "status": "completed",
        }
    if kind == "function_call_output":
        output = item.get("output")
        if output is None:
            raise WireError("output is required", f"{where}.output")
        return {
            "type": "function_call_output",
            "id": item.get("id") if isinstance(item.get("id"), str) else new_id("fco"),
            "call_id": _string(item, "call_id", where),
            "output": _text_of(output, f"{where}.output"),
            "status": "completed",
        }
    if kind == "reasoning":
        content = item.get("content") or []
        summary = item.get("summary") or []
        text = _text_of(content, f"{where}.content") or _text_of(summary, f"{where}.summary")
        return {
            "type": "reasoning",
            "id": item.get("id") if isinstance(item.get("id"), str) else new_id("rs"),
            "summary": [],
            "content": [{"type": "reasoning_text", "text": text}],
        }
    if kind == "item_reference":
        raise WireError("item_reference items are not supported; send the item", f"{where}.type")
    raise WireError(f"unsupported input item type {kind!r}", f"{where}.type")


def items_to_messages(
    instructions: str | None, items: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Normalized items → the neutral OpenAI-chat messages (one assistant turn per run)."""
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    reasoning = ""  # a reasoning item belongs to the assistant turn that follows it
    open_turn = False  # the last message is an assistant turn later items may extend

    def assistant() -> dict[str, Any]:
        nonlocal reasoning, open_turn
        if open_turn and not reasoning:
            return messages[-1]
        message: dict[str, Any] = {"role": "assistant", "content": ""}
        if reasoning:
            message["reasoning_content"] = reasoning
            reasoning = ""
        messages.append(message)
        open_turn = True
        return message

    for item in items:
        kind = item["type"]
        if kind == "reasoning":
            reasoning += "".join(c["text"] for c in item["content"])
        elif kind == "message" and item["role"] == "assistant":
            message = assistant()
            if message.get("tool_calls"):  # text after calls starts a new turn
                open_turn = False
                message = assistant()
            message["content"] += item["content"][0]["text"]
        elif kind == "function_call":
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            }
            assistant().setdefault("tool_calls", []).append(call)
        else:
            if reasoning:  # reasoning with no answer after it: keep it in its own turn
                assistant()
            open_turn = False
            if kind == "function_call_output":
                messages.append(
                    {"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]}
                )
            else:
                role = "system" if item["role"] == "developer" else item["role"]
                messages.append({"role": role, "content": item["content"][0]["text"]})
    if reasoning:
        assistant()
    return messages


# Prep names request fields in chat terms; the Responses wire names its own.
_PARAM_NAMES = {
    "max_tokens": "max_output_tokens",
    "reasoning_effort": "reasoning.effort",
    "response_format": "text.format",
    "session_id": "prompt_cache_key",
    "prompt": "input",
}


def wire_param(field_name: str | None) -> str | None:
    """A prep field name (chat terms) → the Responses request's own."""
    if not field_name:
        return field_name
    if field_name.startswith("messages"):
        return "input"  # messages include instructions and resumed turns: no index
    if field_name.startswith("tools[") and ".function." in field_name:
        return field_name.replace(".function.", ".", 1)
    for name, wire_name in _PARAM_NAMES.items():
        if field_name == name or field_name.startswith(name + "."):
            return wire_name + field_name[len(name) :]
    return field_name


# -- the response --------------------------------------------------------------


def usage_dict(done: Done | None, reasoning_tokens: int = 0) -> dict[str, Any] | None:
    if done is None:
        return None
    u = done.usage
    return {
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {"cached_tokens": u.cached_tokens},
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": min(reasoning_tokens, u.completion_tokens)},
        "total_tokens": u.total_tokens,
    }


def response_object(
    rid: str,
    model: str,
    created_at: int,
    request: ResponsesRequest,
    *,
    status: str,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None = None,
    incomplete_reason: str | None = None,
) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "background": False,
        "completed_at": int(time.time()) if status in ("completed", "incomplete") else None,
        "error": None,
        "incomplete_details": {"reason": incomplete_reason} if incomplete_reason else None,
        "instructions": request.instructions,
        "model": model,
        "output": output,
        "previous_response_id": request.previous_response_id,
        "service_tier": "default",
        "store": request.store,
        **request.echo,
        "usage": usage,
    }


def logprob_entry(event: TokenLogprob) -> dict[str, Any]:
    return {
        "token": event.text,
        "bytes": list(event.text.encode("utf-8")),
        "logprob": event.logprob,
        "top_logprobs": [
            {"token": t, "bytes": list(t.encode("utf-8")), "logprob": lp}
            for t, lp in (event.top or [])
        ],
    }


class OutputBuilder:
    """Neutral events → output items, and the stream events that build them.

    `feed` and `finish` return event payloads without `sequence_number`; the
    route numbers them. The same builder serves the non-streaming path, which
    keeps only `output`.
    """

    def __init__(self) -> None:
        self.output: list[dict[str, Any]] = []
        self.text = ""
        self.reasoning = ""
        self.done: Done | None = None
        self._open: dict[str, Any] | None = None  # the reasoning or message item being written
        self._part_text = ""
        self._logprobs: list[dict[str, Any]] = []  # the open message's
        self._pending: list[dict[str, Any]] = []  # logprobs waiting for their text

    def feed(self, event: Any) -> list[dict[str, Any]]:
        if isinstance(event, TokenLogprob):
            self._pending.append(logprob_entry(event))
            return []
        if isinstance(event, ReasoningDelta):
            self.reasoning += event.text
            self._pending = []  # a thinking token's logprob is not the answer's
            events = self._ensure_open("reasoning")
            self._part_text += event.text
            return events + [
                {
                    "type": "response.reasoning_text.delta",
                    **self._where(),
                    "content_index": 0,
                    "delta": event.text,
                }
            ]
        if isinstance(event, TextDelta):
            self.text += event.text
            events = self._ensure_open("message")
            self._part_text += event.text
            logprobs, self._pending = self._pending, []
            self._logprobs += logprobs
            return events + [
                {
                    "type": "response.output_text.delta",
                    **self._where(),
                    "content_index": 0,
                    "delta": event.text,
                    "logprobs": logprobs,
                }
            ]
        if isinstance(event, ToolCallEvent):
            events = self._close("completed")
            call, self._pending = event.call, []
            item = {
                "type": "function_call",
                "id": new_id("fc"),
                "call_id": call.id,
                "name": call.name,
                "arguments": "",
                "status": "in_progress",
            }
            index = len(self.output)
            self.output.append(item)
            where = {"item_id": item["id"], "output_index": index}
            events.append(
                {"type": "response.output_item.added", "output_index": index, "item": dict(item)}
            )
            events.append(
                {"type": "response.function_call_arguments.delta", **where, "delta": call.arguments}
            )
            item.update(arguments=call.arguments, status="completed")
            events.append(
                {
                    "type": "response.function_call_arguments.done",
                    **where,
                    "name": call.name,
                    "arguments": call.arguments,
                }
            )
            events.append(
                {"type": "response.output_item.done", "output_index": index, "item": dict(item)}
            )
            return events
        if isinstance(event, Done):
            self.done = event
        return []

    def finish(self, status: str) -> list[dict[str, Any]]:
        """Close the open item; `status` is the response's ("completed" or "incomplete").

        A reply with no answer text and no call still has its (empty) message.
        """
        events: list[dict[str, Any]] = []
        if not any(item["type"] in ("message", "function_call") for item in self.output):
            events = self._ensure_open("message")
        if self._open is not None and self._open["type"] == "message":
            self._logprobs += self._pending  # tokens whose text never came (e.g. a stop string)
        self._pending = []
        return events + self._close(status)

    # -- items ------------------------------------------------------------------

    def _where(self) -> dict[str, Any]:
        assert self._open is not None
        return {"item_id": self._open["id"], "output_index": len(self.output) - 1}

    def _ensure_open(self, kind: str) -> list[dict[str, Any]]:
        if self._open is not None and self._open["type"] == kind:
            return []
        events = self._close("completed")
        if kind == "reasoning":
            item: dict[str, Any] = {
                "type": "reasoning",
                "id": new_id("rs"),
                "summary": [],
                "content": [],
            }
            part: dict[str, Any] = {"type": "reasoning_text", "text": ""}
        else:
            item = {
                "type": "message",
                "id": new_id("msg"),
                "role": "assistant",
                "status": "in_progress",
                "content": [],
            }
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        self._open, self._part_text, self._logprobs = item, "", []
        self.output.append(item)
        index = len(self.output) - 1
        events.append(
            {"type": "response.output_item.added", "output_index": index, "item": _copy(item)}
        )
        events.append(
            {
                "type": "response.content_part.added",
                **self._where(),
                "content_index": 0,
                "part": part,
            }
        )
        return events

    def _close(self, status: str) -> list[dict[str, Any]]:
        item = self._open
        if item is None:
            return []
        where = {**self._where(), "content_index": 0}
        text, self._open = self._part_text, None
        if item["type"] == "reasoning":
            part: dict[str, Any] = {"type": "reasoning_text", "text": text}
            item["content"] = [part]
            done = {"type": "response.reasoning_text.done", **where, "text": text}
        else:
            part = {
                "type": "output_text",
                "text": text,
                "annotations": [],
                "logprobs": self._logprobs,
            }
            item.update(content=[part], status=status)
            done = {
                "type": "response.output_text.done",
                **where,
                "text": text,
                "logprobs": self._logprobs,
            }
        return [
            done,
            {"type": "response.content_part.done", **where, "part": _copy(part)},
            {
                "type": "response.output_item.done",
                "output_index": where["output_index"],
                "item": _copy(item),
            },
        ]


def _copy(value: dict[str, Any]) -> dict[str, Any]:
    return copy.deepcopy(value)


def error_event(message: str, code: str) -> dict[str, Any]:
    return {"type": "error", "code": code, "message": message, "param": None}
