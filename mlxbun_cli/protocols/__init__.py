"""Wire formats: each maps its requests to the neutral form and events back."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

# What json.loads raises on a body that is not JSON: bad syntax, bytes that
# are not text, or nesting deeper than the parser's recursion allows.
JSON_ERRORS = (ValueError, UnicodeDecodeError, RecursionError)


class WireError(Exception):
    """A request the wire cannot accept: status, message and the field it names."""

    def __init__(
        self,
        message: str,
        param: str | None = None,
        status: int = 400,
        type: str = "invalid_request_error",
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.type = type
        self.code = code


def is_int(value: Any) -> bool:
    """A JSON integer (JSON's true/false are not numbers here)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def typed_fields(
    body: dict[str, Any], numbers: Iterable[str], integers: Iterable[str] = ()
) -> dict[str, Any]:
    """The named fields of a body, type-checked, each error naming its field."""
    fields: dict[str, Any] = {}
    for name in numbers:
        value = body.get(name)
        if value is not None and not is_number(value):
            raise WireError(f"{name} must be a number", name)
        fields[name] = value
    for name in integers:
        value = body.get(name)
        if value is not None and not is_int(value):
            raise WireError(f"{name} must be an integer", name)
        fields[name] = value
    return fields
