"""`mlxbun jobs`: queue, follow and manage long work in the daemon.

Submitting, cancelling and resuming need a running daemon (`mlxbun serve -d`);
`list`, `show`, `logs` and `rm` read the job store directly when none runs.
"""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer

from mlxbun_cli.completion import complete_job_id, complete_model

app = typer.Typer(
    help="Long work in the daemon: dataset generation, quantize, LoRA fine-tune.",
    no_args_is_help=True,
)
submit_app = typer.Typer(
    help="Queue a job in the daemon (`--watch` follows it).", no_args_is_help=True
)
app.add_typer(submit_app, name="submit")

JobId = Annotated[
    str,
    typer.Argument(
        help="Job id (or a unique start of one).",
        autocompletion=complete_job_id,
        show_default=False,
    ),
]
Watch = Annotated[bool, typer.Option("--watch", "-w", help="Follow the job's progress.")]
JsonOut = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
Remote = Annotated[
    str | None,
    typer.Option("--remote", help="The mlxbun server at this URL.", show_default=False),
]
Model = Annotated[
    str,
    typer.Argument(help="Model name or directory.", autocompletion=complete_model),
]

STATE_STYLE = {
    "queued": "muted",
    "running": "accent",
    "succeeded": "good",
    "failed": "bad",
    "cancelled": "warn",
    "interrupted": "warn",
}


# -- rendering -------------------------------------------------------------------------


def _ago(ts: float | None) -> str:
    if not ts:
        return "—"
    seconds = max(0.0, time.time() - ts)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit} ago"
    return f"{seconds:.0f}s ago"


def progress_text(job: dict[str, Any]) -> str:
    p = job.get("progress") or {}
    if "total" not in p:
        return "—"
    text = f"{p.get('done', 0)}/{p['total']}"
    if job["kind"] == "finetune" and p.get("loss") is not None:
        text += f" · loss {p['loss']:.3f}"
    elif job["kind"] == "quantize" and p.get("stage"):
        text = str(p["stage"])
    elif job["kind"] == "dataset" and p.get("failed"):
        text += f" · {p['failed']} failed"
    return text


def _styled_state(state: str) -> str:
    style = STATE_STYLE.get(state, "muted")
    return f"[{style}]{state}[/{style}]"


def print_job(job: dict[str, Any]) -> None:
    from mlxbun_cli import ui

    out = ui.console()
    out.print(f"[accent]{job['id']}[/accent] · {job['kind']} · {_styled_state(job['state'])}")
    rows = [
        ("progress", progress_text(job)),
        ("output", job.get("output") or "—"),
        ("created", _ago(job.get("created_at"))),
        ("started", _ago(job.get("started_at"))),
        ("finished", _ago(job.get("finished_at"))),
        ("attempt", str(job.get("attempt", 0))),
    ]
    if job.get("error"):
        rows.append(("error", job["error"]))
    for key, value in rows:
        out.print(f"  [muted]{key:>14}[/muted]  {ui.escape(str(value))}")
    for key, value in (job.get("params") or {}).items():
        if value is not None and value != {}:
            out.print(f"  [muted]{key:>14}[/muted]  {ui.escape(str(value))}")


def event_line(kind: str, data: dict[str, Any]) -> str | None:
    """One readable line for an event, or None for the ones a bar shows."""
    if kind == "log":
        return str(data.get("message", ""))
    if kind == "state":
        error = f": {data['error']}" if data.get("error") else ""
        resumed = " (resumed)" if data.get("resumed") else ""
        return f"{data.get('state')}{resumed}{error}"
    if kind == "train":
        return (
            f"step {data.get('step')}: loss {data.get('loss', 0):.4f} · "
            f"{data.get('tokens_per_s', 0):,.0f} tok/s · peak {_mb(data.get('peak_memory_bytes'))}"
        )
    if kind == "val":
        return f"step {data.get('step')}: validation loss {data.get('val_loss', 0):.4f}"
    if kind == "checkpoint":
        return f"checkpoint at step {data.get('step')}"
    if kind == "output":
        return f"output: {data.get('path')}"
    if kind == "progress":
        return None
    return f"{kind}: {data}"


