"""The OpenAI Responses wire: a real `mlxbun serve`, the official SDK, and the store."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from mlxbun_cli.server.responses_store import ResponseStore

NO_THINK = {"effort": "none"}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 10}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


@pytest.fixture
def greedy(no_eos_bias):
    """Deterministic, thinking off, never stopping early (logit_bias: an mlxbun extension)."""
    return dict(
        model="x",
        temperature=0,
        reasoning=NO_THINK,
        max_output_tokens=6,
        extra_body={"logit_bias": no_eos_bias},
    )


@pytest.fixture
def eos_now(tiny_model_dir):
    """A bias that makes the model stop at once: a `completed` response."""
    ids = json.loads((tiny_model_dir / "generation_config.json").read_text())["eos_token_id"]
    return {"logit_bias": {str(i): 100 for i in ids}}


def _post(server, body):
    return httpx.post(server.url + "/v1/responses", json=body, timeout=60)


def test_string_input(openai_client, greedy):
    r = openai_client.responses.create(input="Tell me something", **greedy)
    assert r.id.startswith("resp_") and r.object == "response"
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    [message] = r.output
    assert message.type == "message" and message.role == "assistant"
    assert message.status == "incomplete" and message.id.startswith("msg_")
    assert message.content[0].type == "output_text" and message.content[0].annotations == []
    assert r.output_text and r.output_text == message.content[0].text
    assert r.usage.output_tokens == 6 and r.usage.input_tokens > 0
    assert r.usage.total_tokens == r.usage.input_tokens + 6
    assert r.usage.input_tokens_details.cached_tokens >= 0
    assert r.usage.output_tokens_details.reasoning_tokens == 0
    assert r.previous_response_id is None and r.instructions is None
    assert r.max_output_tokens == 6 and r.store is True


def test_completed_status(openai_client, eos_now):
    r = openai_client.responses.create(
        model="x", input="hi", reasoning=NO_THINK, max_output_tokens=8, extra_body=eos_now
    )
    assert r.status == "completed" and r.incomplete_details is None
    assert r.output[0].type == "message" and r.output[0].status == "completed"
    assert r.output_text == ""


def test_item_list_and_instructions(openai_client, greedy):
    items = [
        {"role": "user", "content": "Hello there"},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Hi! How can I help?"}],
        },
        {"role": "user", "content": [{"type": "input_text", "text": "Tell me a story"}]},
    ]
    plain = openai_client.responses.create(input=items, **greedy)
    told = openai_client.responses.create(input=items, instructions="Be brief.", **greedy)
    short = openai_client.responses.create(input="Tell me a story", **greedy)
    assert told.instructions == "Be brief."
    assert told.usage.input_tokens > plain.usage.input_tokens > short.usage.input_tokens
    # a developer message is a system message: the same prompt as instructions
    dev = [{"role": "developer", "content": "Be brief."}] + items
    assert openai_client.responses.create(input=dev, **greedy).output_text == told.output_text


def test_three_turns_via_previous_response_id(openai_client, greedy):
    r1 = openai_client.responses.create(
        input="My name is Ada.", instructions="You are a parrot.", **greedy
    )
    r2 = openai_client.responses.create(
        input="What is my name?", previous_response_id=r1.id, **greedy
    )
    r3 = openai_client.responses.create(input="Say it again.", previous_response_id=r2.id, **greedy)
    assert r1.usage.input_tokens < r2.usage.input_tokens < r3.usage.input_tokens
    assert r2.previous_response_id == r1.id and r3.previous_response_id == r2.id
    assert r2.instructions is None  # instructions are not carried over
    # Turn 3's prompt is exactly turn 1 + its answer + turn 2 + its answer + turn 3,
    # without turn 1's instructions: a hand-built replay renders the same prompt.
    replay = [
        {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": r1.output_text},
        {"role": "user", "content": "What is my name?"},
        {"role": "assistant", "content": r2.output_text},
        {"role": "user", "content": "Say it again."},
    ]
    manual = openai_client.responses.create(input=replay, store=False, **greedy)
    assert manual.usage.input_tokens == r3.usage.input_tokens
    assert manual.output_text == r3.output_text


def test_get_and_delete(openai_client, greedy):
    r = openai_client.responses.create(input="Remember this", **greedy)
    got = openai_client.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == r.output_text and got.usage == r.usage
    deleted = openai_client.responses.delete(r.id)  # the SDK returns None for a 2xx
    assert deleted is None
    with pytest.raises(openai.NotFoundError):
        openai_client.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        openai_client.responses.delete(r.id)


def test_delete_body(server, greedy):
    r = _post(server, {"input": "x", "max_output_tokens": 2}).json()
    d = httpx.delete(f"{server.url}/v1/responses/{r['id']}")
    assert d.status_code == 200
    assert d.json() == {"id": r["id"], "object": "response", "deleted": True}


def test_store_false_is_not_retrievable(openai_client, greedy):
    r = openai_client.responses.create(input="Forget this", store=False, **greedy)
    assert r.store is False
    with pytest.raises(openai.NotFoundError):
        openai_client.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError) as info:
        openai_client.responses.create(input="and?", previous_response_id=r.id, **greedy)
    assert info.value.body["param"] == "previous_response_id"
    assert info.value.body["code"] == "previous_response_not_found"


@pytest.mark.parametrize(
    "body, status, param",
    [
        # the container first (400), then the lookup (404), then everything else
        ({"input": "x", "previous_response_id": 42}, 400, "previous_response_id"),
        ({"input": "x", "previous_response_id": "chatcmpl-1"}, 400, "previous_response_id"),
        ({"input": 5, "previous_response_id": "resp_missing"}, 400, "input"),
        ({"input": "x", "previous_response_id": "resp_missing"}, 404, "previous_response_id"),
        ({"input": "x", "previous_response_id": "resp_missing", "top_p": 7}, 404, None),
        ({"input": "x", "top_p": "high"}, 400, "top_p"),
        ({"input": "x", "top_p": 7}, 400, "top_p"),
        ({}, 400, "input"),
        ({"input": ""}, 400, "input"),
        ({"input": []}, 400, "input"),
        ({"input": [{"type": "bogus"}]}, 400, "input[0].type"),
        ({"input": [{"role": "wizard", "content": "x"}]}, 400, "input[0].role"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
            400,
            "input[0].content[0].type",
        ),
        ({"input": [{"type": "function_call", "name": "f"}]}, 400, "input[0].call_id"),
        ({"input": [{"type": "function_call_output", "call_id": "c"}]}, 400, "input[0].output"),
        ({"input": "x", "instructions": 3}, 400, "instructions"),
        ({"input": "x", "max_output_tokens": 0}, 400, "max_output_tokens"),
        ({"input": "x", "max_output_tokens": 1.5}, 400, "max_output_tokens"),
        ({"input": "x", "reasoning": {"effort": "huge"}}, 400, "reasoning.effort"),
        ({"input": "x", "text": {"format": {"type": "json_object"}}}, 400, "text.format"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, 400, "tools[0].type"),
        ({"input": "x", "tools": [{"type": "function"}]}, 400, "tools[0].name"),
        ({"input": "x", "tool_choice": "required"}, 400, "tool_choice"),
        (
            {"input": "x", "tools": [WEATHER], "tool_choice": {"type": "function"}},
            400,
            "tool_choice.name",
        ),
        ({"input": "x", "store": "yes"}, 400, "store"),
        ({"input": "x", "background": True}, 400, "background"),
    ],
)
def test_errors_name_the_field(server, body, status, param):
    r = _post(server, body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    if param is not None:
        assert error["param"] == param


def test_bad_json_and_unknown_ids(server):
    r = httpx.post(server.url + "/v1/responses", content=b'{"input": ')
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert httpx.get(server.url + "/v1/responses/resp_nothing").status_code == 404
    assert httpx.delete(server.url + "/v1/responses/resp_nothing").status_code == 404


def test_text_format_json_schema_is_not_supported_yet(openai_client):
    with pytest.raises(openai.BadRequestError) as info:
        openai_client.responses.create(
            model="x",
            input="x",
            text={"format": {"type": "json_schema", "name": "p", "schema": {"type": "object"}}},
        )
    assert "not supported yet" in str(info.value) and info.value.body["param"] == "text.format"


def _sse(server, body):
    """(event name, data) pairs of a raw stream."""
    out, name = [], None
    with httpx.stream("POST", server.url + "/v1/responses", json=body, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                out.append((name, json.loads(line[6:])))
    return out


def test_streaming_event_order(server, openai_client, greedy, no_eos_bias):
    body = {
        "input": "Tell me something",
        "max_output_tokens": 6,
        "temperature": 0,
        "reasoning": NO_THINK,
        "logit_bias": no_eos_bias,
        "stream": True,
    }
    events = _sse(server, body)
    assert all(name == data["type"] for name, data in events)
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    kinds = [d["type"] for _, d in events]
    deltas = kinds.count("response.output_text.delta")
    assert deltas >= 1
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * deltas,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",  # max_output_tokens: OpenAI's terminal event for it
    ]
    data = [d for _, d in events]
    assert data[0]["response"]["status"] == "in_progress" and data[0]["response"]["output"] == []
    text = "".join(d["delta"] for d in data if d["type"] == "response.output_text.delta")
    final = data[-1]["response"]
    assert final["status"] == "incomplete" and final["usage"]["output_tokens"] == 6
    assert final["output"][0]["content"][0]["text"] == text == data[-4]["text"]
    # streamed == whole (greedy), and the streamed response was stored
    whole = openai_client.responses.create(input="Tell me something", **greedy)
    assert whole.output_text == text
    assert openai_client.responses.retrieve(final["id"]).output_text == text


def test_sdk_streaming(openai_client, eos_now):
    stream = openai_client.responses.create(
        model="x",
        input="hi",
        reasoning=NO_THINK,
        max_output_tokens=8,
        stream=True,
        extra_body=eos_now,
    )
    events = list(stream)
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert events[-1].response.status == "completed"
    with openai_client.responses.stream(
        model="x", input="hi", reasoning=NO_THINK, max_output_tokens=8, extra_body=eos_now
    ) as s:
        kinds = [e.type for e in s]
        final = s.get_final_response()
    assert kinds[-1] == "response.completed" and final.status == "completed"
    assert final.output_text == ""


def test_forced_function_call_streams_and_round_trips(openai_client):
    """tool_choice forces a real call (constrained decoding); its output resumes the turn."""
    common = dict(model="x", reasoning=NO_THINK, temperature=0.7, extra_body={"seed": 1})
    with openai_client.responses.stream(
        input="weather in Paris?",
        tools=[WEATHER],
        tool_choice="required",
        max_output_tokens=80,
        **common,
    ) as s:
        kinds = [e.type for e in s]
        final = s.get_final_response()
    assert final.status == "completed"
    [call] = [item for item in final.output if item.type == "function_call"]
    assert call.name == "get_weather" and call.status == "completed"
    assert call.call_id and call.id.startswith("fc_")
    assert "city" in json.loads(call.arguments)
    assert "response.function_call_arguments.delta" in kinds
    assert "response.function_call_arguments.done" in kinds
    after = openai_client.responses.create(
        previous_response_id=final.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
        tools=[WEATHER],
        max_output_tokens=4,
        **common,
    )
    assert after.usage.input_tokens > final.usage.input_tokens


def test_hand_built_function_call_round_trip(openai_client, greedy):
    question = {"role": "user", "content": "weather in Paris?"}
    call = {
        "type": "function_call",
        "call_id": "call_abc",
        "name": "get_weather",
        "arguments": '{"city": "Paris"}',
    }
    output = {"type": "function_call_output", "call_id": "call_abc", "output": "sunny, 21C"}
    bare = openai_client.responses.create(input=[question], tools=[WEATHER], **greedy)
    full = openai_client.responses.create(
        input=[question, call, output], tools=[WEATHER], tool_choice="auto", **greedy
    )
    assert full.usage.input_tokens > bare.usage.input_tokens
    assert full.tools[0].name == "get_weather" and full.tool_choice == "auto"
    # the same turn resumed: the stored conversation keeps the call and its output
    again = openai_client.responses.create(
        input="thanks", previous_response_id=full.id, tools=[WEATHER], **greedy
    )
    assert again.usage.input_tokens > full.usage.input_tokens + 6


def test_reasoning_output_item(openai_client, greedy):
    # A final assistant message is a prefill; one that opens <think> makes the reply thinking.
    items = [
        {"role": "user", "content": "Think first."},
        {"role": "assistant", "content": "<think>\nLet me"},
    ]
    r = openai_client.responses.create(input=items, **{**greedy, "reasoning": {"effort": "high"}})
    assert r.output[0].type == "reasoning" and r.output[0].id.startswith("rs_")
    text = r.output[0].content[0].text
    assert text and r.output[0].content[0].type == "reasoning_text"
    assert r.usage.output_tokens_details.reasoning_tokens > 0
    with openai_client.responses.stream(
        input=items, **{**greedy, "reasoning": {"effort": "high"}}
    ) as s:
        kinds = [e.type for e in s]
        final = s.get_final_response() if kinds[-1] == "response.completed" else None
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert "response.reasoning_text.delta" in kinds and "response.reasoning_text.done" in kinds
    assert final is None and kinds[-1] == "response.incomplete"
    assert r.output[-1].type == "message"  # always a message, even an empty one
    # the reasoning item replays as input (it goes back to the template as reasoning_content)
    back = openai_client.responses.create(
        input=[
            {"role": "user", "content": "Think first."},
            {
                "type": "reasoning",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": text}],
            },
            {"role": "assistant", "content": "Done."},
            {"role": "user", "content": "And?"},
        ],
        **greedy,
    )
    assert back.status == "incomplete"


def test_logprobs(openai_client, greedy):
    r = openai_client.responses.create(
        input="Hi", include=["message.output_text.logprobs"], top_logprobs=2, **greedy
    )
    logprobs = r.output[0].content[0].logprobs
    assert len(logprobs) == 6 and "".join(t.token for t in logprobs) == r.output_text
    assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in logprobs)


def test_stats_show_the_store(server, greedy, openai_client):
    openai_client.responses.create(input="count me", **greedy)
    stats = httpx.get(server.url + "/stats").json()
    # in process: the server's own; isolated: the store of the worker that answered
    store = stats.get("response_store") or next(
        w["response_store"] for w in stats["workers"].values() if w
    )
    assert store["entries"] >= 1 and store["bytes"] > 0
    assert store["max_entries"] == 1000 and store["max_bytes"] == 64 * 1024 * 1024
    assert store["ttl_s"] == 3600 and "evictions" in store
    spec = httpx.get(server.url + "/openapi.json").json()
    assert "/v1/responses" in spec["paths"] and "/v1/responses/{response_id}" in spec["paths"]


# -- the store itself ------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _resp(rid: str, pad: int = 0) -> dict:
    return {"id": rid, "object": "response", "output": [], "pad": "x" * pad}


def test_store_ttl():
    clock = Clock()
    store = ResponseStore(max_entries=10, max_bytes=10**6, ttl_s=60, clock=clock)
    store.put(_resp("resp_a"), [{"type": "message"}])
    clock.now += 30
    store.put(_resp("resp_b"), [])
    assert store.get("resp_a").items == [{"type": "message"}]
    clock.now += 31  # a is 61 s old, b 31 s
    assert store.get("resp_a") is None
    assert store.get("resp_b") is not None
    clock.now += 30
    stats = store.stats()
    assert stats["entries"] == 0 and stats["bytes"] == 0 and stats["expirations"] == 2
    assert not store.delete("resp_b")


def test_store_bytes_and_entries_evict_lru():
    store = ResponseStore(max_entries=3, max_bytes=3000, ttl_s=0, clock=Clock())
    for name in "abc":
        assert store.put(_resp(f"resp_{name}", 800), [])
    assert store.get("resp_a") is not None  # a is now the most recently used
    store.put(_resp("resp_d", 800), [])  # over 3000 bytes: b (LRU) goes
    assert store.get("resp_b") is None and store.get("resp_a") is not None
    assert store.stats()["evictions"] == 1 and store.total_bytes <= 3000
    small = ResponseStore(max_entries=2, max_bytes=10**6, clock=Clock())
    for name in "xyz":
        small.put(_resp(f"resp_{name}"), [])
    assert len(small) == 2 and small.get("resp_x") is None and small.evictions == 1
    assert not store.put(_resp("resp_huge", 5000), [])  # never fits
    assert store.stats()["rejected"] == 1 and store.get("resp_a") is not None
    assert store.put(_resp("resp_a", 10), []) and store.total_bytes <= 3000  # replace
    assert store.delete("resp_a") and store.get("resp_a") is None


# -- store limits through the app (in process: cheap limits, a fake clock) ------


@pytest.fixture
def app_client(tiny_loaded):
    from starlette.testclient import TestClient

    from mlxbun_cli.server.app import create_app
    from mlxbun_cli.server.state import ServeOptions, ServerState

    options = ServeOptions()
    state = ServerState(options, tiny_loaded.ref)
    state.loaded = tiny_loaded  # shared with other tests: no lifespan, so it is not closed
    client = openai.OpenAI(
        base_url="http://testserver/v1",
        api_key="x",
        max_retries=0,
        http_client=TestClient(create_app(state)),
    )
    return state, client


def test_store_eviction_through_the_app(app_client):
    state, client = app_client
    clock = Clock()
    state.responses = ResponseStore(ttl_s=60, clock=clock)
    kw = dict(model="x", max_output_tokens=3, temperature=0, reasoning=NO_THINK)
    first = client.responses.create(input="the first one", **kw)
    state.responses.max_bytes = state.responses.total_bytes * 3 // 2  # room for one
    second = client.responses.create(input="the second one", **kw)
    with pytest.raises(openai.NotFoundError):  # pushed out by bytes
        client.responses.retrieve(first.id)
    assert client.responses.retrieve(second.id).id == second.id
    assert state.responses.stats()["evictions"] == 1
    clock.now += 61
    with pytest.raises(openai.NotFoundError):  # expired
        client.responses.create(input="more", previous_response_id=second.id, **kw)
    assert state.responses.stats()["expirations"] == 1


def test_shutdown_cancel_ends_with_an_error(app_client, no_eos_bias):
    state, client = app_client
    state.options.shutdown_grace = 0
    state.draining.set()  # shutting down: running requests are cancelled at once
    kw = dict(model="x", input="hi", max_output_tokens=2000, extra_body={"logit_bias": no_eos_bias})
    with pytest.raises(openai.APIStatusError) as info:
        client.responses.create(**kw)
    assert info.value.status_code == 503 and info.value.body["type"] == "engine_unavailable"
    events = list(client.responses.create(stream=True, **kw))
    assert events[0].type == "response.created" and events[-1].type == "error"
    assert events[-1].code == "engine_unavailable" and events[-1].param is None
