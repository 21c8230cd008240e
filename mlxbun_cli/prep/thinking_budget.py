"""A cap on thinking tokens: past the budget, the model's think-end marker is forced.

Anthropic's `thinking.budget_tokens` (and mlxbun's `thinking_budget` on the
OpenAI wire and the CLI's `--thinking-budget`) limit how many tokens a reply
may spend reasoning. The processor here counts the tokens generated inside
the thinking block; once the count reaches the budget, it leaves only the
think-end marker's token(s) sampleable, so the model closes its reasoning
and goes on to the answer, as it would have on its own.
"""

from __future__ import annotations

from collections import deque
from typing import Any


class ThinkingBudget:
    """A logits processor (history, logits) -> logits for one request."""

    def __init__(
        self,
        budget: int,
        start_tokens: tuple[int, ...],
        end_tokens: tuple[int, ...],
        in_thinking: bool,
        prompt_length: int,
    ) -> None:
        self.budget = budget
        self._start = start_tokens
        self._end = end_tokens
        self.in_thinking = in_thinking  # the template may open the block itself
        self.used = 0  # tokens generated inside thinking so far
        self._seen = prompt_length  # history already read
        self._recent: deque[int] = deque(maxlen=max(len(start_tokens), len(end_tokens)))
        self._forcing: int | None = None  # index into end_tokens while closing the block

    def __call__(self, history: Any, logits: Any) -> Any:
        length = int(history.shape[-1])
        if length > self._seen:
            for token in history[self._seen :].tolist():
                self._advance(int(token))
            self._seen = length
        if self._forcing is None and self.in_thinking and self.used >= self.budget:
            self._forcing = 0
        if self._forcing is None:
            return logits
        import mlx.core as mx  # here: an isolated server's parent imports prep but never mlx

        target = self._end[self._forcing]
        allowed = mx.arange(logits.shape[-1]) == target
        forced = mx.where(allowed, mx.array(0, logits.dtype), mx.array(-mx.inf, logits.dtype))
        return mx.broadcast_to(forced, logits.shape)

    def _advance(self, token: int) -> None:
        self._recent.append(token)
        if self._forcing is not None:
            self._forcing += 1
            if self._forcing == len(self._end):
                self._forcing = None
        if self.in_thinking:
            if self._ends_with(self._end):
                self.in_thinking = False
            else:
                self.used += 1
        elif self._ends_with(self._start):
            self.in_thinking = True

    def _ends_with(self, marker: tuple[int, ...]) -> bool:
        n = len(marker)
        return len(self._recent) >= n and tuple(self._recent)[-n:] == marker


def for_request(
    tokenizer: Any, budget: int, in_thinking: bool, prompt_length: int
) -> tuple[ThinkingBudget | None, str | None]:
    """The processor for this model, or (None, why not) when it has no thinking markers."""
    start = tuple(getattr(tokenizer, "think_start_tokens", None) or ())
    end = tuple(getattr(tokenizer, "think_end_tokens", None) or ())
    if not start or not end:
        return None, "thinking budget ignored: this model has no thinking markers"
    return ThinkingBudget(budget, start, end, in_thinking, prompt_length), None
