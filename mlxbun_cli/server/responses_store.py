"""The Responses wire's conversation history: an in-memory store, bounded three ways.

Each record is one stored response plus the conversation that led to it (its
input items, previous turns included, without `instructions`), so a later
`previous_response_id` resumes from one record even after older turns were
evicted. The store is bounded by entries, by total bytes (a record's size is
its JSON length) and by age (TTL from when it was stored); the least recently
used record goes first. Expired records are dropped when next touched.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

DEFAULT_MAX_ENTRIES = 1000
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
DEFAULT_TTL_S = 3600.0


@dataclass(frozen=True)
class StoredResponse:
    response: dict[str, Any]  # the response object as GET answers it
    items: list[dict[str, Any]]  # the conversation's input items, previous turns first
    stored_at: float
    size: int


class ResponseStore:
    def __init__(
        self,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        max_bytes: int = DEFAULT_MAX_BYTES,
        ttl_s: float = DEFAULT_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_entries = max(0, int(max_entries))
        self.max_bytes = max(0, int(max_bytes))
        self.ttl_s = float(ttl_s)
        self._clock = clock
        self._records: OrderedDict[str, StoredResponse] = OrderedDict()
        self._lock = threading.Lock()
        self.total_bytes = 0
        self.evictions = 0  # pushed out by the entry or byte bound
        self.expirations = 0  # dropped for age
        self.rejected = 0  # larger than the whole byte budget: never stored

    def __len__(self) -> int:
        with self._lock:
            self._expire()
            return len(self._records)

    def put(self, response: dict[str, Any], items: list[dict[str, Any]]) -> bool:
        """Store (or replace) `response["id"]`; False when it can never fit."""
        rid = response["id"]
        size = len(json.dumps([response, items], ensure_ascii=False, separators=(",", ":")))
        with self._lock:
            self._drop(rid)
            self._expire()
            if self.max_entries < 1 or size > self.max_bytes:
                self.rejected += 1
                return False
            while self._records and (
                len(self._records) >= self.max_entries or self.total_bytes + size > self.max_bytes
            ):
                self._drop(next(iter(self._records)))
                self.evictions += 1
            self._records[rid] = StoredResponse(response, items, self._clock(), size)
            self.total_bytes += size
            return True

    def get(self, rid: str) -> StoredResponse | None:
        """The record, marked most recently used; None when missing or expired."""
        with self._lock:
            record = self._records.get(rid)
            if record is None:
                return None
            if self._expired(record):
                self._drop(rid)
                self.expirations += 1
                return None
            self._records.move_to_end(rid)
            return record

    def delete(self, rid: str) -> bool:
        with self._lock:
            record = self._records.get(rid)
            if record is None:
                return False
            self._drop(rid)
            if self._expired(record):
                self.expirations += 1
                return False
            return True

    def stats(self) -> dict[str, Any]:
        with self._lock:
            self._expire()
            return {
                "entries": len(self._records),
                "bytes": self.total_bytes,
                "evictions": self.evictions,
                "expirations": self.expirations,
                "rejected": self.rejected,
                "max_entries": self.max_entries,
                "max_bytes": self.max_bytes,
                "ttl_s": self.ttl_s,
            }

    # -- under the lock ------------------------------------------------------

    def _expired(self, record: StoredResponse) -> bool:
        return self.ttl_s > 0 and self._clock() - record.stored_at >= self.ttl_s

    def _expire(self) -> None:
        # Records are stored in time order, but `get` reorders by use: scan all.
        stale = [rid for rid, record in self._records.items() if self._expired(record)]
        for rid in stale:
            self._drop(rid)
            self.expirations += 1

    def _drop(self, rid: str) -> None:
        record = self._records.pop(rid, None)
        if record is not None:
            self.total_bytes -= record.size
