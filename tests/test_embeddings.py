"""/v1/embeddings: mean-pooled final hidden states, through the official openai SDK."""

from __future__ import annotations

import threading

import httpx
import mlx.core as mx
import openai
import pytest

from mlxbun_cli.engine import embeddings
from mlxbun_cli.engine.types import EngineRequest, PenaltyOptions, TokenStep
from mlxbun_cli.prep.templates import encode_prompt


def _reference(loaded, tokens: list[int]) -> list[float]:
    """The same vector computed in one pass, without the engine's chunking."""
    hidden = loaded.model.model(mx.array([tokens]))[0].astype(mx.float32)
    mean = hidden.mean(axis=0)
    return (mean / mx.linalg.norm(mean)).tolist()


def _close(a: list[float], b: list[float], tol: float = 1e-4) -> bool:
    return len(a) == len(b) and max(abs(x - y) for x, y in zip(a, b, strict=True)) < tol


def test_vectors_are_the_mean_pooled_hidden_states(tiny_loaded, monkeypatch):
    tokens = encode_prompt(tiny_loaded.tokenizer, "the river at dawn " * 9)
    want = _reference(tiny_loaded, tokens)
    assert _close(embeddings.embed_one(tiny_loaded.model, tokens), want)
    monkeypatch.setattr(embeddings, "CHUNK_TOKENS", 7)  # a long input, in pieces
    assert len(tokens) > 7 * 3
    assert _close(embeddings.embed_one(tiny_loaded.model, tokens), want)


