"""Stop strings matched on decoded text, with streaming hold-back.

Text that could still turn into a stop string is held back until it either
completes one (and is dropped) or cannot (and is released), so no stop text
ever reaches the output.
"""

from __future__ import annotations

from mlxbun_cli.prep.textscan import find_first, partial_suffix_len


class StopMatcher:
    def __init__(self, stops: list[str]) -> None:
        self.stops = [s for s in stops if s]
        self._held = ""
        self.stopped = False
        self.matched: str | None = None

    def feed(self, text: str) -> str:
        """Returns the text safe to emit now; sets `stopped` once a stop matches."""
        if self.stopped:
            return ""
        if not self.stops:
            return text
        buf = self._held + text
        hit = find_first(buf, self.stops)
        if hit is not None:
            self.stopped, self.matched, self._held = True, hit[1], ""
            return buf[: hit[0]]
        keep = partial_suffix_len(buf, self.stops)
        self._held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        """At the end of generation whatever was held is real output."""
        out, self._held = ("" if self.stopped else self._held), ""
        return out
