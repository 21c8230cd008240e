"""Each kind's parameters, checked and completed before a job is queued.

A bad value raises an OptionError naming the field (`params.input`), so the
route answers 400 and the CLI one clear line, before any work starts. Paths
are made absolute here: a daemon's working directory is not the caller's.
Import-light: no mlx, no mlx-lm (the daemon's parent never loads them).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mlxbun_cli.errors import InputError, OptionError
from mlxbun_cli.jobs import KINDS

QUANT_BITS = (2, 3, 4, 5, 6, 8)
QUANT_GROUP_SIZES = (32, 64, 128)
# mlx_lm.convert.QUANT_RECIPES, kept here so the daemon need not import mlx-lm
QUANT_RECIPES = ("mixed_2_6", "mixed_3_4", "mixed_3_6", "mixed_4_6")
DTYPES = ("float16", "bfloat16", "float32")
FINE_TUNE_TYPES = ("lora", "dora")
OPTIMIZERS = ("adam", "adamw", "sgd")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def normalize(kind: Any, params: Any, base_dir: Path | None = None) -> tuple[dict[str, Any], str]:
    """→ (complete params, the output path the job writes)."""
    if kind not in KINDS:
        raise OptionError("kind", f"unknown job kind {kind!r}; one of {', '.join(KINDS)}")
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise OptionError("params", "must be an object")
    return CHECKS[kind](dict(params), base_dir or Path.cwd())


# -- field helpers ---------------------------------------------------------------


def _unknown(params: dict[str, Any], allowed: set[str]) -> None:
    for name in params:
        if name not in allowed:
            raise OptionError(
                f"params.{name}", f"unknown parameter; expected {', '.join(sorted(allowed))}"
            )


def _int(
    params: dict[str, Any], name: str, default: int | None, low: int, high: int | None = None
) -> int | None:
    value = params.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise OptionError(f"params.{name}", f"must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        bound = f"from {low} to {high}" if high is not None else f">= {low}"
        raise OptionError(f"params.{name}", f"must be {bound}, got {value}")
    return value


def _float(
    params: dict[str, Any],
    name: str,
    default: float,
    low: float,
    high: float | None = None,
    low_open: bool = False,
) -> float:
    value = params.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise OptionError(f"params.{name}", f"must be a number, got {value!r}")
    if (value <= low if low_open else value < low) or (high is not None and value > high):
        bound = f"{'>' if low_open else '>='} {low}" + (
            f" and <= {high}" if high is not None else ""
        )
        raise OptionError(f"params.{name}", f"must be {bound}, got {value}")
    return float(value)


def _bool(params: dict[str, Any], name: str, default: bool) -> bool:
    value = params.get(name, default)
    if not isinstance(value, bool):
        raise OptionError(f"params.{name}", f"must be true or false, got {value!r}")
    return value


def _choice(params: dict[str, Any], name: str, default: Any, choices: tuple) -> Any:
    value = params.get(name, default)
    if value is not None and value not in choices:
        raise OptionError(
            f"params.{name}", f"must be one of {', '.join(map(str, choices))}, got {value!r}"
        )
    return value


def _str(params: dict[str, Any], name: str, required: bool = False) -> str | None:
    value = params.get(name)
    if value is None:
        if required:
            raise OptionError(f"params.{name}", "is required")
        return None
    if not isinstance(value, str) or not value.strip():
        raise OptionError(f"params.{name}", "must be a non-empty string")
    return value


def _path(value: str, base: Path) -> Path:
    path = Path(value).expanduser()
    return (path if path.is_absolute() else base / path).resolve()


def _input_file(
    params: dict[str, Any], name: str, base: Path, required: bool = True
) -> Path | None:
    value = _str(params, name, required)
    if value is None:
        return None
    path = _path(value, base)
    if not path.is_file():
        raise OptionError(f"params.{name}", f"no such file: {path}")
    if not os.access(path, os.R_OK):
        raise OptionError(f"params.{name}", f"cannot read {path}")
    return path


def writable(path: Path) -> bool:
    """Whether `path` could be created: its nearest existing ancestor is a writable dir."""
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    return parent.is_dir() and os.access(parent, os.W_OK | os.X_OK)


def _model(params: dict[str, Any]) -> tuple[str, Path]:
    from mlxbun_cli.catalog import find

    name = _str(params, "model", required=True)
    assert name is not None
    try:
        ref = find(name)
    except InputError as exc:
        raise OptionError("params.model", exc.message) from None
    return ref.id, ref.path


def _model_config(path: Path) -> dict[str, Any]:
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # the demo model before its first build; the worker builds it
    return config if isinstance(config, dict) else {}


def _base_name(model_id: str) -> str:
    base = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(model_id.rstrip("/")).name).strip("-.")
    return base or "model"


# -- dataset ---------------------------------------------------------------------


def default_output(input_path: Path) -> Path:
    return input_path.with_name(input_path.stem + ".out.jsonl")


def dataset(params: dict[str, Any], base: Path) -> tuple[dict[str, Any], str]:
    _unknown(params, {"input", "output", "model", "concurrency", "defaults"})
    source = _input_file(params, "input", base)
    assert source is not None
    out_value = _str(params, "output")
    output = _path(out_value, base) if out_value else default_output(source)
    if output == source:
        raise OptionError("params.output", "must not be the input file")
    if output.is_dir():
        raise OptionError("params.output", f"{output} is a directory")
    if not (os.access(output, os.W_OK) if output.exists() else writable(output)):
        raise OptionError("params.output", f"cannot write to {output}")
    out: dict[str, Any] = {"input": str(source), "output": str(output)}
    if params.get("model") is not None:
        out["model"] = _model(params)[0]
    out["concurrency"] = _int(params, "concurrency", 16, 1, 256)
    defaults = params.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise OptionError("params.defaults", "must be an object of request fields")
    check_defaults(defaults)
    out["defaults"] = defaults
    return out, str(output)


def check_defaults(defaults: dict[str, Any]) -> None:
    """Request fields every line inherits, checked as one request would be."""
    from mlxbun_cli.prep.request import validate
    from mlxbun_cli.protocols import WireError
    from mlxbun_cli.protocols.openai import parse_chat

    probe = {**defaults, "messages": [{"role": "user", "content": "probe"}]}
    try:
        validate(parse_chat(probe)[1])
    except WireError as exc:
        field = f"params.defaults.{exc.param}" if exc.param else "params.defaults"
        raise OptionError(field, exc.message) from None
    except OptionError as exc:
        raise OptionError(f"params.defaults.{exc.field}", exc.message.split(": ", 1)[-1]) from None


# -- quantize --------------------------------------------------------------------


def quantize(params: dict[str, Any], base: Path) -> tuple[dict[str, Any], str]:
    from mlxbun_cli import paths

    _unknown(params, {"model", "bits", "group_size", "recipe", "dtype", "name"})
    model_id, model_path = _model(params)
    bits = _choice(params, "bits", 4, QUANT_BITS)
    group_size = _choice(params, "group_size", 64, QUANT_GROUP_SIZES)
    recipe = _choice(params, "recipe", None, QUANT_RECIPES)
    dtype = _choice(params, "dtype", None, DTYPES)
    config = _model_config(model_path)
    hidden = config.get("hidden_size") or (config.get("text_config") or {}).get("hidden_size")
    if isinstance(hidden, int) and hidden % group_size:
        raise OptionError(
            "params.group_size", f"must divide the model's hidden size ({hidden}), got {group_size}"
        )
    if config.get("quantization"):
        raise OptionError("params.model", f"{model_id} is already quantized")
    name = _str(params, "name") or f"{_base_name(model_id)}-{recipe or f'{bits}bit'}"
    if not _NAME.match(name):
        raise OptionError(
            "params.name", f"{name!r} cannot name a model: use letters, digits, . _ -"
        )
    target = paths.models_dir() / name
    if target.exists():
        raise OptionError("params.name", f"{target} already exists; pick another name")
    if not writable(target):
        raise OptionError("params.name", f"cannot write to {target.parent}")
    out = {
        "model": model_id,
        "bits": bits,
        "group_size": group_size,
        "recipe": recipe,
        "dtype": dtype,
        "name": name,
    }
    return out, str(target)


# -- finetune --------------------------------------------------------------------

DATA_FORMATS = ("chat", "completions", "text")


def row_format(row: Any) -> str | None:
    """chat {"messages"}, completions {"prompt","completion"} or text {"text"}; None otherwise."""
    if not isinstance(row, dict):
        return None
    if isinstance(row.get("messages"), list) and row["messages"]:
        return "chat"
    if isinstance(row.get("prompt"), str) and isinstance(row.get("completion"), str):
        return "completions"
    if isinstance(row.get("text"), str):
        return "text"
    return None


def read_training_rows(path: Path, field: str) -> tuple[list[dict[str, Any]], str]:
    """All rows of a training JSONL, one format throughout; blank lines skipped."""
    rows: list[dict[str, Any]] = []
    kind: str | None = None
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise OptionError(field, f"cannot read {path}: {exc}") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise OptionError(field, f"{path} line {number}: not valid JSON ({exc})") from None
        found = row_format(row)
        if found is None:
            raise OptionError(
                field,
                f'{path} line {number}: expected {{"messages": [...]}}, '
                '{"prompt", "completion"} or {"text"}',
            )
        if kind is not None and found != kind:
            raise OptionError(field, f"{path} line {number}: a {found} row in a {kind} file")
        kind = found
        rows.append(row)
    if not rows:
        raise OptionError(field, f"{path} has no rows")
    assert kind is not None
    return rows, kind


def split_sizes(n: int, ratio: float) -> tuple[int, int]:
    """(train, valid) row counts when the valid rows come out of the training file."""
    n_valid = int(n * ratio) if n >= 2 else 0
    return n - n_valid, n_valid


def finetune(params: dict[str, Any], base: Path) -> tuple[dict[str, Any], str]:
    from mlxbun_cli import paths

    allowed = {
        "model", "data", "valid", "valid_ratio", "output", "name", "fine_tune_type", "rank",
        "scale", "dropout", "num_layers", "iters", "batch_size", "learning_rate",
        "max_seq_length", "mask_prompt", "save_every", "report_every", "steps_per_eval",
        "val_batches", "seed", "optimizer", "grad_checkpoint",
    }  # fmt: skip
    _unknown(params, allowed)
    model_id, model_path = _model(params)
    layers = _model_config(model_path).get("num_hidden_layers")
    data = _input_file(params, "data", base)
    assert data is not None
    rows, fmt = read_training_rows(data, "params.data")
    valid = _input_file(params, "valid", base, required=False)
    if valid is not None:
        valid_fmt = read_training_rows(valid, "params.valid")[1]
        if valid_fmt != fmt:
            raise OptionError("params.valid", f"{valid_fmt} rows, but the data has {fmt} rows")
    ratio = _float(params, "valid_ratio", 0.1, 0.0, 0.5)
    n_train = len(rows) if valid is not None else split_sizes(len(rows), ratio)[0]
    batch_size = _int(params, "batch_size", 4, 1, 1024)
    assert batch_size is not None
    if n_train < batch_size:
        raise OptionError(
            "params.batch_size", f"{batch_size} is more than the {n_train} training rows"
        )
    default_layers = min(16, layers) if isinstance(layers, int) else 16
    num_layers = _int(params, "num_layers", default_layers, -1)
    if num_layers == 0:
        raise OptionError("params.num_layers", "must be >= 1, or -1 for every layer")
    if isinstance(layers, int) and num_layers is not None and num_layers > layers:
        raise OptionError("params.num_layers", f"the model has {layers} layers, got {num_layers}")
    fine_tune_type = _choice(params, "fine_tune_type", "lora", FINE_TUNE_TYPES)
    name = _str(params, "name") or (
        f"{_base_name(model_id)}-{fine_tune_type}-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    if not _NAME.match(name):
        raise OptionError(
            "params.name", f"{name!r} cannot name an adapter: use letters, digits, . _ -"
        )
    out_value = _str(params, "output")
    output = _path(out_value, base) if out_value else paths.data_dir() / "adapters" / name
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise OptionError("params.output", f"{output} already exists and is not empty")
    if not writable(output):
        raise OptionError("params.output", f"cannot write to {output}")
    out = {
        "model": model_id,
        "data": str(data),
        "valid": str(valid) if valid else None,
        "valid_ratio": ratio,
        "format": fmt,
        "output": str(output),
        "name": name,
        "fine_tune_type": fine_tune_type,
        "rank": _int(params, "rank", 8, 1, 1024),
        "scale": _float(params, "scale", 20.0, 0.0, low_open=True),
        "dropout": _float(params, "dropout", 0.0, 0.0, 0.99),
        "num_layers": num_layers,
        "iters": _int(params, "iters", 100, 1),
        "batch_size": batch_size,
        "learning_rate": _float(params, "learning_rate", 1e-5, 0.0, low_open=True),
        "max_seq_length": _int(params, "max_seq_length", 2048, 8),
        "mask_prompt": _bool(params, "mask_prompt", False),
        "save_every": _int(params, "save_every", 100, 1),
        "report_every": _int(params, "report_every", 10, 1),
        "steps_per_eval": _int(params, "steps_per_eval", 200, 1),
        "val_batches": _int(params, "val_batches", 25, -1),
        "seed": _int(params, "seed", 0, 0),
        "optimizer": _choice(params, "optimizer", "adam", OPTIMIZERS),
        "grad_checkpoint": _bool(params, "grad_checkpoint", False),
    }
    if out["mask_prompt"] and fmt == "text":
        raise OptionError("params.mask_prompt", "needs chat or completions rows, not text")
    return out, str(output)


CHECKS: dict[str, Callable[[dict[str, Any], Path], tuple[dict[str, Any], str]]] = {
    "dataset": dataset,
    "quantize": quantize,
    "finetune": finetune,
}
