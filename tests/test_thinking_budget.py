"""Thinking budgets: Anthropic's budget_tokens, the OpenAI-wire extension and --thinking-budget."""

from __future__ import annotations

import json

import mlx.core as mx
import pytest
from conftest import run_cli

from mlxbun_cli.engine.types import TokenStep
from mlxbun_cli.errors import OptionError
from mlxbun_cli.prep import thinking_budget
from mlxbun_cli.prep.pipeline import prepare
from mlxbun_cli.prep.request import GenerationRequest
from mlxbun_cli.protocols import anthropic, openai

THINK, END_THINK, EOS = 1022, 1023, 1017  # the demo tokenizer's <think>, </think>, EOS


def _always_think(budget: int | None, **extra) -> GenerationRequest:
    """A request whose every free token is <think>: the budget alone ends each block."""
    fields = dict(
        messages=[{"role": "user", "content": "Why is the sky blue?"}],
        max_tokens=12,
        temperature=0,
        logit_bias={THINK: 100.0, EOS: -100.0},
        chat_template_kwargs={"enable_thinking": True},
        thinking_budget=budget,
    )
    return GenerationRequest(**{**fields, **extra})


def _tokens(loaded, req: GenerationRequest) -> list[int]:
    prepared = prepare(loaded, req)
    _, events = loaded.scheduler.stream(prepared.engine_request)
    return [e.token for e in events if isinstance(e, TokenStep)]


def test_the_budget_ends_the_thinking_block(tiny_loaded, monkeypatch):
    def no_reads(*args):
        raise AssertionError("one-token markers must not wait for the step in flight")

    monkeypatch.setattr(thinking_budget.ThinkingBudget, "_after_reading", no_reads)
    assert tiny_loaded.tokenizer.think_start_tokens == (THINK,)
    assert tiny_loaded.tokenizer.think_end_tokens == (END_THINK,)
    assert _tokens(tiny_loaded, _always_think(None)) == [THINK] * 12
    # <think> opens the block, three tokens think, </think> is forced; only
    # that first block is policed.
    assert _tokens(tiny_loaded, _always_think(3)) == [THINK] * 4 + [END_THINK] + [THINK] * 7


def test_the_budget_ignores_a_bias_against_the_end_marker(tiny_loaded):
    req = _always_think(2, temperature=0.7, seed=3)
    req.logit_bias[END_THINK] = -100.0
    assert _tokens(tiny_loaded, req)[:4] == [THINK, THINK, THINK, END_THINK]


def _drive(processor, prompt: list[int], wants: list[int], vocab: int = 16) -> list[int]:
    """Generate as mlx-lm and the scheduler do: each call sees every token so far,
    but the newest has not been observed yet (it is still being computed)."""
    out: list[int] = []
    for want in wants:
        logits = mx.zeros((1, vocab))
        result = processor(mx.array(prompt + out, dtype=mx.int32), logits)
        row = result[0].tolist()
        forced = [i for i, v in enumerate(row) if v == 0] if min(row) < 0 else None
        assert forced is None or len(forced) == 1
        token = forced[0] if forced else want
        if out:
            processor.observe(out[-1])
        out.append(token)
    return out


def test_markers_of_one_or_more_tokens():
    budget = thinking_budget.ThinkingBudget
    # One-token markers, opened by the model: decided without reading the newest token.
    p = budget(2, (5,), (7,), in_thinking=False, prompt_length=2)
    assert _drive(p, [1, 2], [5, 3, 3, 3, 3, 5, 3, 3]) == [5, 3, 3, 7, 3, 5, 3, 3]
    assert p.state.retired  # a second block is not policed
    # A model that ends its thinking in time is left alone.
    p = budget(3, (5,), (7,), in_thinking=False, prompt_length=2)
    assert _drive(p, [1, 2], [5, 3, 7, 4, 4, 4, 4]) == [5, 3, 7, 4, 4, 4, 4]
    # Opened by the template; the newest token is the end marker just in time.
    p = budget(2, (5,), (7,), in_thinking=True, prompt_length=2)
    assert _drive(p, [1, 2], [3, 7, 4, 4]) == [3, 7, 4, 4]
    # Two-token markers: forced token by token.
    p = budget(2, (5, 6), (7, 8), in_thinking=True, prompt_length=2)
    assert _drive(p, [1, 2], [3, 4, 9, 9, 9]) == [3, 4, 7, 8, 9]
    # Part of the end marker already out when the budget runs out: finished, not restarted.
    p = budget(2, (5,), (7, 8, 9), in_thinking=True, prompt_length=2)
    assert _drive(p, [1, 2], [3, 7, 4, 4, 4, 4]) == [3, 7, 8, 9, 4, 4]


