"""Which models are resident, which one answers a request, and leases on them.

A request whose `model` is an exact local id leases that model (loading it,
evicting the least recently used unpinned, unleased model when the memory
budget or --max-models needs room); any other name is answered by the current
model. A lease is held until the response body ends, so a model is never
unloaded under a stream.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from mlxbun_cli.catalog import ModelRef, known_models, resolve
from mlxbun_cli.errors import AdmissionError, InputError
from mlxbun_cli.server.state import ServeOptions
from mlxbun_cli.server.supervisor import EngineUnavailable, Supervisor, Worker

log = logging.getLogger("mlxbun.residency")

# Activations, KV cache and the runtime beside the weights.
OVERHEAD_FACTOR = 1.15
OVERHEAD_BYTES = 64 * 1024 * 1024


def estimate_bytes(ref: ModelRef) -> int:
    """Weights on disk plus headroom: the parent never loads a model to size it."""
    total = 0
    try:
        for entry in os.scandir(ref.path):
            if entry.name.endswith(".safetensors"):
                total += os.stat(entry.path).st_size  # follows HF cache symlinks
    except OSError:
        pass
    return int(total * OVERHEAD_FACTOR) + OVERHEAD_BYTES


def default_budget() -> int:
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        physical = 8 << 30
    return int(physical * 0.75)


def parse_keep_alive(value: Any) -> float | None:
    """Ollama-style keep_alive: seconds, or "30s"/"5m"/"1h"; negative = forever."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise InputError('keep_alive must be a duration like 300, "5m" or "1h"')
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str) and value.strip():
        text = value.strip().lower()
        units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
        for suffix in ("ms", "s", "m", "h"):
            if text.endswith(suffix):
                try:
                    seconds = float(text[: -len(suffix)]) * units[suffix]
                except ValueError:
                    break
                return -1.0 if seconds < 0 else seconds
        try:
            seconds = float(text)
        except ValueError:
            raise InputError(
                f'keep_alive {value!r} is not a duration like 300, "5m" or "1h"'
            ) from None
    else:
        raise InputError('keep_alive must be a duration like 300, "5m" or "1h"')
    return -1.0 if seconds < 0 else seconds


@dataclass
class Lease:
    worker: Worker
    router: ModelRouter
    keep_alive: float | None = None
    released: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.router._release(self)


LOCAL_IDS_TTL_S = 2.0
MISS_RESCAN_S = 0.25  # an unknown name rescans, at most this often


