"""Human sizes: `4GB`, `500MB`, `1.5G`, `1024` (bytes)."""

from __future__ import annotations

import re

from mlxbun_cli.errors import OptionError

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kb": 1 << 10,
    "m": 1 << 20,
    "mb": 1 << 20,
    "g": 1 << 30,
    "gb": 1 << 30,
    "t": 1 << 40,
    "tb": 1 << 40,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
}


def parse_size(text: str, option: str = "size") -> int:
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not match or match.group(2).lower() not in _UNITS:
        raise OptionError(option, f"expected a size like 500MB or 4GB, got {text!r}")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])
