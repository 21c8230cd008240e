"""LoRA / DoRA supervised fine-tuning with mlx-lm's trainer, resumable.

Runs in a worker process. mlx-lm's `train` does the steps; a TrainingCallback
turns its reports into job events (loss, tokens/s, memory), writes a
checkpoint (adapter weights, optimizer state, step) every `save_every` steps
and when asked to stop, and a resumed run loads the last checkpoint and
trains only the steps left. The output is an adapter directory
(adapters.safetensors + adapter_config.json) that `--adapter DIR` loads.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
import types
from pathlib import Path
from typing import Any

from mlxbun_cli.jobs.context import JobContext, Stopped
from mlxbun_cli.jobs.params import read_training_rows, split_sizes

INTERRUPTIBLE = False  # it stops at the next step, after writing a checkpoint

CHECKPOINT = "checkpoint"


class _StopTraining(Exception):
    pass


def split_rows(p: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Training and validation rows: the valid file's, or a seeded share of the data."""
    rows = read_training_rows(Path(p["data"]), "params.data")[0]
    if p.get("valid"):
        return rows, read_training_rows(Path(p["valid"]), "params.valid")[0]
    shuffled = list(rows)
    random.Random(p["seed"]).shuffle(shuffled)
    n_train, _ = split_sizes(len(shuffled), p["valid_ratio"])
    return shuffled[:n_train], shuffled[n_train:]


def adapter_config(p: dict[str, Any], model_path: Path) -> dict[str, Any]:
    """What mlx-lm's `load_adapters` reads, plus how the adapter was made."""
    from mlxbun_cli import __version__

    return {
        "fine_tune_type": p["fine_tune_type"],
        "num_layers": p["num_layers"],
        "lora_parameters": {"rank": p["rank"], "scale": p["scale"], "dropout": p["dropout"]},
        "model": p["model"],
        "base_model_path": str(model_path),
        "data": p["data"],
        "valid": p.get("valid"),
        "iters": p["iters"],
        "batch_size": p["batch_size"],
        "learning_rate": p["learning_rate"],
        "max_seq_length": p["max_seq_length"],
        "mask_prompt": p["mask_prompt"],
        "optimizer": p["optimizer"],
        "seed": p["seed"],
        "mlxbun_version": __version__,
    }


def _optimizer(p: dict[str, Any]) -> Any:
    import mlx.optimizers as optim

    kind = {"adam": optim.Adam, "adamw": optim.AdamW, "sgd": optim.SGD}[p["optimizer"]]
    return kind(learning_rate=p["learning_rate"])


def _replace_file(path: Path, write: Any) -> None:
    tmp = path.with_name(path.name + ".tmp" + path.suffix)
    write(str(tmp))
    os.replace(tmp, path)


def save_checkpoint(out: Path, model: Any, optimizer: Any, step: int) -> Path:
    """Adapter weights, optimizer state and step, swapped in whole."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    final, tmp, old = out / CHECKPOINT, out / f"{CHECKPOINT}.tmp", out / f"{CHECKPOINT}.old"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    weights = dict(tree_flatten(model.trainable_parameters()))
    mx.save_safetensors(str(tmp / "adapters.safetensors"), weights)
    mx.save_safetensors(str(tmp / "optimizer.safetensors"), dict(tree_flatten(optimizer.state)))
    (tmp / "state.json").write_text(json.dumps({"step": step, "time": time.time()}))
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)
    # The adapter dir is usable mid-run, as of the last checkpoint.
    _replace_file(out / "adapters.safetensors", lambda f: mx.save_safetensors(f, weights))
    return final


def load_checkpoint(out: Path, model: Any, optimizer: Any) -> int:
    """The step the last checkpoint reached (0 without one); weights and state loaded."""
    import mlx.core as mx
    from mlx.utils import tree_unflatten

    for name in (CHECKPOINT, f"{CHECKPOINT}.old"):  # .old: killed between the two renames
        directory = out / name
        if (directory / "state.json").is_file():
            break
    else:
        return 0
    step = int(json.loads((directory / "state.json").read_text())["step"])
    model.load_weights(list(mx.load(str(directory / "adapters.safetensors")).items()), strict=False)
    optimizer.state = tree_unflatten(
        list(mx.load(str(directory / "optimizer.safetensors")).items())
    )
    return step


class _Reporter:
    """mlx-lm's TrainingCallback (duck-typed): events, progress, checkpoints, and the stop check."""

    def __init__(self, ctx: JobContext, model: Any, optimizer: Any, out: Path, start: int) -> None:
        self.ctx, self.model, self.optimizer, self.out = ctx, model, optimizer, out
        self.start = start
        self.step = start
        self.saved_step = start
        self.p = ctx.params
        self._window: list[float] = []
        self._val_loss: float | None = None

    def on_val_loss_report(self, info: dict[str, Any]) -> None:
        self._val_loss = float(info["val_loss"])
        step = self.start + int(info["iteration"])
        self.ctx.event(
            "val",
            step=step,
            val_loss=round(self._val_loss, 5),
            seconds=round(float(info["val_time"]), 3),
        )

    def on_train_loss_report(self, info: dict[str, Any]) -> None:
        p = self.p
        self.step = self.start + int(info["iteration"])
        loss = float(info["train_loss"])
        self._window.append(loss)
        memory = int(float(info["peak_memory"]) * 1e9)
        tokens_s = round(float(info["tokens_per_second"]), 1)
        if self.step % p["report_every"] == 0 or self.step == p["iters"]:
            self.ctx.event(
                "train",
                step=self.step,
                loss=round(sum(self._window) / len(self._window), 5),
                learning_rate=float(info["learning_rate"]),
                tokens_per_s=tokens_s,
                it_per_s=round(float(info["iterations_per_second"]), 2),
                trained_tokens=int(info["trained_tokens"]),
                peak_memory_bytes=memory,
            )
            self._window = []
        progress = {
            "done": self.step,
            "total": p["iters"],
            "loss": round(loss, 5),
            "val_loss": self._val_loss,
            "tokens_per_s": tokens_s,
            "peak_memory_bytes": memory,
        }
        stopping = self.ctx.stop.is_set()
        self.ctx.progress(progress, force=stopping or self.step == p["iters"])
        if self.step % p["save_every"] == 0 and self.step < p["iters"]:
            self.checkpoint()
        if stopping:
            self.checkpoint()
            raise _StopTraining()

    def checkpoint(self) -> None:
        if self.saved_step == self.step:
            return
        path = save_checkpoint(self.out, self.model, self.optimizer, self.step)
        self.saved_step = self.step
        self.ctx.event("checkpoint", step=self.step, path=str(path))


