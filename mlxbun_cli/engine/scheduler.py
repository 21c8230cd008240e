"""One scheduler thread per loaded model, driving mlx-lm's BatchGenerator.

Every request is a batch member ("one request is a batch of one"), so
concurrent requests share decode steps. Results go to each request's sink
callback from the scheduler thread; cancellation takes effect at the next step.
"""

from __future__ import annotations

import concurrent.futures
import gc
import itertools
import logging
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mlxbun_cli.engine.types import EngineRequest, Finished, TokenStep, Usage

log = logging.getLogger(__name__)

Event = TokenStep | Finished


_live: weakref.WeakSet[Scheduler] = weakref.WeakSet()


def close_all() -> None:
    """At exit: stop every scheduler still running, then clear this thread's streams."""
    for scheduler in list(_live):
        scheduler.close()
    release_streams()


def release_streams() -> None:
    """mlx needs its streams cleared before a thread, or the process, ends."""
    import mlx.core as mx

    clear = getattr(mx, "clear_streams", None)
    if clear is not None:
        mx.synchronize()
        clear()


Sink = Callable[[Event], None]


class EngineShutDown(RuntimeError):
    """Work handed to a scheduler that has stopped, or was stopping."""


@dataclass
class SchedulerStats:
    requests: int = 0
    completed: int = 0
    cancelled: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    cache_hits: int = 0
    busy_seconds: float = 0.0  # time inside batch steps (prefill and decode)
    started_at: float = field(default_factory=time.time)


class EventStream:
    """The events of one request, in order, ending with Finished.

    Not a generator on purpose: a KeyboardInterrupt while waiting leaves it
    usable, so the caller can cancel and still drain to the final event.
    """

    def __init__(self, handle: Handle, events: queue.SimpleQueue) -> None:
        self._handle = handle
        self._events = events
        self.finished = False

    def __iter__(self) -> EventStream:
        return self

    def __next__(self) -> Event:
        if self.finished:
            raise StopIteration
        event = self._events.get()
        if isinstance(event, Finished):
            self.finished = True
        return event

    def __del__(self) -> None:
        if not self.finished:
            self._handle.cancel()  # a consumer that walked away frees its slot


class Handle:
    """The caller's side of one submitted request."""

    def __init__(self, scheduler: Scheduler, request_id: int) -> None:
        self._scheduler = scheduler
        self.request_id = request_id
        self.cancelled = threading.Event()

    def cancel(self) -> None:
        if not self.cancelled.is_set():
            self.cancelled.set()
            self._scheduler._cancel_pending.set()
            self._scheduler._wake.set()


@dataclass
class _Active:
    handle: Handle
    request: EngineRequest
    sink: Sink
    usage: Usage
    submitted: float
    admitted: float = 0.0
    first_token: float = 0.0
    uid: int | None = None
    sent_early: bool = False  # its first token went out at admission (engine.first_token)
    # Processors that follow the tokens as they come out (prep/thinking_budget.py).
    observers: list[Any] = field(default_factory=list)


