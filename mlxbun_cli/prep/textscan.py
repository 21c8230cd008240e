"""Streaming text helpers: hold back what might be the start of a marker."""

from __future__ import annotations

from collections.abc import Iterable


def partial_suffix_len(text: str, markers: Iterable[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of a marker."""
    best = 0
    for marker in markers:
        for n in range(min(len(marker) - 1, len(text)), best, -1):
            if text.endswith(marker[:n]):
                best = n
                break
    return best


def find_first(text: str, markers: Iterable[str]) -> tuple[int, str] | None:
    """The earliest occurrence of any marker, as (index, marker)."""
    found: tuple[int, str] | None = None
    for marker in markers:
        idx = text.find(marker)
        if idx != -1 and (found is None or idx < found[0]):
            found = (idx, marker)
    return found
