"""Tool calls: found in the streamed answer and parsed with mlx-lm's per-family parser."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from mlxbun_cli.errors import OptionError
from mlxbun_cli.prep.textscan import partial_suffix_len


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as the OpenAI wire carries it

    def as_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


def validate_tools(tools: Any) -> list[dict[str, Any]] | None:
    """OpenAI tool list → normalized list; errors name the offending entry."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise OptionError("tools", "must be a list")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise OptionError(f"tools[{i}]", "must be an object")
        fn = tool.get("function") if tool.get("type", "function") == "function" else None
        if not isinstance(fn, dict):
            raise OptionError(f"tools[{i}].function", "is required for a function tool")
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise OptionError(f"tools[{i}].function.name", "is required")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise OptionError(f"tools[{i}].function.parameters", "must be a JSON-schema object")
        out.append({"type": "function", "function": {**fn, "parameters": params}})
    return out or None


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


class ToolCallExtractor:
    """Streams answer text through, pulling out `start … end` tool-call spans."""

    def __init__(self, start: str, end: str, parser: Any, tools: list[dict[str, Any]] | None):
        self.start, self.end = start, end
        self.parser = parser
        self.tools = tools
        self._held = ""
        self._in_call = False
        self.calls: list[ToolCall] = []
        self.failures = 0

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        buf = self._held + text
        self._held = ""
        out, calls = [], []
        while buf:
            marker = self.end if self._in_call else self.start
            idx = buf.find(marker)
            if idx == -1:
                if self._in_call:
                    self._held = buf
                else:
                    keep = partial_suffix_len(buf, [marker])
                    out.append(buf[: len(buf) - keep])
                    self._held = buf[len(buf) - keep :]
                break
            if self._in_call:
                body = buf[:idx]
                call = self._parse(body)
                if call is None:
                    out.append(self.start + body + self.end)
                else:
                    calls.append(call)
            else:
                out.append(buf[:idx])
            buf = buf[idx + len(marker) :]
            self._in_call = not self._in_call
        self.calls.extend(calls)
        return "".join(out), calls

    def flush(self) -> tuple[str, list[ToolCall]]:
        held, self._held = self._held, ""
        if self._in_call:
            self._in_call = False
            call = self._parse(held)  # a call cut short by max_tokens may still parse
            if call is not None:
                self.calls.append(call)
                return "", [call]
            return self.start + held, []
        return held, []

    def _parse(self, body: str) -> ToolCall | None:
        try:
            parsed = self.parser(body, self.tools)
        except Exception:
            parsed = None
        if isinstance(parsed, list):
            parsed = parsed[0] if len(parsed) == 1 else None
        if not isinstance(parsed, dict) or not isinstance(parsed.get("name"), str):
            self.failures += 1
            return None
        args = parsed.get("arguments", {})
        if not isinstance(args, str):
            args = json.dumps(args, ensure_ascii=False)
        return ToolCall(new_call_id(), parsed["name"], args)
