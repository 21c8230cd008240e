"""`mlxbun models`: the models on this machine — list, show, pull, rm, add, forget."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from mlxbun_cli.completion import complete_model

if TYPE_CHECKING:
    from mlxbun_cli.model_info import ModelDetails, ModelSummary

app = typer.Typer(
    help="Local models: list, show, pull from the Hub, remove, register directories.",
    no_args_is_help=True,
)

JsonOut = typer.Option(False, "--json", help="Machine-readable output.")


@app.command("list")
def list_(
    quantized: bool = typer.Option(False, "--quantized", help="Only quantized models."),
    max_size: str | None = typer.Option(
        None, "--max-size", help="Only models at most this big on disk: 500MB, 4GB, 1.5G."
    ),
    json_out: bool = JsonOut,
) -> None:
    """Every local model: size, parameters, quantization, capabilities, residency.

    Looks in the Hugging Face cache, mlxbun's data dir and registered directories;
    reads only config files and safetensors headers. Unreadable entries are
    listed as skipped (on stderr).

    Example: mlxbun models list --quantized --max-size 4GB
    """
    from mlxbun_cli import ui
    from mlxbun_cli.model_info import list_models
    from mlxbun_cli.sizes import parse_size

    # Powers of 1024, as the sizes listed: a model shown as 3.9 GB passes 4GB.
    limit = parse_size(max_size, "--max-size") if max_size is not None else None
    listing = list_models(quantized=quantized, max_size=limit)
    if json_out:
        ui.print_json(listing.as_dict())
        return
    _print_listing(listing.models)
    if listing.skipped:
        ui.note(f"skipped {len(listing.skipped)} unreadable:")
        for item in listing.skipped:
            ui.note(f"  {item.id}: {item.reason}")


@app.command("show")
def show(
    model: str = typer.Argument(
        ..., help="Model id, unique part of one, or a directory.", autocompletion=complete_model
    ),
    ctx: int = typer.Option(8192, "--ctx", help="Context length for the memory estimate."),
    json_out: bool = JsonOut,
) -> None:
    """One model in detail: config, chat template, defaults, files, memory needed.

    The memory estimate is the weights plus the KV cache for a context of --ctx
    tokens: 2 x layers x KV heads x head dim x bytes per element, per token.

    Example: mlxbun models show Qwen3-0.6B --ctx 32768
    """
    from mlxbun_cli import ui
    from mlxbun_cli.model_info import show_model

    details = show_model(model, ctx)
    if json_out:
        ui.print_json(details.as_dict())
    else:
        _print_details(details)


@app.command("rm")
def rm(
    model: str = typer.Argument(
        ..., help="Model id or unique part of one.", autocompletion=complete_model
    ),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
) -> None:
    """Delete a downloaded model (hub cache or data dir) after confirmation.

    A registered directory is only unregistered, never deleted. A model the
    running daemon holds in memory is refused.

    Example: mlxbun models rm mlx-community/Qwen3-0.6B-4bit --yes
    """
    from mlxbun_cli import catalog, ui
    from mlxbun_cli.errors import InputError
    from mlxbun_cli.model_info import plan_removal
    from mlxbun_cli.render import human_bytes

    plan = plan_removal(model)
    if not plan.anything:
        ui.note(f"{plan.ref.id}: nothing on disk to remove")
        return
    if plan.action == "unregister":
        verb, what = "unregister", f"{plan.ref.id} (its files in {plan.ref.path} stay)"
    else:
        verb, what = "delete", f"{plan.ref.id}: {plan.targets[0]} ({human_bytes(plan.bytes)})"
    if not yes:
        if not sys.stdin.isatty():
            raise InputError(f"not removing {plan.ref.id} without confirmation: use --yes")
        if not typer.confirm(f"{verb} {what}?", default=False):
            ui.note("nothing removed")
            raise typer.Exit(1)
    catalog.remove(plan.ref)
    ui.note(f"{verb}d {what}")


@app.command("pull")
def pull(
    repo_id: str = typer.Argument(..., help="Hub repo id, ORG/NAME."),
    revision: str | None = typer.Option(None, "--revision", help="Branch, tag or commit."),
) -> None:
    """Download a model from the Hugging Face Hub into its cache (resumable).

    Fetches only what an MLX model needs: configs, *.safetensors, tokenizer
    files and chat templates. Prints the snapshot directory.

    Example: mlxbun models pull mlx-community/Qwen3-0.6B-4bit
    """
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from mlxbun_cli import hub, ui
    from mlxbun_cli.render import human_bytes

    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        _amount_column(),
        TimeRemainingColumn(),
        console=ui.err_console(),
    )
    with progress:
        result = hub.pull(repo_id, revision, tqdm_class=hub.rich_tqdm(progress))
    ui.note(
        f"pulled {result.repo_id}@{result.revision}: {result.files} files, "
        f"{human_bytes(result.bytes)}"
    )
    typer.echo(str(result.path))


@app.command("add")
def add(
    path: Path = typer.Argument(..., help="A model directory (with config.json)."),
    name: str | None = typer.Option(None, "--name", help="Name it goes by (default: folder name)."),
) -> None:
    """Register a model directory under a name, leaving its files where they are.

    Example: mlxbun models add ~/models/my-finetune --name mine
    """
    from mlxbun_cli import catalog, ui

    ref = catalog.register(path, name)
    ui.note(f"registered {ref.id} -> {ref.path}")


@app.command("forget")
def forget(
    name: str = typer.Argument(..., help="A registered name.", autocompletion=complete_model),
) -> None:
    """Unregister a name `models add` made; the directory is not touched.

    Example: mlxbun models forget mine
    """
    from mlxbun_cli import catalog, ui

    ref = catalog.unregister(name)
    ui.note(f"forgot {ref.id}; {ref.path} is untouched")


# --- rendering -----------------------------------------------------------------------


@app.command("ps")
def ps(
    json_out: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Models resident in the daemon: memory, leases, idle time.

    Example: mlxbun models ps
    """
    import time

    from mlxbun_cli import ui
    from mlxbun_cli.render import human_bytes
    from mlxbun_cli.services.residency_client import resident_models

    report = resident_models()
    if json_out:
        ui.print_json(report)
        return
    out = ui.console()
    out.print(
        f"budget {human_bytes(report['budget_bytes'])} · resident {human_bytes(report['resident_bytes'])}"
        f" · max {report['max_models']} models · {report['evictions']} evictions"
    )
    if not report["models"]:
        out.print("[muted]no model resident[/muted]")
    for m in report["models"]:
        flags = [
            f
            for f, on in (("current", m["model"] == report["current"]), ("pinned", m["pinned"]))
            if on
        ]
        idle = time.time() - m["last_used"]
        out.print(
            f"{m['model']}  {m['state']}  pid {m['pid']}  ~{human_bytes(m['estimated_bytes'])}  "
            f"leases {m['leases']}  idle {idle:.0f}s  restarts {m['restarts']}"
            + (f"  ({', '.join(flags)})" if flags else "")
        )


