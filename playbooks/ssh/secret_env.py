"""Secrets on the host: a 0600 env file written over SFTP, for `run(..., env_file=path)`.

Secret values never travel on a command line and never appear in logs or exceptions.
"""

from __future__ import annotations

import contextlib
import logging
import re
import shlex
import uuid
from collections.abc import Mapping
from pathlib import PurePosixPath

import paramiko
from fabric import Connection
from paramiko.sftp import CMD_HANDLE, CMD_OPEN, SFTP_FLAG_CREATE, SFTP_FLAG_EXCL, SFTP_FLAG_WRITE

from playbooks.ssh.errors import CommandTimeout, ConnectionLost, SSHError
from playbooks.ssh.sftp import _makedirs, _remove_quietly, _replace, _reraise_stall, _sftp

log = logging.getLogger(__name__)

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _open_new(sftp: paramiko.SFTPClient, path: str, mode: int) -> paramiko.SFTPFile:
    """Create `path` exclusively with permissions `mode` set by the open call itself."""
    attrs = paramiko.SFTPAttributes()
    attrs.st_mode = mode
    kind, msg = sftp._request(
        CMD_OPEN, path, SFTP_FLAG_WRITE | SFTP_FLAG_CREATE | SFTP_FLAG_EXCL, attrs
    )
    if kind != CMD_HANDLE:
        raise OSError(f"unexpected SFTP reply {kind} to open")
    return paramiko.SFTPFile(sftp, msg.get_binary(), "wb")


def write_secret_env(conn: Connection, path: str, mapping: Mapping[str, str],
                     timeout: float | None = None) -> None:
    """Write `KEY='value'` lines to a 0600 file on the host, for `run(..., env_file=path)`.

    The file is created with mode 0600 (and checked) before any content is written, under a
    temporary name, then renamed into place; missing parent directories are created 0700.
    Neither values nor their lengths appear in logs or exceptions.
    """
    for name in mapping:
        if not _ENV_NAME.fullmatch(name):
            raise ValueError(f"invalid environment variable name {name!r}")
    if any("\0" in value for value in mapping.values()):
        raise ValueError("an environment value contains a NUL byte")
    target = PurePosixPath(path)
    if not target.is_absolute():
        raise ValueError(f"secret env file path must be absolute (got {path!r})")
    content = "".join(f"{name}={shlex.quote(value)}\n" for name, value in mapping.items())
    tmp = str(target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.tmp"))
    try:
        with _sftp(conn, f"writing secret env file {path}", timeout) as sftp:
            try:
                _makedirs(sftp, target.parent, 0o700)
                with _open_new(sftp, tmp, 0o600) as handle:
                    handle.chmod(0o600)  # also covers servers that ignore open-time attributes
                    if handle.stat().st_mode & 0o077:
                        raise OSError("the file could not be made private (mode is not 0600)")
                    handle.write(content.encode())
                _replace(sftp, tmp, str(target))
            except OSError as exc:
                _reraise_stall(exc, sftp)
                with contextlib.suppress(OSError):
                    sftp.remove(tmp)
                raise SSHError(f"writing secret env file {conn.host}:{path} failed: "
                               f"{exc}") from None
    except (CommandTimeout, ConnectionLost):
        _remove_quietly(conn, tmp)  # never leave a copy of the secret under another name
        raise
    log.info("wrote secret env file %s:%s (%s)", conn.host, path, ", ".join(sorted(mapping)))
