"""The batched logit bias gives exactly mlx-lm's per-row tokens, each row its own bias."""

from __future__ import annotations

from mlxbun_cli.engine import batch_bias
from mlxbun_cli.engine.scheduler import Scheduler
from mlxbun_cli.engine.types import EngineRequest, PenaltyOptions, TokenStep


def _tokens(
    loaded, requests, late, batched: bool, monkeypatch, join_after: int = 6
) -> tuple[list, list, int]:
    """Tokens per request; `late` joins once `join_after` events of the first have come."""
    calls = {"n": 0}
    if batched:
        real = batch_bias._BiasedModel.__call__

        def counting(self, *args, **kwargs):
            calls["n"] += 1
            return real(self, *args, **kwargs)

        monkeypatch.setattr(batch_bias._BiasedModel, "__call__", counting)
    else:
        monkeypatch.setattr(batch_bias, "install", lambda generator: False)
    scheduler = Scheduler(loaded.model, loaded.tokenizer)
    try:
        streams = [scheduler.stream(r)[1] for r in requests]
        out: list[list[int]] = [[] for _ in requests]
        for _ in range(join_after):  # the batch is decoding when the late request joins
            event = next(streams[0])
            if isinstance(event, TokenStep):
                out[0].append(event.token)
        _, late_stream = scheduler.stream(late)
        late_tokens = [e.token for e in late_stream if isinstance(e, TokenStep)]
        for i, stream in enumerate(streams):
            out[i] += [e.token for e in stream if isinstance(e, TokenStep)]
        return out, late_tokens, calls["n"]
    finally:
        scheduler.close()
        monkeypatch.undo()


def test_batched_bias_matches_per_row_processors(tiny_loaded, monkeypatch):
    eos = tiny_loaded.tokenizer.eos_token_ids
    no_eos = {t: -100.0 for t in eos}

    def requests():
        return [
            EngineRequest(
                list(range(3, 12)), max_tokens=60, penalties=PenaltyOptions(logit_bias=no_eos)
            ),
            EngineRequest(list(range(5, 9)), max_tokens=40),  # no processors at all
            EngineRequest(
                list(range(20, 40)), max_tokens=50, penalties=PenaltyOptions(logit_bias={42: 100.0})
            ),
            EngineRequest(
                list(range(7, 15)),
                max_tokens=55,
                penalties=PenaltyOptions(logit_bias={77: 3.0, **no_eos}),
            ),
        ]

    def late():  # a penalty makes the batch mixed, so it takes the per-row path meanwhile
        return EngineRequest(
            list(range(9, 19)),
            max_tokens=12,
            penalties=PenaltyOptions(logit_bias=no_eos, repetition_penalty=1.5),
        )

    per_row, per_row_late, _ = _tokens(tiny_loaded, requests(), late(), False, monkeypatch)
    batched, batched_late, steps = _tokens(tiny_loaded, requests(), late(), True, monkeypatch)
    assert batched == per_row and batched_late == per_row_late
    assert set(batched[2]) == {42}  # a +100 bias wins every step, on its own row only
    assert 42 not in batched[0] + batched[3]
    assert [len(t) for t in batched] == [60, 40, 50, 55] and len(batched_late) == 12
    assert steps > 30  # the batched path carried most steps, not the fallback


def test_rows_that_swap_places_keep_their_own_bias(tiny_loaded, monkeypatch):
    # [plain, biased] -> the plain row finishes -> a new plain row joins: [biased, plain].
    # Same processors, same count: only the layout tells the two batches apart.
    def requests():
        return [
            EngineRequest(list(range(3, 9)), max_tokens=4),
            EngineRequest(
                list(range(20, 30)), max_tokens=40, penalties=PenaltyOptions(logit_bias={42: 100.0})
            ),
        ]

    def late():
        return EngineRequest(list(range(9, 19)), max_tokens=20)

    # The late one joins after the plain one's 4 tokens and its end.
    per_row, per_row_late, _ = _tokens(tiny_loaded, requests(), late(), False, monkeypatch, 5)
    batched, batched_late, steps = _tokens(tiny_loaded, requests(), late(), True, monkeypatch, 5)
    assert set(batched[1]) == {42} and 42 not in batched_late
    assert batched == per_row and batched_late == per_row_late and steps > 10


def test_install_declines_an_unknown_batch_class():
    class Generator:
        _generation_batch = object()

    assert batch_bias.install(Generator()) is False