@app.command("load")
def load(
    model: Annotated[str, typer.Argument(help="A local model id.", autocompletion=complete_model)],
    pin: Annotated[
        bool, typer.Option("--pin", help="Keep it resident (never evicted, no idle unload).")
    ] = False,
) -> None:
    """Load a model into the daemon (evicting an idle one if the budget needs room).

    Example: mlxbun models load mlx-community/Qwen3-4B-4bit --pin
    """
    from mlxbun_cli import ui
    from mlxbun_cli.services import residency_client

    with ui.err_console().status(f"loading {model}…"):
        result = residency_client.load(model, pin)
    ui.console().print(
        f"[good]loaded[/good] {result['model']['model']} (pid {result['model']['pid']})"
    )


@app.command("unload")
def unload(
    model: Annotated[
        str, typer.Argument(help="A resident model id.", autocompletion=complete_model)
    ],
) -> None:
    """Unload a resident model from the daemon (refused while it serves a request).

    Example: mlxbun models unload demo
    """
    from mlxbun_cli import ui
    from mlxbun_cli.services import residency_client

    residency_client.unload(model)
    ui.console().print(f"[good]unloaded[/good] {model}")


def human_count(n: int | None) -> str:
    if n is None:
        return "—"
    for size, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= size:
            return f"{n / size:.1f}{suffix}"
    return str(n)


_DTYPES = {"bfloat16": "bf16", "float16": "f16", "float32": "f32"}


def quant_label(model: ModelSummary) -> str:
    q = model.quantization
    if q is None:
        return _DTYPES.get(model.dtype or "", model.dtype or "—")
    if q.get("bits"):
        group = f" g{q['group_size']}" if q.get("group_size") else ""
        return f"{q['bits']}-bit{group}"
    return str(q.get("quant_method") or q.get("mode") or "quantized")


