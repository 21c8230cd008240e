"""A cap on thinking tokens: past the budget, the model's think-end marker is forced.

Anthropic's `thinking.budget_tokens` (and mlxbun's `thinking_budget` on the
OpenAI wire and the CLI's `--thinking-budget`) limit how many tokens a reply
may spend reasoning. The processor here counts the tokens generated inside
the reply's thinking block; once the count reaches the budget, it leaves
only the think-end marker's token(s) sampleable, so the model closes its
reasoning and goes on to the answer, as it would have on its own. Only the
first block is policed: after it closes the processor does nothing.

It never waits for the decode step in flight. mlx-lm calls a processor with
the token history while the newest token is still being computed, and
reading it would stall the batch's pipelining. The scheduler instead passes
each token to `observe` once it is out, so the processor knows every token
but the newest; with one-token markers (the usual case) the decision about
that one is made lazily inside the step's graph. Multi-token markers are
rarer, and read the newest token.
"""

from __future__ import annotations

import copy
from collections import deque
from typing import Any


class _State:
    """Where the reply is, as of the tokens folded in so far."""

    def __init__(self, in_thinking: bool, marker_length: int) -> None:
        self.in_thinking = in_thinking  # the template may open the block itself
        self.used = 0  # tokens generated inside the block
        self.retired = False  # the block has closed: nothing left to police
        self.recent: deque[int] = deque(maxlen=marker_length)

    def fold(self, token: int, start: tuple[int, ...], end: tuple[int, ...]) -> None:
        if self.retired:
            return
        self.recent.append(token)
        if self.in_thinking:
            if self.ends_with(end):
                self.in_thinking, self.retired = False, True
            else:
                self.used += 1
        elif self.ends_with(start):
            self.in_thinking = True

    def ends_with(self, marker: tuple[int, ...]) -> bool:
        n = len(marker)
        return len(self.recent) >= n and tuple(self.recent)[-n:] == marker


class ThinkingBudget:
    """A logits processor (history, logits) -> logits for one request, with `observe`."""

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
        self.state = _State(in_thinking, max(len(start_tokens), len(end_tokens)))
        self._prompt_length = prompt_length
        self._observed = 0  # generated tokens passed to observe()
        self._single = len(start_tokens) == len(end_tokens) == 1

    def observe(self, token: int) -> None:
        """Fold in the next generated token (the scheduler calls this in order)."""
        self._observed += 1
        self.state.fold(token, self._start, self._end)

    def __call__(self, history: Any, logits: Any) -> Any:
        state = self.state
        unseen = int(history.shape[-1]) - self._prompt_length - self._observed
        if unseen > 1:  # not fed by a scheduler: read what it has not seen
            return self._after_reading(history, logits, unseen)
        if state.retired or not state.in_thinking:
            # The newest token may open the block, but with none of the budget
            # spent: no token needs forcing yet.
            return logits
        if state.used + unseen < self.budget:
            return logits
        if unseen == 0:
            return self._force(logits, self._target(state))
        if self._single:
            # The newest token is thinking unless it is the end marker itself:
            # decided inside the step's graph, without waiting for the token.
            end = self._end[0]
            return self._force(logits, end, unless=history[-1] == end)
        return self._after_reading(history, logits, unseen)  # multi-token markers (rare)

    def _after_reading(self, history: Any, logits: Any, unseen: int) -> Any:
        ahead = copy.deepcopy(self.state)  # observe() folds these into the real state later
        for token in history[int(history.shape[-1]) - unseen :].tolist():
            ahead.fold(int(token), self._start, self._end)
        if ahead.retired or not ahead.in_thinking or ahead.used < self.budget:
            return logits
        return self._force(logits, self._target(ahead))

    def _target(self, state: _State) -> int:
        """The end-marker token to force next; part of the marker may already be out."""
        for k in range(len(self._end) - 1, 0, -1):
            if state.ends_with(self._end[:k]):
                return self._end[k]
        return self._end[0]

    def _force(self, logits: Any, token: int, unless: Any = None) -> Any:
        import mlx.core as mx  # here: an isolated server's parent imports prep but never mlx

        allowed = mx.arange(logits.shape[-1]) == token
        forced = mx.where(allowed, mx.array(0, logits.dtype), mx.array(-mx.inf, logits.dtype))
        forced = mx.broadcast_to(forced, logits.shape)
        return forced if unless is None else mx.where(unless, logits, forced)


def for_request(
    tokenizer: Any, budget: int, in_thinking: bool, prompt_length: int
) -> tuple[ThinkingBudget | None, str | None]:
    """The processor for this model, or (None, why not) when it has no thinking markers."""
    start = tuple(getattr(tokenizer, "think_start_tokens", None) or ())
    end = tuple(getattr(tokenizer, "think_end_tokens", None) or ())
    if not start or not end:
        return None, "thinking budget ignored: this model has no thinking markers"
    return ThinkingBudget(budget, start, end, in_thinking, prompt_length), None
