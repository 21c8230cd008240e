"""Constrained decoding with llguidance: JSON schemas, grammars, forced tool calls.

A request's constraint becomes a per-request logits processor that keeps only
the tokens the grammar allows; it composes with continuous batching because
each batch member carries its own processor. A schema llguidance cannot
compile never fails the request: it runs unconstrained and says why.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from mlxbun_cli.errors import OptionError

GRAMMAR_TYPES = ("lark", "regex", "json_schema")
COMPACT_JSON: dict[str, Any] = {"whitespace_flexible": False}


@dataclass(frozen=True)
class Constraint:
    kind: str  # "json_schema", "lark", "regex", "tool_call"
    source: Any
    field: str  # the request field it came from, for messages


def _check_schema(schema: Any, field: str) -> dict[str, Any]:
    if not isinstance(schema, dict):
        raise OptionError(field, "must be a JSON-schema object")
    from jsonschema import exceptions, validators

    try:
        validators.validator_for(schema).check_schema(schema)
    except exceptions.SchemaError as exc:
        raise OptionError(field, f"is not a valid JSON schema: {exc.message}") from None
    return schema


def from_response_format(value: Any) -> Constraint | None:
    """OpenAI `response_format` (chat) → a constraint, or None for plain text."""
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise OptionError("response_format", "must be an object with a type")
    kind = value["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return Constraint("json_schema", {"type": "object"}, "response_format")
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict):
            raise OptionError("response_format.json_schema", "must be an object with a schema")
        schema = _check_schema(spec.get("schema", {}), "response_format.json_schema.schema")
        return Constraint("json_schema", schema, "response_format")
    raise OptionError(
        "response_format.type", f"must be text, json_object or json_schema, not {kind!r}"
    )


def from_grammar_field(value: Any) -> Constraint | None:
    """mlxbun's `grammar` field: a Lark string, or {"type": lark|regex|json_schema, "value": …}."""
    if value is None:
        return None
    if isinstance(value, str):
        return Constraint("lark", value, "grammar")
    if not isinstance(value, dict) or value.get("type") not in GRAMMAR_TYPES:
        raise OptionError(
            "grammar", f"must be a Lark string or {{type: {'|'.join(GRAMMAR_TYPES)}, value}}"
        )
    body = value.get("value")
    if value["type"] == "json_schema":
        return Constraint("json_schema", _check_schema(body, "grammar.value"), "grammar")
    if not isinstance(body, str) or not body:
        raise OptionError("grammar.value", "must be a non-empty string")
    return Constraint(value["type"], body, "grammar")


def from_tool_choice(choice: Any, tools: list[dict[str, Any]] | None) -> Constraint | None:
    """`required` or a named function → the reply must be that tool call."""
    if choice is None or choice in ("auto", "none"):
        return None
    if not tools:
        if choice == "required" or isinstance(choice, dict):
            raise OptionError("tool_choice", "needs tools")
        return None
    if choice == "required":
        return Constraint("tool_call", tools, "tool_choice")
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") or choice.get("name")
        chosen = [t for t in tools if t["function"]["name"] == name]
        if not chosen:
            raise OptionError("tool_choice", f"names a function that is not in tools: {name!r}")
        return Constraint("tool_call", chosen, "tool_choice")
    raise OptionError(
        "tool_choice", "must be none, auto, required or {type: function, function: {name}}"
    )


