"""Options shared by `generate` and `chat`, declared once."""

from __future__ import annotations

from typing import Annotated

import typer

Temperature = Annotated[
    float | None,
    typer.Option(
        "--temperature",
        "--temp",
        "-t",
        help="Sampling temperature; 0 is greedy. Default: the model's.",
        rich_help_panel="Sampling",
    ),
]
TopP = Annotated[
    float | None,
    typer.Option("--top-p", help="Nucleus sampling mass in (0, 1].", rich_help_panel="Sampling"),
]
TopK = Annotated[
    int | None,
    typer.Option(
        "--top-k", help="Sample from the k most likely tokens (0: off).", rich_help_panel="Sampling"
    ),
]
MinP = Annotated[
    float | None,
    typer.Option(
        "--min-p", help="Drop tokens below min_p × the top probability.", rich_help_panel="Sampling"
    ),
]
XtcProbability = Annotated[
    float | None,
    typer.Option(
        "--xtc-probability",
        help="XTC: chance of excluding top choices.",
        rich_help_panel="Sampling",
    ),
]
XtcThreshold = Annotated[
    float | None,
    typer.Option("--xtc-threshold", help="XTC: probability threshold.", rich_help_panel="Sampling"),
]
RepetitionPenalty = Annotated[
    float | None,
    typer.Option(
        "--repetition-penalty",
        help="Multiplicative penalty on repeated tokens (1: off).",
        rich_help_panel="Sampling",
    ),
]
PresencePenalty = Annotated[
    float | None,
    typer.Option(
        "--presence-penalty",
        help="Additive penalty on tokens already present, -2..2.",
        rich_help_panel="Sampling",
    ),
]
FrequencyPenalty = Annotated[
    float | None,
    typer.Option(
        "--frequency-penalty",
        help="Penalty by how often a token appeared, -2..2.",
        rich_help_panel="Sampling",
    ),
]
LogitBias = Annotated[
    list[str] | None,
    typer.Option("--logit-bias", help="TOKEN_ID=BIAS, repeatable.", rich_help_panel="Sampling"),
]
Seed = Annotated[
    int | None,
    typer.Option(
        "--seed",
        help="Fixed seed: the same seed replays the same text.",
        rich_help_panel="Sampling",
    ),
]
MaxTokens = Annotated[
    int | None,
    typer.Option("--max-tokens", "-n", help="Most tokens to generate.", rich_help_panel="Sampling"),
]
Stop = Annotated[
    list[str] | None,
    typer.Option(
        "--stop", help="Stop at this text (never printed); repeatable.", rich_help_panel="Sampling"
    ),
]
Think = Annotated[
    bool | None,
    typer.Option(
        "--think/--no-think",
        help="Turn the model's thinking on or off (default: the model's).",
        rich_help_panel="Thinking",
    ),
]
ReasoningEffort = Annotated[
    str | None,
    typer.Option(
        "--reasoning-effort",
        help="none|minimal|low|medium|high|xhigh; none turns thinking off.",
        rich_help_panel="Thinking",
    ),
]
ThinkingBudget = Annotated[
    int | None,
    typer.Option(
        "--thinking-budget",
        min=1,
        metavar="TOKENS",
        help="End the model's thinking after this many tokens, then answer.",
        rich_help_panel="Thinking",
    ),
]
Adapter = Annotated[
    str | None,
    typer.Option("--adapter", help="Path to a LoRA adapter directory.", rich_help_panel="Model"),
]
Local = Annotated[
    bool,
    typer.Option(
        "--local",
        help="Run in this process even when a daemon is running.",
        rich_help_panel="Where",
    ),
]
Remote = Annotated[
    str | None,
    typer.Option(
        "--remote",
        help="Use the mlxbun server at this URL.",
        rich_help_panel="Where",
        show_default=False,
    ),
]
System = Annotated[str | None, typer.Option("--system", "-s", help="System prompt.")]
JsonSchemaFile = Annotated[
    str | None,
    typer.Option(
        "--json-schema",
        help="Constrain replies to JSON valid against this JSON-schema file.",
        rich_help_panel="Structure",
        show_default=False,
    ),
]
ToolsFile = Annotated[
    str | None,
    typer.Option(
        "--tools",
        help="A JSON file with an OpenAI tool list the model may call.",
        rich_help_panel="Structure",
        show_default=False,
    ),
]
ToolChoice = Annotated[
    str | None,
    typer.Option(
        "--tool-choice",
        help="auto (default), none, required, or a function name to force.",
        rich_help_panel="Structure",
        show_default=False,
    ),
]


SAMPLING_PARAMS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "xtc_probability",
    "xtc_threshold",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "seed",
    "max_tokens",
    "stop",
    "think",
    "reasoning_effort",
    "thinking_budget",
)


def fields_from(params: dict) -> dict:
    """The sampling flags among a command's parameters → request fields."""
    return sampling_fields(**{name: params[name] for name in SAMPLING_PARAMS})


def sampling_fields(
    *,
    temperature,
    top_p,
    top_k,
    min_p,
    xtc_probability,
    xtc_threshold,
    repetition_penalty,
    presence_penalty,
    frequency_penalty,
    logit_bias,
    seed,
    max_tokens,
    stop,
    think,
    reasoning_effort,
    thinking_budget,
) -> dict:
    """CLI flags → GenerationRequest keyword arguments."""
    from mlxbun_cli.errors import OptionError

    bias = None
    if logit_bias:
        bias = {}
        for item in logit_bias:
            token, sep, value = item.partition("=")
            try:
                bias[int(token)] = float(value)
            except ValueError:
                raise OptionError("--logit-bias", f"expected TOKEN_ID=BIAS, got {item!r}") from None
            if not sep:
                raise OptionError("--logit-bias", f"expected TOKEN_ID=BIAS, got {item!r}")
    kwargs = {} if think is None else {"enable_thinking": think}
    return dict(
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        min_p=min_p,
        xtc_probability=xtc_probability,
        xtc_threshold=xtc_threshold,
        repetition_penalty=repetition_penalty,
        presence_penalty=presence_penalty,
        frequency_penalty=frequency_penalty,
        logit_bias=bias,
        seed=seed,
        max_tokens=max_tokens,
        stop=list(stop or []),
        chat_template_kwargs=kwargs,
        reasoning_effort=reasoning_effort,
        thinking_budget=thinking_budget,
    )
