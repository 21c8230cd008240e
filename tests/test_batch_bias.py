"""The batched logit bias gives exactly mlx-lm's per-row tokens, each row its own bias."""

from __future__ import annotations

from mlxbun_cli.engine import batch_bias
from mlxbun_cli.engine.scheduler import Scheduler
from mlxbun_cli.engine.types import EngineRequest, PenaltyOptions, TokenStep


def _tokens(loaded, requests, late, batched: bool, monkeypatch) -> tuple[list, list, int]:
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
        for _ in range(6):  # the batch is decoding when the late request joins
            out[0].append(next(streams[0]).token)
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


def _swap_run(loaded, batched: bool) -> dict[int, list[int]]:
    """[plain, biased]; the plain row ends in the very step a new plain row joins."""
    from mlx_lm.generate import BatchGenerator

    generator = BatchGenerator(loaded.model, stop_tokens=[])
    if batched:
        assert batch_bias.install(generator)
    plain, biased = generator.insert(
        [list(range(3, 9)), list(range(20, 30))],
        max_tokens=[4, 40],
        logits_processors=[[], [batch_bias.LogitBias({42: 100.0})]],
    )
    tokens: dict[int, list[int]] = {plain: [], biased: []}
    late = None
    try:
        while True:
            _, responses = generator.next()
            for r in responses:
                tokens.setdefault(r.uid, []).append(r.token)
            if late is None and len(tokens[plain]) == 2:
                # Prefilled in the next step, it joins the batch as the plain row leaves.
                (late,) = generator.insert([list(range(9, 19))], max_tokens=[20])
            if late is not None and len(tokens.get(late, [])) == 20:
                return {"plain": tokens[plain], "biased": tokens[biased], "late": tokens[late]}
    finally:
        generator.close()


def test_rows_that_swap_places_keep_their_own_bias(tiny_loaded):
    # Same processors, same row count before and after: only the layout differs.
    per_row = _swap_run(tiny_loaded, batched=False)
    batched = _swap_run(tiny_loaded, batched=True)
    assert set(batched["biased"]) == {42} and 42 not in batched["late"]
    assert batched == per_row


def test_install_declines_an_unknown_batch_class():
    class Generator:
        _generation_batch = object()

    assert batch_bias.install(Generator()) is False
