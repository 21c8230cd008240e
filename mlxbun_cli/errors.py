"""The one error family the CLI and the server turn into a clear message.

MlxbunError                 exit 1: something failed
├── InputError              exit 2: the user asked for something invalid
│   ├── ModelNotFoundError      no local model matches the name
│   ├── AmbiguousModelError     a name matches several local models
│   ├── InvalidModelError       a directory that is not a loadable model
│   └── OptionError             an out-of-range or malformed option
├── ModelLoadError          a model that looked right failed to load
├── GenerationError         the engine failed while generating
└── BackendUnavailableError the daemon cannot be reached
"""

from __future__ import annotations


class MlxbunError(Exception):
    """An error whose message is written for the user."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class InputError(MlxbunError):
    exit_code = 2


class ModelNotFoundError(InputError):
    pass


class AmbiguousModelError(InputError):
    def __init__(self, name: str, candidates: list[str]) -> None:
        listed = ", ".join(candidates[:10])
        more = f" (and {len(candidates) - 10} more)" if len(candidates) > 10 else ""
        super().__init__(
            f"model name '{name}' is ambiguous: it matches {listed}{more}",
            hint="name one of them exactly",
        )
        self.candidates = candidates


class InvalidModelError(InputError):
    pass


class OptionError(InputError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class AdmissionError(InputError):
    """Refused before any work: the memory ceiling leaves no room."""

    code = "memory_admission"

    def __init__(self, message: str, hint: str | None = None, field: str = "model") -> None:
        super().__init__(message, hint)
        self.field = field


class ModelLoadError(MlxbunError):
    pass


class GenerationError(MlxbunError):
    pass


class BackendUnavailableError(MlxbunError):
    pass
