"""Shared request prep, piece by piece: stops, thinking, precedence, tools, validation."""

from __future__ import annotations

import json

import pytest

from mlxbun_cli.errors import OptionError
from mlxbun_cli.prep.options import GenerationDefaults, resolve_enable_thinking, sampling_for
from mlxbun_cli.prep.request import GenerationRequest, validate
from mlxbun_cli.prep.stops import StopMatcher
from mlxbun_cli.prep.thinking import ThinkingSplitter
from mlxbun_cli.prep.tools import ToolCallExtractor, validate_tools


def feed_all(matcher: StopMatcher, pieces: list[str]) -> str:
    out = "".join(matcher.feed(p) for p in pieces)
    return out + matcher.flush()


@pytest.mark.parametrize(
    "pieces, stops, expected",
    [
        (["Hello wor", "ld! END", " more"], ["END"], "Hello world! "),
        (["abc", "E", "N", "D", "x"], ["END"], "abc"),  # stop split across every token
        (["abc", "E", "N", "x"], ["END"], "abcENx"),  # partial match released
        (["a<", "/s", "top> tail"], ["</stop>"], "a"),
        (["one two"], [], "one two"),
        (["xxENDyyFIN"], ["FIN", "END"], "xx"),  # earliest stop wins
        (["tail EN"], ["END"], "tail EN"),  # held text released at the end
    ],
)
def test_stop_hold_back_never_leaks(pieces, stops, expected):
    matcher = StopMatcher(stops)
    emitted = []
    for piece in pieces:
        emitted.append(matcher.feed(piece))
        for stop in stops:
            assert stop not in "".join(emitted)
    assert "".join(emitted) + matcher.flush() == expected


def test_thinking_split_streaming():
    splitter = ThinkingSplitter()
    pieces = ["<thi", "nk>plan", " it</th", "ink>\n\nThe ", "answer"]
    reasoning = content = ""
    for piece in pieces:
        r, c = splitter.feed(piece)
        reasoning, content = reasoning + r, content + c
    r, c = splitter.flush()
    assert (reasoning + r, content + c) == ("plan it", "The answer")


def test_thinking_starts_open_when_prompt_ends_in_think():
    splitter = ThinkingSplitter(in_thinking=True)
    r, c = splitter.feed("hmm</think>ok")
    assert (r, c) == ("hmm", "ok")


@pytest.mark.parametrize(
    "kwargs, effort, server, model, expected",
    [
        ({"enable_thinking": True}, "none", False, False, True),  # explicit wins
        ({"enable_thinking": False}, "high", True, True, False),
        ({"enable_thinking": None}, "high", True, True, None),  # null = template default
        ({}, "none", True, True, False),  # effort next
        ({}, "low", False, False, True),
        ({}, None, False, True, False),  # then the server default
        ({}, None, None, False, False),  # then the model's
        ({}, None, None, None, None),
    ],
)
def test_enable_thinking_precedence(kwargs, effort, server, model, expected):
    req = GenerationRequest(
        messages=[{"role": "user", "content": "x"}],
        chat_template_kwargs=kwargs,
        reasoning_effort=effort,
    )
    defaults = GenerationDefaults(enable_thinking=model)
    assert resolve_enable_thinking(req, defaults, server) is expected


def test_no_think_temperature_cap():
    defaults = GenerationDefaults(temperature=0.9, no_think_temperature_cap=0.7)
    req = GenerationRequest(messages=[{"role": "user", "content": "x"}])
    assert sampling_for(req, defaults, False).temperature == 0.7
    assert sampling_for(req, defaults, True).temperature == 0.9
    req.temperature = 1.2  # an explicit temperature always wins
    assert sampling_for(req, defaults, False).temperature == 1.2


def test_model_defaults_fold_under_request():
    defaults = GenerationDefaults(temperature=0.6, top_p=0.95, top_k=20)
    req = GenerationRequest(prompt="x", top_k=5)
    s = sampling_for(req, defaults, None)
    assert (s.temperature, s.top_p, s.top_k) == (0.6, 0.95, 5)


@pytest.mark.parametrize(
    "field, value",
    [
        ("temperature", -1),
        ("top_p", 1.5),
        ("top_p", 0),
        ("max_tokens", 0),
        ("top_k", -3),
        ("min_p", 2),
        ("presence_penalty", 3),
        ("top_logprobs", 50),
        ("temperature", "hot"),
    ],
)
def test_out_of_range_options_name_the_field(field, value):
    req = GenerationRequest(prompt="x")
    setattr(req, field, value)
    with pytest.raises(OptionError) as info:
        validate(req)
    assert info.value.field == field


def test_empty_prompt_and_messages_rejected():
    with pytest.raises(OptionError):
        validate(GenerationRequest(prompt="   "))
    with pytest.raises(OptionError):
        validate(GenerationRequest(messages=[]))


def json_parser(text, tools=None):
    return json.loads(text.strip())


def test_tool_call_extraction_streaming():
    ext = ToolCallExtractor("<tool_call>", "</tool_call>", json_parser, None)
    text = 'Let me check.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    out, calls = "", []
    for i in range(0, len(text), 7):  # arbitrary token boundaries
        o, c = ext.feed(text[i : i + 7])
        out, calls = out + o, calls + c
    o, c = ext.flush()
    out, calls = out + o, calls + c
    assert out == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Oslo"})]


def test_unparseable_tool_call_comes_back_as_text():
    ext = ToolCallExtractor("<tool_call>", "</tool_call>", json_parser, None)
    out, calls = ext.feed("<tool_call>not json</tool_call> rest")
    assert calls == [] and out == "<tool_call>not json</tool_call> rest"
    assert ext.failures == 1


def test_validate_tools_names_the_entry():
    with pytest.raises(OptionError) as info:
        validate_tools([{"type": "function", "function": {"parameters": {}}}])
    assert info.value.field == "tools[0].function.name"
