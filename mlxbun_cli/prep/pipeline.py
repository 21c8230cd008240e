"""A request from start to finish: prepare it, run it on the engine, shape its output.

`prepare` does all validation before any work, so a server can answer 4xx
before sending headers. `OutputProcessor` turns engine token steps into
neutral events (stop strings, thinking split, tool calls); `run` drives it
synchronously for the CLI, and the server drives the same processor from its
event loop.
"""

from __future__ import annotations

import math
import random
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from mlxbun_cli.engine.loader import LoadedModel
from mlxbun_cli.engine.types import EngineRequest, Finished, TokenStep
from mlxbun_cli.errors import AdmissionError, OptionError
from mlxbun_cli.prep import grammar, thinking_budget
from mlxbun_cli.prep import options as opts
from mlxbun_cli.prep.events import (
    Done,
    OutputEvent,
    ReasoningDelta,
    TextDelta,
    TokenLogprob,
    ToolCallEvent,
)
from mlxbun_cli.prep.request import GenerationRequest, validate
from mlxbun_cli.prep.stops import StopMatcher
from mlxbun_cli.prep.templates import encode_prompt, render_chat
from mlxbun_cli.prep.thinking import ThinkingSplitter
from mlxbun_cli.prep.tools import ToolCallExtractor, validate_tools

CHAT_MAX_TOKENS = 8192
COMPLETION_MAX_TOKENS = 512


@dataclass
class PreparedRequest:
    engine_request: EngineRequest
    stops: list[str]
    start_in_thinking: bool
    split_thinking: bool
    tools: list[dict[str, Any]] | None
    enable_thinking: bool | None
    prompt_text: str
    max_tokens_clamped_from: int | None  # the asked-for value when it was lowered
    warnings: list[str] = field(default_factory=list)  # e.g. a grammar that did not compile


def prepare(
    loaded: LoadedModel,
    req: GenerationRequest,
    *,
    server_thinking: bool | None = None,
    default_max_tokens: int | None = None,
    constrained_decoding: bool = True,
) -> PreparedRequest:
    validate(req)
    tokenizer = loaded.tokenizer
    tools = validate_tools(req.tools)
    if req.tool_choice == "none":
        tools = None
    constraints = [
        c
        for c in (
            grammar.from_tool_choice(req.tool_choice, tools),
            grammar.from_response_format(req.response_format),
            grammar.from_grammar_field(req.grammar),
        )
        if c is not None
    ]
    if len(constraints) > 1:
        raise OptionError(constraints[1].field, f"cannot be combined with {constraints[0].field}")
    thinking = opts.resolve_enable_thinking(req, loaded.defaults, server_thinking)
    if req.messages is not None:
        extra = dict(req.chat_template_kwargs)
        effort = opts.template_reasoning_effort(req.reasoning_effort)
        if effort and "reasoning_effort" not in extra:
            extra["reasoning_effort"] = effort
        rendered = render_chat(
            tokenizer,
            req.messages,
            tools=tools,
            enable_thinking=thinking,
            extra_kwargs=extra,
            think_start=getattr(tokenizer, "think_start", None),
            think_end=getattr(tokenizer, "think_end", None),
        )
        text, tokens, start_in_thinking = rendered.text, rendered.tokens, rendered.start_in_thinking
        fallback_max = CHAT_MAX_TOKENS
    else:
        text = req.prompt or ""
        tokens, start_in_thinking = encode_prompt(tokenizer, text), False
        fallback_max = COMPLETION_MAX_TOKENS
    if not tokens:
        raise OptionError("prompt", "encodes to no tokens")
    asked = req.max_tokens or default_max_tokens or fallback_max
    max_tokens, clamped_from = asked, None
    prompt_field = "messages" if req.messages is not None else "prompt"
    if loaded.context_length:
        room = loaded.context_length - len(tokens)
        if room < 1:
            raise OptionError(
                prompt_field,
                f"the prompt is {len(tokens)} tokens, which fills the model's "
                f"{loaded.context_length}-token context",
            )
        if asked > room:
            max_tokens = room
            clamped_from = asked if req.max_tokens else None
    memory_room = _memory_room(loaded, len(tokens), prompt_field)
    if memory_room is not None and max_tokens > memory_room:
        clamped_from = clamped_from or asked
        max_tokens = memory_room
    sampling = opts.sampling_for(req, loaded.defaults, thinking)
    if sampling.top_k >= loaded.vocab_size:
        # top_k over the vocabulary keeps every token: the same as no top_k, and
        # mlx-lm's top-k kernel refuses it (inside the shared batch step).
        sampling = replace(sampling, top_k=0)
    if sampling.temperature > 0 and sampling.seed is None:
        # Pick the seed here so it can be reported and replayed.
        sampling = replace(sampling, seed=random.getrandbits(31))
    warnings: list[str] = []
    processors: list[Any] = []
    if constraints and not constrained_decoding:
        warnings.append(f"{constraints[0].field} ignored: constrained decoding is turned off")
    elif constraints:
        processor, warning = grammar.compile_constraint(loaded, constraints[0])
        processors = [processor] if processor is not None else []
        warnings += [warning] if warning else []
    split_thinking = req.messages is not None and bool(getattr(tokenizer, "has_thinking", False))
    # A budget of max_tokens or more can never be reached: no processor then.
    wants_budget = req.thinking_budget is not None and req.thinking_budget < max_tokens
    if wants_budget and req.messages is not None and thinking is not False:
        if processors:
            budget, warning = None, "thinking budget ignored: the output is constrained"
        elif split_thinking:
            budget, warning = thinking_budget.for_request(
                tokenizer, req.thinking_budget, start_in_thinking, len(tokens)
            )
        else:
            budget, warning = None, "thinking budget ignored: this model does not think"
        # Request processors run after the penalty ones: a bias cannot undo the forced end.
        processors += [budget] if budget is not None else []
        warnings += [warning] if warning else []
    engine_request = EngineRequest(
        prompt_tokens=tokens,
        max_tokens=max_tokens,
        sampling=sampling,
        penalties=opts.penalties_for(req, loaded.defaults, loaded.vocab_size),
        top_logprobs=int(req.top_logprobs or 0),
        want_logprobs=bool(req.logprobs or req.top_logprobs),
        cache_key=(loaded.adapter, req.session_id),
        logits_processors=processors,
    )
    return PreparedRequest(
        engine_request=engine_request,
        stops=list(req.stop),
        start_in_thinking=start_in_thinking,
        split_thinking=split_thinking,
        tools=tools,
        enable_thinking=thinking,
        prompt_text=text,
        max_tokens_clamped_from=clamped_from,
        warnings=warnings,
    )


