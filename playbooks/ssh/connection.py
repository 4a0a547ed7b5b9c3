"""SSH connections: one factory, pinned host keys, bounded retries of transient failures.

Every connection authenticates with the one key file given to the factory (no agent, no
~/.ssh keys, no ssh_config) and accepts exactly the host key it is told to expect.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import paramiko
from fabric import Config, Connection
from paramiko.ssh_exception import NoValidConnectionsError
from tenacity import RetryCallState
from tenacity.stop import stop_base

from playbooks.ssh.errors import AuthenticationFailed, HostKeyMismatch, HostUnreachable, SSHError
from playbooks.ssh.hostkeys import (
    HostKey,
    PinnedHostKeyPolicy,
    _as_key,
    _disabled_host_key_algorithms,
    fingerprint,
    format_host_key,
)
from playbooks.ssh.limits import COMMAND_TIMEOUT_S, IO_TIMEOUT_S, config_overrides
from providers import retrying

log = logging.getLogger(__name__)

# paramiko logs refused tunnel channels (vLLM not listening yet, which the readiness probe
# expects) at ERROR; the engine reports what matters as job events. Set where every SSH
# connection is made, so commands that never connect do not load `logging` for it.
logging.getLogger("paramiko").setLevel(logging.CRITICAL)

# --- retries ---------------------------------------------------------------------------------

_TRANSIENT_ERRNOS = {
    errno.ECONNREFUSED,
    errno.ECONNRESET,
    errno.ECONNABORTED,
    errno.EHOSTUNREACH,
    errno.ENETUNREACH,
    errno.ETIMEDOUT,
    errno.EPIPE,
}


def is_transient(exc: BaseException) -> bool:
    """Whether trying again can help: refused/reset connections and timeouts, not auth or keys."""
    if isinstance(
        exc,
        HostKeyMismatch | paramiko.AuthenticationException | paramiko.BadHostKeyException,
    ):
        return False
    if isinstance(exc, NoValidConnectionsError | TimeoutError | EOFError | ConnectionError):
        return True
    if isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNOS:
        return True
    if isinstance(exc, paramiko.SSHException):
        # sshd still booting, or at MaxStartups, closes before its banner. "No existing
        # session": paramiko's `Transport.start_client(timeout=...)` returns WITHOUT an error
        # when the timeout passes before the key exchange is done (paramiko 5.1.0
        # transport.py), and the next call says this: a host that accepted TCP and never
        # sent its banner (issue 23 §3), i.e. one not reachable over SSH (yet).
        text = str(exc)
        return any(sign in text for sign in ("Error reading SSH protocol banner",
                                             "Connection reset", "No existing session"))
    return False


# A host that accepted TCP and sent no SSH banner this many times in a row is unreachable
# now, whatever is left of the connect deadline (meant for a host still booting, whose port
# refuses or closes at once): a silent one is broken, and re-placing it beats waiting
# (issue 23 §3).
SILENT_TRIES = 3
# Between connection attempts: 0.2 s, 0.4 s, … at most 5 s (never past the deadline).
BACKOFF = retrying.backoff(0.2, 5.0)


def is_silent(exc: BaseException) -> bool:
    """Whether an attempt failed because the host said nothing (no banner, no key exchange)."""
    text = str(exc)
    if isinstance(exc, TimeoutError):
        return "no SSH banner" in text
    if not isinstance(exc, paramiko.SSHException):
        return False
    # paramiko's transport thread reports a banner read that timed out (rather than one
    # the server closed: EOFError) as "Error reading SSH protocol banner", raised while
    # handling the socket timeout.
    return "No existing session" in text or (
        "Error reading SSH protocol banner" in text
        and isinstance(exc.__context__ or exc.__cause__, TimeoutError))


def _why(exc: BaseException) -> str:
    if is_silent(exc):
        return f"it accepts TCP connections but sends no SSH banner ({exc})"
    return str(exc)


class _SilentStop(stop_base):
    """A tenacity stop condition: SILENT_TRIES silent attempts in a row."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, state: RetryCallState) -> bool:
        exc = state.outcome.exception() if state.outcome else None
        self.count = self.count + 1 if exc is not None and is_silent(exc) else 0
        return self.count >= SILENT_TRIES


