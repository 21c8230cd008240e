"""The huggingface_hub client mlxbun pushes with, and its errors as one line each.

`HF_ENDPOINT` is read at call time (huggingface_hub reads it once, at import), so
tests and users can point a running process at another Hub.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mlxbun_cli.errors import InputError, MlxbunError

if TYPE_CHECKING:
    from huggingface_hub import HfApi


class HubError(MlxbunError):
    """The Hub refused a request (`status`), or could not be reached (`status` None)."""

    def __init__(self, message: str, hint: str | None = None, status: int | None = None) -> None:
        super().__init__(message, hint)
        self.status = status


def endpoint() -> str:
    from mlxbun_cli.hub import endpoint as hub_endpoint

    return hub_endpoint()


def client(token: str) -> HfApi:
    from huggingface_hub import HfApi

    from mlxbun_cli import __version__

    return HfApi(
        endpoint=endpoint(), token=token, library_name="mlxbun", library_version=__version__
    )


def whoami(token: str) -> str:
    """The user name the Hub gives this token; HubError when it refuses or is unreachable."""
    try:
        info = client(token).whoami(token=token)
    except Exception as exc:
        raise hub_error(exc, "check the token") from exc
    return str(info.get("name") or "?")


def check_repo_id(repo_id: str) -> str:
    """huggingface_hub's own rules for a repo id, before any network."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    repo_id = repo_id.strip() if isinstance(repo_id, str) else repo_id
    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        raise InputError(
            f"'{repo_id}' is not a valid Hub repo id: {first_line(exc)}",
            hint="repo ids look like NAME or ORG/NAME: letters, digits, - _ . (no -- or ..)",
        ) from None
    return repo_id


def _transport_errors() -> tuple[type[BaseException], ...]:
    """Connection failures of whichever HTTP client this huggingface_hub uses."""
    found: list[type[BaseException]] = []
    for module, name in (("httpx2", "TransportError"), ("httpx", "TransportError")):
        try:
            found.append(getattr(__import__(module), name))
        except (ImportError, AttributeError):
            pass
    try:  # huggingface_hub < 1.0 used requests
        import requests

        found.append(requests.exceptions.ConnectionError)
        found.append(requests.exceptions.Timeout)
    except ImportError:
        pass
    return tuple(found)


def hub_error(
    exc: BaseException, doing: str, repo: str | None = None, token_from: str | None = None
) -> MlxbunError:
    """huggingface_hub's exception → the most specific one-line error.

    `doing` says what failed ("create the repo"); `repo` names it; `token_from` says
    where the token came from, so a refused one can be found.
    """
    from huggingface_hub import constants, errors

    where = endpoint()
    what = f" {repo}" if repo else ""
    if isinstance(exc, MlxbunError):
        return exc
    if isinstance(exc, errors.OfflineModeIsEnabled):
        return HubError(
            f"cannot {doing}{what}: offline mode is on (HF_HUB_OFFLINE)",
            hint="set HF_HUB_OFFLINE=0 to reach the Hub; `--dry-run` works offline",
        )
    if isinstance(exc, errors.HfHubHTTPError):
        return _http_error(exc, doing, repo, where, token_from)
    if isinstance(exc, _transport_errors()):
        offline = " (offline mode is on)" if constants.is_offline_mode() else ""
        return HubError(
            f"cannot reach the Hugging Face Hub at {where} to {doing}{what}{offline}",
            hint="check the network (or HF_ENDPOINT); nothing was committed",
        )
    if isinstance(exc, ValueError):  # e.g. the Hub's check of README.md metadata
        return InputError(f"cannot {doing}{what}: {first_line(exc)}")
    return HubError(f"cannot {doing}{what}: {type(exc).__name__}: {first_line(exc)}")


def _http_error(
    exc: Any, doing: str, repo: str | None, where: str, token_from: str | None
) -> HubError:
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    said = _server_message(exc)
    what = f" {repo}" if repo else ""
    token = f"the token from {token_from}" if token_from else "the token"
    if status == 401:
        return HubError(
            f"the Hub refused {token} (401 Unauthorized) when trying to {doing}{what}: "
            "it is invalid or expired",
            hint=f"make a token at {where}/settings/tokens, then `mlxbun push login`",
            status=status,
        )
    if status == 403:
        return HubError(
            f"{token} may not {doing}{what} (403 Forbidden)" + (f": {said}" if said else ""),
            hint="use a token with write access to that namespace (your user or an org you belong to)",
            status=status,
        )
    if status == 404:
        return HubError(
            f"the Hub has no{what or ' such repo'} (404) when trying to {doing}"
            + (f": {said}" if said else ""),
            hint="check the repo id and that the token can see it",
            status=status,
        )
    if status == 409:
        return HubError(
            f"the Hub refused to {doing}{what} (409 Conflict)" + (f": {said}" if said else ""),
            hint="a repo of another type may have that name, or someone pushed at the same "
            "time; try again",
            status=status,
        )
    return HubError(
        f"the Hub answered {status} when trying to {doing}{what}" + (f": {said}" if said else ""),
        status=status,
    )


def _server_message(exc: Any) -> str:
    said = getattr(exc, "server_message", None)
    if said:
        return first_line(said)
    response = getattr(exc, "response", None)
    try:
        return first_line(response.headers.get("X-Error-Message") or "")
    except Exception:  # noqa: BLE001 - a best-effort detail
        return ""


def first_line(text: object) -> str:
    lines = str(text).strip().splitlines()
    return lines[0].strip() if lines else ""