def _memory_room(loaded: LoadedModel, prompt_tokens: int, field: str) -> int | None:
    """Tokens that fit to generate under the model's memory ceiling (None: no ceiling)."""
    if not loaded.memory_ceiling:
        return None
    free = loaded.memory_ceiling - loaded.weights_bytes
    fits = free // loaded.kv_bytes_per_token
    if prompt_tokens + 1 > fits:
        raise AdmissionError(
            f"not enough memory: the prompt's {prompt_tokens} tokens need "
            f"{(prompt_tokens + 1) * loaded.kv_bytes_per_token >> 20} MB of KV cache, and only "
            f"{max(0, free) >> 20} MB is free under this model's {loaded.memory_ceiling >> 20} MB ceiling",
            hint="shorten the prompt, or raise --memory-budget",
            field=field,
        )
    return int(fits - prompt_tokens)


class OutputProcessor:
    """Engine token steps in, neutral output events out, for one request."""

    def __init__(self, loaded: LoadedModel, prepared: PreparedRequest) -> None:
        tok = loaded.tokenizer
        self._tokenizer = tok
        self._eos = set(tok.eos_token_ids)
        self._detok = tok.detokenizer
        self._stops = StopMatcher(prepared.stops)
        self._thinking = (
            ThinkingSplitter(tok.think_start, tok.think_end, prepared.start_in_thinking)
            if prepared.split_thinking and tok.think_start
            else None
        )
        self._tools = (
            ToolCallExtractor(
                tok.tool_call_start, tok.tool_call_end, tok.tool_parser, prepared.tools
            )
            if prepared.tools and getattr(tok, "has_tool_calling", False)
            else None
        )
        self._want_logprobs = prepared.engine_request.want_logprobs
        self._seed = prepared.engine_request.sampling.seed
        self.stop_requested = False  # a stop string matched: cancel the engine side
        self._finish_reason: str | None = None

    @property
    def tool_parse_failures(self) -> int:
        return self._tools.failures if self._tools else 0

    def on_step(self, step: TokenStep) -> list[OutputEvent]:
        if self.stop_requested:
            return []
        events: list[OutputEvent] = []
        is_eos = step.finish_reason == "stop" and step.token in self._eos
        if not is_eos:
            self._detok.add_token(step.token)
        if step.finish_reason is not None:
            self._detok.finalize()
        text = self._detok.last_segment
        if self._want_logprobs and not is_eos and step.logprob is not None:
            events.append(self._logprob_event(step))
        events.extend(self._shape(self._stops.feed(text)))
        if self._stops.stopped:
            self.stop_requested = True
            self._finish_reason = "stop"
        return events

    def on_finish(self, finished: Finished) -> list[OutputEvent]:
        events = list(self._shape(self._stops.flush(), final=True))
        reason = self._finish_reason or finished.finish_reason
        calls = self._tools.calls if self._tools else []
        if calls and reason == "stop":
            reason = "tool_calls"
        events.append(
            Done(
                reason, finished.usage, list(calls), finished.error, self._seed, self._stops.matched
            )
        )
        return events

    def _shape(self, text: str, final: bool = False) -> Iterator[OutputEvent]:
        reasoning, content = ("", text)
        if self._thinking is not None:
            reasoning, content = self._thinking.feed(text)
            if final:
                more_r, more_c = self._thinking.flush()
                reasoning, content = reasoning + more_r, content + more_c
        if reasoning:
            yield ReasoningDelta(reasoning)
        if self._tools is not None:
            content, calls = self._tools.feed(content)
            if final:
                tail, more = self._tools.flush()
                content, calls = content + tail, calls + more
            for call in calls:
                yield ToolCallEvent(self._tools.calls.index(call), call)
        if content:
            yield TextDelta(content)

    def _logprob_event(self, step: TokenStep) -> TokenLogprob:
        decode = self._tokenizer.decode
        top = (
            [(decode([t]), finite_logprob(lp)) for t, lp in step.top_logprobs]
            if step.top_logprobs
            else None
        )
        return TokenLogprob(step.token, decode([step.token]), finite_logprob(step.logprob), top)


