"""The engine and shared prep end to end on a real (tiny, random) model."""

from __future__ import annotations

import threading
import time

import pytest

from mlxbun_cli.client.results import collect
from mlxbun_cli.engine.types import TokenStep
from mlxbun_cli.errors import OptionError
from mlxbun_cli.prep.events import Done, TextDelta
from mlxbun_cli.prep.pipeline import OutputProcessor, prepare, run
from mlxbun_cli.prep.request import GenerationRequest


def chat(text: str, **fields) -> GenerationRequest:
    return GenerationRequest(messages=[{"role": "user", "content": text}], **fields)


def no_eos(loaded) -> dict[int, float]:
    """Random weights may emit EOS anywhere; tests that need length forbid it."""
    return {t: -100.0 for t in loaded.tokenizer.eos_token_ids}


def test_seed_replays_exactly(tiny_loaded):
    req = dict(
        max_tokens=24, temperature=0.9, top_p=0.95, seed=1234, logit_bias=no_eos(tiny_loaded)
    )
    first = collect(run(tiny_loaded, chat("Tell me a story", **req)))
    second = collect(run(tiny_loaded, chat("Tell me a story", **req)))
    other = collect(run(tiny_loaded, chat("Tell me a story", **{**req, "seed": 99})))
    assert first.text == second.text and first.reasoning == second.reasoning
    assert first.done.usage.completion_tokens == 24
    assert (other.text, other.reasoning) != (first.text, first.reasoning)


def test_greedy_is_deterministic_and_reports_usage(tiny_loaded):
    a = collect(run(tiny_loaded, chat("hello", max_tokens=12, temperature=0)))
    b = collect(run(tiny_loaded, chat("hello", max_tokens=12, temperature=0)))
    assert a.text == b.text
    usage = a.done.usage
    assert usage.prompt_tokens > 0 and 1 <= usage.completion_tokens <= 12
    assert a.done.finish_reason in ("stop", "length")


