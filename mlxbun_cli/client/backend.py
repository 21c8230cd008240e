"""Backends: one interface, generation in process (LocalBackend) or via the daemon."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from mlxbun_cli.prep.events import OutputEvent
from mlxbun_cli.prep.request import GenerationRequest


@dataclass(frozen=True)
class ModelInfo:
    id: str
    is_demo: bool
    where: str  # "in process" or the daemon URL
    load_seconds: float | None = None
    weights_bytes: int | None = None
    context_length: int | None = None
    has_thinking: bool = False
    has_tools: bool = False


class Stream(Protocol):
    # What the request was given that it did not use (an uncompilable schema,
    # an unusable thinking budget); complete once iteration has started.
    warnings: list[str]

    def __iter__(self) -> Iterator[OutputEvent]: ...
    def cancel(self) -> None: ...


class Backend(Protocol):
    def model_info(self) -> ModelInfo: ...
    def stream(self, req: GenerationRequest) -> Stream: ...
    def close(self) -> None: ...


class LocalBackend:
    """Loads the model into this process and runs the shared engine + prep."""

    def __init__(
        self,
        model: str | None,
        *,
        adapter: str | None = None,
        default_model: str | None = None,
        server_thinking: bool | None = None,
        default_max_tokens: int | None = None,
        cache_bytes: int = 1 << 30,
        cache_entries: int = 16,
        constrained_decoding: bool = True,
        compiled_decode: bool = True,
        deferred_output: bool = False,
    ) -> None:
        from mlxbun_cli.catalog import resolve

        self.ref = resolve(model, default_model)  # fail fast, before any heavy import
        self._adapter = adapter
        self._server_thinking = server_thinking
        self._default_max_tokens = default_max_tokens
        self._constrained = constrained_decoding
        # Batch work: shape each reply once it is done rather than per token.
        self._deferred = deferred_output
        self._scheduler_options = {
            "cache_bytes": cache_bytes,
            "cache_entries": cache_entries,
            "compiled_decode": compiled_decode,
        }
        self._loaded: Any = None

    @property
    def loaded(self) -> Any:
        if self._loaded is None:
            from mlxbun_cli.engine.loader import load_model

            self._loaded = load_model(self.ref, self._adapter, **self._scheduler_options)
        return self._loaded

    def model_info(self) -> ModelInfo:
        loaded = self.loaded
        tok = loaded.tokenizer
        return ModelInfo(
            id=loaded.id,
            is_demo=loaded.is_demo,
            where="in process",
            load_seconds=loaded.load_seconds,
            weights_bytes=loaded.weights_bytes,
            context_length=loaded.context_length,
            has_thinking=bool(getattr(tok, "has_thinking", False)),
            has_tools=bool(getattr(tok, "has_tool_calling", False)),
        )

    def stream(self, req: GenerationRequest) -> Stream:
        from mlxbun_cli.prep.pipeline import run

        return run(
            self.loaded,
            req,
            server_thinking=self._server_thinking,
            default_max_tokens=self._default_max_tokens,
            constrained_decoding=self._constrained,
            deferred=self._deferred,
        )

    def stats(self) -> dict[str, Any]:
        if self._loaded is None or self._loaded._scheduler is None:
            return {}
        sched = self._loaded.scheduler
        return {**sched.stats.__dict__, "cache": sched.cache_info()}

    def close(self) -> None:
        if self._loaded is not None:
            self._loaded.close()