class _GivenUp(stop_base):
    """A tenacity stop condition: the caller's `give_up()` says the host is gone (the
    provider reports the instance preempted or destroyed while its SSH was coming up), so
    waiting out the connect deadline for a port that will never answer is pointless."""

    def __init__(self, give_up: Callable[[], bool] | None) -> None:
        self.give_up = give_up

    def __call__(self, state: RetryCallState) -> bool:
        return self.give_up is not None and self.give_up()


# --- the factory -----------------------------------------------------------------------------


@dataclass
class _Entry:
    connection: Connection
    pinned: str


class ConnectionFactory:
    """Hands out one open fabric `Connection` per (host, port, user), host key pinned.

    `connect_timeout` bounds each attempt (TCP, banner, auth); `connect_deadline` bounds all
    retries of transient failures together. Each connection keeps `command_timeout_s` (a
    command whose caller gives no timeout) and `io_timeout_s` (each SFTP reply) in its config.
    """

    def __init__(
        self,
        key_filename: str | Path,
        *,
        connect_timeout: float = 10.0,
        connect_deadline: float = 60.0,
        keepalive_s: int = 15,
        command_timeout_s: float = COMMAND_TIMEOUT_S,
        io_timeout_s: float = IO_TIMEOUT_S,
    ) -> None:
        self.key_filename = Path(key_filename)
        if not self.key_filename.is_file():
            raise ValueError(f"SSH key file {self.key_filename} does not exist")
        self.connect_timeout = connect_timeout
        self.connect_deadline = connect_deadline
        self.keepalive_s = keepalive_s
        self.command_timeout_s = command_timeout_s
        self.io_timeout_s = io_timeout_s
        self._connections: dict[tuple[str, int, str], _Entry] = {}
        self._lock = threading.Lock()  # guards the two dicts
        self._opening: dict[tuple[str, int, str], threading.Lock] = {}

    def __enter__(self) -> ConnectionFactory:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close_all()

    def connect(self, host: str, port: int, user: str, host_key: HostKey, *,
                give_up: Callable[[], bool] | None = None) -> Connection:
        """An open connection to user@host:port that verified `host_key` (reused if alive).

        `give_up`, asked between attempts: True stops retrying (the last error is raised)."""
        key = _as_key(host_key)
        pinned = format_host_key(key)
        ident = (host, port, user)
        with self._lock:
            opening = self._opening.setdefault(ident, threading.Lock())
        with opening:  # one connect per host at a time; other hosts are not held up
            with self._lock:
                entry = self._connections.get(ident)
            if entry is not None and entry.pinned == pinned and entry.connection.is_connected:
                return entry.connection
            if entry is not None:
                with self._lock:
                    self._connections.pop(ident, None)
                entry.connection.close()
            connection = self._new_connection(host, port, user, key)
            self._open(connection, key, give_up)
            with self._lock:
                self._connections[ident] = _Entry(connection, pinned)
            return connection

    def close(self, host: str, port: int, user: str) -> None:
        """Close and forget the connection to user@host:port, if any."""
        with self._lock:
            entry = self._connections.pop((host, port, user), None)
        if entry is not None:
            entry.connection.close()

    def close_all(self) -> None:
        """Close every connection this factory opened."""
        with self._lock:
            entries = list(self._connections.values())
            self._connections.clear()
        for entry in entries:
            with contextlib.suppress(Exception):
                entry.connection.close()

    def _new_connection(self, host: str, port: int, user: str, key: paramiko.PKey) -> Connection:
        config = Config(
            lazy=True,  # no /etc/fabric.yml, ~/.fabric.yml or ssh_config files
            ssh_config=paramiko.SSHConfig(),
            overrides={"load_ssh_configs": False, "forward_agent": False,
                       **config_overrides(self.command_timeout_s, self.io_timeout_s)},
        )
        connection = Connection(
            host,
            user=user,
            port=port,
            config=config,
            gateway=False,
            forward_agent=False,
            connect_kwargs={
                "key_filename": str(self.key_filename),
                "look_for_keys": False,
                "allow_agent": False,
                "banner_timeout": self.connect_timeout,
                "auth_timeout": self.connect_timeout,
                "channel_timeout": self.connect_timeout,
                "disabled_algorithms": {"keys": _disabled_host_key_algorithms(key)},
            },
        )
        connection.client.set_missing_host_key_policy(PinnedHostKeyPolicy(key, port))
        return connection

    def _open(self, connection: Connection, key: paramiko.PKey,
              give_up: Callable[[], bool] | None = None) -> None:
        host, port = connection.host, connection.port
        started = time.monotonic()
        deadline = started + self.connect_deadline
        attempts = 0

        def attempt() -> None:
            nonlocal attempts
            attempts += 1
            remaining = max(0.1, deadline - time.monotonic())
            connection.connect_timeout = min(self.connect_timeout, remaining)
            try:
                connection.open()
            except BaseException:
                connection.close()
                raise

        def before_sleep(state: RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome else None
            log.info("ssh %s:%s not reachable yet (attempt %d): %s", host, port, attempts, error)

        try:
            for trial in retrying.policy(is_transient, deadline_s=self.connect_deadline,
                                         stop=_SilentStop() | _GivenUp(give_up), wait=BACKOFF,
                                         before_sleep=before_sleep):
                with trial:
                    attempt()
        except HostKeyMismatch:
            raise
        except paramiko.BadHostKeyException as exc:
            raise HostKeyMismatch(
                host, port, fingerprint(exc.expected_key), fingerprint(exc.key)
            ) from None
        except paramiko.AuthenticationException:
            raise AuthenticationFailed(
                f"{connection.user}@{host}:{port} refused key {self.key_filename}: "
                "check that the instance was created with this key's public half"
            ) from None
        except Exception as exc:
            elapsed = time.monotonic() - started
            if is_transient(exc):
                raise HostUnreachable(
                    f"ssh {host}:{port} unreachable after {attempts} attempts in {elapsed:.1f}s: "
                    f"{_why(exc)}",
                    attempts,
                ) from exc
            if isinstance(exc, paramiko.SSHException) and "host key" in str(exc).lower():
                raise HostKeyMismatch(
                    host,
                    port,
                    fingerprint(key),
                    f"a key of another type (it offers no {key.get_name()} key)",
                ) from None
            raise SSHError(f"ssh {host}:{port}: {exc}") from exc
        transport = connection.transport
        if transport is not None and self.keepalive_s:
            transport.set_keepalive(self.keepalive_s)
        log.debug(
            "ssh %s@%s:%s connected (host key %s)", connection.user, host, port, fingerprint(key)
        )


def trust_on_first_use(
    host: str, port: int = 22, *, timeout: float = 10.0, deadline: float = 60.0,
    retry_refused: bool = True, give_up: Callable[[], bool] | None = None,
) -> paramiko.PKey:
    """The host key the server presents now, for the caller to record and pin from then on.

    Only call this at first contact with a host reached over a trusted path (right after the
    provider created it); afterwards connect with the recorded key. `retry_refused` False:
    a refused connection fails at once (a server already running, as one a user registers,
    that refuses does not start listening by waiting; a booting instance may). `give_up`,
    asked between attempts: True stops retrying (the instance is gone; the last error is
    raised).
    """
    started = time.monotonic()
    attempts = 0

    def fetch() -> paramiko.PKey:
        nonlocal attempts
        attempts += 1
        limit = max(0.1, min(timeout, deadline - (time.monotonic() - started)))
        sock = socket.create_connection((host, port), timeout=limit)
        transport = paramiko.Transport(sock)
        try:
            transport.banner_timeout = limit
            transport.start_client(timeout=limit)
            if not (transport.is_active() and transport.initial_kex_done):
                # start_client's timeout passed silently (see `is_transient`).
                raise TimeoutError(f"no SSH banner or key exchange within {limit:.1f}s")
            key: paramiko.PKey = transport.get_remote_server_key()
            return key
        finally:
            transport.close()

    try:
        for trial in retrying.policy(
                lambda e: is_transient(e) and (
                    retry_refused or not isinstance(e, ConnectionRefusedError)),
                deadline_s=deadline, stop=_SilentStop() | _GivenUp(give_up), wait=BACKOFF):
            with trial:
                return fetch()
    except Exception as exc:
        if is_transient(exc):
            elapsed = time.monotonic() - started
            raise HostUnreachable(
                f"ssh {host}:{port} unreachable after {attempts} attempts in {elapsed:.1f}s: "
                f"{_why(exc)}",
                attempts,
            ) from exc
        raise SSHError(f"ssh {host}:{port}: could not read the host key: {exc}") from exc
    raise AssertionError("unreachable")  # pragma: no cover