def finite_logprob(value: float | None) -> float:
    """-inf/NaN (from extreme penalties or biases) as OpenAI's -9999.0: JSON has no inf."""
    value = float(value) if value is not None else float("nan")
    return value if math.isfinite(value) else -9999.0


class Generation:
    """A running request, iterated in the caller's thread; `cancel()` from anywhere."""

    def __init__(self, loaded: LoadedModel, prepared: PreparedRequest) -> None:
        self.prepared = prepared
        self.warnings = list(prepared.warnings)
        self.processor = OutputProcessor(loaded, prepared)
        self._handle, self._steps = loaded.scheduler.stream(prepared.engine_request)

    def cancel(self) -> None:
        self._handle.cancel()

    def __iter__(self) -> Iterator[OutputEvent]:
        # Re-iterable: after an interrupt, iterating again resumes where it was.
        processor = self.processor
        for event in self._steps:
            if isinstance(event, Finished):
                yield from processor.on_finish(event)
                return
            events = processor.on_step(event)
            if processor.stop_requested:
                self._handle.cancel()
            yield from events


class DeferredGeneration:
    """A request whose output is shaped once it has finished, not token by token.

    For batch work nobody watches: the engine's steps are only appended to a
    list (no consumer wake-up per token), then run through the same
    OutputProcessor at the end, so the events are the ones a stream would give.
    Requests with stop strings stream instead: they must stop the engine early.
    """

    def __init__(self, loaded: LoadedModel, prepared: PreparedRequest) -> None:
        self.prepared = prepared
        self.warnings = list(prepared.warnings)
        self.processor = OutputProcessor(loaded, prepared)
        self._steps: list[Any] = []
        self._finished = threading.Event()

        def sink(event: Any) -> None:
            self._steps.append(event)
            if isinstance(event, Finished):
                self._finished.set()

        self._handle = loaded.scheduler.submit(prepared.engine_request, sink)
        self._events: list[OutputEvent] | None = None

    def cancel(self) -> None:
        self._handle.cancel()

    def __iter__(self) -> Iterator[OutputEvent]:
        if self._events is None:
            while not self._finished.wait(0.1):  # a timeout keeps Ctrl-C responsive
                pass
            processor, events = self.processor, []
            for step in self._steps:
                if isinstance(step, Finished):
                    events += processor.on_finish(step)
                    break
                events += processor.on_step(step)
            self._events = events
        yield from self._events


def run(
    loaded: LoadedModel,
    req: GenerationRequest,
    *,
    deferred: bool = False,
    **prepare_options: Any,
) -> Generation | DeferredGeneration:
    prepared = prepare(loaded, req, **prepare_options)
    if deferred and not prepared.stops:
        return DeferredGeneration(loaded, prepared)
    return Generation(loaded, prepared)
