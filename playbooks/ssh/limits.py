"""The SSH layer's timeouts: their defaults, and the ones a connection was made with.

A leaf with no third-party imports (orch's settings take the defaults from here without
loading paramiko). The values come from the caller, never from the environment: the engine
reads ORCH_SSH_COMMAND_TIMEOUT_S / ORCH_SSH_IO_TIMEOUT_S (orchestrator/core/settings.py) and
hands them to `ConnectionFactory`, which keeps them in each connection's fabric config, so
`run` and the SFTP calls find them on the connection they are given.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fabric import Connection

COMMAND_TIMEOUT_S = 3600.0
"""Seconds a remote command may run when its caller gives no timeout of its own."""
IO_TIMEOUT_S = 120.0
"""Seconds each SFTP reply may take."""

# The key of orch's own values in a connection's fabric (invoke) config.
CONFIG_KEY = "orch_ssh"


def config_overrides(command_timeout_s: float, io_timeout_s: float) -> dict[str, Any]:
    """What `ConnectionFactory` puts into each connection's config."""
    return {CONFIG_KEY: {"command_timeout_s": command_timeout_s, "io_timeout_s": io_timeout_s}}


def _configured(conn: Connection, name: str, default: float) -> float:
    values = conn.config.get(CONFIG_KEY) or {}
    value = values.get(name)
    return default if value is None else float(value)


def command_timeout(conn: Connection) -> float:
    """The command timeout `conn` was made with (COMMAND_TIMEOUT_S for one made elsewhere)."""
    return _configured(conn, "command_timeout_s", COMMAND_TIMEOUT_S)


def io_timeout(conn: Connection) -> float:
    """The SFTP reply timeout `conn` was made with (IO_TIMEOUT_S for one made elsewhere)."""
    return _configured(conn, "io_timeout_s", IO_TIMEOUT_S)
