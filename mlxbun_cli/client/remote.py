"""RemoteBackend: the same neutral events, from a running server over HTTP."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from typing import Any

from mlxbun_cli.client.backend import ModelInfo
from mlxbun_cli.engine.types import Usage
from mlxbun_cli.errors import BackendUnavailableError, InputError
from mlxbun_cli.prep.events import (
    Done,
    OutputEvent,
    ReasoningDelta,
    TextDelta,
    TokenLogprob,
    ToolCallEvent,
)
from mlxbun_cli.prep.request import GenerationRequest
from mlxbun_cli.prep.tools import ToolCall

_SAMPLING_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "xtc_probability",
    "xtc_threshold",
    "repetition_penalty",
    "repetition_context_size",
    "presence_penalty",
    "frequency_penalty",
    "seed",
    "max_tokens",
)


def request_body(req: GenerationRequest, model: str | None) -> tuple[str, dict[str, Any]]:
    """The OpenAI-wire path and body that carry this neutral request."""
    body: dict[str, Any] = {
        k: getattr(req, k) for k in _SAMPLING_FIELDS if getattr(req, k) is not None
    }
    if model:
        body["model"] = model
    if req.logit_bias:
        body["logit_bias"] = {str(k): v for k, v in req.logit_bias.items()}
    if req.stop:
        body["stop"] = req.stop
    if req.session_id:
        body["session_id"] = req.session_id
    if req.grammar is not None:
        body["grammar"] = req.grammar
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    if req.messages is None:
        body["prompt"] = req.prompt
        if req.logprobs:
            body["logprobs"] = req.top_logprobs
        return "/v1/completions", body
    body["messages"] = req.messages
    if req.tools:
        body["tools"] = req.tools
    if req.tool_choice is not None:
        body["tool_choice"] = req.tool_choice
    if req.response_format is not None:
        body["response_format"] = req.response_format
    if req.chat_template_kwargs:
        body["chat_template_kwargs"] = req.chat_template_kwargs
    if req.reasoning_effort:
        body["reasoning_effort"] = req.reasoning_effort
    if req.thinking_budget:
        body["thinking_budget"] = req.thinking_budget
    if req.logprobs:
        body["logprobs"] = True
        body["top_logprobs"] = req.top_logprobs
    return "/v1/chat/completions", body


def usage_from(data: dict[str, Any]) -> Usage:
    timings = data.get("timings") or {}
    completion = int(data.get("completion_tokens") or 0)
    prompt = int(data.get("prompt_tokens") or 0)
    cached = int((data.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    ttft = float(timings.get("time_to_first_token_s") or 0.0)
    gen_tps = float(timings.get("generation_tps") or 0.0)
    prompt_tps = float(timings.get("prompt_tps") or 0.0)
    return Usage(
        prompt_tokens=prompt,
        cached_tokens=cached,
        completion_tokens=completion,
        prompt_seconds=(prompt - cached) / prompt_tps if prompt_tps else ttft,
        generation_seconds=(completion - 1) / gen_tps if gen_tps and completion > 1 else 0.0,
        peak_memory_bytes=int(timings.get("peak_memory_bytes") or 0),
    )


def seed_from(fingerprint: Any) -> int | None:
    if isinstance(fingerprint, str) and fingerprint.startswith("mlxbun-seed-"):
        try:
            return int(fingerprint.rsplit("-", 1)[1])
        except ValueError:
            return None
    return None


_WARNING = re.compile(r'299 mlxbun "([^"]*)"')  # the server drops quotes inside


def warnings_from(header: str | None) -> list[str]:
    """The server's `Warning: 299 mlxbun "..."` texts (routes_openai.prepared_headers)."""
    return _WARNING.findall(header or "")


