"""A lone request's fast start (engine.first_token) gives exactly mlx-lm's path's results."""

from __future__ import annotations

import pytest

from mlxbun_cli.engine import first_token
from mlxbun_cli.engine.scheduler import Scheduler
from mlxbun_cli.engine.types import (
    EngineRequest,
    Finished,
    PenaltyOptions,
    SamplingOptions,
    TokenStep,
)


class HistoryProbe:
    """A logits processor that records the token history it is shown."""

    def __init__(self) -> None:
        self.seen: list[list[int]] = []

    def __call__(self, tokens, logits):
        self.seen.append(tokens.tolist())
        return logits


def _no_eos(loaded, **extra) -> PenaltyOptions:
    return PenaltyOptions(logit_bias={t: -100.0 for t in loaded.tokenizer.eos_token_ids}, **extra)


def _collect(stream) -> dict:
    steps, finished = [], None
    for event in stream:
        if isinstance(event, TokenStep):
            top = [(i, round(v, 4)) for i, v in event.top_logprobs or []]
            lp = None if event.logprob is None else round(event.logprob, 4)
            steps.append((event.token, lp, top, event.finish_reason))
        else:
            assert isinstance(event, Finished)
            finished = event
    usage = finished.usage
    return {
        "steps": steps,
        "finish": finished.finish_reason,
        "usage": (usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens),
    }


def _run(loaded, fast: bool, requests, monkeypatch) -> tuple[list[dict], int]:
    """Each request alone, in turn, on a fresh scheduler; results and fast starts."""
    starts = []
    real_start = first_token.start

    def counting_start(generator):
        starts.append(1)
        return real_start(generator)

    monkeypatch.setattr(first_token, "start", counting_start)
    scheduler = Scheduler(loaded.model, loaded.tokenizer, fast_first_token=fast)
    try:
        return [_collect(scheduler.stream(r)[1]) for r in requests], len(starts)
    finally:
        scheduler.close()


def test_lone_requests_match_the_stock_path(tiny_loaded, monkeypatch):
    eos = sorted(tiny_loaded.tokenizer.eos_token_ids)

    def requests(probe: HistoryProbe, cached_probe: HistoryProbe):
        prompt = list(range(3, 40))
        cached = dict(
            cache_key="s", penalties=_no_eos(tiny_loaded), logits_processors=[cached_probe]
        )
        return [
            EngineRequest(prompt, max_tokens=20, penalties=_no_eos(tiny_loaded)),
            EngineRequest(
                list(range(50, 61)),
                max_tokens=30,
                sampling=SamplingOptions(temperature=0.9, top_p=0.9, top_k=40, seed=11),
                penalties=_no_eos(tiny_loaded, repetition_penalty=1.3, presence_penalty=0.5),
                top_logprobs=3,
                want_logprobs=True,
                logits_processors=[probe],
            ),
            # The same session twice, then longer: prompt-cache hits (exact, prefix).
            EngineRequest(prompt, max_tokens=5, **cached),
            EngineRequest(prompt, max_tokens=5, **cached),
            EngineRequest(prompt + [7, 8, 9], max_tokens=5, **cached),
            EngineRequest([5], max_tokens=4, penalties=_no_eos(tiny_loaded)),  # one-token prompt
            # Ends at the first token: length.
            EngineRequest(prompt, max_tokens=1, want_logprobs=True, top_logprobs=2),
            EngineRequest(  # ends at the first token: a stop token
                prompt, max_tokens=9, penalties=PenaltyOptions(logit_bias={eos[0]: 100.0})
            ),
        ]

    stock_probes, fast_probes = (HistoryProbe(), HistoryProbe()), (HistoryProbe(), HistoryProbe())
    stock, stock_starts = _run(tiny_loaded, False, requests(*stock_probes), monkeypatch)
    fast, fast_starts = _run(tiny_loaded, True, requests(*fast_probes), monkeypatch)
    assert stock_starts == 0 and fast_starts == len(fast)
    assert fast == stock
    # The processors saw the same histories: the whole prompt (cached part
    # included), then each new token.
    assert [p.seen for p in fast_probes] == [p.seen for p in stock_probes]
    fast_probe, cached_probe = fast_probes
    assert [len(h) for h in cached_probe.seen[::6]] == [37, 37, 40]
    generated = [step[0] for step in fast[1]["steps"]]
    for i, history in enumerate(fast_probe.seen[:30]):
        assert history == list(range(50, 61)) + generated[:i]
    # What the cases were meant to cover did happen.
    assert [r["usage"][1] for r in fast[2:5]] == [0, 36, 37]
    assert fast[6]["steps"][0][3] == "length" and len(fast[6]["steps"]) == 1
    assert fast[7]["finish"] == "stop" and fast[7]["steps"][0][0] == eos[0]
    assert all(r["finish"] == "length" for r in fast[:6])


