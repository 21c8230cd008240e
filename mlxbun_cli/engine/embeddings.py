"""Text embeddings from a language model: its final hidden states, mean-pooled.

A chat model has no embedding head. As llama.cpp and Ollama do with such
models, the vector is the mean over the input's tokens of the last layer's
(normalized) hidden states, scaled to unit length so that cosine similarity
is a dot product. The quality is the model's: a model trained for
embeddings gives good ones, a chat model serviceable ones.

`embed_one` runs on the model's engine thread (Scheduler.call), between
decode steps, so it never runs beside a step on the same weights.
"""

from __future__ import annotations

import math
from typing import Any

CHUNK_TOKENS = 2048  # long inputs go through the backbone in pieces, with a KV cache


def text_model(model: Any) -> Any | None:
    """The model whose `.model` is the transformer without its vocabulary head.

    mlx-lm's text models are their own; its multimodal ones wrap one at
    `.language_model`. Others (Mamba's `.backbone`, GPT-2's layout) are not
    recognised: None, and a clear error rather than a wrong vector."""
    for owner in (model, getattr(model, "language_model", None)):
        inner = getattr(owner, "model", None)
        if callable(inner) and hasattr(inner, "layers"):
            return owner
    return None


def embed_one(model: Any, tokens: list[int]) -> list[float]:
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    owner = text_model(model)
    if owner is None:
        raise ValueError("this model has no transformer backbone to take embeddings from")
    inner = owner.model
    cache = make_prompt_cache(owner)
    total = None
    for start in range(0, len(tokens), CHUNK_TOKENS):
        hidden = inner(mx.array([tokens[start : start + CHUNK_TOKENS]]), cache=cache)
        chunk_sum = hidden[0].astype(mx.float32).sum(axis=0)
        total = chunk_sum if total is None else total + chunk_sum
        mx.eval(total, [c.state for c in cache])
    mean = total / len(tokens)
    vector = mean / mx.maximum(mx.linalg.norm(mean), 1e-12)
    result = vector.tolist()
    mx.clear_cache()
    if not all(math.isfinite(x) for x in result):
        raise ValueError("the model's hidden states are not finite numbers")
    return result
