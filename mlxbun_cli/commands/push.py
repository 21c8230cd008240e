"""`mlxbun push`: send a model, an adapter or a dataset to the Hugging Face Hub.

`mlxbun push PATH REPO_ID` and `mlxbun push --job ID REPO_ID` run `push upload`
(the group's default command); `push login|logout|status` manage the token.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer.core import TyperGroup

from mlxbun_cli.completion import complete_job_id, complete_repo_id

if TYPE_CHECKING:
    from mlxbun_cli.publishing.push import PushPlan, PushResult

DEFAULT_COMMAND = "upload"


class _UploadByDefault(TyperGroup):
    """A group whose first word, when it names no subcommand, starts `upload`.

    So `mlxbun push ./model me/model` is `mlxbun push upload ./model me/model`,
    while `mlxbun push login` is the login command (a folder named like a
    subcommand is pushed as ./login).
    """

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        help_names = ctx.help_option_names or ["--help"]
        if args and args[0] not in self.commands and args[0] not in help_names:
            args = [DEFAULT_COMMAND, *args]
        return super().parse_args(ctx, args)


app = typer.Typer(
    cls=_UploadByDefault,
    help="Publish a model, an adapter or a dataset to the Hugging Face Hub.\n\n"
    "mlxbun push PATH REPO_ID, or mlxbun push --job ID REPO_ID, runs `upload`\n"
    "(`mlxbun push upload --help` lists its options); login, logout and status\n"
    "manage the Hub token.\n\n"
    "Example: mlxbun push ./Qwen3-0.6B-4bit me/Qwen3-0.6B-4bit --private",
    no_args_is_help=True,
)

TokenOption = Annotated[
    str | None,
    typer.Option(
        "--token",
        help="Hub token (else HF_TOKEN, then `push login`'s, then huggingface_hub's). "
        "Others can see it in the process list: prefer those.",
    ),
]
JsonOut = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]


@app.command(DEFAULT_COMMAND)
def upload(
    path: Annotated[
        Path | None,
        typer.Argument(
            metavar="PATH",
            help="A model folder, an adapter folder, or a .jsonl file / folder of them.",
            show_default=False,
        ),
    ] = None,
    repo_id: Annotated[
        str | None,
        typer.Argument(
            metavar="REPO_ID",
            help="The Hub repo: ORG/NAME (or NAME, in your namespace).",
            autocompletion=complete_repo_id,
            show_default=False,
        ),
    ] = None,
    job: Annotated[
        str | None,
        typer.Option(
            "--job",
            help="Push a succeeded job's output instead of PATH.",
            autocompletion=complete_job_id,
        ),
    ] = None,
    private: Annotated[
        bool, typer.Option("--private", help="Make the repo private (when it is created).")
    ] = False,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="List what would be sent, and the card; no network."),
    ] = False,
    token: TokenOption = None,
    json_out: JsonOut = False,
) -> None:
    """Send a model, an adapter or a dataset to the Hub (the default command).

    A model folder (config.json + *.safetensors) or an adapter folder
    (adapter_config.json + adapters.safetensors) goes to a model repo, *.jsonl
    data to a dataset repo; the repo is created when missing. Unless the
    folder has its own README.md, a card that records how it was made goes
    into the commit (never into the folder). Unchanged content: no commit.

    Example: mlxbun push --job job_3f2a me/my-lora --dry-run
    """
    from mlxbun_cli import ui
    from mlxbun_cli.completion import remember_repo_id
    from mlxbun_cli.errors import InputError
    from mlxbun_cli.publishing import credentials, push

    if job is not None and repo_id is None and path is not None:
        path, repo_id = None, str(path)  # `push --job ID REPO_ID`
    if repo_id is None:
        raise InputError("give the repo to push to: mlxbun push PATH REPO_ID (or --job ID REPO_ID)")
    plan = push.plan(repo_id, source_path=path, job_id=job, private=private)
    if dry_run:
        _print_plan(plan, credentials.resolve(token), json_out)
        return
    credential = credentials.require(token)
    result = _run(plan, credential, quiet=json_out)
    remember_repo_id(result.repo_id)
    if json_out:
        ui.print_json(result.as_dict())
        return
    _print_result(plan, result)


@app.command("login")
def login(token: TokenOption = None, json_out: JsonOut = False) -> None:
    """Save a Hub token for mlxbun (mode 0600), checked with the Hub.

    Without --token it asks for one (hidden), or reads a line from a pipe.
    A token the Hub refuses is not saved; when the Hub cannot be reached it
    is saved anyway, with a warning.

    Example: mlxbun push login
    """
    import sys

    from mlxbun_cli import ui
    from mlxbun_cli.publishing import credentials

    if token is None:
        if sys.stdin.isatty():
            token = typer.prompt("Hugging Face token", hide_input=True)
        else:
            token = sys.stdin.readline()
    result = credentials.login(token)
    if json_out:
        ui.print_json(result.as_dict())
        return
    who = f"logged in as {result.user}" if result.user else "token saved"
    ui.console().print(f"[good]{ui.escape(who)}[/good]: {ui.escape(str(result.path))} (mode 0600)")
    if result.warning:
        ui.err_console().print(f"[warn]warning: {ui.escape(result.warning)}[/warn]")
    if result.overridden_by:
        ui.note(f"{result.overridden_by} is set and takes precedence over the saved token")


@app.command("logout")
def logout() -> None:
    """Remove mlxbun's saved token (other sources are left as they are).

    Example: mlxbun push logout
    """
    from mlxbun_cli import ui
    from mlxbun_cli.publishing import credentials

    path = credentials.token_file()
    if credentials.remove():
        ui.console().print(f"removed {ui.escape(str(path))}")
    else:
        ui.note(f"no saved token ({path})")
    still = credentials.resolve()
    if still is not None:
        ui.note(f"a token still comes from {still.describe()}")


@app.command("status")
def status(json_out: JsonOut = False) -> None:
    """Say where the Hub token in force comes from (never the token itself).

    Example: mlxbun push status
    """
    from mlxbun_cli import ui
    from mlxbun_cli.publishing import credentials

    found = credentials.all_sources()
    saved = credentials.token_file()
    mode = credentials.file_mode(saved)
    if json_out:
        ui.print_json(
            {
                "ok": True,
                "hasToken": bool(found),
                "source": found[0].as_dict() if found else None,
                "others": [c.as_dict() for c in found[1:]],
                "saved_file": str(saved),
                "saved_mode": oct(mode) if mode is not None else None,
            }
        )
        return
    out = ui.console()
    if not found:
        out.print(f"[warn]no Hugging Face token[/warn]: {credentials.HOW_TO_GIVE}")
        return
    out.print(f"token in force: from {ui.escape(found[0].describe())}")
    for other in found[1:]:
        ui.note(f"also set, not used: {other.describe()}")
    if mode is not None and mode & 0o077:
        ui.err_console().print(
            f"[warn]warning: {ui.escape(str(saved))} is readable by others "
            f"(mode {oct(mode)}); chmod 600 it[/warn]"
        )


# -- rendering ----------------------------------------------------------------------------


def _run(plan: PushPlan, credential: Any, quiet: bool) -> PushResult:
    """Execute with a progress display on stderr (a terminal): one line per step.

    On failure the lines are taken away, so the error stands alone.
    """
    from huggingface_hub.utils import (
        are_progress_bars_disabled,
        disable_progress_bars,
        enable_progress_bars,
    )
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from mlxbun_cli import ui
    from mlxbun_cli.publishing import push

    console = ui.err_console()
    progress = Progress(
        SpinnerColumn(finished_text="[good]✓[/good]"),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=console,
        disable=quiet or not console.is_terminal,
    )
    tasks: list[Any] = []

    def finish(**fields: Any) -> None:
        for task in tasks:
            progress.update(task, total=1, completed=1, **fields)

    def on_stage(name: str, detail: str) -> None:
        finish()
        tasks.append(progress.add_task(f"{name}: {ui.escape(detail)}", total=None))

    # huggingface_hub's own tqdm bars would fight the rich display for the terminal.
    was_disabled = are_progress_bars_disabled()
    disable_progress_bars()
    try:
        with progress:
            try:
                result = push.execute(plan, credential, on_stage=on_stage)
            except BaseException:
                finish(visible=False)
                raise
            finish()
    finally:
        if not was_disabled:
            enable_progress_bars()
    return result


def _print_plan(plan: PushPlan, credential: Any, json_out: bool) -> None:
    from rich.table import Table

    from mlxbun_cli import ui
    from mlxbun_cli.render import human_bytes

    if json_out:
        data = plan.as_dict()
        data["token_source"] = credential.as_dict() if credential else None
        ui.print_json(data)
        return
    out = ui.console()
    rows = f", {plan.content.rows} rows" if plan.content.rows is not None else ""
    out.print(
        f"[accent]dry run[/accent]: would push the {plan.kind} in "
        f"{ui.escape(str(plan.content.root))}{rows} to the {plan.repo_type} repo "
        f"[bold]{ui.escape(plan.repo_id)}[/bold]" + (" (private)" if plan.private else "")
    )
    table = Table(show_edge=False, pad_edge=False, box=None)
    table.add_column("file")
    table.add_column("size", justify="right")
    table.add_column("from", style="muted")
    for f in plan.files:
        table.add_row(
            ui.escape(f.path_in_repo),
            human_bytes(f.size),
            "generated card" if f.local is None else ui.escape(str(f.local)),
        )
    out.print(table)
    out.print(f"{len(plan.files)} files, {human_bytes(plan.total_bytes)}")
    token = f"from {credential.describe()}" if credential else "none found (the push would fail)"
    out.print(f"[muted]token: {ui.escape(token)}[/muted]")
    if plan.card is None:
        out.print("[muted]card: the folder's own README.md[/muted]")
    else:
        out.print("\n[bold]README.md (generated)[/bold]")
        out.print(ui.escape(plan.card), highlight=False)


def _print_result(plan: PushPlan, result: PushResult) -> None:
    from mlxbun_cli import ui
    from mlxbun_cli.render import human_bytes

    short = (result.commit or "")[:8]
    if result.up_to_date:
        ui.note(f"{result.repo_id} is already up to date (commit {short}); nothing was committed")
    else:
        ui.note(
            f"pushed the {result.kind} to {result.repo_id}: {len(result.files)} files, "
            f"{human_bytes(plan.total_bytes)}, commit {short}"
        )
    if result.private_ignored:
        ui.err_console().print(
            f"[warn]warning: {ui.escape(result.repo_id)} already existed as a public repo; "
            "--private only applies when the repo is created[/warn]"
        )
    typer.echo(result.url)
