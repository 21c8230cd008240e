"""`mlxbun chat`: an interactive terminal chat."""

from __future__ import annotations

from typing import Annotated

import typer

from mlxbun_cli.commands import _options as o
from mlxbun_cli.completion import complete_model


def chat(
    model: Annotated[
        str | None,
        typer.Argument(
            autocompletion=complete_model,
            help="Model: `demo`, a local directory, an HF repo id in the local cache, or a unique part of a local name. Default: the configured default_model.",
            show_default=False,
        ),
    ] = None,
    system: o.System = None,
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
    hide_thinking: Annotated[
        bool,
        typer.Option(
            "--hide-thinking", help="Collapse thinking to one line (/thoughts on shows it)."
        ),
    ] = False,
) -> None:
    """Chat with a model in the terminal.

    Replies stream as markdown; thinking shows dimmed. Type /help inside
    for commands. With stdin piped, each input line gets one plain reply.

    Examples:

        mlxbun chat demo

        printf 'hi\\nhow are you\\n' | mlxbun chat demo --seed 1
    """
    import sys

    from mlxbun_cli import chat_ui, render
    from mlxbun_cli.chat_session import ChatSession
    from mlxbun_cli.services.generate import open_backend, structure_fields

    fields = o.fields_from(locals())
    fields.update(structure_fields(json_schema, tools, tool_choice))
    session = ChatSession(fields=fields, system=system, show_thinking=not hide_thinking)
    session.request_for("check")  # bad flags fail before the model loads
    backend = open_backend(model, adapter=adapter, local=local, remote=remote)
    try:
        render.model_banner(backend.model_info())
        if sys.stdin.isatty():
            chat_ui.run_interactive(backend, session)
        else:
            chat_ui.run_piped(backend, session, sys.stdin)
    finally:
        backend.close()