def tool_call_schema(tools: list[dict[str, Any]]) -> dict[str, Any]:
    calls = [
        {
            "type": "object",
            "properties": {
                "name": {"const": t["function"]["name"]},
                "arguments": t["function"].get("parameters") or {"type": "object"},
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for t in tools
    ]
    return calls[0] if len(calls) == 1 else {"anyOf": calls}


def grammar_text(constraint: Constraint, markers: tuple[str, str] | None) -> str:
    """llguidance grammar text; `markers` are the tool-call start/end as Lark terms."""
    from llguidance import LLMatcher

    if constraint.kind == "json_schema":
        # No free whitespace: a weak model could otherwise spend every token on it.
        return LLMatcher.grammar_from_json_schema(constraint.source, defaults=COMPACT_JSON)
    if constraint.kind == "regex":
        return LLMatcher.grammar_from_regex(constraint.source)
    if constraint.kind == "lark":
        return LLMatcher.grammar_from_lark(constraint.source)
    if markers is None:
        raise ValueError("this model's chat template has no tool-call markers")
    schema = json.dumps({**tool_call_schema(constraint.source), "x-guidance": COMPACT_JSON})
    return LLMatcher.grammar_from_lark(
        f'start: {markers[0]} "\\n" call "\\n" {markers[1]}\ncall: %json {schema}\n'
    )


def _marker_term(llg: Any, tokenizer: Any, text: str) -> str:
    """A special token is matched by name (`<tool_call>`), plain text as a string."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if (
        len(ids) == 1
        and llg.is_special_token(ids[0])
        and text.startswith("<")
        and text.endswith(">")
    ):
        return text
    return json.dumps(text)


def llg_tokenizer(loaded: Any) -> Any:
    """llguidance's view of the model's tokenizer; built once per model (~1 s)."""
    cached = getattr(loaded, "_llg_tokenizer", None)
    if cached is None:
        from llguidance import LLTokenizer

        hf = getattr(loaded.tokenizer, "_tokenizer", loaded.tokenizer)
        backend = getattr(hf, "backend_tokenizer", None) or getattr(hf, "_tokenizer", None)
        if backend is None or not hasattr(backend, "to_str"):
            raise ValueError("constrained decoding needs a fast (tokenizers) tokenizer")
        cached = LLTokenizer(
            backend.to_str(),
            n_vocab=loaded.vocab_size,
            eos_token=sorted(loaded.tokenizer.eos_token_ids),
        )
        loaded._llg_tokenizer = cached
    return cached


class GrammarProcessor:
    """An mlx-lm logits processor: tokens outside the grammar get -inf."""

    def __init__(self, matcher: Any) -> None:
        self.matcher = matcher
        self._started = False

    def __call__(self, tokens: Any, logits: Any) -> Any:
        import mlx.core as mx
        import numpy as np

        if self._started:
            self.matcher.consume_token(int(tokens[-1].item()))  # the token sampled last step
        self._started = True
        vocab = logits.shape[-1]
        bits = np.unpackbits(
            np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8), bitorder="little"
        )
        allowed = np.zeros(vocab, dtype=bool)
        n = min(vocab, bits.shape[0])
        allowed[:n] = bits[:n].astype(bool)
        if not allowed.any():  # an error state: let the sequence end rather than emit junk
            return logits
        return mx.where(mx.array(allowed), logits, mx.array(-float("inf"), dtype=logits.dtype))


def compile_constraint(
    loaded: Any, constraint: Constraint
) -> tuple[GrammarProcessor | None, str | None]:
    """A processor for the request, or (None, why) when it cannot be compiled."""
    try:
        from llguidance import LLMatcher

        tok, llg = loaded.tokenizer, llg_tokenizer(loaded)
        markers = None
        start, end = getattr(tok, "tool_call_start", None), getattr(tok, "tool_call_end", None)
        if constraint.kind == "tool_call" and start and end:
            markers = (_marker_term(llg, tok, start), _marker_term(llg, tok, end))
        matcher = LLMatcher(llg, grammar_text(constraint, markers), log_level=0)
        if matcher.is_error():
            return (
                None,
                f"{constraint.field} could not be compiled: {_first_line(matcher.get_error())}",
            )
    except Exception as exc:  # never fail the request over its grammar
        return None, f"{constraint.field} could not be compiled: {_first_line(str(exc))}"
    return GrammarProcessor(matcher), None


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return " ".join(lines[:3])[:300] if lines else "unknown error"
