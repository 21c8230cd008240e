"""`mlxbun generate`: one-shot generation, streamed or as JSON."""

from __future__ import annotations

from typing import Annotated

import typer

from mlxbun_cli.commands import _options as o
from mlxbun_cli.completion import complete_model


def generate(
    model: Annotated[
        str | None,
        typer.Argument(
            autocompletion=complete_model,
            help="Model: `demo`, a local directory, an HF repo id in the local cache, or a unique part of a local name.",
            show_default=False,
        ),
    ] = None,
    prompt: Annotated[
        str | None,
        typer.Argument(
            help="The prompt; `-` reads it from stdin. With one argument it is the prompt and the default model is used.",
            show_default=False,
        ),
    ] = None,
    raw: Annotated[
        bool, typer.Option("--raw", help="Send the prompt as is, without the chat template.")
    ] = False,
    system: o.System = None,
    json_out: Annotated[
        bool,
        typer.Option(
            "--json", help="Print one JSON object with text, reasoning, tool calls and usage."
        ),
    ] = False,
    logprobs: Annotated[
        int,
        typer.Option(
            "--logprobs",
            help="With --json: include each token's logprob and N alternatives.",
            min=0,
            max=20,
        ),
    ] = 0,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="No stats or notes on stderr.")
    ] = False,
    temperature: o.Temperature = None,
    top_p: o.TopP = None,
    top_k: o.TopK = None,
    min_p: o.MinP = None,
    xtc_probability: o.XtcProbability = None,
    xtc_threshold: o.XtcThreshold = None,
    repetition_penalty: o.RepetitionPenalty = None,
    presence_penalty: o.PresencePenalty = None,
    frequency_penalty: o.FrequencyPenalty = None,
    logit_bias: o.LogitBias = None,
    seed: o.Seed = None,
    max_tokens: o.MaxTokens = None,
    stop: o.Stop = None,
    think: o.Think = None,
    reasoning_effort: o.ReasoningEffort = None,
    thinking_budget: o.ThinkingBudget = None,
    adapter: o.Adapter = None,
    json_schema: o.JsonSchemaFile = None,
    tools: o.ToolsFile = None,
    tool_choice: o.ToolChoice = None,
    local: o.Local = False,
    remote: o.Remote = None,
    batch: Annotated[
        str | None,
        typer.Option(
            "--batch",
            help="Run every request line of this JSONL (OpenAI batch lines, or {messages} / "
            "{prompt} objects) with a progress bar; rerunning resumes.",
            rich_help_panel="Batch",
            show_default=False,
        ),
    ] = None,
    output: Annotated[
        str | None,
        typer.Option(
            "--output",
            "-o",
            help="With --batch: the results JSONL (default: IN.out.jsonl).",
            rich_help_panel="Batch",
            show_default=False,
        ),
    ] = None,
    concurrency: Annotated[
        int,
        typer.Option(
            "--concurrency",
            help="With --batch: requests in flight at once (they share one batch).",
            min=1,
            max=256,
            rich_help_panel="Batch",
        ),
    ] = 64,
) -> None:
    """Generate a reply to one prompt, streamed to the terminal.

    The answer goes to stdout; thinking (dimmed) and stats go to stderr, so
    pipes get only the answer.

    Examples:

        mlxbun generate demo "Write a haiku about the sea" -n 40 --seed 1

        echo "Summarise this" | mlxbun generate demo - --json

        mlxbun generate demo --batch prompts.jsonl -o answers.jsonl -n 64
    """
    from mlxbun_cli import render, ui
    from mlxbun_cli.services.generate import (
        build_request,
        open_backend,
        read_prompt,
        structure_fields,
    )

    fields = o.fields_from(locals())
    fields.update(structure_fields(json_schema, tools, tool_choice))
    quiet = quiet or ui.is_quiet()  # `mlxbun -q generate` as well as `generate -q`
    if batch is not None or output is not None:
        from mlxbun_cli.commands.jobs import batch_command, check_batch_flags

        check_batch_flags(batch, prompt, system=system, raw=raw, logprobs=logprobs)
        batch_command(
            batch,
            output,
            model,
            fields,
            concurrency=concurrency,
            adapter=adapter,
            local=local,
            remote=remote,
            quiet=quiet,
            json_out=json_out,
        )
        return
    if prompt is None and model is not None:
        model, prompt = None, model  # one argument: the prompt, with the default model
    request = build_request(
        read_prompt(prompt), system=system, raw=raw, logprobs=logprobs, fields=fields
    )
    backend = open_backend(model, adapter=adapter, local=local, remote=remote)
    try:
        info = backend.model_info()
        if not quiet:
            render.model_banner(info)
        if json_out:
            render.print_result_json(info, backend.stream(request))
        else:
            render.stream_plain(backend.stream(request), show_stats=not quiet)
    finally:
        backend.close()
