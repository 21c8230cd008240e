"""The Anthropic Messages wire: parsing and rendering units, then the official SDK
against a real `mlxbun serve` subprocess."""

from __future__ import annotations

import asyncio
import json

import anthropic
import httpx
import pytest

from mlxbun_cli.engine.types import Usage
from mlxbun_cli.prep.events import Done, ReasoningDelta, TextDelta, TokenLogprob, ToolCallEvent
from mlxbun_cli.prep.tools import ToolCall
from mlxbun_cli.protocols import WireError
from mlxbun_cli.protocols import anthropic as wire
from mlxbun_cli.server.routes_anthropic import render_stream

USER = [{"role": "user", "content": "Tell me something"}]
GREEDY = {"temperature": 0}  # not a typed SDK parameter any more: sent as extra_body
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


def _call(call_id: str, name: str, arguments: dict) -> dict:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


# -- units: request mapping ----------------------------------------------------


# A tool round by hand: two calls, one result an error, then a follow-up.
HISTORY = {
    "max_tokens": 5,
    "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Two cities.", "signature": "sig"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "w", "input": {"c": "Paris"}},
                {"type": "tool_use", "id": "toolu_2", "name": "w", "input": {"c": "Rome"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "content": [{"type": "text", "text": "no data"}],
                    "is_error": True,
                },
                {"type": "text", "text": "And tomorrow?"},
            ],
        },
    ],
    "tools": [{**WEATHER, "name": "w"}],
    "stop_sequences": ["END", ""],
    "metadata": {"user_id": "ignored"},
}


def test_history_maps_to_neutral_openai_messages():
    parsed = wire.parse_messages({**HISTORY, "top_k": 5})
    req = parsed.request
    assert req.messages == [
        {"role": "system", "content": "Be brief.\n\nBe kind."},
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "reasoning_content": "Two cities.",
            "tool_calls": [
                _call("toolu_1", "w", {"c": "Paris"}),
                _call("toolu_2", "w", {"c": "Rome"}),
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "name": "w", "content": "sunny"},
        {"role": "tool", "tool_call_id": "toolu_2", "name": "w", "content": "Error: no data"},
        {"role": "user", "content": "And tomorrow?"},
    ]
    assert req.tools == [
        {
            "type": "function",
            "function": {
                "name": "w",
                "parameters": WEATHER["input_schema"],
                "description": WEATHER["description"],
            },
        }
    ]
    assert (req.max_tokens, req.stop, req.top_k, req.tool_choice) == (5, ["END"], 5, None)
    assert req.chat_template_kwargs == {} and not parsed.stream


@pytest.mark.parametrize(
    "extra, kwargs, tools_kept, choice",
    [
        ({"thinking": {"type": "enabled", "budget_tokens": 2048}}, {"enable_thinking": True}, 1, 0),
        ({"thinking": {"type": "disabled"}}, {"enable_thinking": False}, 1, 0),
        ({"thinking": {"type": "adaptive"}}, {}, 1, 0),
        ({"tool_choice": {"type": "none"}}, {}, 0, "none"),
        ({"tool_choice": {"type": "auto"}}, {}, 1, "auto"),
        ({"tool_choice": {"type": "any"}}, {}, 1, "required"),
        (
            {"tool_choice": {"type": "tool", "name": "get_weather"}},
            {},
            1,
            {"type": "function", "function": {"name": "get_weather"}},
        ),
    ],
)
def test_thinking_and_tool_choice_map(extra, kwargs, tools_kept, choice):
    body = {"max_tokens": 4, "messages": USER, "tools": [WEATHER], **extra}
    req = wire.parse_messages(body).request
    assert req.chat_template_kwargs == kwargs
    assert bool(req.tools) == bool(tools_kept)
    assert req.tool_choice == (choice or None)


def _with(**fields):
    return {"max_tokens": 4, "messages": USER, **fields}


def _turns(*content):
    roles = (["user", "assistant"] * len(content))[: len(content)]
    return _with(messages=[{"role": r, "content": c} for r, c in zip(roles, content, strict=True)])


USE = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}
RESULT = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}
IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}