class RemoteStream:
    def __init__(self, backend: RemoteBackend, path: str, body: dict[str, Any]) -> None:
        self._backend = backend
        self._path = path
        self._body = body
        self._cancelled = threading.Event()
        self._response: Any = None
        self._started = False
        self.warnings: list[str] = []

    def cancel(self) -> None:
        self._cancelled.set()
        response = self._response
        if response is not None:
            try:
                response.close()  # the server sees the hang-up and stops the sequence
            except Exception:
                pass

    def __iter__(self) -> Iterator[OutputEvent]:
        if self._started:
            # Iterated again after an interrupt: the request is over, never resent.
            yield Done("cancelled", Usage(), [], None, None)
            return
        self._started = True
        yield from self._events()

    def _events(self) -> Iterator[OutputEvent]:
        import httpx

        url = self._backend.url
        finish: str | None = None
        usage = Usage()
        seed: int | None = None
        calls: list[ToolCall] = []
        try:
            with self._backend.client.stream("POST", self._path, json=self._body) as response:
                self._response = response
                if response.status_code >= 400:
                    response.read()
                    raise _http_error(response)
                self.warnings = warnings_from(response.headers.get("warning"))
                for line in response.iter_lines():
                    if self._cancelled.is_set():
                        break
                    if not line.startswith("data: "):
                        continue
                    payload = line[6:]
                    if payload == "[DONE]":
                        break
                    chunk = json.loads(payload)
                    if "error" in chunk:
                        error = chunk["error"] or {}
                        reason = "cancelled" if error.get("type") == "server_shutdown" else "error"
                        yield Done(reason, usage, calls, error.get("message"), seed)
                        return
                    seed = seed_from(chunk.get("system_fingerprint")) or seed
                    if chunk.get("usage"):
                        usage = usage_from(chunk["usage"])
                    for choice in chunk.get("choices") or []:
                        yield from self._choice_events(choice, calls)
                        finish = choice.get("finish_reason") or finish
        except (httpx.TransportError, httpx.StreamError) as exc:
            if self._cancelled.is_set():
                yield Done("cancelled", usage, calls, None, seed)
                return
            raise BackendUnavailableError(
                f"the mlxbun server at {url} stopped answering ({type(exc).__name__})",
                hint="`mlxbun daemon status` shows whether it still runs; --local runs in process",
            ) from exc
        if self._cancelled.is_set():
            yield Done("cancelled", usage, calls, None, seed)
            return
        yield Done(finish or "stop", usage, calls, None, seed)

    @staticmethod
    def _choice_events(choice: dict[str, Any], calls: list[ToolCall]) -> Iterator[OutputEvent]:
        logprobs = choice.get("logprobs") or {}
        for entry in logprobs.get("content") or []:
            top = [(t["token"], t["logprob"]) for t in entry.get("top_logprobs") or []]
            yield TokenLogprob(-1, entry["token"], entry["logprob"], top or None)
        if "text" in choice:  # completions wire
            tokens = logprobs.get("tokens") or []
            for i, token in enumerate(tokens):
                top_map = (logprobs.get("top_logprobs") or [{}] * len(tokens))[i] or {}
                yield TokenLogprob(
                    -1, token, logprobs["token_logprobs"][i], list(top_map.items()) or None
                )
            if choice["text"]:
                yield TextDelta(choice["text"])
            return
        delta = choice.get("delta") or {}
        if delta.get("reasoning_content"):
            yield ReasoningDelta(delta["reasoning_content"])
        if delta.get("content"):
            yield TextDelta(delta["content"])
        for call in delta.get("tool_calls") or []:
            fn = call.get("function") or {}
            tool_call = ToolCall(
                call.get("id") or "", fn.get("name") or "", fn.get("arguments") or ""
            )
            calls.append(tool_call)
            yield ToolCallEvent(call.get("index", len(calls) - 1), tool_call)


def _http_error(response: Any) -> Exception:
    try:
        error = response.json().get("error") or {}
        message = error.get("message") or response.text
    except ValueError:
        message = response.text
    if response.status_code in (400, 404, 413, 422):
        return InputError(message)
    if response.status_code == 401:
        return InputError(
            f"the server refused the API key: {message}",
            hint="set MLXBUN_API_KEY or `mlxbun config set api_key KEY`",
        )
    return BackendUnavailableError(f"the server answered {response.status_code}: {message}")


class RemoteBackend:
    def __init__(
        self,
        url: str,
        *,
        model: str | None = None,
        api_key: str | None = None,
        transport: Any = None,
        timeout: float = 600.0,
    ) -> None:
        import httpx

        self.url = url.rstrip("/")
        self.model = model
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(
            base_url=self.url,
            headers=headers,
            transport=transport,
            timeout=httpx.Timeout(timeout, connect=5.0),
        )
        self._info: ModelInfo | None = None

    def model_info(self) -> ModelInfo:
        import httpx

        if self._info is None:
            try:
                health = self.client.get("/health", timeout=5.0).json()
            except (httpx.HTTPError, ValueError) as exc:
                raise BackendUnavailableError(
                    f"no mlxbun server answers at {self.url} ({type(exc).__name__})",
                    hint="start one with `mlxbun serve -d`, or use --local",
                ) from exc
            model_id = health.get("model") or "?"
            self._info = ModelInfo(id=model_id, is_demo=model_id == "demo", where=self.url)
        return self._info

    def stream(self, req: GenerationRequest) -> RemoteStream:
        path, body = request_body(req, self.model)
        return RemoteStream(self, path, body)

    def close(self) -> None:
        self.client.close()
