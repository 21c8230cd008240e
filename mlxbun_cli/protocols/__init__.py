"""Wire formats: each maps its requests to the neutral form and events back."""


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