@pytest.mark.parametrize(
    "body, param",
    [
        ([1], None),
        ({"messages": USER}, "max_tokens"),
        (_with(max_tokens=0), "max_tokens"),
        (_with(max_tokens="8"), "max_tokens"),
        (_with(messages=[]), "messages"),
        (_with(messages=[{"role": "system", "content": "x"}]), "messages[0].role"),
        (_with(messages=[{"role": "user", "content": 3}]), "messages[0].content"),
        (_turns([USE]), "messages[0].content[0]"),  # tool_use from the user
        (_turns("hi", [RESULT]), "messages[1].content[0]"),  # tool_result from the assistant
        (
            _turns("hi", [USE], [{**RESULT, "tool_use_id": "toolu_9"}]),
            "messages[2].content[0].tool_use_id",
        ),
        (_turns("hi", [USE], [{"type": "text", "text": "x"}, RESULT]), "messages[2].content[1]"),
        (_turns("hi", [USE], [RESULT, RESULT]), "messages[2].content[1].tool_use_id"),
        (_turns([IMAGE]), "messages[0].content[0]"),
        (_turns("hi", [{**USE, "input": "{}"}]), "messages[1].content[0].input"),
        (_with(system=[{"type": "image"}]), "system[0]"),
        (_with(system=7), "system"),
        (_with(tools=[{"name": "t"}]), "tools[0].input_schema"),
        (_with(tools=[{"name": "t", "input_schema": "x"}]), "tools[0].input_schema"),
        (_with(tools=[{"type": "bash_20250124", "name": "bash"}]), "tools[0].type"),
        (_with(tools=[WEATHER, WEATHER]), "tools[1].name"),
        (_with(tool_choice={"type": "any"}), "tool_choice"),
        (_with(tools=[WEATHER], tool_choice={"type": "tool", "name": "x"}), "tool_choice.name"),
        (_with(tool_choice={"type": "sometimes"}), "tool_choice.type"),
        (_with(thinking={"type": "enabled"}), "thinking.budget_tokens"),
        (_with(thinking={"type": "maybe"}), "thinking.type"),
        (_with(stop_sequences="END"), "stop_sequences"),
        (_with(temperature="hot"), "temperature"),
        (_with(top_k=1.5), "top_k"),
        (_with(stream="yes"), "stream"),
        (_with(output_config={"format": {"type": "regex"}}), "output_config.format.type"),
    ],
)
def test_bad_requests_name_the_field(body, param):
    with pytest.raises(WireError) as info:
        wire.parse_messages(body)
    assert info.value.status == 400 and info.value.param == param
    message = wire.error_body(info.value.message, param=param)["error"]["message"]
    assert param is None or param in message


def test_count_tokens_does_not_need_max_tokens():
    assert wire.parse_messages({"messages": USER}, count_only=True).request.max_tokens is None


def test_error_body_in_anthropic_shape():
    assert wire.error_body("boom", "server_error") == {
        "type": "error",
        "error": {"type": "api_error", "message": "boom"},
    }
    assert wire.error_body("x", "engine_unavailable")["error"]["type"] == "overloaded_error"
    assert wire.error_body("must be set", param="max_tokens")["error"]["message"] == (
        "max_tokens: must be set"
    )


# -- units: the stream renderer --------------------------------------------------


def _frames(raw: bytes) -> list[tuple[str, dict]]:
    frames = []
    for chunk in raw.decode().split("\n\n"):
        if chunk:
            name, data = chunk.split("\n")
            assert name.startswith("event: ") and data.startswith("data: ")
            frames.append((name[7:], json.loads(data[6:])))
    return frames


def _render(events: list) -> list:
    async def source():
        for event in events:
            yield event

    async def collect() -> bytes:
        renderer = wire.MessageStream("msg_1", "tiny")
        return b"".join([c async for c in render_stream(source(), renderer, 10)])

    return _frames(asyncio.run(collect()))