def test_engine_calls_run_between_steps_and_report_errors(tiny_loaded):
    scheduler = tiny_loaded.scheduler
    bias = PenaltyOptions(logit_bias={t: -100.0 for t in tiny_loaded.tokenizer.eos_token_ids})
    _, stream = scheduler.stream(EngineRequest(list(range(3, 20)), max_tokens=80, penalties=bias))
    next(stream)  # decoding
    where = scheduler.call(threading.current_thread).result(timeout=10)
    assert where.name == "mlxbun-scheduler"
    failing = scheduler.call(lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        failing.result(timeout=10)
    steps = [e for e in stream if isinstance(e, TokenStep)]
    assert len(steps) == 79  # the running request was not disturbed


@pytest.fixture
def client(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    yield client
    client.close()


def test_openai_sdk_embeddings(client, server, tiny_model_dir, tiny_loaded):
    texts = ["the river at dawn", "the river at dawn", "a cold mountain pass"]
    result = client.embeddings.create(model="tiny", input=texts)  # the SDK asks for base64
    vectors = [d.embedding for d in sorted(result.data, key=lambda d: d.index)]
    assert len(vectors) == 3 and all(len(v) == 64 for v in vectors)
    assert all(abs(sum(x * x for x in v) - 1) < 1e-4 for v in vectors)
    assert vectors[0] == vectors[1] and vectors[0] != vectors[2]
    tokens = encode_prompt(tiny_loaded.tokenizer, texts[0])
    assert result.usage.prompt_tokens == 2 * len(tokens) + len(
        encode_prompt(tiny_loaded.tokenizer, texts[2])
    )
    assert _close(vectors[0], _reference(tiny_loaded, tokens))
    # Floats on the wire, token ids as input, and one string: the same vector.
    floats = client.embeddings.create(model="tiny", input=texts[0], encoding_format="float")
    assert _close(floats.data[0].embedding, vectors[0], 1e-6)
    by_ids = client.embeddings.create(model="tiny", input=[tokens], encoding_format="float")
    assert _close(by_ids.data[0].embedding, vectors[0], 1e-6)
    assert client.embeddings.create(model="tiny", input="x", dimensions=64).data


@pytest.mark.parametrize(
    "body, param, says",
    [
        ({}, "input", "input must be"),
        ({"input": []}, "input", "must not be empty"),
        ({"input": ""}, "input", "input[0]"),
        ({"input": ["ok", 3]}, "input", "input[1]"),
        ({"input": [[1, 2], []]}, "input", "input[1]"),
        ({"input": [[1, 99999]]}, "input", "outside the vocabulary"),
        ({"input": "x" * 30000}, "input", "context"),
        ({"input": "x", "encoding_format": "hex"}, "encoding_format", "float or base64"),
        ({"input": "x", "dimensions": 0}, "dimensions", "positive"),
        ({"input": "x", "dimensions": 8}, "dimensions", "must be 64"),
    ],
)
def test_bad_embedding_requests_are_400s_naming_the_field(server, body, param, says):
    response = httpx.post(server.url + "/v1/embeddings", json=body, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and says in error["message"]
    assert httpx.get(server.url + "/health", timeout=10).status_code == 200


def test_waiting_calls_let_decoding_and_newcomers_through(tiny_loaded):
    import time

    scheduler = tiny_loaded.scheduler
    bias = PenaltyOptions(logit_bias={t: -100.0 for t in tiny_loaded.tokenizer.eos_token_ids})
    _, stream = scheduler.stream(EngineRequest(list(range(3, 20)), max_tokens=60, penalties=bias))
    next(stream)
    seen = [scheduler.call(lambda: scheduler.stats.generated_tokens) for _ in range(5)]
    counts = [f.result(timeout=10) for f in seen]
    assert counts == sorted(set(counts))  # a decode step between any two calls
    list(stream)
    # Idle engine, slow calls waiting: a new request starts after the one running.
    slow = [scheduler.call(lambda: time.sleep(0.2)) for _ in range(5)]
    finished: list[float] = []
    for f in slow:
        f.add_done_callback(lambda _: finished.append(time.perf_counter()))
    time.sleep(0.05)
    _, late = scheduler.stream(EngineRequest(list(range(3, 9)), max_tokens=3, penalties=bias))
    next(late)
    first_token = time.perf_counter()
    list(late)
    for f in slow:
        f.result(timeout=10)
    assert sum(t < first_token for t in finished) == 1  # only the call already running


def _stats(server) -> dict:
    data = httpx.get(server.url + "/stats", timeout=10).json()
    return next(iter(data.get("workers", {}).values()), data)


def _hang_up_after(server, path: str, body: dict, seconds: float) -> None:
    import json
    import socket
    import time
    from urllib.parse import urlsplit

    url = urlsplit(server.url)
    raw = json.dumps(body).encode()
    with socket.create_connection((url.hostname, url.port)) as sock:
        head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        sock.sendall(head.encode() + b"Content-Length: %d\r\n\r\n" % len(raw) + raw)
        time.sleep(seconds)


def _until(check, timeout: float = 10) -> bool:
    import time

    deadline = time.time() + timeout
    while time.time() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return False


def test_a_client_that_hangs_up_stops_its_whole_answer_requests(server, no_eos_bias):
    # Embeddings: 40 long inputs, seconds of work, abandoned after 0.3 s.
    before = _stats(server)["client_disconnects"]
    inputs = [[5 + (i * 7 + j) % 900 for j in range(3000)] for i in range(40)]
    _hang_up_after(server, "/v1/embeddings", {"input": inputs}, 0.3)
    assert _until(lambda: _stats(server)["client_disconnects"] > before)
    # A non-streamed chat that would run 4000 tokens (seconds), abandoned: it stops.
    before = _stats(server)["client_disconnects"]
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4000,
        "logit_bias": no_eos_bias,
    }
    _hang_up_after(server, "/v1/chat/completions", body, 0.5)
    assert _until(lambda: _stats(server)["client_disconnects"] > before)
    assert _until(lambda: _stats(server)["engine"]["active"] == 0, timeout=2)
    reply = httpx.post(
        server.url + "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
        timeout=30,
    )
    assert reply.status_code == 200


def test_bodies_nested_too_deep_are_400s(server):
    body = '{"input": ' + "[" * 100_000 + "]" * 100_000 + "}"
    for path in ("/v1/embeddings", "/v1/chat/completions", "/v1/messages", "/v1/responses"):
        response = httpx.post(
            server.url + path, content=body, headers={"content-type": "application/json"}
        )
        assert response.status_code == 400, (path, response.text[:200])
