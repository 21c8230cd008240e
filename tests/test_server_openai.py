"""The OpenAI wire through a real `mlxbun serve` subprocess and the official SDK."""

from __future__ import annotations

import json
import threading
import time

import httpx
import openai
import pytest
from serverutil import worker_stats

USER = [{"role": "user", "content": "Tell me something"}]


def test_chat_non_streaming(openai_client, no_eos_bias):
    r = openai_client.chat.completions.create(
        model="anything", messages=USER, max_tokens=8, temperature=0, logit_bias=no_eos_bias
    )
    choice = r.choices[0]
    assert choice.finish_reason == "length"
    assert isinstance(choice.message.content, str) and choice.message.content
    assert r.usage.completion_tokens == 8
    assert r.usage.prompt_tokens > 0
    assert r.usage.prompt_tokens_details.cached_tokens >= 0


def test_chat_streaming_with_usage(openai_client, no_eos_bias):
    stream = openai_client.chat.completions.create(
        model="x",
        messages=USER,
        max_tokens=6,
        temperature=0,
        logit_bias=no_eos_bias,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finishes == ["length"]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6
    full = openai_client.chat.completions.create(
        model="x", messages=USER, max_tokens=6, temperature=0, logit_bias=no_eos_bias
    )
    assert text == full.choices[0].message.content  # streamed == whole, greedy


def test_seed_replays_over_the_wire(openai_client, no_eos_bias):
    kwargs = dict(
        model="x", messages=USER, max_tokens=12, temperature=0.9, seed=42, logit_bias=no_eos_bias
    )
    a = openai_client.chat.completions.create(**kwargs).choices[0].message.content
    b = openai_client.chat.completions.create(**kwargs).choices[0].message.content
    assert a == b


def test_stop_never_leaks(openai_client, no_eos_bias):
    base = (
        openai_client.completions.create(
            model="x", prompt="The", max_tokens=30, temperature=0, logit_bias=no_eos_bias
        )
        .choices[0]
        .text
    )
    stop = base[len(base) // 2 : len(base) // 2 + 4]
    cut = openai_client.completions.create(
        model="x", prompt="The", max_tokens=30, temperature=0, logit_bias=no_eos_bias, stop=[stop]
    )
    assert cut.choices[0].text == base[: base.find(stop)]
    assert cut.choices[0].finish_reason == "stop"
    streamed = "".join(
        c.choices[0].text
        for c in openai_client.completions.create(
            model="x",
            prompt="The",
            max_tokens=30,
            temperature=0,
            logit_bias=no_eos_bias,
            stop=stop,
            stream=True,
        )
        if c.choices
    )
    assert streamed == cut.choices[0].text


def test_logprobs(openai_client, no_eos_bias):
    r = openai_client.chat.completions.create(
        model="x",
        messages=USER,
        max_tokens=4,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
        logit_bias=no_eos_bias,
    )
    content = r.choices[0].logprobs.content
    assert len(content) == 4
    assert all(len(t.top_logprobs) == 3 and t.logprob <= 0 for t in content)
    assert "".join(t.token for t in content) == r.choices[0].message.content
    c = openai_client.completions.create(
        model="x", prompt="Hi", max_tokens=3, temperature=0, logprobs=2, logit_bias=no_eos_bias
    )
    assert len(c.choices[0].logprobs.tokens) == 3
    assert all(len(t) <= 2 for t in c.choices[0].logprobs.top_logprobs)


def test_thinking_and_tools_are_accepted(openai_client):
    tools = [
        {
            "type": "function",
            "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}},
        }
    ]
    messages = USER + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": "{}"},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "42"},
    ]
    r = openai_client.chat.completions.create(
        model="x",
        messages=messages,
        tools=tools,
        max_tokens=4,
        temperature=0,
        reasoning_effort="none",
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_models_health_stats_openapi(server):
    models = httpx.get(server.url + "/v1/models").json()
    ids = [m["id"] for m in models["data"]]
    current = [m for m in models["data"] if m["current"]]
    assert len(current) == 1 and current[0]["resident"]
    one = httpx.get(server.url + "/v1/models/" + current[0]["id"])
    assert one.status_code == 200 and one.json()["id"] == current[0]["id"]
    assert "demo" in ids
    assert httpx.get(server.url + "/v1/models/no-such-model").status_code == 404
    assert httpx.get(server.url + "/health").json()["status"] == "ok"
    parent = httpx.get(server.url + "/stats").json()
    assert parent["mode"] == "isolated" and parent["residency"]["current"] == current[0]["id"]
    engine = httpx.get(server.url + "/engine").json()
    [worker] = engine["workers"]
    assert worker["state"] == "ready" and worker["pid"] and worker["memory"]["active_bytes"] > 0
    stats = worker_stats(server)
    for key in ("requests", "uptime_s", "engine", "prompt_cache", "memory"):
        assert key in stats
    assert {"queue_depth", "cache_hits", "generated_tokens"} <= set(stats["engine"])
    spec = httpx.get(server.url + "/openapi.json").json()
    assert "/v1/chat/completions" in spec["paths"]


@pytest.mark.parametrize(
    "body, param",
    [
        ('{"messages": [', None),  # malformed JSON
        ("[1, 2]", None),  # not an object
        ({"messages": "hi"}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"messages": USER, "temperature": "hot"}, "temperature"),
        (
            {"messages": USER, "tools": [{"type": "function", "function": {"parameters": {}}}]},
            "tools[0].function.name",
        ),
        ({"messages": USER, "stop": [1, 2]}, "stop"),
        ({"messages": USER, "max_tokens": 0}, "max_tokens"),
        ({"messages": USER, "max_tokens": 1e9}, "max_tokens"),
        ({"messages": USER, "top_p": 3}, "top_p"),
        ({"messages": USER, "n": 3}, "n"),
        ({"messages": USER, "model": 7}, "model"),
        ({"messages": USER, "logit_bias": {"abc": 1}}, "logit_bias"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(server, body, param):
    content = body if isinstance(body, str) else json.dumps(body)
    r = httpx.post(
        server.url + "/v1/chat/completions",
        content=content,
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["message"] and error["type"] == "invalid_request_error"
    assert error["param"] == param


def test_oversize_body_413_and_server_keeps_serving(server, openai_client):
    big = b'{"messages": [{"role": "user", "content": "' + b"x" * (50 * 1024 * 1024) + b'"}]}'
    r = httpx.post(server.url + "/v1/chat/completions", content=big, timeout=60)
    assert r.status_code == 413
    assert r.json()["error"]["type"] == "request_too_large"
    ok = openai_client.chat.completions.create(model="x", messages=USER, max_tokens=2)
    assert ok.choices[0].message is not None


def test_unknown_route_404_in_openai_shape(server):
    r = httpx.get(server.url + "/v1/nothing-here")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"


def test_sdk_raises_a_proper_error(openai_client):
    with pytest.raises(openai.BadRequestError) as info:
        openai_client.chat.completions.create(model="x", messages=[], max_tokens=2)
    assert "messages" in str(info.value)


def _stats(server):
    return worker_stats(server)


def test_client_disconnect_cancels_the_sequence(server, no_eos_bias):
    before = _stats(server)
    body = {
        "messages": USER,
        "max_tokens": 3000,
        "temperature": 0,
        "stream": True,
        "logit_bias": no_eos_bias,
    }
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=30) as r:
        lines = 0
        for line in r.iter_lines():
            if line.startswith("data: "):
                lines += 1
            if lines >= 5:
                break
    deadline = time.time() + 10
    while time.time() < deadline:
        after = _stats(server)
        if (
            after["engine"]["cancelled"] > before["engine"]["cancelled"]
            and after["engine"]["active"] == 0
        ):
            break
        time.sleep(0.05)
    assert after["engine"]["cancelled"] == before["engine"]["cancelled"] + 1
    assert after["client_disconnects"] >= before["client_disconnects"] + 1
    assert after["engine"]["generated_tokens"] - before["engine"]["generated_tokens"] < 1000


def test_concurrent_streams_share_the_batch(server, no_eos_bias):
    results: dict[int, str] = {}
    seen_active = []

    def one(i: int) -> None:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
        stream = client.chat.completions.create(
            model="x",
            messages=[{"role": "user", "content": f"request {i}"}],
            max_tokens=400,
            temperature=0,
            logit_bias=no_eos_bias,
            stream=True,
        )
        results[i] = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        client.close()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        seen_active.append(_stats(server)["engine"]["active"])
        time.sleep(0.01)
    for t in threads:
        t.join()
    assert len(results) == 4 and all(results.values())
    assert max(seen_active) >= 2