def _mb(value: Any) -> str:
    return f"{(value or 0) / 1e6:.1f} MB"


class JobView:
    """A rich progress bar fed by job events; other events print above it."""

    def __init__(self, kind: str, label: str) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        from mlxbun_cli import ui

        self.kind = kind
        self.console = ui.err_console()
        self.progress = Progress(
            TextColumn("[accent]{task.description}[/accent]"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[extra]}"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=self.console,
            transient=False,
        )
        self.task = self.progress.add_task(label, total=None, extra="")
        self.state: str | None = None
        self.last: dict[str, Any] = {}

    def __enter__(self) -> JobView:
        self.progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.stop()

    def __call__(self, kind: str, data: dict[str, Any]) -> None:
        if kind == "progress":
            self.last = data
            self.progress.update(
                self.task,
                completed=data.get("done", 0),
                total=data.get("total"),
                extra=self._extra(data),
            )
            return
        if kind == "state":
            self.state = data.get("state")
        line = event_line(kind, data)
        if line:
            from mlxbun_cli import ui

            self.console.print(f"[muted]{ui.escape(line)}[/muted]")

    def _extra(self, p: dict[str, Any]) -> str:
        if self.kind == "dataset":
            failed = f" · {p['failed']} failed" if p.get("failed") else ""
            return f"{p.get('tok_s', 0):,.0f} tok/s{failed}"
        if self.kind == "finetune":
            loss = p.get("loss")
            return (f"loss {loss:.3f} · " if loss is not None else "") + (
                f"{p.get('tokens_per_s') or 0:,.0f} tok/s"
            )
        return str(p.get("stage", ""))


def watch_job(client: Any, job_id: str) -> dict[str, Any]:
    """Follow a job until it ends; Ctrl-C detaches (the job goes on)."""
    from mlxbun_cli import ui

    job = client.get(job_id)
    end: dict[str, Any] = {}
    try:
        with JobView(job["kind"], f"{job['kind']} {job['id']}") as view:
            for kind, event in client.events(job["id"], follow=True):
                if kind == "end":
                    end = event
                    break
                view(kind, event.get("data") or {})
    except KeyboardInterrupt:
        ui.note(f"detached; the job goes on (`mlxbun jobs watch {job['id']}` follows it again)")
        raise typer.Exit(130) from None
    final = end.get("job") or client.get(job["id"])
    if end.get("reason") == "server_shutdown":
        ui.note("the daemon is shutting down; the job will be interrupted (resumable)")
    return final


def _finish(job: dict[str, Any]) -> None:
    from mlxbun_cli import ui

    state = job["state"]
    if state == "succeeded":
        ui.console().print(f"[good]succeeded[/good] · {job.get('output') or ''}")
        return
    if state == "failed":
        from mlxbun_cli.errors import MlxbunError

        raise MlxbunError(
            f"job {job['id']} failed: {job.get('error')}",
            hint=f"`mlxbun jobs resume {job['id']}` retries it",
        )
    ui.err_console().print(f"[warn]{state}[/warn] · `mlxbun jobs resume {job['id']}` continues it")
    raise typer.Exit(1)


def _submitted(client: Any, job: dict[str, Any], watch: bool, json_out: bool) -> None:
    from mlxbun_cli import ui

    try:
        if json_out and not watch:
            ui.print_json(job)
            return
        ui.note(f"queued {job['kind']} job {job['id']} → {job.get('output')}")
        if not watch:
            ui.console().print(job["id"])
            return
        final = watch_job(client, job["id"])
    finally:
        client.close()
    if json_out:
        ui.print_json(final)
    _finish(final)


def _submit(
    kind: str, params: dict[str, Any], remote: str | None, watch: bool, json_out: bool
) -> None:
    from mlxbun_cli.jobs.client import require_daemon

    client = require_daemon(remote)
    try:
        job = client.submit(kind, {k: v for k, v in params.items() if v is not None})
    except BaseException:
        client.close()
        raise
    _submitted(client, job, watch, json_out)


