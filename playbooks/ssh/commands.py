"""Remote commands: argv lists quoted word by word, every command bounded by a timeout.

Commands are argv lists joined with `shlex.join`, so no user value reaches the remote shell
unquoted; secrets travel in an env file (see `secret_env`) sourced by the command, never on
its command line.
"""

from __future__ import annotations

import logging
import shlex
import time
from collections.abc import Sequence
from pathlib import PurePosixPath

import paramiko
from fabric import Connection
from invoke.exceptions import CommandTimedOut, ThreadException

from playbooks.ssh.errors import CommandTimeout, ConnectionLost, Result
from playbooks.ssh.limits import command_timeout

log = logging.getLogger(__name__)

# Sources the env file with every variable exported, then replaces itself with argv. The file
# path and argv are positional parameters: nothing is interpolated into the script.
_WITH_ENV = 'set -a; . "$1"; set +a; shift; exec "$@"'


def build_command(argv: Sequence[str], env_file: str | None = None) -> str:
    """The remote command line for `argv`, every word quoted; with `env_file` sourced first."""
    if not argv:
        raise ValueError("argv must not be empty")
    words = [str(word) for word in argv]
    if any("\0" in word for word in words):
        raise ValueError("a command argument contains a NUL byte")
    if env_file is None:
        return shlex.join(words)
    if not PurePosixPath(env_file).is_absolute():
        raise ValueError(f"env_file must be an absolute path (got {env_file!r})")
    return shlex.join(["sh", "-c", _WITH_ENV, "sh", env_file, *words])


def run(
    conn: Connection,
    argv: Sequence[str],
    timeout: float | None,
    env_file: str | None = None,
) -> Result:
    """Run `argv` on the host (no pty, no stdin); non-zero exits are returned, not raised.

    `timeout=None` means the connection's command timeout (`ConnectionFactory`'s
    `command_timeout_s`, by default `limits.COMMAND_TIMEOUT_S`): no command waits forever.
    """
    if timeout is None:
        timeout = command_timeout(conn)
    command = build_command(argv, env_file)
    log.debug("ssh %s:%s $ %s", conn.host, conn.port, command)
    started = time.monotonic()
    try:
        result = conn.run(
            command, hide=True, warn=True, timeout=timeout, in_stream=False, pty=False
        )
    except CommandTimedOut:
        raise CommandTimeout(
            f"{argv[0]} on {conn.host}:{conn.port} did not finish within {timeout}s"
        ) from None
    except (paramiko.SSHException, EOFError, OSError, ThreadException) as exc:
        raise ConnectionLost(
            f"{conn.host}:{conn.port}: connection lost running {argv[0]}: {exc}"
        ) from exc
    exit_code = int(result.exited)
    if exit_code == -1:
        # No exit status came back. invoke sometimes reports a timeout this way instead of
        # raising CommandTimedOut (a race between its timer and the channel closing, seen on
        # a loaded machine), so a status-less end at or past the timeout is a timeout.
        if timeout is not None and time.monotonic() - started >= timeout:
            raise CommandTimeout(
                f"{argv[0]} on {conn.host}:{conn.port} did not finish within {timeout}s"
            )
        if _dropping(conn):
            raise ConnectionLost(f"{conn.host}:{conn.port}: connection lost while {argv[0]} ran")
    return Result(
        argv=tuple(str(a) for a in argv),
        command=command,
        exit_code=exit_code,
        stdout=result.stdout,
        stderr=result.stderr,
        duration_s=time.monotonic() - started,
    )


def _dropping(conn: Connection, within: float = 2.0) -> bool:
    """Whether the connection is gone, after a command ended with no exit status.

    The channel's end can arrive before the transport notices that the server went away
    (seen on a loaded machine), so give it a moment; a command killed by a signal also ends
    without a status, on a connection that stays up.
    """
    deadline = time.monotonic() + within
    while conn.is_connected:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True
