"""Per-request samplers and logits processors built on mlx-lm's sample_utils."""

from __future__ import annotations

import random
from typing import Any

import mlx.core as mx
from mlx_lm.sample_utils import (
    apply_min_p,
    apply_top_k,
    apply_top_p,
    apply_xtc,
    greedy_sampler,
    make_logits_processors,
)

from mlxbun_cli.engine.batch_bias import LogitBias
from mlxbun_cli.engine.types import PenaltyOptions, SamplingOptions


def make_request_sampler(options: SamplingOptions, special_tokens: list[int]) -> Any:
    """A sampler with its own PRNG key, so a fixed seed replays exactly.

    Greedy requests share mlx-lm's one `greedy_sampler`, which lets the batch
    sample all of them in one call.
    """
    if options.temperature <= 0:
        return greedy_sampler
    seed = options.seed if options.seed is not None else random.getrandbits(32)
    state = {"key": mx.random.key(seed & 0xFFFF_FFFF_FFFF_FFFF)}  # any int, even negative
    temp = options.temperature
    top_p, top_k, min_p = options.top_p, options.top_k, options.min_p
    xtc_p, xtc_t = options.xtc_probability, options.xtc_threshold

    def sampler(logprobs: mx.array) -> mx.array:
        key, sub, xtc_key = mx.random.split(state["key"], 3)
        state["key"] = key
        if 0 < top_p < 1.0:
            logprobs = apply_top_p(logprobs, top_p)
        if min_p > 0.0:
            logprobs = apply_min_p(logprobs, min_p, 1)
        if xtc_p > 0.0:
            # apply_xtc draws from the global PRNG; seed it from our stream.
            mx.random.seed(int(mx.random.randint(0, 2**31 - 1, key=xtc_key).item()))
            logprobs = apply_xtc(logprobs, xtc_p, xtc_t, special_tokens)
        if top_k > 0:
            logprobs = apply_top_k(logprobs, top_k)
        return mx.random.categorical(logprobs * (1.0 / temp), key=sub)

    return sampler


def make_request_processors(penalties: PenaltyOptions) -> list[Any]:
    if not penalties.active:
        return []
    bias = [LogitBias(penalties.logit_bias)] if penalties.logit_bias else []
    return bias + make_logits_processors(
        repetition_penalty=penalties.repetition_penalty,
        repetition_context_size=penalties.repetition_context_size,
        presence_penalty=penalties.presence_penalty,
        frequency_penalty=penalties.frequency_penalty,
    )
