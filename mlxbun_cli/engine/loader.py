"""Loading a model with mlx-lm, with load time and memory reported."""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlxbun_cli.catalog import ModelRef, read_model_config
from mlxbun_cli.errors import InvalidModelError, ModelLoadError
from mlxbun_cli.prep.options import GenerationDefaults

log = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    ref: ModelRef
    model: Any
    tokenizer: Any
    config: dict[str, Any]
    defaults: GenerationDefaults
    adapter: str | None
    load_seconds: float
    weights_bytes: int
    context_length: int | None
    memory_ceiling: int | None = None  # bytes this model may use in all (admission)
    _scheduler: Any = field(default=None, repr=False)
    _scheduler_lock: Any = field(default_factory=threading.Lock, repr=False)
    scheduler_options: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def id(self) -> str:
        return self.ref.id

    @property
    def is_demo(self) -> bool:
        return self.ref.is_demo

    @property
    def vocab_size(self) -> int:
        return int(self.config.get("vocab_size") or len(self.tokenizer))

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V for every layer: what one more token of context costs."""
        cfg = {**(self.config.get("text_config") or {}), **self.config}
        layers = int(cfg.get("num_hidden_layers") or cfg.get("n_layer") or 0)
        heads = int(cfg.get("num_attention_heads") or 1)
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        head_dim = int(cfg.get("head_dim") or (int(cfg.get("hidden_size") or 0) // heads))
        dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
        width = 4 if "32" in dtype else 2
        return max(1, 2 * layers * kv_heads * head_dim * width)

    @property
    def scheduler(self) -> Any:
        with self._scheduler_lock:  # concurrent first users must share one scheduler
            if self._scheduler is None:
                from mlxbun_cli.engine.scheduler import Scheduler

                self._scheduler = Scheduler(self.model, self.tokenizer, **self.scheduler_options)
            return self._scheduler

    def close(self) -> None:
        if self._scheduler is not None:
            self._scheduler.close()
            self._scheduler = None


def _context_length(config: dict[str, Any]) -> int | None:
    for key in ("max_position_embeddings", "max_seq_len", "n_positions", "seq_length"):
        value = config.get(key) or (config.get("text_config") or {}).get(key)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _check_weights(path: Path) -> None:
    if not any(path.glob("*.safetensors")):
        raise InvalidModelError(
            f"{path} has no *.safetensors weights",
            hint="MLX loads safetensors; convert other formats with `mlx_lm.convert`",
        )


_exit_cleanup_registered = False


def _register_exit_cleanup() -> None:
    """Clear the main thread's mlx streams before the interpreter shuts down."""
    global _exit_cleanup_registered
    if not _exit_cleanup_registered:
        import atexit

        from mlxbun_cli.engine.scheduler import close_all

        atexit.register(close_all)
        _exit_cleanup_registered = True


def load_model(
    ref: ModelRef,
    adapter: str | Path | None = None,
    memory_ceiling: int | None = None,
    **scheduler_options: Any,
) -> LoadedModel:
    config = read_model_config(ref.path)
    _check_weights(ref.path)
    if adapter is not None and not (Path(adapter) / "adapter_config.json").is_file():
        raise InvalidModelError(f"{adapter} is not an adapter directory: no adapter_config.json")
    import mlx.core as mx
    from mlx_lm import load

    _register_exit_cleanup()
    started = time.perf_counter()
    before = mx.get_active_memory()
    try:
        model, tokenizer = load(str(ref.path), adapter_path=str(adapter) if adapter else None)
    except (ValueError, KeyError, FileNotFoundError, json.JSONDecodeError, RuntimeError) as exc:
        raise ModelLoadError(f"could not load model {ref.id}: {exc}") from exc
    except Exception as exc:  # mlx-lm raises many kinds; the user needs one line
        log.exception("model load failed")
        raise ModelLoadError(f"could not load model {ref.id}: {type(exc).__name__}: {exc}") from exc
    # Materialise every weight now (LoRA layers included), on this thread, so the
    # scheduler thread never has to evaluate arrays bound to another thread's stream.
    mx.eval(model.parameters())
    from mlxbun_cli.prep.templates import warm_up

    warm_up(tokenizer)
    elapsed = time.perf_counter() - started
    log.info("loaded %s from %s in %.2fs", ref.id, ref.path, elapsed)
    return LoadedModel(
        ref=ref,
        model=model,
        tokenizer=tokenizer,
        config=config,
        defaults=GenerationDefaults.from_model_dir(ref.path),
        adapter=str(adapter) if adapter else None,
        load_seconds=elapsed,
        weights_bytes=max(0, mx.get_active_memory() - before),
        context_length=_context_length(config),
        memory_ceiling=memory_ceiling,
        scheduler_options=scheduler_options,
    )