def test_stream_renderer_block_grammar_with_a_tool_call():
    usage = Usage(prompt_tokens=10, cached_tokens=4, completion_tokens=7)
    call = ToolCall("call_abc", "get_weather", '{"city": "Paris"}')
    frames = _render(
        [
            ReasoningDelta("Hmm"),
            ReasoningDelta(", Paris."),
            TextDelta("Let me check."),
            ToolCallEvent(0, call),
            TokenLogprob(1, "x", -0.1),
            Done("tool_calls", usage, [call]),
        ]
    )
    names = [name for name, _ in frames]
    assert names == [
        "message_start",
        "ping",
        "content_block_start",  # 0 thinking
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",  # 1 text
        "content_block_delta",
        "content_block_stop",
        "content_block_start",  # 2 tool_use
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = frames[0][1]["message"]
    assert start["content"] == [] and start["usage"]["input_tokens"] == 10
    assert start["stop_reason"] is None
    indexes = [data["index"] for _, data in frames if "index" in data]
    assert indexes == [0, 0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert frames[2][1]["content_block"] == {"type": "thinking", "thinking": "", "signature": ""}
    assert frames[4][1]["delta"] == {"type": "thinking_delta", "thinking": ", Paris."}
    assert frames[7][1]["delta"] == {"type": "text_delta", "text": "Let me check."}
    tool = frames[9][1]["content_block"]
    assert tool == {"type": "tool_use", "id": "toolu_abc", "name": "get_weather", "input": {}}
    delta = frames[10][1]["delta"]
    assert delta["type"] == "input_json_delta" and json.loads(delta["partial_json"]) == {
        "city": "Paris"
    }
    assert frames[12][1]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert frames[12][1]["usage"] == {
        "input_tokens": 6,
        "output_tokens": 7,
        "cache_read_input_tokens": 4,
        "cache_creation_input_tokens": 0,
    }


def test_whole_message_matches_the_stream():
    call = ToolCall("call_x", "f", "not json")
    stream = wire.MessageStream("msg_1", "tiny")
    for event in [TextDelta("a"), TextDelta("b"), ToolCallEvent(0, call), TextDelta("c")]:
        stream.feed(event)
    message = stream.message(Done("length", Usage(prompt_tokens=3, completion_tokens=2)), None)
    assert message["content"] == [
        {"type": "text", "text": "ab"},
        {"type": "tool_use", "id": "toolu_x", "name": "f", "input": {}},
        {"type": "text", "text": "c"},
    ]
    assert message["stop_reason"] == "max_tokens" and message["type"] == "message"


@pytest.mark.parametrize(
    "done, error_type",
    [
        (Done("error", Usage(), error="engine fell over"), "api_error"),
        (Done("cancelled", Usage()), "overloaded_error"),
    ],
)
def test_failed_or_cancelled_stream_ends_with_an_error_event(done, error_type):
    frames = _render([TextDelta("partial"), done])
    assert [name for name, _ in frames][-2:] == ["content_block_delta", "error"]
    assert frames[-1][1]["type"] == "error" and frames[-1][1]["error"]["type"] == error_type


def test_stop_sequence_told_apart_from_eos():
    # The neutral Done names the stop string that ended the reply (None for EOS).
    steps = [TextDelta("ab")]
    by_stop = _render([*steps, Done("stop", Usage(), stop_sequence="cd")])
    assert by_stop[-2][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "cd"}
    by_eos = _render([*steps, Done("stop", Usage())])
    assert by_eos[-2][1]["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}


# -- through the server with the SDK ----------------------------------------------


@pytest.fixture
def client(server):
    c = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0, timeout=60)
    yield c
    c.close()


def test_non_streaming_message(client):
    r = client.messages.create(model="anything", max_tokens=8, messages=USER, extra_body=GREEDY)
    assert r.id.startswith("msg_") and r.type == "message" and r.role == "assistant"
    assert r.stop_reason in ("end_turn", "max_tokens") and r.stop_sequence is None
    assert [b.type for b in r.content] in ([], ["text"])
    assert 0 < r.usage.output_tokens <= 8
    assert (
        r.usage.input_tokens + r.usage.cache_read_input_tokens
        == client.messages.count_tokens(model="x", messages=USER).input_tokens
    )


def test_streaming_events_and_final_message(client, server):
    kwargs = dict(model="x", max_tokens=12, messages=USER, extra_body=GREEDY)
    with client.messages.stream(**kwargs) as stream:
        types = [e.type for e in stream if e.type not in ("text", "thinking", "input_json")]
        final = stream.get_final_message()
    assert types[0] == "message_start" and types[-2:] == ["message_delta", "message_stop"]
    blocks = types[1:-2]
    if blocks:
        assert blocks[0] == "content_block_start" and blocks[-1] == "content_block_stop"
        assert set(blocks[1:-1]) <= {"content_block_delta"}
    whole = client.messages.create(**kwargs)
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in whole.content]
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens
    # The raw wire: `event:` lines, a ping, JSON data.
    body = {"max_tokens": 3, "messages": USER, "stream": True}
    raw = httpx.post(server.url + "/v1/messages", json=body, timeout=30)
    assert raw.headers["content-type"].startswith("text/event-stream")
    names = [name for name, _ in _frames(raw.content)]
    assert names[:2] == ["message_start", "ping"] and names[-1] == "message_stop"


def test_system_blocks_and_thinking_switch_the_prompt(client):
    def count(**kwargs):
        return client.messages.count_tokens(model="x", messages=USER, **kwargs).input_tokens

    plain = count()
    as_string = count(system="Be brief.\n\nBe kind.")
    as_blocks = count(
        system=[{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}]
    )
    assert as_string == as_blocks > plain
    off = count(thinking={"type": "disabled"})
    on = count(thinking={"type": "enabled", "budget_tokens": 1024})
    assert off > on  # the template closes an empty think block when thinking is off
    r = client.messages.create(
        model="x",
        max_tokens=4,
        messages=USER,
        system=[{"type": "text", "text": "Be brief."}],
        thinking={"type": "disabled"},
        extra_body=GREEDY,
    )
    assert all(b.type == "text" for b in r.content)


def test_tool_loop(client):
    question = [{"role": "user", "content": "Weather in Paris?"}]
    forced = client.messages.create(
        model="x",
        max_tokens=60,
        messages=question,
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
        extra_body=GREEDY,
    )
    assert forced.stop_reason == "tool_use"
    (use,) = [b for b in forced.content if b.type == "tool_use"]
    assert use.id.startswith("toolu_") and use.name == "get_weather"
    assert use.input["city"] in ("Paris", "Rome")
    with client.messages.stream(
        model="x",
        max_tokens=60,
        messages=question,
        tools=[WEATHER],
        tool_choice={"type": "any"},
        extra_body=GREEDY,
    ) as stream:
        partials = [e.partial_json for e in stream if e.type == "input_json"]
        streamed = stream.get_final_message()
    assert streamed.stop_reason == "tool_use" and partials
    assert [b.input for b in streamed.content if b.type == "tool_use"] == [use.input]
    history = question + [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in forced.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny, 21C"}],
        },
    ]
    answer = client.messages.create(
        model="x", max_tokens=6, messages=history, tools=[WEATHER], extra_body=GREEDY
    )
    assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use")
    with_result = client.messages.count_tokens(model="x", messages=history, tools=[WEATHER])
    assert (
        with_result.input_tokens
        > client.messages.count_tokens(model="x", messages=question, tools=[WEATHER]).input_tokens
    )
    by_hand = client.messages.create(model="x", **HISTORY, extra_body=GREEDY)
    assert by_hand.stop_reason in ("end_turn", "max_tokens", "stop_sequence", "tool_use")