def _abs(path: str | None) -> str | None:
    from pathlib import Path

    return str(Path(path).expanduser().resolve()) if path else None


# -- submit ------------------------------------------------------------------------------


@submit_app.command("dataset")
def submit_dataset(
    input: Annotated[str, typer.Argument(help="Requests, one JSON object a line.")],
    output: Annotated[
        str | None,
        typer.Option(
            "--output", "-o", help="Results file (default: IN.out.jsonl).", show_default=False
        ),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            "--model", "-m", help="Model (default: the daemon's).", autocompletion=complete_model
        ),
    ] = None,
    concurrency: Annotated[
        int, typer.Option("--concurrency", "-c", help="Requests in flight at once.", min=1, max=256)
    ] = 64,
    max_tokens: Annotated[
        int | None,
        typer.Option("--max-tokens", "-n", help="Default max_tokens for lines without one."),
    ] = None,
    temperature: Annotated[
        float | None, typer.Option("--temperature", "--temp", "-t", help="Default temperature.")
    ] = None,
    seed: Annotated[int | None, typer.Option("--seed", help="Default seed.")] = None,
    watch: Watch = False,
    json_out: JsonOut = False,
    remote: Remote = None,
) -> None:
    """Generate a reply for every request line of a JSONL file, in the daemon.

    Lines are OpenAI batch lines ({"custom_id", "method", "url", "body"}) or
    plain {"messages": [...]} (chat) / {"prompt": "..."} (text completion)
    objects. Results go to OUT in the OpenAI batch output shape as they finish;
    bad lines go to OUT.errors.jsonl. Resuming skips the custom_ids done.

    Example: mlxbun jobs submit dataset prompts.jsonl -o answers.jsonl -n 256 --watch
    """
    defaults = {
        k: v
        for k, v in (("max_tokens", max_tokens), ("temperature", temperature), ("seed", seed))
        if v is not None
    }
    params = {
        "input": _abs(input),
        "output": _abs(output),
        "model": model,
        "concurrency": concurrency,
        "defaults": defaults,
    }
    _submit("dataset", params, remote, watch, json_out)


@submit_app.command("quantize")
def submit_quantize(
    model: Model,
    bits: Annotated[
        int, typer.Option("--bits", "-b", help="Bits per weight: 2, 3, 4, 5, 6 or 8.")
    ] = 4,
    group_size: Annotated[
        int, typer.Option("--group-size", "-g", help="Weights sharing one scale: 32, 64 or 128.")
    ] = 64,
    recipe: Annotated[
        str | None,
        typer.Option(
            "--recipe",
            help="Mixed-bit recipe: mixed_2_6, mixed_3_4, mixed_3_6 or mixed_4_6.",
            show_default=False,
        ),
    ] = None,
    dtype: Annotated[
        str | None,
        typer.Option(
            "--dtype",
            help="float16, bfloat16 or float32 for the unquantized weights.",
            show_default=False,
        ),
    ] = None,
    name: Annotated[
        str | None,
        typer.Option(
            "--name", help="Name in the models dir (default: MODEL-4bit).", show_default=False
        ),
    ] = None,
    watch: Watch = False,
    json_out: JsonOut = False,
    remote: Remote = None,
) -> None:
    """Quantize a model to MLX 2–8 bit into the models dir, with a model card.

    Example: mlxbun jobs submit quantize Qwen/Qwen3-0.6B --bits 4 --watch
    """
    params = {
        "model": _abs(model) if model.startswith((".", "/", "~")) else model,
        "bits": bits,
        "group_size": group_size,
        "recipe": recipe,
        "dtype": dtype,
        "name": name,
    }
    _submit("quantize", params, remote, watch, json_out)


