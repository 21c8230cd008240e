"""Isolated mode: workers write event streams straight to the client's connection."""

from __future__ import annotations

import json
import socket
import time
from urllib.parse import urlsplit

import httpx

from mlxbun_cli.server import handoff

PROMPT = [{"role": "user", "content": "tell me about rivers"}]


def _handoffs(server) -> dict:
    return httpx.get(server.url + "/stats", timeout=10).json()["handoffs"]


def _chat_text(lines: list[str]) -> str:
    text = ""
    for line in lines:
        if line.startswith("data: {"):
            for choice in json.loads(line[6:]).get("choices", []):
                text += choice["delta"].get("content") or ""
    return text


def _http10_post(url: str, path: str, body: dict, extra_headers: str = "") -> bytes:
    """A raw HTTP/1.0 request (no chunked responses: the parent relays)."""
    parts = urlsplit(url)
    payload = json.dumps(body).encode()
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        sock.sendall(
            (
                f"POST {path} HTTP/1.0\r\nHost: {parts.netloc}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
                f"{extra_headers}\r\n"
            ).encode()
            + payload
        )
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data


def test_worker_writes_streams_and_the_connection_stays_usable(server, no_eos_bias):
    body = {
        "messages": PROMPT,
        "max_tokens": 40,
        "temperature": 0,
        "logit_bias": no_eos_bias,
    }
    before = _handoffs(server)
    with httpx.Client(base_url=server.url, timeout=60) as client:  # one kept-alive connection
        streamed = []
        for _ in range(2):
            with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
                assert r.status_code == 200
                assert handoff.HEADER not in r.headers
                lines = list(r.iter_lines())
            assert lines[-2:] == ["data: [DONE]", ""] or lines[-1] == "data: [DONE]"
            streamed.append(_chat_text(lines))
        whole = client.post("/v1/chat/completions", json=body).json()
        with client.stream(
            "POST",
            "/v1/messages",
            json={"messages": PROMPT, "max_tokens": 20, "temperature": 0, "stream": True},
        ) as r:
            events = [line for line in r.iter_lines() if line.startswith("event: ")]
        assert events[0] == "event: message_start" and events[-1] == "event: message_stop"
    text = whole["choices"][0]["message"]["content"]
    assert streamed == [text, text] and whole["usage"]["completion_tokens"] == 40
    after = _handoffs(server)
    assert after["given"] == before["given"] + 3

    # HTTP/1.0 has no chunked bodies: the parent relays, with the same text.
    raw = _http10_post(server.url, "/v1/chat/completions", {**body, "stream": True})
    head, _, payload = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    assert _chat_text(payload.decode().splitlines()) == text
    assert _handoffs(server) == after


def test_a_client_cannot_make_the_worker_wait_for_a_handoff(server):
    body = {"messages": PROMPT, "max_tokens": 3, "stream": True}
    start = time.monotonic()
    raw = _http10_post(
        server.url, "/v1/chat/completions", body, f"{handoff.HEADER}: forged-token\r\n"
    )
    assert raw.startswith(b"HTTP/1.1 200") and b"data: [DONE]" in raw
    assert handoff.HEADER.encode() not in raw.lower()
    assert time.monotonic() - start < handoff.WAIT_S  # the worker never saw the forged offer


def test_responses_streams_are_handed_off_and_the_parent_keeps_the_history(server, openai_client):
    before = _handoffs(server)

    def stream(**extra) -> tuple[list, dict]:
        events = list(
            openai_client.responses.create(
                model="tiny", input="name a river", max_output_tokens=12, stream=True, **extra
            )
        )
        return events, events[-1].response.model_dump()

    events, first = stream()
    assert events[0].type == "response.created" and events[0].response.store is True
    assert first["status"] in ("completed", "incomplete")
    events, second = stream(previous_response_id=first["id"])
    assert events[0].response.previous_response_id == first["id"]
    assert second["previous_response_id"] == first["id"] and second["store"] is True
    assert _handoffs(server)["given"] == before["given"] + 2
    # The parent stored what the worker streamed, though it never saw the stream.
    stored = httpx.get(f"{server.url}/v1/responses/{second['id']}", timeout=10).json()
    assert stored["previous_response_id"] == first["id"] and stored["status"] == second["status"]
    assert [(o["id"], o["content"][0]["text"]) for o in stored["output"]] == [
        (o["id"], o["content"][0]["text"]) for o in second["output"]
    ]


def test_handoffs_resume_after_the_worker_restarts(server):
    import os
    import signal

    from serverutil import wait_for

    def stream_once() -> None:
        body = {"messages": PROMPT, "max_tokens": 5, "stream": True}
        with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as r:
            assert "data: [DONE]" in list(r.iter_lines())

    stream_once()  # the parent now holds a side channel to this worker
    engine = httpx.get(server.url + "/engine", timeout=10).json()["workers"][0]
    os.kill(engine["pid"], signal.SIGKILL)
    wait_for(
        lambda: (
            (w := httpx.get(server.url + "/engine", timeout=10).json()["workers"][0])["state"]
            == "ready"
            and w["pid"] != engine["pid"]
        )
    )
    before = _handoffs(server)
    stream_once()  # same socket path, new worker: the stale channel is replaced
    after = _handoffs(server)
    assert after["given"] == before["given"] + 1 and after["missed"] == before["missed"]