def test_requests_arriving_together_or_joining_keep_the_stock_path(tiny_loaded, monkeypatch):
    def run(fast: bool):
        starts = []
        real_start = first_token.start
        monkeypatch.setattr(first_token, "start", lambda g: starts.append(1) or real_start(g))
        scheduler = Scheduler(tiny_loaded.model, tiny_loaded.tokenizer, fast_first_token=fast)
        try:
            first = scheduler.stream(
                EngineRequest(list(range(3, 20)), max_tokens=60, penalties=_no_eos(tiny_loaded))
            )[1]
            head = [next(first).token for _ in range(5)]  # running: the next one joins
            joiner = scheduler.stream(
                EngineRequest(list(range(30, 45)), max_tokens=20, penalties=_no_eos(tiny_loaded))
            )[1]
            results = [head + [s[0] for s in _collect(first)["steps"]], _collect(joiner)]
            return results, len(starts)
        finally:
            scheduler.close()

    stock, _ = run(False)
    fast, starts = run(True)
    assert fast == stock and len(fast[0]) == 60
    assert starts == 1  # the first request only: the joiner found a busy engine


def test_a_fast_started_request_can_be_cancelled(tiny_loaded):
    scheduler = Scheduler(tiny_loaded.model, tiny_loaded.tokenizer)
    try:
        handle, stream = scheduler.stream(
            EngineRequest(list(range(3, 20)), max_tokens=500, penalties=_no_eos(tiny_loaded))
        )
        assert isinstance(next(stream), TokenStep)
        handle.cancel()
        events = list(stream)
        assert isinstance(events[-1], Finished) and events[-1].finish_reason == "cancelled"
        again = _collect(
            scheduler.stream(
                EngineRequest(list(range(3, 9)), max_tokens=7, penalties=_no_eos(tiny_loaded))
            )[1]
        )
        assert again["finish"] == "length" and len(again["steps"]) == 7
    finally:
        scheduler.close()


@pytest.mark.parametrize("broken", ["_unprocessed_sequences", "_generation_batch"])
def test_an_unfamiliar_generator_keeps_the_stock_path(broken):
    class Generator:
        pass

    generator = Generator()
    for name in first_token._GENERATOR_PARTS:
        if name != broken:
            setattr(generator, name, None)
    assert not first_token.supported(generator)


def test_prompts_longer_than_one_prefill_chunk_keep_the_stock_path(tiny_loaded, monkeypatch):
    starts = []
    real_start = first_token.start
    monkeypatch.setattr(first_token, "start", lambda g: starts.append(1) or real_start(g))

    def run(fast: bool, prompt_length: int) -> list:
        scheduler = Scheduler(
            tiny_loaded.model, tiny_loaded.tokenizer, prefill_step_size=8, fast_first_token=fast
        )
        try:
            request = EngineRequest(
                list(range(3, 3 + prompt_length)), max_tokens=6, penalties=_no_eos(tiny_loaded)
            )
            return _collect(scheduler.stream(request)[1])["steps"]
        finally:
            scheduler.close()

    assert run(True, 9) == run(False, 9) and len(starts) == 1  # one chunk and a step: fast
    assert run(True, 10) == run(False, 10) and len(starts) == 1  # chunk by chunk, as mlx-lm


def test_the_fast_start_can_be_turned_off(tiny_loaded, monkeypatch):
    monkeypatch.setenv("MLXBUN_FAST_FIRST_TOKEN", "0")
    scheduler = Scheduler(tiny_loaded.model, tiny_loaded.tokenizer)
    try:
        assert scheduler._fast_first_token is False
    finally:
        scheduler.close()
