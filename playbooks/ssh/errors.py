"""What the SSH layer raises, and the `Result` of a remote command that `CommandFailed` carries."""

from __future__ import annotations

from dataclasses import dataclass


class SSHError(Exception):
    """Base of every error this module raises."""


class HostKeyMismatch(SSHError):
    """The server presented a host key other than the pinned one: refuse to talk to it."""

    def __init__(self, host: str, port: int, expected: str, actual: str) -> None:
        super().__init__(
            f"host key mismatch for {host}:{port}: expected {expected}, server presented "
            f"{actual}. The host was replaced or someone is intercepting the connection; "
            "record the new key only if the provider confirms it."
        )
        self.host = host
        self.port = port
        self.expected = expected
        self.actual = actual


class AuthenticationFailed(SSHError):
    """The server refused our key (not retried: retrying cannot fix it)."""


class HostUnreachable(SSHError):
    """No SSH connection could be made before the deadline (after `attempts` tries)."""

    def __init__(self, message: str, attempts: int) -> None:
        super().__init__(message)
        self.attempts = attempts


class ConnectionLost(SSHError):
    """The connection dropped while a command or transfer was running."""


class CommandTimeout(SSHError):
    """A remote command ran longer than its timeout."""


class CommandFailed(SSHError):
    """A remote command exited non-zero (raised by `Result.check`)."""

    def __init__(self, result: Result) -> None:
        tail = result.stderr.strip()[-2000:] or result.stdout.strip()[-2000:]
        super().__init__(
            f"{result.argv[0]} exited with status {result.exit_code}"
            + (f": {tail}" if tail else "")
        )
        self.result = result


@dataclass(frozen=True)
class Result:
    """What a remote command did."""

    argv: tuple[str, ...]
    command: str
    exit_code: int
    stdout: str
    stderr: str
    duration_s: float

    @property
    def ok(self) -> bool:
        """Whether it exited 0."""
        return self.exit_code == 0

    def check(self) -> Result:
        """Self if it exited 0, else raise `CommandFailed` (with the stderr tail)."""
        if not self.ok:
            raise CommandFailed(self)
        return self