def _print_listing(models: list[ModelSummary]) -> None:
    """Aligned columns as one rich Text: a rich Table takes ~1 ms a row to lay out."""
    from rich.text import Text

    from mlxbun_cli import ui
    from mlxbun_cli.render import human_bytes

    header = ("model", "arch", "params", "quant", "size", "capabilities", "resident")
    rows = [
        (
            m.id,
            m.architecture or "—",
            human_count(m.parameters),
            quant_label(m),
            human_bytes(m.size_bytes) if m.size_bytes is not None else "—",
            " ".join(m.capabilities) or (m.note or ""),
            "yes" if m.resident else "",
        )
        for m in models
    ]
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
    text = Text()
    for n, row in enumerate((header, *rows)):
        cells = [
            cell.rjust(width) if i in (2, 4) else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        style = "bold" if n == 0 else ""
        if row[-1]:
            text.append("  ".join(cells[:-1]) + "  ", style=style)
            text.append(row[-1], style=style or "good")
        else:
            text.append("  ".join(cells[:-1]).rstrip(), style=style)
        text.append("\n")
    text.rstrip()
    ui.console().print(text)


def _print_details(d: ModelDetails) -> None:
    from rich.table import Table

    from mlxbun_cli import ui
    from mlxbun_cli.render import human_bytes

    out = ui.console()
    s = d.summary
    out.print(
        f"[accent]{ui.escape(s.id)}[/accent] [muted]({s.source}: {ui.escape(s.path)})[/muted]"
    )

    def section(title: str, rows: list[tuple[str, str]]) -> None:
        out.print(f"\n[bold]{title}[/bold]")
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="muted")
        grid.add_column()
        for key, value in rows:
            grid.add_row(key, ui.escape(value))
        out.print(grid)

    section(
        "model",
        [
            ("architecture", s.architecture or "—"),
            ("parameters", human_count(s.parameters)),
            ("weights", f"{human_bytes(s.weights_bytes)} ({quant_label(s)})"),
            ("size on disk", human_bytes(s.size_bytes)),
            ("context", f"{s.context_length} tokens" if s.context_length else "—"),
            ("capabilities", ", ".join(s.capabilities) or "—"),
            ("resident", "yes (in the running daemon)" if s.resident else "no"),
        ],
    )
    section("config", [(k, _short(v)) for k, v in d.config.items()])
    if d.chat_template_source:
        out.print(
            f"\n[bold]chat template[/bold] [muted]({d.chat_template_source}, "
            f"{d.chat_template_lines} lines)[/muted]"
        )
        for line in d.chat_template_head:
            out.print(f"  {ui.escape(line)}", highlight=False)
        if d.chat_template_lines > len(d.chat_template_head):
            out.print("  [muted]…[/muted]")
    else:
        out.print("\n[bold]chat template[/bold] [warn]none: only raw completion[/warn]")
    if d.generation:
        section("generation defaults", [(k, _short(v)) for k, v in d.generation.items()])
    files = [
        (f.name, human_bytes(f.size) if f.size is not None else "broken link") for f in d.files
    ]
    section("files", files)
    m = d.memory
    if m.kv_bytes_per_token is None:
        kv = [("KV cache", "unknown (config lacks layers/heads)")]
    else:
        kv = [
            ("KV per token", f"{human_bytes(m.kv_bytes_per_token)} = {m.formula}"),
            ("KV cache", human_bytes(m.kv_bytes)),
        ]
    section(
        f"memory for {m.ctx} tokens of context",
        [
            ("weights", human_bytes(m.weights_bytes)),
            *kv,
            ("total", f"≈ {human_bytes(m.total_bytes)}"),
        ],
    )
    if s.context_length and m.ctx > s.context_length:
        ui.note(f"--ctx {m.ctx} is past the model's max_position_embeddings ({s.context_length})")


def _short(value: object, limit: int = 80) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _amount_column():
    """Bytes done/total and speed for byte bars; n/total for the file count."""
    from rich.progress import ProgressColumn
    from rich.text import Text

    from mlxbun_cli.render import human_bytes

    class Amount(ProgressColumn):
        def render(self, task):
            if task.fields.get("unit") != "B":
                total = "?" if task.total is None else int(task.total)
                return Text(f"{int(task.completed)}/{total}")
            total = human_bytes(task.total) if task.total else "?"
            speed = f" {human_bytes(task.speed)}/s" if task.speed else ""
            return Text(f"{human_bytes(task.completed)}/{total}{speed}")

    return Amount()
