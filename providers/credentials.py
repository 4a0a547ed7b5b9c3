"""API keys from the environment or a 0600 file; never logged, stored or put in argv."""

from __future__ import annotations

import os
import stat
from pathlib import Path

# Environment variable per provider (provider-apis.md: Bearer keys).
ENV = {"vastai": "VAST_API_KEY", "runpod": "RUNPOD_API_KEY", "lambda": "LAMBDA_API_KEY"}


class CredentialsError(Exception):
    """The credentials file exists but must not be used (e.g. readable by others)."""


def credentials_file() -> Path:
    """$XDG_CONFIG_HOME/orch/credentials (default ~/.config/orch/credentials)."""
    base = os.environ.get("XDG_CONFIG_HOME", "").strip()
    root = Path(base) if base and Path(base).is_absolute() else Path.home() / ".config"
    return root / "orch" / "credentials"


def api_key(provider: str, path: Path | None = None) -> str | None:
    """The key for `provider`: its environment variable, else `provider = KEY` in the file.

    None when neither has one (the provider is then left out of planning, with a note).
    """
    env = ENV.get(provider)
    if env and os.environ.get(env, "").strip():
        return os.environ[env].strip()
    path = path or credentials_file()
    try:
        info = path.stat()
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(info.st_mode):  # a FIFO would block the read forever
        raise CredentialsError(f"{path} is not a regular file; write `PROVIDER = KEY` lines "
                               "to a file there")
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise CredentialsError(f"{path} is readable by other users; run `chmod 600 {path}`")
    for line in path.read_text(encoding="utf-8").splitlines():
        name, sep, value = line.partition("=")
        if sep and name.strip() == provider and value.strip():
            return value.strip().strip('"')
    return None