def run(ctx: JobContext) -> None:
    import mlx.core as mx
    import numpy as np
    from mlx_lm import load
    from mlx_lm.tuner.datasets import CacheDataset, create_dataset
    from mlx_lm.tuner.trainer import TrainingArgs, train
    from mlx_lm.tuner.utils import linear_to_lora_layers

    from mlxbun_cli.catalog import resolve

    p = ctx.params
    out = Path(p["output"])
    out.mkdir(parents=True, exist_ok=True)
    ref = resolve(p["model"])
    mx.random.seed(p["seed"])
    np.random.seed(p["seed"])
    ctx.progress({"done": 0, "total": p["iters"], "stage": "loading"}, force=True)
    model, tokenizer = load(str(ref.path))
    train_rows, valid_rows = split_rows(p)
    settings = types.SimpleNamespace(mask_prompt=p["mask_prompt"])
    train_set = CacheDataset(create_dataset(train_rows, tokenizer, settings))
    valid_set = None
    if len(valid_rows) >= p["batch_size"]:
        valid_set = CacheDataset(create_dataset(valid_rows, tokenizer, settings))
    model.freeze()
    config = adapter_config(p, ref.path)
    linear_to_lora_layers(
        model, p["num_layers"], config["lora_parameters"], use_dora=p["fine_tune_type"] == "dora"
    )
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    optimizer = _optimizer(p)
    start = load_checkpoint(out, model, optimizer)
    ctx.log(
        f"{len(train_rows)} training rows, {len(valid_rows) if valid_set else 0} validation rows"
        + (f"; resuming from the checkpoint at step {start}" if start else ""),
        start_step=start,
    )
    reporter = _Reporter(ctx, model, optimizer, out, start)
    remaining = p["iters"] - start
    if remaining > 0:
        ctx.check_stop()
        args = TrainingArgs(
            batch_size=p["batch_size"],
            iters=remaining,
            val_batches=p["val_batches"],
            steps_per_report=1,  # each step reports, so a stop is seen at the next step
            steps_per_eval=p["steps_per_eval"],
            steps_per_save=remaining + 1,  # checkpoints are the reporter's
            max_seq_length=p["max_seq_length"],
            adapter_file=str(out / "adapters.safetensors"),
            grad_checkpoint=p["grad_checkpoint"],
        )
        try:
            train(model, optimizer, train_set, valid_set, args, training_callback=reporter)
        except _StopTraining:
            raise Stopped() from None
    from mlx.utils import tree_flatten

    weights = dict(tree_flatten(model.trainable_parameters()))
    _replace_file(out / "adapters.safetensors", lambda f: mx.save_safetensors(f, weights))
    write_card(out, p, ref.path)
    shutil.rmtree(out / CHECKPOINT, ignore_errors=True)
    ctx.event("output", path=str(out), steps=p["iters"])


def write_card(out: Path, p: dict[str, Any], model_path: Path) -> None:
    from mlxbun_cli import __version__

    lines = [
        "---",
        "library_name: mlx",
        "tags:",
        "- mlx",
        "- mlxbun",
        f"- {p['fine_tune_type']}",
        "---",
        "",
        f"# {p['name']}",
        "",
        f"A {p['fine_tune_type'].upper()} adapter for `{p['model']}`, trained with "
        f"mlxbun {__version__} (mlx-lm's trainer) on {time.strftime('%Y-%m-%d')}.",
        "",
        f"- data: `{Path(p['data']).name}`, {p['iters']} steps, batch {p['batch_size']}, "
        f"learning rate {p['learning_rate']}",
        f"- rank {p['rank']}, scale {p['scale']}, dropout {p['dropout']}, layers {p['num_layers']}",
        "",
        f"Use it with `mlxbun generate {p['model']} --adapter {out}`.",
        "",
    ]
    (out / "README.md").write_text("\n".join(lines), encoding="utf-8")