def test_stop_sequences(client):
    prompt = [{"role": "user", "content": "Write a story"}]
    base = client.messages.create(model="x", max_tokens=30, messages=prompt, extra_body=GREEDY)
    text = "".join(b.text for b in base.content if b.type == "text")
    if len(text) < 6:
        pytest.skip("the random model stopped too early to pick a stop sequence")
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    cut = client.messages.create(
        model="x", max_tokens=30, messages=prompt, stop_sequences=[stop], extra_body=GREEDY
    )
    assert "".join(b.text for b in cut.content) == text[: text.find(stop)]
    assert (cut.stop_reason, cut.stop_sequence) == ("stop_sequence", stop)
    with client.messages.stream(
        model="x", max_tokens=30, messages=prompt, stop_sequences=[stop], extra_body=GREEDY
    ) as stream:
        streamed = stream.get_final_message()
    assert (streamed.stop_reason, streamed.stop_sequence) == ("stop_sequence", stop)
    assert streamed.content == cut.content


@pytest.mark.parametrize(
    "body, field",
    [
        ('{"messages": [', None),
        ({"messages": USER}, "max_tokens"),
        ({"max_tokens": 4, "messages": [{"role": "user", "content": [USE]}]}, "messages[0]"),
        ({"max_tokens": 4, "messages": [{"role": "user", "content": [IMAGE]}]}, "text-only"),
        ({"max_tokens": 4, "messages": USER, "tools": [{"name": "t"}]}, "input_schema"),
        ({"max_tokens": 10**9, "messages": USER, "top_p": 3}, "top_p"),  # from prep
        (
            {
                "max_tokens": 4,
                "messages": USER,
                "output_config": {"format": {"type": "json_schema", "schema": {"type": 5}}},
            },
            "output_config.format.schema",
        ),
    ],
)
def test_errors_in_anthropic_shape(server, body, field):
    content = body if isinstance(body, str) else json.dumps(body)
    r = httpx.post(
        server.url + "/v1/messages", content=content, headers={"content-type": "application/json"}
    )
    assert r.status_code == 400, r.text
    data = r.json()
    assert data["type"] == "error" and data["error"]["type"] == "invalid_request_error"
    assert field is None or field in data["error"]["message"]


def test_unknown_route_under_messages_in_anthropic_shape(server):
    r = httpx.post(server.url + "/v1/messages/nothing", json={})
    assert r.status_code == 404
    assert r.json() == {
        "type": "error",
        "error": {"type": "not_found_error", "message": "no route for POST /v1/messages/nothing"},
    }


def test_sdk_errors_and_openapi(server, client):
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model="x", max_tokens=0, messages=USER)
    assert info.value.body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in info.value.body["error"]["message"]
    spec = httpx.get(server.url + "/openapi.json").json()
    assert {"/v1/messages", "/v1/messages/count_tokens"} <= set(spec["paths"])