class ModelRouter:
    def __init__(self, options: ServeOptions, default: ModelRef) -> None:
        self.options = options
        self.default = default
        self.current = default.id
        self.supervisor = Supervisor(options)
        self.budget = options.memory_budget or default_budget()
        self._lock = asyncio.Lock()
        self._reaper: asyncio.Task | None = None
        self.evictions = 0
        self._local_ids: tuple[float, dict[str, ModelRef]] | None = None
        self._rescanning = False
        self._misses: set[str] = set()  # names not local at the last scan

    # -- which model ----------------------------------------------------------------

    def local_ids(self, fresh: bool = False) -> dict[str, ModelRef]:
        # Scanning the registry, data dir and HF cache costs milliseconds, so
        # the result is reused: once it is LOCAL_IDS_TTL_S old a thread scans
        # again while requests go on with the last scan, so a model added on
        # disk shows up within about that time and no request waits for a scan.
        if fresh or self._local_ids is None:
            self._scan()
        elif time.monotonic() - self._local_ids[0] > LOCAL_IDS_TTL_S and not self._rescanning:
            self._rescanning = True
            try:
                threading.Thread(target=self._scan, name="mlxbun-model-scan", daemon=True).start()
            except RuntimeError:  # no thread to be had: scan here
                self._scan()
        return self._local_ids[1]

    def _scan(self) -> None:
        started = time.monotonic()
        try:
            refs = {ref.id: ref for ref in known_models()}
            refs[self.default.id] = self.default
            # A slow background scan must not replace a newer one made meanwhile.
            if self._local_ids is None or started >= self._local_ids[0]:
                self._local_ids = (started, refs)
                self._misses = set()  # names unknown to the last scan may be known now
        finally:
            self._rescanning = False

    def _scan_age(self) -> float:
        return time.monotonic() - self._local_ids[0] if self._local_ids else float("inf")

    def target_for(self, model: Any) -> ModelRef:
        if model is not None and not isinstance(model, str):
            raise InputError("model must be a string")
        refs = self.local_ids()
        if (
            isinstance(model, str)
            and model not in refs
            and model not in self._misses  # an alias or another server's name: not again
            and self._scan_age() > MISS_RESCAN_S
        ):
            refs = self.local_ids(fresh=True)  # a model added a moment ago
            if model not in refs:
                self._misses.add(model)
        if isinstance(model, str) and model in refs:
            ref = refs[model]
            return resolve(ref.id) if ref.is_demo else ref
        return refs[self.current]

    # -- residency --------------------------------------------------------------------

    @property
    def resident_bytes(self) -> int:
        return sum(w.estimated_bytes for w in self.supervisor.workers.values())

    def _adapter_for(self, ref: ModelRef) -> str | None:
        # `serve MODEL --adapter DIR` applies to that model, not to others it loads.
        return self.options.adapter if ref.id == self.default.id else None

    def prestart_default(self) -> None:
        """Start the default model's worker now, before the parent's own start-up.

        Called before the web stack is imported, so the worker's imports and
        model load overlap the parent's; `start()` then adopts the process.
        """
        if self.default.id in self.supervisor.workers:
            return
        need = estimate_bytes(self.default)
        if need <= self.budget:
            self.supervisor.prestart(
                self.default, self._adapter_for(self.default), memory_ceiling=self.budget
            )

    async def start(self) -> None:
        await self.ensure(self.default, pin=self.default.id in self.options.pinned)
        if self._reaper is None:
            self._reaper = asyncio.get_running_loop().create_task(self._reap_idle())

    async def ensure(self, ref: ModelRef, pin: bool = False) -> Worker:
        """The model's worker, starting it (and evicting others) when needed."""
        async with self._lock:
            worker = self.supervisor.workers.get(ref.id)
            if worker is None:
                need = estimate_bytes(ref)
                await self._make_room(need, ref.id)
                # The model may use what the others leave of the budget.
                worker = self.supervisor.new_worker(
                    ref,
                    need,
                    adapter=self._adapter_for(ref),
                    memory_ceiling=self.budget - self.resident_bytes,
                )
                worker.keep_alive = self.options.keep_alive
            worker.pinned = worker.pinned or pin or ref.id in self.options.pinned
        return worker

    async def _make_room(self, need: int, for_id: str) -> None:
        if need > self.budget:
            raise AdmissionError(
                f"model {for_id} needs about {need >> 20} MB, more than the whole memory budget "
                f"({self.budget >> 20} MB)",
                hint="raise --memory-budget, or use a smaller (quantized) model",
            )
        while self.resident_bytes + need > self.budget or len(self.supervisor.workers) >= max(
            1, self.options.max_models
        ):
            victims = [
                w for w in self.supervisor.workers.values() if not w.pinned and w.leases == 0
            ]
            if not victims:
                raise AdmissionError(
                    f"model {for_id} does not fit: the resident models are pinned or in use",
                    hint="retry when current requests finish, or unload one with `mlxbun models unload`",
                )
            victim = min(victims, key=lambda w: w.last_used)
            log.info("evicting %s to make room for %s", victim.ref.id, for_id)
            self.evictions += 1
            await self.supervisor.stop_worker(victim)

    async def lease(self, model: Any, keep_alive: Any = None) -> Lease:
        ref = self.target_for(model)
        keep = parse_keep_alive(keep_alive)
        worker = await self.ensure(ref)
        worker.leases += 1
        worker.last_used = time.time()
        try:
            await self.supervisor.wait_ready(worker)
        except EngineUnavailable:
            worker.leases -= 1
            raise
        return Lease(worker, self, keep)

    def _release(self, lease: Lease) -> None:
        worker = lease.worker
        worker.leases = max(0, worker.leases - 1)
        worker.last_used = time.time()
        if lease.keep_alive is not None:
            worker.keep_alive = None if lease.keep_alive < 0 else lease.keep_alive

    async def unload(self, model_id: str) -> bool:
        async with self._lock:
            worker = self.supervisor.workers.get(model_id)
            if worker is None:
                return False
            if worker.leases:
                raise InputError(
                    f"model {model_id} is serving {worker.leases} request(s); retry when they end"
                )
            await self.supervisor.stop_worker(worker)
            return True

    async def _reap_idle(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            now = time.time()
            for worker in list(self.supervisor.workers.values()):
                keep = worker.keep_alive
                if (
                    keep is not None
                    and not worker.pinned
                    and worker.leases == 0
                    and worker.state in ("ready", "failed")
                    and now - worker.last_used > keep
                ):
                    log.info("unloading idle model %s (keep_alive %.0fs)", worker.ref.id, keep)
                    async with self._lock:
                        if (
                            worker.leases == 0
                            and self.supervisor.workers.get(worker.ref.id) is worker
                        ):
                            await self.supervisor.stop_worker(worker)

    async def shutdown(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        await self.supervisor.shutdown()

    def report(self) -> dict[str, Any]:
        return {
            "budget_bytes": self.budget,
            "resident_bytes": self.resident_bytes,
            "max_models": self.options.max_models,
            "current": self.current,
            "evictions": self.evictions,
            "models": [w.describe() for w in self.supervisor.workers.values()],
        }


__all__ = ["AdmissionError", "EngineUnavailable", "Lease", "ModelRouter", "estimate_bytes"]
