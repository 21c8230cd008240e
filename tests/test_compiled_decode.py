"""The compiled decode step gives exactly the plain step's tokens, or stays off."""

from __future__ import annotations

import pytest

from mlxbun_cli.engine.scheduler import Scheduler
from mlxbun_cli.engine.types import EngineRequest, Finished, PenaltyOptions, TokenStep


def _no_eos(loaded) -> PenaltyOptions:
    return PenaltyOptions(logit_bias={t: -100.0 for t in loaded.tokenizer.eos_token_ids})


def _run_batch(loaded, compiled: bool, requests, join_late=None):
    """Tokens per request from a fresh scheduler; `join_late` arrives mid-decode."""
    scheduler = Scheduler(loaded.model, loaded.tokenizer, compiled_decode=compiled)
    try:
        streams = [scheduler.stream(r)[1] for r in requests]
        tokens: list[list[int]] = [[] for _ in requests]
        late_tokens: list[int] = []
        if join_late is not None:
            first = next(streams[0])
            tokens[0].append(first.token)
            # Let a few steps pass so the newcomer joins a running batch.
            for _ in range(5):
                tokens[0].append(next(streams[0]).token)
            _, late = scheduler.stream(join_late)
            late_tokens = [e.token for e in late if isinstance(e, TokenStep)]
        for i, stream in enumerate(streams):
            for event in stream:
                if isinstance(event, TokenStep):
                    tokens[i].append(event.token)
                else:
                    assert isinstance(event, Finished) and event.finish_reason == "length"
        return tokens, late_tokens, scheduler.compiled_decode_state, scheduler.decode_model
    finally:
        scheduler.close()


def _requests(loaded, lengths_and_caps):
    bias = _no_eos(loaded)
    return [
        EngineRequest(list(range(3, 3 + n)), max_tokens=cap, penalties=bias)
        for n, cap in lengths_and_caps
    ]


def test_compiled_matches_plain_across_batch_changes(tiny_loaded):
    # Different prompt lengths (left padding), rows finishing at different
    # steps (the batch shrinks), more than one 64-slot capacity step, and a
    # request that joins a running batch (the batch grows).
    shapes = [(5, 150), (17, 90), (2, 40)]
    late = _requests(tiny_loaded, [(9, 70)])[0]
    plain = _run_batch(tiny_loaded, False, _requests(tiny_loaded, shapes), late)
    fast = _run_batch(tiny_loaded, True, _requests(tiny_loaded, shapes), late)
    assert [len(t) for t in fast[0]] == [150, 90, 40] and len(fast[1]) == 70
    assert fast[0] == plain[0] and fast[1] == plain[1]
    assert plain[2] == "off"
    assert fast[2] == "on" and fast[3].compiled_steps > 150


def test_single_stream_matches_plain_with_sampling_and_penalties(tiny_loaded):
    from mlxbun_cli.engine.types import SamplingOptions

    def request():
        return EngineRequest(
            list(range(10, 30)),
            max_tokens=80,
            sampling=SamplingOptions(temperature=0.8, top_p=0.9, seed=7),
            penalties=PenaltyOptions(
                repetition_penalty=1.3,
                logit_bias={t: -100.0 for t in tiny_loaded.tokenizer.eos_token_ids},
            ),
        )

    plain = _run_batch(tiny_loaded, False, [request()])
    fast = _run_batch(tiny_loaded, True, [request()])
    assert fast[0] == plain[0] and len(fast[0][0]) == 80


def test_probe_turns_compile_off_for_a_model_that_ignores_the_mask(tiny_loaded, monkeypatch):
    from mlxbun_cli.engine import compiled_decode

    # A model that never asks the cache for a mask would attend to unused slots.
    monkeypatch.setattr(compiled_decode._StepCache, "make_mask", lambda self, n, **kw: None)
    shapes = [(6, 30)]
    plain = _run_batch(tiny_loaded, False, _requests(tiny_loaded, shapes))
    fast = _run_batch(tiny_loaded, True, _requests(tiny_loaded, shapes))
    assert fast[2] == "unsupported" and fast[3].compiled_steps == 0
    assert fast[0] == plain[0]


def test_compile_failure_keeps_the_plain_path(tiny_loaded, monkeypatch):
    from mlxbun_cli.engine import compiled_decode

    def broken(self, *args):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(compiled_decode.CompiledDecodeModel, "_step", broken)
    shapes = [(4, 12)]
    fast = _run_batch(tiny_loaded, True, _requests(tiny_loaded, shapes))
    plain = _run_batch(tiny_loaded, False, _requests(tiny_loaded, shapes))
    assert fast[2] == "unsupported" and fast[0] == plain[0]


@pytest.mark.parametrize("value, state", [("0", "off"), ("1", "on")])
def test_setting_reaches_the_engine(tiny_model_dir, monkeypatch, value, state):
    from mlxbun_cli.config import Settings
    from mlxbun_cli.prep.request import GenerationRequest
    from mlxbun_cli.services.generate import local_backend

    monkeypatch.setenv("MLXBUN_COMPILED_DECODE", value)
    backend = local_backend(str(tiny_model_dir), None, Settings())
    try:
        for _ in backend.stream(GenerationRequest(prompt="hi", max_tokens=4)):
            pass
        assert backend.loaded.scheduler.compiled_decode_state == state
    finally:
        backend.close()


def test_a_step_that_fails_later_falls_back_without_losing_the_batch(tiny_loaded, monkeypatch):
    from mlxbun_cli.engine import compiled_decode

    original = compiled_decode.CompiledDecodeModel._step

    def fails_for_three_rows(self, tokens, *args):
        if tokens.shape[0] == 3:  # the probe (two rows) passes; the real batch does not
            raise RuntimeError("cannot compile this shape")
        return original(self, tokens, *args)

    monkeypatch.setattr(compiled_decode.CompiledDecodeModel, "_step", fails_for_three_rows)
    shapes = [(5, 20), (9, 20), (3, 20)]
    fast = _run_batch(tiny_loaded, True, _requests(tiny_loaded, shapes))
    plain = _run_batch(tiny_loaded, False, _requests(tiny_loaded, shapes))
    assert fast[2] == "unsupported"
    assert fast[0] == plain[0] and [len(t) for t in fast[0]] == [20, 20, 20]
