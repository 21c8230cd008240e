"""The Hugging Face Hub token, from the first place that has one.

1. `--token` on the command line
2. `HF_TOKEN` (or the older `HUGGING_FACE_HUB_TOKEN`) in the environment
3. mlxbun's own saved token: `mlxbun push login` writes `config_dir()/hf_token`, mode 0600
4. huggingface_hub's own login (`hf auth login`): `huggingface_hub.get_token()`. It reads
   the environment first too, but step 2 has already taken any token there, so what it
   gives here is its saved token (or an OIDC / Colab one where those are set up).

A `Credential` never shows its token in a repr; nothing here prints, logs or returns
one to a caller that did not give it.
"""

from __future__ import annotations

import os
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlxbun_cli import paths
from mlxbun_cli.errors import InputError, MlxbunError

TOKEN_FILE = "hf_token"
ENV_VARS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
HOW_TO_GIVE = "pass --token, set HF_TOKEN, or run `mlxbun push login`"


class NoTokenError(InputError):
    def __init__(self) -> None:
        super().__init__(
            "no Hugging Face token: " + HOW_TO_GIVE,
            hint="make a token with write access at https://huggingface.co/settings/tokens",
        )


@dataclass(frozen=True)
class Credential:
    token: str = field(repr=False)
    source: str  # "flag" | "env" | "mlxbun" | "huggingface_hub"
    where: str  # "--token", "HF_TOKEN", or the file it was read from

    def describe(self) -> str:
        return {
            "flag": "--token",
            "env": self.where,
            "mlxbun": f"mlxbun's login ({self.where})",
            "huggingface_hub": f"huggingface_hub's login ({self.where})",
        }[self.source]

    def as_dict(self) -> dict[str, str]:
        """Where the token came from; never the token."""
        return {"source": self.source, "where": self.where}


def token_file() -> Path:
    return paths.config_dir() / TOKEN_FILE


def clean(token: Any) -> str:
    """A token as given, trimmed; refused when it cannot be one (without echoing it)."""
    if not isinstance(token, str) or not token.strip():
        raise InputError("the token is empty")
    token = token.strip()
    if any(ch.isspace() or not ch.isprintable() for ch in token):
        raise InputError("the token has spaces or control characters in it; paste it again")
    return token


# -- the sources, in order ------------------------------------------------------------


def _from_env() -> Credential | None:
    for name in ENV_VARS:
        value = (os.environ.get(name) or "").strip()
        if value:
            return Credential(value, "env", name)
    return None


def saved_token() -> str | None:
    """mlxbun's saved token, or None when there is none."""
    path = token_file()
    try:
        text = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise MlxbunError(
            f"cannot read the saved token in {path}: {exc}",
            hint="`mlxbun push logout` removes it; `mlxbun push login` saves a new one",
        ) from exc
    return text or None


def _from_mlxbun() -> Credential | None:
    token = saved_token()
    return Credential(token, "mlxbun", str(token_file())) if token else None


def _from_huggingface_hub() -> Credential | None:
    from huggingface_hub import constants, get_token

    try:
        token = get_token()
    except Exception as exc:  # e.g. HF_OIDC_RESOURCE set and the exchange failed
        from mlxbun_cli.publishing.hubapi import first_line

        raise MlxbunError(f"huggingface_hub could not give its token: {first_line(exc)}") from exc
    if not token:
        return None
    where = constants.HF_TOKEN_PATH
    return Credential(token, "huggingface_hub", where if os.path.exists(where) else "get_token()")


def _sources(flag: str | None) -> list[Any]:
    flagged = (lambda: Credential(clean(flag), "flag", "--token")) if flag is not None else None
    return [s for s in (flagged, _from_env, _from_mlxbun, _from_huggingface_hub) if s]


def resolve(flag: str | None = None) -> Credential | None:
    """The token in force: the first source that has one."""
    for source in _sources(flag):
        found = source()
        if found is not None:
            return found
    return None


def require(flag: str | None = None) -> Credential:
    found = resolve(flag)
    if found is None:
        raise NoTokenError()
    return found


def all_sources() -> list[Credential]:
    """Every source that has a token, the one in force first (for `push status`)."""
    return [c for c in (source() for source in _sources(None)) if c is not None]


# -- mlxbun's saved token ------------------------------------------------------------------


def save(token: str) -> Path:
    """Write the token to config_dir()/hf_token: 0600 from creation, replaced atomically."""
    token = clean(token)
    path = token_file()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    # mkstemp creates the file 0600 with O_EXCL, so the token is never readable by others.
    fd, tmp = tempfile.mkstemp(prefix=f".{TOKEN_FILE}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(token + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def remove() -> bool:
    """Delete mlxbun's saved token; False when there was none."""
    try:
        token_file().unlink()
    except FileNotFoundError:
        return False
    return True


def file_mode(path: Path) -> int | None:
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except OSError:
        return None


# -- login ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoginResult:
    path: Path
    user: str | None  # who the Hub says the token is; None when it could not be asked
    warning: str | None
    overridden_by: str | None  # an environment variable that takes precedence

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": True,
            "path": str(self.path),
            "user": self.user,
            "warning": self.warning,
            "overridden_by": self.overridden_by,
        }


def login(token: str) -> LoginResult:
    """Check the token with the Hub when it can be reached, then save it.

    A token the Hub refuses (401) is not saved; when the Hub cannot be asked
    (offline, unreachable, an error of its own) it is saved with a warning.
    """
    from mlxbun_cli.publishing.hubapi import HubError, whoami

    token = clean(token)
    user = warning = None
    try:
        user = whoami(token)
    except HubError as exc:
        if exc.status == 401:
            raise InputError(
                "the Hub refused this token (401 Unauthorized): it was not saved",
                hint="copy a current token from https://huggingface.co/settings/tokens",
            ) from None
        warning = f"saved without checking: {exc.message}"
    env = _from_env()
    return LoginResult(save(token), user, warning, env.where if env else None)