def test_stop_string_held_back_across_token_boundaries(tiny_loaded):
    bias = no_eos(tiny_loaded)
    base = collect(
        run(
            tiny_loaded,
            GenerationRequest(prompt="The", max_tokens=40, temperature=0, logit_bias=bias),
        )
    )
    text = base.text
    assert len(text) > 12
    # A stop string that straddles tokens: take characters from the middle.
    stop = text[len(text) // 2 : len(text) // 2 + 5]
    expected = text[: text.find(stop)]
    deltas = []
    for event in run(
        tiny_loaded,
        GenerationRequest(prompt="The", max_tokens=40, temperature=0, logit_bias=bias, stop=[stop]),
    ):
        if isinstance(event, TextDelta):
            deltas.append(event.text)
            assert stop not in "".join(deltas)
        if isinstance(event, Done):
            assert event.finish_reason == "stop"
    assert "".join(deltas) == expected


def test_cancel_stops_at_next_step(tiny_loaded):
    gen = run(
        tiny_loaded, chat("go", max_tokens=2000, temperature=0, logit_bias=no_eos(tiny_loaded))
    )
    seen = 0
    done = None
    for event in gen:
        if isinstance(event, TextDelta):
            seen += 1
            if seen == 3:
                gen.cancel()
        if isinstance(event, Done):
            done = event
    assert done is not None and done.finish_reason == "cancelled"
    assert done.usage.completion_tokens < 50
    assert tiny_loaded.scheduler.active_count == 0


def test_two_concurrent_requests_share_the_batch(tiny_loaded):
    bias = no_eos(tiny_loaded)
    solo = collect(
        run(tiny_loaded, chat("alpha", max_tokens=30, temperature=0, logit_bias=bias))
    ).text
    results: dict[str, str] = {}
    peak = []

    def worker(name: str) -> None:
        results[name] = collect(
            run(tiny_loaded, chat(name, max_tokens=30, temperature=0, logit_bias=bias))
        ).text

    threads = [threading.Thread(target=worker, args=(n,)) for n in ("alpha", "beta")]
    for t in threads:
        t.start()
    deadline = time.time() + 30
    while any(t.is_alive() for t in threads) and time.time() < deadline:
        peak.append(tiny_loaded.scheduler.active_count)
        time.sleep(0.001)
    for t in threads:
        t.join()
    assert max(peak) == 2  # both were members of one batch at once
    assert results["alpha"] == solo  # batching does not change a greedy answer
    assert len(results["beta"]) > 0


def test_prefix_cache_hit_reports_cached_tokens(tiny_loaded):
    system = {"role": "system", "content": "You are a careful assistant. " * 8}
    first = GenerationRequest(
        messages=[system, {"role": "user", "content": "first question"}],
        max_tokens=5,
        temperature=0,
    )
    a = collect(run(tiny_loaded, first))
    second = GenerationRequest(
        messages=[
            system,
            {"role": "user", "content": "first question"},
            {"role": "assistant", "content": a.text},
            {"role": "user", "content": "and another"},
        ],
        max_tokens=5,
        temperature=0,
    )
    b = collect(run(tiny_loaded, second))
    assert (
        a.done.usage.cached_tokens == 0 or a.done.usage.cached_tokens < a.done.usage.prompt_tokens
    )
    assert b.done.usage.cached_tokens > 40
    assert tiny_loaded.scheduler.cache_info()["entries"] >= 1


def test_logprobs_shape(tiny_loaded):
    res = collect(
        run(
            tiny_loaded,
            chat(
                "hi",
                max_tokens=4,
                temperature=0,
                logprobs=True,
                top_logprobs=3,
                logit_bias=no_eos(tiny_loaded),
            ),
        )
    )
    assert len(res.logprobs) == 4
    for entry in res.logprobs:
        assert entry["logprob"] <= 0
        assert len(entry["top_logprobs"]) == 3
        # greedy: the chosen token is the most likely one
        assert entry["logprob"] == pytest.approx(entry["top_logprobs"][0]["logprob"])


def test_thinking_toggle_renders_into_the_template(tiny_loaded):
    off = prepare(tiny_loaded, chat("x", chat_template_kwargs={"enable_thinking": False}))
    on = prepare(tiny_loaded, chat("x", chat_template_kwargs={"enable_thinking": True}))
    effort_none = prepare(tiny_loaded, chat("x", reasoning_effort="none"))
    assert "<think>\n\n</think>" in off.prompt_text
    assert "<think>\n\n</think>" not in on.prompt_text
    assert effort_none.prompt_text == off.prompt_text
    assert off.enable_thinking is False and on.enable_thinking is True


def test_tool_call_parsed_from_real_tokens(tiny_loaded):
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    prepared = prepare(
        tiny_loaded, chat("weather?", tools=tools, chat_template_kwargs={"enable_thinking": False})
    )
    assert "get_weather" in prepared.prompt_text  # the template lists the tools
    tok = tiny_loaded.tokenizer
    reply = (
        'Checking.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    )
    processor = OutputProcessor(tiny_loaded, prepared)
    events = []
    ids = tok.encode(reply)
    for token in ids:
        events += processor.on_step(TokenStep(token, finish_reason=None))
    eos = sorted(tok.eos_token_ids)[0]
    events += processor.on_step(TokenStep(eos, finish_reason="stop"))
    from mlxbun_cli.engine.types import Finished, Usage

    events += processor.on_finish(Finished("stop", Usage()))
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    done = events[-1]
    assert text == "Checking."
    assert done.finish_reason == "tool_calls"
    assert [(c.name, c.arguments) for c in done.tool_calls] == [("get_weather", '{"city": "Oslo"}')]


def test_prompt_that_fills_the_context_is_refused(tiny_loaded):
    with pytest.raises(OptionError) as info:
        prepare(tiny_loaded, GenerationRequest(prompt="word " * 5000))
    assert "context" in str(info.value)


def test_max_tokens_clamped_to_context(tiny_loaded):
    prepared = prepare(tiny_loaded, GenerationRequest(prompt="hello", max_tokens=10**9))
    assert prepared.engine_request.max_tokens < tiny_loaded.context_length
    assert prepared.max_tokens_clamped_from == 10**9


def test_inputs_the_fuzzer_found(tiny_loaded):
    """Each of these once failed inside the shared batch step or the tokenizer."""
    bias = no_eos(tiny_loaded)
    odd = [
        chat("x", max_tokens=3, temperature=0.5, top_k=10**6, logit_bias=bias),  # top_k > vocab
        chat("x", max_tokens=3, temperature=0.5, seed=-(2**60), logit_bias=bias),  # negative seed
        chat("hi \ud83d there", max_tokens=3, logit_bias=bias),  # a lone surrogate
        chat("x", max_tokens=3, repetition_penalty=5e-324, logprobs=True, top_logprobs=2),
    ]
    for req in odd:
        result = collect(run(tiny_loaded, req))
        assert result.done.finish_reason in ("length", "stop")
        for entry in result.logprobs:
            assert entry["logprob"] > float("-inf")


def test_deferred_output_matches_the_stream(tiny_loaded):
    """Batch work shapes replies at the end; the events must be what a stream gives."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    for fields in (
        dict(max_tokens=30, temperature=0.8, seed=3),
        dict(max_tokens=20, temperature=0, logprobs=True, top_logprobs=2, tools=tools),
    ):
        streamed = collect(run(tiny_loaded, chat("hello there", **fields)))
        deferred_gen = run(tiny_loaded, chat("hello there", **fields), deferred=True)
        assert type(deferred_gen).__name__ == "DeferredGeneration"
        deferred = collect(deferred_gen)
        assert (deferred.text, deferred.reasoning, deferred.logprobs) == (
            streamed.text,
            streamed.reasoning,
            streamed.logprobs,
        )
        assert deferred.done.usage.completion_tokens == streamed.done.usage.completion_tokens
    # Stop strings must stop the engine early, so they keep streaming.
    with_stop = run(tiny_loaded, chat("hi", max_tokens=5, stop=["zz"]), deferred=True)
    assert type(with_stop).__name__ == "Generation"
    for _ in with_stop:
        pass
