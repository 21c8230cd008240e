"""Start a lone request on an idle generator: whole prompt in one call, first token in hand.

mlx-lm's BatchGenerator needs three of its steps to give a new request its
first token: prefill all but the last prompt token; run that last token as a
one-row decode step (which samples the first token); then one more decode
step, whose graph is built before the first token is read back. When the
generator is idle and one request arrives (a single user, the common case)
`start` prefills the prompt and samples the first token from its last
position in one evaluation, with the request's own processors and sampler,
and hands the generator a decode batch that continues from there. The tokens
are the same as mlx-lm's path; the first one comes a model call and a graph
build sooner, and it is returned so the scheduler can send it at once.

Anything else keeps mlx-lm's own path: requests arriving together, a busy
batch, a prompt longer than one prefill chunk (mlx-lm's path takes it chunk
by chunk, so a cancel or a newcomer is seen in between), an mlx-lm whose
internals differ from the ones read here, or MLXBUN_FAST_FIRST_TOKEN=0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_lm.generate import GenerationBatch
from mlx_lm.models.cache import TokenBuffer

_GENERATOR_PARTS = (
    "_unprocessed_sequences",
    "_generation_batch",
    "_prompt_batch",
    "_currently_processing",
    "_stream",
    "prefill_step_size",
    "sampler",
    "model",
)
_BATCH_PARTS = ("_next_tokens", "_next_logprobs", "_token_context", "_num_tokens", "_matchers")
_PENDING_FIELDS = 8  # (uid, segments, max_tokens, cache, all_tokens, sampler, processors, stops)


@dataclass
class Started:
    uid: int
    token: int
    logprobs: mx.array  # the first token's log-probabilities over the vocabulary
    # False when the first token ends the request (a stop token, max_tokens 1):
    # the generator's next step reports it with its finish reason.
    emit_now: bool


def supported(generator: Any) -> bool:
    """Whether this mlx-lm's generator has the parts `start` reads (checked once)."""
    if not all(hasattr(generator, name) for name in _GENERATOR_PARTS):
        return False
    if not isinstance(generator._generation_batch, GenerationBatch):
        return False
    try:
        batch = _empty_batch(generator)
    except Exception:
        return False
    return all(hasattr(batch, name) for name in _BATCH_PARTS)


def can_start(generator: Any) -> bool:
    """True when `generator` is idle but for one request just inserted, whose
    prompt takes mlx-lm's path at most one prefill chunk and one step: a longer
    one goes chunk by chunk there, so a cancel or a newcomer is seen in between."""
    pending = generator._unprocessed_sequences
    return (
        len(pending) == 1
        and len(pending[0]) == _PENDING_FIELDS
        and len(generator._generation_batch) == 0
        and len(generator._prompt_batch) == 0
        and not generator._currently_processing
        and sum(len(segment) for segment in pending[0][1]) <= generator.prefill_step_size + 1
    )


def _empty_batch(generator: Any) -> Any:
    empty = mx.array([], dtype=mx.uint32)
    return GenerationBatch(generator.model, [], empty, [], [], [], generator.sampler, [], [], [])


def start(generator: Any) -> Started:
    """Prefill the pending request and put it in the decode batch; see the module doc."""
    from mlx_lm.generate import _merge_caches

    uid, segments, max_tokens, cache, all_tokens, sampler, processors, stops = (
        generator._unprocessed_sequences.popleft()
    )
    prompt = [t for segment in segments for t in segment]
    context = list(all_tokens) + prompt  # every token the KV cache will hold
    sampler = sampler or generator.sampler
    model = generator.model
    with mx.stream(generator._stream):
        batch_cache = _merge_caches([cache])
        tokens = mx.array([prompt])
        # The last token gets its own call: a model's logits cover every
        # position it is given, and only the last one is wanted. The earlier
        # call's logits are never evaluated, so they cost nothing.
        if len(prompt) > 1:
            model(tokens[:, :-1], cache=batch_cache)
        logits = model(tokens[:, -1:], cache=batch_cache)[:, -1, :]
        if processors:
            history = mx.array(context, dtype=mx.int32)
            for processor in processors:
                logits = processor(history, logits)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        sampled = sampler(logprobs)
        mx.eval(sampled, logprobs)
        if len(prompt) > 1:
            mx.clear_cache()  # as mlx-lm's prefill does: the activations go back
        token = int(sampled.item())

        batch = _empty_batch(generator)
        batch.uids = [uid]
        batch.prompt_cache = batch_cache
        batch.tokens = [context]
        batch.samplers = [sampler]
        batch.logits_processors = [processors]
        batch.stop_sequences = [stops]
        batch.max_tokens = [max_tokens]
        # The generator's next step feeds `sampled` to the model and reports it.
        batch._next_tokens = sampled
        batch._next_logprobs = [logprobs[0]]
        batch._token_context = [TokenBuffer(context)]
        batch._num_tokens = [0]
        batch._matchers = [stops.matcher()]
        generator._generation_batch.extend(batch)
    ends_here = max_tokens <= 1 or stops.matcher().advance(token)
    return Started(uid, token, logprobs[0], emit_now=not ends_here)
