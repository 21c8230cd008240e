"""Quantize a model to MLX 2–8 bit (or an mlx-lm mixed recipe) into the models dir.

Runs in a worker process. The model is written to a hidden temp dir beside
the target and renamed into place at the end, so the models dir never holds
a half-written model; a README.md model card records how it was made.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from mlxbun_cli.errors import InputError
from mlxbun_cli.jobs.context import JobContext

INTERRUPTIBLE = True  # one long call: a stop request interrupts it at once
STAGES = ("loading", "quantizing", "saving", "done")


def partial_dir(target: Path, job_id: str) -> Path:
    return target.parent / f".{target.name}.{job_id}.partial"


def run(ctx: JobContext) -> None:
    from mlxbun_cli.catalog import resolve

    p = ctx.params
    target = Path(ctx.job.output or "")
    if target.exists():
        raise InputError(
            f"{target} already exists", hint="remove it, or quantize under another name"
        )
    ref = resolve(p["model"])
    tmp = partial_dir(target, ctx.id)
    shutil.rmtree(tmp, ignore_errors=True)  # what an earlier, killed attempt left
    try:
        info = _convert(ctx, ref.path, tmp)
        write_model_card(tmp, ref.id, p, info)
        ctx.check_stop()
        tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    size = sum(f.stat().st_size for f in target.glob("*.safetensors"))
    ctx.progress(_stage("done", size_bytes=size, **info), force=True)
    ctx.event("output", path=str(target), size_bytes=size, **info)


def _stage(name: str, **extra: Any) -> dict[str, Any]:
    return {"stage": name, "done": STAGES.index(name), "total": len(STAGES) - 1, **extra}


def _convert(ctx: JobContext, source: Path, tmp: Path) -> dict[str, Any]:
    import mlx.core as mx
    from mlx.utils import tree_map_with_path
    from mlx_lm.convert import mixed_quant_predicate_builder
    from mlx_lm.utils import compute_bits_per_weight, load, quantize_model, save

    p = ctx.params
    ctx.progress(_stage("loading"), force=True)
    model, tokenizer, config = load(str(source), return_config=True, lazy=True)
    ctx.check_stop()
    dtype = p.get("dtype") or config.get("torch_dtype")
    if dtype in ("float16", "bfloat16", "float32"):
        target_dtype = getattr(mx, dtype)
        cast = getattr(model, "cast_predicate", lambda _: True)

        def set_dtype(key: str, value: Any) -> Any:
            if cast(key) and mx.issubdtype(value.dtype, mx.floating):
                return value.astype(target_dtype)
            return value

        model.update(tree_map_with_path(set_dtype, model.parameters()))
    ctx.progress(_stage("quantizing"), force=True)
    recipe = p.get("recipe")
    predicate = mixed_quant_predicate_builder(recipe, model, p["group_size"]) if recipe else None
    model, config = quantize_model(
        model, config, p["group_size"], p["bits"], quant_predicate=predicate
    )
    bits_per_weight = round(float(compute_bits_per_weight(model)), 3)
    ctx.check_stop()
    ctx.progress(_stage("saving", bits_per_weight=bits_per_weight), force=True)
    save(tmp, str(source), model, tokenizer, config)
    return {"bits_per_weight": bits_per_weight}


def write_model_card(directory: Path, source: str, p: dict[str, Any], info: dict[str, Any]) -> None:
    from mlxbun_cli import __version__

    is_repo_id = source.count("/") == 1 and not Path(source).is_absolute()
    front = ["---", "library_name: mlx", "pipeline_tag: text-generation"]
    if is_repo_id:
        front.append(f"base_model: {source}")
    front += ["tags:", "- mlx", "- mlxbun", "- quantized", "---", ""]
    settings = {
        "source": f"`{source}`",
        "bits": str(p["bits"]) if not p.get("recipe") else "per layer (recipe)",
        "group size": str(p["group_size"]),
        "recipe": p.get("recipe") or "—",
        "dtype": p.get("dtype") or "the source's",
        "bits per weight": str(info.get("bits_per_weight", "?")),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "mlxbun": __version__,
    }
    rows = "\n".join(f"| {key} | {value} |" for key, value in settings.items())
    body = (
        f"# {p['name']}\n\n"
        f"An MLX quantization of `{source}`, made with `mlxbun jobs submit quantize` "
        f"(mlxbun {__version__}, mlx-lm's quantizer).\n\n"
        f"| setting | value |\n|---|---|\n{rows}\n\n"
        f"Use it with `mlxbun chat {p['name']}` or `mlxbun serve {p['name']}`.\n"
    )
    (directory / "README.md").write_text("\n".join(front) + body, encoding="utf-8")
