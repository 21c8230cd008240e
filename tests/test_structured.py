"""Constrained decoding: JSON schemas, grammars and forced tool calls always parse."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from mlxbun_cli.client.results import collect
from mlxbun_cli.errors import OptionError
from mlxbun_cli.prep.pipeline import prepare, run
from mlxbun_cli.prep.request import GenerationRequest

# Bounded values: a random-weight model would otherwise write digits forever.
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "member": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["red", "blue"]}, "maxItems": 3},
    },
    "required": ["name", "age", "member", "tags"],
    "additionalProperties": False,
}
WEATHER = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 10}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }
]
NO_THINK = {"enable_thinking": False}


def ask(**fields) -> GenerationRequest:
    return GenerationRequest(
        messages=[{"role": "user", "content": "answer in JSON"}],
        chat_template_kwargs=NO_THINK,
        **fields,
    )


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_json_schema_output_always_validates(tiny_loaded, seed):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    result = collect(
        run(tiny_loaded, ask(response_format=fmt, max_tokens=200, temperature=1.0, seed=seed))
    )
    assert result.done.finish_reason == "stop"
    jsonschema.validate(json.loads(result.text), PERSON)


def test_json_object_mode(tiny_loaded):
    result = collect(
        run(
            tiny_loaded,
            ask(
                response_format={"type": "json_object"}, max_tokens=200, temperature=0, grammar=None
            ),
        )
    )
    if result.done.finish_reason == "stop":
        assert isinstance(json.loads(result.text), dict)
    else:  # a free-form object may run out of tokens; it must still be a JSON prefix
        assert result.text.startswith("{")


def test_regex_and_lark_grammars(tiny_loaded):
    r = collect(
        run(
            tiny_loaded,
            ask(
                grammar={"type": "regex", "value": "(yes|no)-[0-9]{3}"},
                max_tokens=20,
                temperature=1.0,
                seed=5,
            ),
        )
    )
    assert r.done.finish_reason == "stop"
    import re

    assert re.fullmatch(r"(yes|no)-[0-9]{3}", r.text)
    lark = 'start: "colour: " COLOUR\nCOLOUR: "red" | "green" | "blue"'
    r = collect(run(tiny_loaded, ask(grammar=lark, max_tokens=20, temperature=1.0, seed=2)))
    assert r.text in ("colour: red", "colour: green", "colour: blue")


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "get_weather"}}]
)
def test_forced_tool_call_is_parsed(tiny_loaded, choice):
    r = collect(
        run(
            tiny_loaded,
            ask(tools=WEATHER, tool_choice=choice, max_tokens=80, temperature=0.7, seed=1),
        )
    )
    assert r.done.finish_reason == "tool_calls"
    [call] = r.tool_calls
    assert call["function"]["name"] == "get_weather"
    jsonschema.validate(
        json.loads(call["function"]["arguments"]), WEATHER[0]["function"]["parameters"]
    )
    assert r.text == ""


def test_uncompilable_schema_runs_unconstrained_with_a_warning(tiny_loaded):
    fmt = {
        "type": "json_schema",
        "json_schema": {"schema": {"type": "string", "pattern": "(?<=a)b"}},
    }
    prepared = prepare(tiny_loaded, ask(response_format=fmt, max_tokens=4))
    assert prepared.engine_request.logits_processors == []
    assert prepared.warnings and "could not be compiled" in prepared.warnings[0]
    off = prepare(
        tiny_loaded,
        ask(response_format={"type": "json_object"}, max_tokens=4),
        constrained_decoding=False,
    )
    assert off.engine_request.logits_processors == [] and "turned off" in off.warnings[0]


@pytest.mark.parametrize(
    "fields, param",
    [
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": 5}}}},
            "response_format.json_schema.schema",
        ),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"tool_choice": "required"}, "tool_choice"),
        (
            {"tools": WEATHER, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
        ),
        ({"grammar": {"type": "ebnf", "value": "x"}}, "grammar"),
        ({"grammar": 'start: "a"', "response_format": {"type": "json_object"}}, "grammar"),
    ],
)
def test_bad_constraints_name_the_field(tiny_loaded, fields, param):
    with pytest.raises(OptionError) as info:
        prepare(tiny_loaded, ask(max_tokens=4, **fields))
    assert info.value.field == param


def test_constrained_and_free_requests_share_a_batch(tiny_loaded):
    import threading

    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}
    out = {}

    def go(name, **fields):
        out[name] = collect(run(tiny_loaded, ask(max_tokens=60, temperature=0.9, seed=3, **fields)))

    threads = [
        threading.Thread(target=go, args=("json",), kwargs={"response_format": fmt}),
        threading.Thread(target=go, args=("free",)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    jsonschema.validate(json.loads(out["json"].text), PERSON)
    assert out["free"].done.finish_reason in ("stop", "length")


def test_structured_output_over_the_wire(openai_client, server):
    r = openai_client.chat.completions.create(
        model="x",
        messages=[{"role": "user", "content": "json"}],
        max_tokens=200,
        temperature=0.8,
        seed=4,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": PERSON},
        },
        extra_body={"chat_template_kwargs": NO_THINK},
    )
    jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)
    t = openai_client.chat.completions.create(
        model="x",
        messages=[{"role": "user", "content": "weather in Oslo?"}],
        max_tokens=80,
        temperature=0.7,
        seed=1,
        tools=WEATHER,
        tool_choice="required",
        extra_body={"chat_template_kwargs": NO_THINK},
    )
    assert t.choices[0].finish_reason == "tool_calls"
    assert t.choices[0].message.tool_calls[0].function.name == "get_weather"
    stream = openai_client.chat.completions.create(
        model="x",
        messages=[{"role": "user", "content": "weather?"}],
        max_tokens=80,
        temperature=0.7,
        seed=1,
        tools=WEATHER,
        tool_choice="required",
        stream=True,
        extra_body={"chat_template_kwargs": NO_THINK},
    )
    chunks = list(stream)
    deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert deltas and deltas[0].function.name == "get_weather"
    assert [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ] == ["tool_calls"]
    bad = _chat_with_schema(server, {"schema": {"type": "string", "pattern": "(?<=a)b"}})
    assert bad.status_code == 200 and "could not be compiled" in bad.headers["warning"]


def _chat_with_schema(server, json_schema: dict) -> httpx.Response:
    return httpx.post(
        server.url + "/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 3,
            "response_format": {"type": "json_schema", "json_schema": json_schema},
        },
        timeout=30,
    )


def test_a_warning_quoting_control_characters_still_makes_a_valid_header(server):
    # llguidance's compile error quotes the pattern, \x01 included.
    schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": "(?=\x01)a"}}}
    response = _chat_with_schema(server, {"name": "x", "schema": schema})
    assert response.status_code == 200, response.text
    warning = response.headers["warning"]
    assert warning.startswith('299 mlxbun "') and not any(ord(c) < 32 for c in warning)