@submit_app.command("finetune")
def submit_finetune(
    model: Model,
    data: Annotated[
        str,
        typer.Argument(
            help='Training JSONL: {"messages"}, {"prompt","completion"} or {"text"} lines.'
        ),
    ],
    valid: Annotated[
        str | None,
        typer.Option(
            "--valid", help="Validation JSONL (default: a share of DATA).", show_default=False
        ),
    ] = None,
    valid_ratio: Annotated[
        float, typer.Option("--valid-ratio", help="Share of DATA held out for validation.")
    ] = 0.1,
    output: Annotated[
        str | None,
        typer.Option(
            "--output", "-o", help="Adapter dir (default: in the data dir).", show_default=False
        ),
    ] = None,
    name: Annotated[
        str | None, typer.Option("--name", help="Adapter name.", show_default=False)
    ] = None,
    dora: Annotated[bool, typer.Option("--dora", help="Train DoRA instead of LoRA.")] = False,
    iters: Annotated[int, typer.Option("--iters", help="Training steps.", min=1)] = 100,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Rows per step.", min=1)] = 4,
    learning_rate: Annotated[
        float, typer.Option("--learning-rate", "--lr", help="Adam learning rate.")
    ] = 1e-5,
    rank: Annotated[int, typer.Option("--rank", help="LoRA rank.", min=1)] = 8,
    scale: Annotated[float, typer.Option("--scale", help="LoRA scale.")] = 20.0,
    dropout: Annotated[float, typer.Option("--dropout", help="LoRA dropout.")] = 0.0,
    num_layers: Annotated[
        int | None,
        typer.Option(
            "--num-layers", help="Layers to adapt, from the top (-1: all).", show_default=False
        ),
    ] = None,
    max_seq_length: Annotated[
        int, typer.Option("--max-seq-length", help="Longest row, in tokens.")
    ] = 2048,
    mask_prompt: Annotated[
        bool, typer.Option("--mask-prompt", help="Train on the replies only.")
    ] = False,
    save_every: Annotated[
        int, typer.Option("--save-every", help="Checkpoint every N steps.", min=1)
    ] = 100,
    report_every: Annotated[
        int, typer.Option("--report-every", help="A loss event every N steps.", min=1)
    ] = 10,
    seed: Annotated[int, typer.Option("--seed", help="Seed for the split, init and order.")] = 0,
    watch: Watch = False,
    json_out: JsonOut = False,
    remote: Remote = None,
) -> None:
    """LoRA (or DoRA) fine-tune a model on a local JSONL, with checkpoints.

    The adapter dir it writes loads with `mlxbun generate MODEL --adapter DIR`.
    Cancel keeps the last checkpoint; `mlxbun jobs resume ID` continues from it.

    Example: mlxbun jobs submit finetune Qwen/Qwen3-0.6B train.jsonl --iters 600 --watch
    """
    params = {
        "model": _abs(model) if model.startswith((".", "/", "~")) else model,
        "data": _abs(data),
        "valid": _abs(valid),
        "valid_ratio": valid_ratio,
        "output": _abs(output),
        "name": name,
        "fine_tune_type": "dora" if dora else "lora",
        "iters": iters,
        "batch_size": batch_size,
        "learning_rate": learning_rate,
        "rank": rank,
        "scale": scale,
        "dropout": dropout,
        "num_layers": num_layers,
        "max_seq_length": max_seq_length,
        "mask_prompt": mask_prompt,
        "save_every": save_every,
        "report_every": report_every,
        "seed": seed,
    }
    _submit("finetune", params, remote, watch, json_out)


# -- the rest ------------------------------------------------------------------------------


