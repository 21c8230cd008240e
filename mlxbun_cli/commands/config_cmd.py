"""`mlxbun config`: what settings are in force and where each came from."""

from __future__ import annotations

import typer

app = typer.Typer(
    help="Show and change settings (flags > MLXBUN_* env > config file > defaults).",
    no_args_is_help=True,
)


@app.command("show")
def show(json_out: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """Print every setting, its value and where it came from.

    Example: MLXBUN_PORT=9000 mlxbun config show
    """
    from mlxbun_cli import paths, ui
    from mlxbun_cli.config import SPEC_BY_NAME, Settings

    settings = Settings()
    data = settings.public_dict()
    if json_out:
        ui.print_json(
            {
                "settings": data,
                "config_file": str(paths.config_file()),
                "locations": {k: str(v) for k, v in paths.all_locations().items()},
            }
        )
        return
    from rich.table import Table

    table = Table(title="settings", title_justify="left")
    for column in ("setting", "value", "source", "meaning"):
        table.add_column(column)
    for name, item in data.items():
        value = "—" if item["value"] is None else str(item["value"])
        table.add_row(name, value, item["source"], SPEC_BY_NAME[name].help)
    out = ui.console()
    out.print(table)
    out.print(f"[muted]config file: {paths.config_file()}[/muted]")
    for kind, path in paths.all_locations().items():
        out.print(f"[muted]{kind:>6}: {path}[/muted]")


@app.command("set")
def set_(
    name: str = typer.Argument(..., help="Setting name."),
    value: str = typer.Argument(..., help="New value."),
) -> None:
    """Save a setting in the config file.

    Example: mlxbun config set default_model demo
    """
    from mlxbun_cli import ui
    from mlxbun_cli.config import SPEC_BY_NAME, set_in_file

    set_in_file(name, value)
    shown = "(set)" if name in SPEC_BY_NAME and SPEC_BY_NAME[name].secret else value
    ui.note(f"{name} = {shown} saved")


@app.command("unset")
def unset(name: str = typer.Argument(..., help="Setting name.")) -> None:
    """Remove a setting from the config file (back to env or default).

    Example: mlxbun config unset default_model
    """
    from mlxbun_cli import ui
    from mlxbun_cli.config import set_in_file

    set_in_file(name, None)
    ui.note(f"{name} removed from the config file")


@app.command("path")
def path() -> None:
    """Print the config file's path.

    Example: $EDITOR "$(mlxbun config path)"
    """
    from mlxbun_cli import paths

    typer.echo(str(paths.config_file()))