class Scheduler:
    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        cache_bytes: int = 1 << 30,
        cache_entries: int = 16,
        completion_batch_size: int = 32,
        prefill_batch_size: int = 8,
        prefill_step_size: int = 2048,
        compiled_decode: bool = True,
        fast_first_token: bool | None = None,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.stats = SchedulerStats()
        self._inbox: queue.SimpleQueue[_Active] = queue.SimpleQueue()
        self._calls: queue.SimpleQueue[tuple[Callable, concurrent.futures.Future]] = (
            queue.SimpleQueue()
        )
        self._calls_lock = threading.Lock()  # a call is queued before the exit drain, or refused
        self._calls_closed = False
        self._wake = threading.Event()
        self._cancel_pending = threading.Event()
        self._stop = threading.Event()
        self._ids = itertools.count(1)
        self._active: dict[int, _Active] = {}  # uid -> request
        self._batch_args = dict(
            completion_batch_size=completion_batch_size,
            prefill_batch_size=prefill_batch_size,
            prefill_step_size=prefill_step_size,
        )
        self._compiled_decode = compiled_decode
        if fast_first_token is None:  # an escape hatch, should mlx-lm's internals move
            fast_first_token = os.environ.get("MLXBUN_FAST_FIRST_TOKEN", "1") != "0"
        self._fast_first_token = fast_first_token
        self._cache_bytes = cache_bytes
        self._cache_entries = cache_entries
        self.prompt_cache: Any = None
        self.decode_model: Any = None  # CompiledDecodeModel when compiled_decode is on
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mlxbun-scheduler", daemon=True)
        self._thread.start()
        self._ready.wait()
        _live.add(self)

    # -- caller side ---------------------------------------------------------

    def submit(self, request: EngineRequest, sink: Sink) -> Handle:
        if self._stop.is_set():
            raise EngineShutDown("scheduler is shut down")
        handle = Handle(self, next(self._ids))
        item = _Active(handle, request, sink, Usage(), submitted=time.perf_counter())
        self._inbox.put(item)
        self._wake.set()
        return handle

    def stream(self, request: EngineRequest) -> tuple[Handle, EventStream]:
        """Submit and iterate events in the calling thread."""
        events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        handle = self.submit(request, events.put)
        return handle, EventStream(handle, events)

    def call(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        """Run `fn` on the engine thread between two steps (other model work, e.g.
        embeddings, must not run beside a step); its result or error goes to the future."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._calls_lock:
            if self._stop.is_set() or self._calls_closed:
                raise EngineShutDown("scheduler is shut down")
            self._calls.put((fn, future))
        self._wake.set()
        return future

    @property
    def queue_depth(self) -> int:
        return self._inbox.qsize()

    @property
    def active_count(self) -> int:
        return len(self._active)

    @property
    def compiled_decode_state(self) -> str:
        """ "off" (setting), "pending" (not probed yet), "on", or "unsupported"."""
        model = self.decode_model
        if model is None:
            return "off"
        return {None: "pending", True: "on", False: "unsupported"}[model.enabled]

    def cache_info(self) -> dict[str, int]:
        cache = self.prompt_cache
        if cache is None:
            return {"entries": 0, "bytes": 0}
        return {"entries": len(cache), "bytes": int(cache.nbytes)}

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout)

    # -- scheduler thread ----------------------------------------------------

    def _run(self) -> None:
        import mlx.core as mx
        from mlx_lm.generate import BatchGenerator, StopSequences
        from mlx_lm.models.cache import LRUPromptCache

        from mlxbun_cli.engine import batch_bias, first_token

        self._mx = mx
        self._stop_sequences_cls = StopSequences
        self.prompt_cache = LRUPromptCache(self._cache_entries, self._cache_bytes)
        eos = sorted(self.tokenizer.eos_token_ids)
        self._eos_stops = StopSequences([[t] for t in eos])
        self._special = eos
        # This thread's own default stream: mlx-lm's module-level generation
        # stream is thread-local to the importing thread.
        stream = self._stream = mx.new_stream(mx.default_device())
        model = self.model
        if self._compiled_decode:
            from mlxbun_cli.engine.compiled_decode import CompiledDecodeModel

            model = self.decode_model = CompiledDecodeModel(model)
        generator = BatchGenerator(
            model, stop_tokens=[[t] for t in eos], stream=stream, **self._batch_args
        )
        batch_bias.install(generator)
        self._fast_first_token = self._fast_first_token and first_token.supported(generator)
        self._ready.set()
        try:
            while not self._stop.is_set():
                self._run_calls()
                self._admit(generator)
                self._reap_cancelled(generator)
                if not self._active:
                    self._wake.wait(0.05)
                    self._wake.clear()
                    continue
                try:
                    tic = time.perf_counter()
                    prompt_responses, gen_responses = generator.next()
                    self.stats.busy_seconds += time.perf_counter() - tic
                except Exception as exc:  # an engine fault ends every member, loudly
                    log.exception("generation step failed")
                    self._fail_all(generator, f"generation failed: {exc}")
                    continue
                self._dispatch(gen_responses)
        finally:
            self._fail_all(generator, "engine shut down", reason="cancelled")
            with self._calls_lock:
                self._calls_closed = True
            while not self._calls.empty():
                future = self._calls.get_nowait()[1]
                if future.set_running_or_notify_cancel():
                    future.set_exception(EngineShutDown("engine shut down"))
            generator.close()
            # Arrays made on this thread's stream die on this thread (as
            # mlx-lm's server does); otherwise exit can abort in mlx's teardown.
            self.prompt_cache = None
            del generator
            gc.collect()
            release_streams()

    def _run_calls(self) -> None:
        # While requests decode or wait, one call per step, so they go on in
        # between; with nothing else to do, every waiting call.
        while not self._calls.empty() and not self._stop.is_set():
            fn, future = self._calls.get_nowait()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                tic = time.perf_counter()
                with self._mx.stream(self._stream):
                    result = fn()
                self.stats.busy_seconds += time.perf_counter() - tic
            except Exception as exc:  # the caller gets it; the engine goes on
                future.set_exception(exc)
            else:
                future.set_result(result)
            if self._active or not self._inbox.empty():
                return

    def _admit(self, generator: Any) -> None:
        if self._inbox.empty():  # the common case, checked every step
            return
        from mlxbun_cli.engine import first_token
        from mlxbun_cli.engine.sampling import make_request_processors, make_request_sampler

        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if item.handle.cancelled.is_set():
                self._finish(item, "cancelled")
                continue
            request = item.request
            self.stats.requests += 1
            prompt = list(request.prompt_tokens)
            cache, rest = self._fetch_cache(request.cache_key, prompt)
            cached = len(prompt) - len(rest)
            item.usage.prompt_tokens = len(prompt)
            item.usage.cached_tokens = cached
            item.admitted = time.perf_counter()
            item.usage.queued_seconds = item.admitted - item.submitted
            try:
                sampler = make_request_sampler(request.sampling, self._special)
                processors = make_request_processors(request.penalties)
                processors += list(request.logits_processors)
                item.observers = [p for p in processors if hasattr(p, "observe")]
                (uid,) = generator.insert(
                    [rest],
                    max_tokens=[request.max_tokens],
                    caches=[cache],
                    all_tokens=[prompt[:cached]],
                    samplers=[sampler],
                    logits_processors=[processors],
                    stop_sequences=[self._eos_stops],
                )
                started = None
                # A lone request on an idle engine starts at once (see first_token).
                if (
                    self._fast_first_token
                    and self._inbox.empty()
                    and first_token.can_start(generator)
                ):
                    tic = time.perf_counter()
                    started = first_token.start(generator)
                    self.stats.busy_seconds += time.perf_counter() - tic
            except Exception as exc:
                log.exception("could not admit request")
                self._finish(item, "error", error=str(exc))
                continue
            if cached:
                self.stats.cache_hits += 1
            self.stats.prompt_tokens += len(prompt)
            self.stats.cached_tokens += cached
            item.uid = uid
            self._active[uid] = item
            if started is not None and started.emit_now:
                item.sent_early = True
                self._send_token(item, started.token, started.logprobs, None)
            log.debug(
                "admitted request %s: %d prompt tokens (%d cached), max %d, batch of %d",
                item.handle.request_id,
                len(prompt),
                cached,
                request.max_tokens,
                len(self._active),
            )

    def _fetch_cache(self, key: Any, prompt: list[int]) -> tuple[Any, list[int]]:
        from mlx_lm.models.cache import can_trim_prompt_cache, trim_prompt_cache

        if len(prompt) < 2:
            return None, prompt
        cache, rest = self.prompt_cache.fetch_nearest_cache(key, prompt)
        if cache is not None and not rest:
            # An exact hit still needs one token to feed the model.
            if can_trim_prompt_cache(cache):
                trim_prompt_cache(cache, 1)
                rest = prompt[-1:]
            else:
                cache, rest = None, prompt
        return cache, rest

    def _reap_cancelled(self, generator: Any) -> None:
        if not self._cancel_pending.is_set():
            return
        self._cancel_pending.clear()
        gone = [uid for uid, item in self._active.items() if item.handle.cancelled.is_set()]
        if not gone:
            return
        generator.remove(gone)
        for uid in gone:
            item = self._active.pop(uid)
            self.stats.cancelled += 1
            self._finish(item, "cancelled")

    def _dispatch(self, responses: list[Any]) -> None:
        now = time.perf_counter()
        for r in responses:
            item = self._active.get(r.uid)
            if item is None:
                continue
            if item.sent_early:
                # The generator reports the token sent at admission; start()
                # only sends early a token that does not end the request.
                item.sent_early = False
                if r.finish_reason is None:
                    continue
            else:
                self._send_token(item, r.token, r.logprobs, r.finish_reason, now)
            if r.finish_reason is not None:
                del self._active[r.uid]
                if r.prompt_cache is not None and r.all_tokens:
                    self.prompt_cache.insert_cache(
                        item.request.cache_key, list(r.all_tokens), r.prompt_cache
                    )
                item.usage.generation_seconds = now - item.first_token
                self.stats.completed += 1
                self._finish(item, r.finish_reason)

    def _send_token(
        self,
        item: _Active,
        token: int,
        logprobs: Any,
        finish_reason: str | None,
        now: float | None = None,
    ) -> None:
        now = time.perf_counter() if now is None else now
        request = item.request
        if not item.first_token:
            item.first_token = now
            item.usage.prompt_seconds = now - item.admitted
        item.usage.completion_tokens += 1
        self.stats.generated_tokens += 1
        for observer in item.observers:
            observer.observe(token)
        logprob = top = None
        if request.want_logprobs or request.top_logprobs:
            logprob, top = self._logprobs(logprobs, token, request.top_logprobs)
        self._emit(item, TokenStep(token, logprob, top, finish_reason))

    def _logprobs(self, logprobs: Any, token: int, top_n: int) -> tuple[float, list | None]:
        mx = self._mx
        chosen = float(logprobs[token].item())
        if not top_n:
            return chosen, None
        top_n = min(top_n, logprobs.shape[-1])
        idx = mx.argpartition(-logprobs, kth=top_n - 1)[:top_n]
        vals = logprobs[idx]
        pairs = sorted(zip(idx.tolist(), vals.tolist(), strict=True), key=lambda p: -p[1])
        return chosen, [(int(i), float(v)) for i, v in pairs]

    def _finish(self, item: _Active, reason: str, error: str | None = None) -> None:
        if item.first_token and not item.usage.generation_seconds:
            item.usage.generation_seconds = time.perf_counter() - item.first_token
        try:
            item.usage.peak_memory_bytes = int(self._mx.get_peak_memory())
        except Exception:
            pass
        if reason == "error":
            self.stats.errors += 1
        self._emit(item, Finished(reason, item.usage, error))

    def _emit(self, item: _Active, event: Event) -> None:
        try:
            item.sink(event)
        except Exception:  # a broken consumer must not stop the batch
            log.exception("event sink failed; cancelling request %s", item.handle.request_id)
            item.handle.cancelled.set()

    def _fail_all(self, generator: Any, message: str, reason: str = "error") -> None:
        if self._active:
            try:
                generator.remove(list(self._active))
            except Exception:
                log.exception("could not clear the batch")
        for item in list(self._active.values()):
            self._finish(item, reason, error=message if reason == "error" else None)
        self._active.clear()
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                break
            self._finish(item, "cancelled")