@app.command("list")
def list_(
    kind: Annotated[
        str | None, typer.Option("--kind", help="dataset, quantize or finetune.")
    ] = None,
    state: Annotated[
        str | None,
        typer.Option(
            "--state", help="queued, running, succeeded, failed, cancelled or interrupted."
        ),
    ] = None,
    limit: Annotated[int, typer.Option("--limit", help="Most jobs shown.", min=0)] = 50,
    json_out: JsonOut = False,
    remote: Remote = None,
) -> None:
    """Recent jobs, newest first (read from the store when no daemon runs).

    Example: mlxbun jobs list --state running
    """
    from mlxbun_cli import ui
    from mlxbun_cli.jobs import KINDS, STATES
    from mlxbun_cli.jobs.client import jobs_api

    if kind is not None and kind not in KINDS:
        from mlxbun_cli.errors import OptionError

        raise OptionError("--kind", f"must be one of {', '.join(KINDS)}")
    if state is not None and state not in STATES:
        from mlxbun_cli.errors import OptionError

        raise OptionError("--state", f"must be one of {', '.join(STATES)}")
    client = jobs_api(remote)
    try:
        jobs = client.list(limit, kind, state)
    finally:
        client.close()
    if json_out:
        ui.print_json(jobs)
        return
    if not jobs:
        ui.note("no jobs")
        return
    from rich.table import Table

    table = Table(title="jobs", title_justify="left")
    widths = {"id": 16, "kind": 8, "state": 9, "progress": 8, "created": 7}  # ids never cut
    for column, width in widths.items():
        table.add_column(column, no_wrap=True, min_width=width)
    table.add_column("output", no_wrap=True, overflow="ellipsis", max_width=24)
    for job in jobs:
        table.add_row(
            job["id"],
            job["kind"],
            _styled_state(job["state"]),
            progress_text(job),
            _ago(job.get("created_at")),
            _short_path(job.get("output")),
        )
    ui.console().print(table)


def _short_path(path: str | None) -> str:
    """The output's name: `jobs show` has the whole path."""
    if not path:
        return "—"
    from pathlib import Path

    return Path(path).name


@app.command("show")
def show(job_id: JobId, json_out: JsonOut = False, remote: Remote = None) -> None:
    """A job's state, progress, params and output.

    Example: mlxbun jobs show job_3fa2
    """
    from mlxbun_cli import ui
    from mlxbun_cli.jobs.client import jobs_api

    client = jobs_api(remote)
    try:
        job = client.get(job_id)
    finally:
        client.close()
    if json_out:
        ui.print_json(job)
    else:
        print_job(job)


@app.command("watch")
def watch(job_id: JobId, remote: Remote = None) -> None:
    """Follow a job's progress live; Ctrl-C detaches and the job goes on.

    Exit code 0 when it succeeds, 1 otherwise.

    Example: mlxbun jobs watch job_3fa2
    """
    from mlxbun_cli.jobs.client import jobs_api

    client = jobs_api(remote)
    try:
        final = watch_job(client, job_id)
    finally:
        client.close()
    _finish(final)


@app.command("logs")
def logs(
    job_id: JobId,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new events.")
    ] = False,
    json_out: Annotated[bool, typer.Option("--json", help="One JSON event a line.")] = False,
    remote: Remote = None,
) -> None:
    """A job's events, one a line (--json: every event, progress too, as JSON).

    Example: mlxbun jobs logs job_3fa2 -f
    """
    import json
    import sys

    from mlxbun_cli import ui
    from mlxbun_cli.jobs.client import jobs_api

    client = jobs_api(remote)
    try:
        for kind, event in client.events(job_id, follow=follow):
            if kind == "end":
                break
            if json_out:
                sys.stdout.write(json.dumps(event, ensure_ascii=False) + "\n")
                sys.stdout.flush()
                continue
            line = event_line(kind, event.get("data") or {})
            if line is not None:
                stamp = time.strftime("%H:%M:%S", time.localtime(event.get("ts", 0)))
                ui.console().print(f"[muted]{stamp}[/muted] {kind:<10} {ui.escape(line)}")
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    finally:
        client.close()


@app.command("cancel")
def cancel(job_id: JobId, remote: Remote = None) -> None:
    """Stop a queued or running job; what it finished stays (resume continues).

    Example: mlxbun jobs cancel job_3fa2
    """
    from mlxbun_cli import ui
    from mlxbun_cli.jobs.client import require_daemon

    client = require_daemon(remote)
    try:
        job = client.cancel(job_id)
    finally:
        client.close()
    what = "cancelled" if job["state"] == "cancelled" else "cancelling"
    ui.console().print(f"[warn]{what}[/warn] {job['id']}")