def test_requests_that_cannot_use_a_budget_say_so(tiny_loaded):
    class NoThinking:
        think_start_tokens = None
        think_end_tokens = None

    processor, warning = thinking_budget.for_request(NoThinking(), 5, False, 3)
    assert processor is None and "no thinking markers" in warning
    schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    constrained = prepare(tiny_loaded, _always_think(3, response_format=schema))
    assert constrained.warnings == ["thinking budget ignored: the output is constrained"]
    off = prepare(tiny_loaded, _always_think(3, chat_template_kwargs={"enable_thinking": False}))
    assert off.warnings == [] and off.engine_request.logits_processors == []
    unreachable = prepare(tiny_loaded, _always_think(12))  # max_tokens is 12
    assert unreachable.engine_request.logits_processors == []
    assert len(prepare(tiny_loaded, _always_think(11)).engine_request.logits_processors) == 1
    with pytest.raises(OptionError) as err:
        prepare(tiny_loaded, _always_think(0))
    assert err.value.field == "thinking_budget"


def test_the_wires_carry_the_budget():
    messages = [{"role": "user", "content": "hi"}]
    body = {"max_tokens": 9, "messages": messages}
    enabled = {"type": "enabled", "budget_tokens": 1500}
    assert anthropic.parse_messages({**body, "thinking": enabled}).request.thinking_budget == 1500
    adaptive = {"type": "adaptive"}
    assert anthropic.parse_messages({**body, "thinking": adaptive}).request.thinking_budget is None
    _, req, _, _ = openai.parse_chat({"messages": messages, "thinking_budget": 64})
    assert req.thinking_budget == 64
    for bad in (0, "64", 2.5, True):
        with pytest.raises(openai.WireError) as err:
            openai.parse_chat({"messages": messages, "thinking_budget": bad})
        assert err.value.param == "thinking_budget"


def _generate(model: str, *extra: str) -> dict:
    args = ["generate", model, "Why?", "--think", "--thinking-budget", "2", "--max-tokens", "4"]
    args += ["--logit-bias", f"{THINK}=100", "--logit-bias", f"{EOS}=-100", "--json", *extra]
    result = run_cli(*args)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_cli_flag_in_process_and_through_the_server(tiny_model_dir, server):
    local = _generate(str(tiny_model_dir), "--local")
    assert local["reasoning"] == "<think><think>"  # two thinking tokens, then </think>
    remote = _generate(str(tiny_model_dir), "--remote", server.url)
    assert remote["reasoning"] == local["reasoning"] and remote["text"] == local["text"]


def test_anthropic_sdk_request_with_a_budget(server):
    import anthropic as sdk

    client = sdk.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=60)
    message = client.messages.create(
        model="tiny",
        max_tokens=16,
        thinking={"type": "enabled", "budget_tokens": 4},
        messages=[{"role": "user", "content": "Why is the sky blue?"}],
    )
    assert message.usage.output_tokens <= 16 and message.stop_reason in ("end_turn", "max_tokens")


@pytest.mark.parametrize("where", ["local", "remote"])
def test_the_cli_says_when_a_budget_is_ignored(tiny_model_dir, server, tmp_path, where):
    schema = tmp_path / "schema.json"
    schema.write_text('{"type": "object"}')
    args = ["generate", str(tiny_model_dir), "Why?", "--think", "--thinking-budget", "2"]
    args += ["--json-schema", str(schema), "--max-tokens", "4"]
    args += ["--local"] if where == "local" else ["--remote", server.url]
    plain = run_cli(*args)
    assert plain.returncode == 0, plain.stderr
    assert "warning: thinking budget ignored: the output is constrained" in plain.stderr
    data = json.loads(run_cli(*args, "--json").stdout)
    assert data["warnings"] == ["thinking budget ignored: the output is constrained"]
