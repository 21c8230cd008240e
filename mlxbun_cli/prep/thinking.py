"""Split a model's thinking (`<think>` spans) from its answer while streaming."""

from __future__ import annotations

from mlxbun_cli.prep.textscan import partial_suffix_len


class ThinkingSplitter:
    """Feeds text, returns (reasoning, content) pieces; holds back partial tags."""

    def __init__(
        self, start: str = "<think>", end: str = "</think>", in_thinking: bool = False
    ) -> None:
        self.start, self.end = start, end
        self.in_thinking = in_thinking
        self._held = ""
        self._strip_lead = False  # drop the newlines that follow a closing tag

    def feed(self, text: str) -> tuple[str, str]:
        buf = self._held + text
        self._held = ""
        reasoning, content = [], []
        while buf:
            tag = self.end if self.in_thinking else self.start
            idx = buf.find(tag)
            if idx == -1:
                keep = partial_suffix_len(buf, [tag])
                piece, self._held = buf[: len(buf) - keep], buf[len(buf) - keep :]
                buf = ""
            else:
                piece, buf = buf[:idx], buf[idx + len(tag) :]
            (reasoning if self.in_thinking else content).append(self._lead(piece))
            if idx != -1:
                self._strip_lead = self.in_thinking  # after </think> comes "\n\n"
                self.in_thinking = not self.in_thinking
        return "".join(reasoning), "".join(content)

    def _lead(self, piece: str) -> str:
        if self._strip_lead and piece:
            stripped = piece.lstrip("\n")
            if stripped:
                self._strip_lead = False
            return stripped
        return piece

    def flush(self) -> tuple[str, str]:
        held, self._held = self._held, ""
        return (held, "") if self.in_thinking else ("", held)