@app.command("resume")
def resume(
    job_id: JobId, watch: Watch = False, json_out: JsonOut = False, remote: Remote = None
) -> None:
    """Queue an interrupted, failed or cancelled job again, from where it stopped.

    Example: mlxbun jobs resume job_3fa2 --watch
    """
    from mlxbun_cli.jobs.client import require_daemon

    client = require_daemon(remote)
    try:
        job = client.resume(job_id)
    except BaseException:
        client.close()
        raise
    _submitted(client, job, watch, json_out)


@app.command("rm")
def rm(
    job_id: JobId,
    outputs: Annotated[
        bool,
        typer.Option("--outputs", help="Delete what it wrote too (results, model or adapter)."),
    ] = False,
    remote: Remote = None,
) -> None:
    """Forget a finished job; --outputs deletes its files as well.

    Example: mlxbun jobs rm job_3fa2 --outputs
    """
    from mlxbun_cli import ui
    from mlxbun_cli.jobs.client import jobs_api

    client = jobs_api(remote)
    try:
        job = client.get(job_id)
        removed = client.remove(job["id"], outputs)
    finally:
        client.close()
    ui.console().print(f"removed {job['id']}")
    for path in removed:
        ui.note(f"deleted {path}")


# -- `generate --batch` ------------------------------------------------------------------


def batch_command(
    input: str,
    output: str | None,
    model: str | None,
    fields: dict[str, Any],
    *,
    concurrency: int,
    adapter: str | None,
    local: bool,
    remote: str | None,
    quiet: bool,
    json_out: bool,
) -> None:
    """`mlxbun generate --batch IN.jsonl -o OUT.jsonl`: run it, show progress, sum up."""
    from pathlib import Path

    from mlxbun_cli import ui
    from mlxbun_cli.services.batch import request_defaults, run_batch

    options = dict(
        output=output,
        model=model,
        defaults=request_defaults(fields),
        concurrency=concurrency,
        adapter=adapter,
        local=local,
        remote=remote,
    )
    if quiet:
        result = run_batch(input, **options)  # type: ignore[arg-type]
    else:
        with JobView("dataset", f"batch {Path(input).name}") as view:
            result = run_batch(input, listener=view, **options)  # type: ignore[arg-type]
    if json_out:
        from dataclasses import asdict

        ui.print_json(asdict(result))
    p = result.progress
    summary = f"{p.get('done', 0)}/{p.get('total', '?')} done → {result.output}"
    if p.get("failed") or p.get("invalid"):
        summary += f" · {p.get('failed', 0)} failed, {p.get('invalid', 0)} bad lines → {result.errors_file}"
    if result.state == "succeeded":
        if not quiet:
            ui.note(
                f"{summary} · {p.get('completion_tokens', 0)} tokens at {p.get('tok_s', 0):,.1f} tok/s ({result.where})"
            )
        return
    ui.err_console().print(f"[warn]stopped[/warn] · {ui.escape(summary)}")
    ui.note("run the same command again to resume: finished requests are not redone")
    raise typer.Exit(130)


def check_batch_flags(
    batch: str | None, prompt: str | None, *, system: str | None, raw: bool, logprobs: int
) -> None:
    from mlxbun_cli.errors import InputError

    if batch is None:
        raise InputError("-o/--output goes with --batch IN.jsonl")
    if prompt is not None:
        raise InputError(
            "--batch reads its prompts from the file; drop the PROMPT argument",
            hint="with --batch the one argument is the model",
        )
    for flag, given in (("--system", system), ("--raw", raw), ("--logprobs", logprobs)):
        if given:
            raise InputError(
                f"{flag} does not apply to --batch",
                hint="put it in each line's body instead (OpenAI batch lines take any request field)",
            )
