"""SSH to GPU hosts: one connection factory, pinned host keys, bounded retries, quoted commands.

Every connection authenticates with the one key file given to the factory (no agent, no
~/.ssh keys, no ssh_config) and accepts exactly the host key it is told to expect; that key
comes from the provider or from `trust_on_first_use` at first contact, and is recorded by
the caller. Commands are argv lists joined with `shlex.join`, so no user value reaches the
remote shell unquoted; secrets travel in a 0600 env file written over SFTP, never on a
command line.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import logging
import os
import re
import select
import shlex
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from types import TracebackType
from typing import Any, TypeAlias

import paramiko
from fabric import Config, Connection
from invoke.exceptions import CommandTimedOut, ThreadException
from paramiko.ssh_exception import NoValidConnectionsError
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_delay

log = logging.getLogger(__name__)

HostKey: TypeAlias = "paramiko.PKey | str"
"""A pinned host key: a paramiko key or its OpenSSH text `ssh-ed25519 AAAA...`."""

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_RSA_ALGORITHMS = ("rsa-sha2-512", "rsa-sha2-256", "ssh-rsa")


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


# --- host keys -------------------------------------------------------------------------------


def parse_host_key(text: str) -> paramiko.PKey:
    """A key from its OpenSSH text form, `TYPE BASE64 [comment]`."""
    parts = text.split()
    if len(parts) < 2:
        raise ValueError("a host key looks like 'ssh-ed25519 AAAA...'")
    try:
        return paramiko.PKey.from_type_string(parts[0], base64.b64decode(parts[1]))
    except Exception as exc:  # paramiko raises several types for bad key data
        raise ValueError(f"not a valid {parts[0]} host key: {exc}") from None


def format_host_key(key: paramiko.PKey) -> str:
    """The OpenSSH text form of a key, what the caller records (`ssh-ed25519 AAAA...`)."""
    return f"{key.get_name()} {key.get_base64()}"


def fingerprint(key: paramiko.PKey) -> str:
    """`SHA256:...` as OpenSSH prints it."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def _as_key(key: HostKey) -> paramiko.PKey:
    return parse_host_key(key) if isinstance(key, str) else key


def _same_key(a: paramiko.PKey, b: paramiko.PKey) -> bool:
    return a.get_name() == b.get_name() and a.asbytes() == b.asbytes()


class PinnedHostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Accept the one expected host key; anything else raises `HostKeyMismatch`.

    The client's known-hosts store stays empty, so paramiko asks this policy about every
    key the server presents.
    """

    def __init__(self, expected: paramiko.PKey, port: int) -> None:
        self.expected = expected
        self.port = port

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        """Called by paramiko with the server's key, before authentication."""
        if not _same_key(key, self.expected):
            host = hostname.removeprefix("[").split("]")[0]
            raise HostKeyMismatch(host, self.port, fingerprint(self.expected), fingerprint(key))


def _host_key_algorithms(key: paramiko.PKey) -> list[str]:
    name = key.get_name()
    return list(_RSA_ALGORITHMS) if name == "ssh-rsa" else [name]


def _disabled_host_key_algorithms(key: paramiko.PKey) -> list[str]:
    """Every host key algorithm but the pinned key's, so negotiation picks the pinned type."""
    allowed = set(_host_key_algorithms(key))
    known: tuple[str, ...] = tuple(getattr(paramiko.Transport, "_preferred_keys", ()))
    return [algorithm for algorithm in known if algorithm not in allowed]


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
        # sshd still booting, or at MaxStartups, closes before its banner.
        text = str(exc)
        return "Error reading SSH protocol banner" in text or "Connection reset" in text
    return False


# --- the factory -----------------------------------------------------------------------------


@dataclass
class _Entry:
    connection: Connection
    pinned: str


class ConnectionFactory:
    """Hands out one open fabric `Connection` per (host, port, user), host key pinned.

    `connect_timeout` bounds each attempt (TCP, banner, auth); `connect_deadline` bounds all
    retries of transient failures together.
    """

    def __init__(
        self,
        key_filename: str | Path,
        *,
        connect_timeout: float = 10.0,
        connect_deadline: float = 60.0,
        keepalive_s: int = 15,
    ) -> None:
        self.key_filename = Path(key_filename)
        if not self.key_filename.is_file():
            raise ValueError(f"SSH key file {self.key_filename} does not exist")
        self.connect_timeout = connect_timeout
        self.connect_deadline = connect_deadline
        self.keepalive_s = keepalive_s
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

    def connect(self, host: str, port: int, user: str, host_key: HostKey) -> Connection:
        """An open connection to user@host:port that verified `host_key` (reused if alive)."""
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
            self._open(connection, key)
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
            overrides={"load_ssh_configs": False, "forward_agent": False},
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

    def _open(self, connection: Connection, key: paramiko.PKey) -> None:
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

        def wait(state: RetryCallState) -> float:
            backoff = min(5.0, 0.2 * 2 ** (state.attempt_number - 1))
            return max(0.0, min(backoff, deadline - time.monotonic()))

        def before_sleep(state: RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome else None
            log.info("ssh %s:%s not reachable yet (attempt %d): %s", host, port, attempts, error)

        try:
            for trial in Retrying(
                retry=retry_if_exception(is_transient),
                stop=stop_after_delay(self.connect_deadline),
                wait=wait,
                before_sleep=before_sleep,
                reraise=True,
            ):
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
                    f"{exc}",
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
    host: str, port: int = 22, *, timeout: float = 10.0, deadline: float = 60.0
) -> paramiko.PKey:
    """The host key the server presents now, for the caller to record and pin from then on.

    Only call this at first contact with a host reached over a trusted path (right after the
    provider created it); afterwards connect with the recorded key.
    """
    started = time.monotonic()
    attempts = 0

    def fetch() -> paramiko.PKey:
        nonlocal attempts
        attempts += 1
        sock = socket.create_connection((host, port), timeout=timeout)
        transport = paramiko.Transport(sock)
        try:
            transport.banner_timeout = timeout
            transport.start_client(timeout=timeout)
            key: paramiko.PKey = transport.get_remote_server_key()
            return key
        finally:
            transport.close()

    try:
        for trial in Retrying(
            retry=retry_if_exception(is_transient),
            stop=stop_after_delay(deadline),
            wait=lambda s: min(5.0, 0.2 * 2 ** (s.attempt_number - 1)),
            reraise=True,
        ):
            with trial:
                return fetch()
    except Exception as exc:
        if is_transient(exc):
            elapsed = time.monotonic() - started
            raise HostUnreachable(
                f"ssh {host}:{port} unreachable after {attempts} attempts in {elapsed:.1f}s: {exc}",
                attempts,
            ) from exc
        raise SSHError(f"ssh {host}:{port}: could not read the host key: {exc}") from exc
    raise AssertionError("unreachable")  # pragma: no cover


# --- commands --------------------------------------------------------------------------------


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

    `timeout=None` means `COMMAND_TIMEOUT_S`: no command waits forever.
    """
    if timeout is None:
        timeout = COMMAND_TIMEOUT_S
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


# --- files -----------------------------------------------------------------------------------

# paramiko's SFTP client pairs each reply with its request by reading the one channel: two
# threads on one client read each other's replies and both wait forever (issue 10 §1). So
# every thread gets an SFTP channel of its own on the shared connection, and every read on it
# has a deadline: a host that stops answering fails the call instead of hanging the job.
IO_TIMEOUT_S = float(os.environ.get("ORCH_SSH_IO_TIMEOUT_S", "120"))
"""Seconds an SFTP call may wait for a reply (or the next chunk of a transfer)."""
COMMAND_TIMEOUT_S = float(os.environ.get("ORCH_SSH_COMMAND_TIMEOUT_S", "3600"))
"""Seconds a remote command may run when its caller gives no timeout of its own."""

_threads = threading.local()


def _thread_clients() -> dict[int, tuple[paramiko.Transport, paramiko.SFTPClient]]:
    clients: dict[int, tuple[paramiko.Transport, paramiko.SFTPClient]] | None = getattr(
        _threads, "sftp", None)
    if clients is None:
        clients = _threads.sftp = {}
    return clients


def _open_sftp(conn: Connection, timeout: float) -> paramiko.SFTPClient:
    """This thread's SFTP client on `conn` (opened on first use), reads bounded by `timeout`."""
    transport = conn.transport if conn.is_connected else None
    if transport is None:
        raise ConnectionLost(f"{conn.host}:{conn.port}: not connected (SFTP unavailable)")
    clients = _thread_clients()
    for key, (other, client) in list(clients.items()):
        if not other.is_active():  # the connection was closed: forget its channel
            del clients[key]
            with contextlib.suppress(Exception):
                client.close()
    entry = clients.get(id(conn))
    if entry is None or entry[0] is not transport or entry[1].sock.closed:
        try:
            channel = transport.open_session(timeout=timeout)
            channel.settimeout(timeout)
            channel.invoke_subsystem("sftp")
            client = paramiko.SFTPClient(channel)
        except TimeoutError:
            raise CommandTimeout(f"{conn.host}:{conn.port}: the SFTP subsystem did not answer "
                                 f"within {timeout:.0f}s") from None
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise ConnectionLost(f"{conn.host}:{conn.port}: SFTP unavailable: {exc}") from exc
        entry = clients[id(conn)] = (transport, client)
    entry[1].get_channel().settimeout(timeout)
    return entry[1]


def _drop_sftp(conn: Connection) -> None:
    """Close this thread's SFTP channel on `conn`: after a timeout its replies are out of step."""
    entry = _thread_clients().pop(id(conn), None)
    if entry is not None:
        with contextlib.suppress(Exception):
            entry[1].close()


@contextlib.contextmanager
def _sftp(conn: Connection, what: str, timeout: float | None = None
          ) -> Iterator[paramiko.SFTPClient]:
    """This thread's SFTP client for one call; a stall or a dropped channel raises SSHError.

    Callers catch OSError for missing files: a timeout (also an OSError) never reaches them,
    it is turned into CommandTimeout here, on the way out of the call's `try`.
    """
    limit = IO_TIMEOUT_S if timeout is None else timeout
    client = _open_sftp(conn, limit)
    try:
        yield client
    except _Stalled as exc:
        _drop_sftp(conn)
        raise CommandTimeout(f"{what} on {conn.host}:{conn.port}: no reply over SFTP within "
                             f"{limit:.0f}s") from exc.__cause__
    except TimeoutError as exc:
        _drop_sftp(conn)
        raise CommandTimeout(f"{what} on {conn.host}:{conn.port}: no reply over SFTP within "
                             f"{limit:.0f}s") from exc
    except (EOFError, paramiko.SSHException) as exc:
        _drop_sftp(conn)
        raise ConnectionLost(f"{what} on {conn.host}:{conn.port}: connection lost: "
                             f"{exc}") from exc


class _Stalled(Exception):
    """Internal: an SFTP reply timed out inside a helper's own `except OSError`."""


def _reraise_stall(exc: BaseException) -> None:
    """Inside `except OSError`: a timeout is not a file error, let `_sftp` report it."""
    if isinstance(exc, TimeoutError):
        raise _Stalled() from exc


def stat(conn: Connection, remote: str, timeout: float | None = None
         ) -> paramiko.SFTPAttributes | None:
    """A remote path's attributes, or None when it does not exist."""
    with _sftp(conn, f"stat {remote}", timeout) as sftp:
        try:
            return sftp.stat(remote)
        except FileNotFoundError:
            return None


def list_dir(conn: Connection, remote: str, timeout: float | None = None
             ) -> list[paramiko.SFTPAttributes] | None:
    """A remote directory's entries with their attributes, or None when it is missing."""
    with _sftp(conn, f"listing {remote}", timeout) as sftp:
        try:
            return list(sftp.listdir_attr(remote))
        except FileNotFoundError:
            return None


def remove_files(conn: Connection, paths: Sequence[str], timeout: float | None = None
                 ) -> list[str]:
    """Delete remote files (missing ones are fine); returns the paths that were there."""
    removed = []
    with _sftp(conn, "removing files", timeout) as sftp:
        for path in paths:
            try:
                sftp.remove(path)
            except FileNotFoundError:
                continue
            removed.append(path)
    return removed


def _replace(sftp: paramiko.SFTPClient, source: str, target: str) -> None:
    try:
        sftp.posix_rename(source, target)
    except OSError:
        # Servers without posix-rename: plain rename fails on an existing target.
        with contextlib.suppress(OSError):
            sftp.remove(target)
        sftp.rename(source, target)


def _makedirs(sftp: paramiko.SFTPClient, folder: PurePosixPath, mode: int) -> None:
    missing: list[PurePosixPath] = []
    current = folder
    while str(current) not in ("/", "."):
        try:
            sftp.stat(str(current))
            break
        except FileNotFoundError:
            missing.append(current)
            current = current.parent
    for path in reversed(missing):
        sftp.mkdir(str(path), mode)
        sftp.chmod(str(path), mode)


def put_file(conn: Connection, local: str | Path, remote: str, mode: int | None = None,
             timeout: float | None = None) -> None:
    """Upload a file; it appears at `remote` complete (written aside, then renamed)."""
    target = PurePosixPath(remote)
    tmp = str(target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.part"))
    try:
        with _sftp(conn, f"upload to {remote}", timeout) as sftp:
            try:
                _makedirs(sftp, target.parent, 0o755)
                sftp.put(str(local), tmp)
                if mode is not None:
                    sftp.chmod(tmp, mode)
                _replace(sftp, tmp, remote)
            except OSError as exc:
                _reraise_stall(exc)
                with contextlib.suppress(OSError):
                    sftp.remove(tmp)
                raise SSHError(f"upload to {conn.host}:{remote} failed: {exc}") from exc
    except (CommandTimeout, ConnectionLost):
        _remove_quietly(conn, tmp)
        raise


def get_file(conn: Connection, remote: str, local: str | Path,
             timeout: float | None = None) -> None:
    """Download a file; `local` is replaced only once the whole file arrived."""
    target = Path(local)
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.part")
    try:
        with _sftp(conn, f"download of {remote}", timeout) as sftp:
            try:
                sftp.get(remote, str(tmp))
                tmp.replace(target)
            except OSError as exc:
                _reraise_stall(exc)
                raise SSHError(f"download of {conn.host}:{remote} failed: {exc}") from exc
    finally:
        tmp.unlink(missing_ok=True)


def read_file(conn: Connection, remote: str, timeout: float | None = None) -> bytes | None:
    """A remote file's content, or None when it does not exist."""
    with _sftp(conn, f"reading {remote}", timeout) as sftp:
        try:
            with sftp.open(remote, "rb") as handle:
                data: bytes = handle.read()
                return data
        except FileNotFoundError:
            return None
        except OSError as exc:
            _reraise_stall(exc)
            raise SSHError(f"reading {conn.host}:{remote} failed: {exc}") from exc


def _remove_quietly(conn: Connection, remote: str) -> None:
    """Best effort, on a fresh channel: a failed transfer leaves no temporary file behind."""
    with contextlib.suppress(SSHError, OSError):
        remove_files(conn, [remote], timeout=min(IO_TIMEOUT_S, 30.0))


def _open_new(sftp: paramiko.SFTPClient, path: str, mode: int) -> paramiko.SFTPFile:
    """Create `path` exclusively with permissions `mode` set by the open call itself."""
    from paramiko.sftp import (
        CMD_HANDLE,
        CMD_OPEN,
        SFTP_FLAG_CREATE,
        SFTP_FLAG_EXCL,
        SFTP_FLAG_WRITE,
    )

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
                _reraise_stall(exc)
                with contextlib.suppress(OSError):
                    sftp.remove(tmp)
                raise SSHError(f"writing secret env file {conn.host}:{path} failed: "
                               f"{exc}") from None
    except (CommandTimeout, ConnectionLost):
        _remove_quietly(conn, tmp)  # never leave a copy of the secret under another name
        raise
    log.info("wrote secret env file %s:%s (%s)", conn.host, path, ", ".join(sorted(mapping)))


# --- tunnels ---------------------------------------------------------------------------------


class _Forwarder:
    """Accepts on a free 127.0.0.1 port; each connection becomes a direct-tcpip channel.

    A channel the server cannot open (the remote port refuses, e.g. a server still loading)
    closes that one local connection and the forwarder keeps accepting, so callers can poll
    readiness through it.
    """

    def __init__(self, transport: paramiko.Transport, remote_host: str, remote_port: int) -> None:
        self.transport = transport
        self.remote = (remote_host, remote_port)
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.listener.settimeout(0.2)
        self.local_port: int = self.listener.getsockname()[1]
        self.stopping = threading.Event()
        self.sockets: set[Any] = set()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._accept, name="ssh-tunnel", daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                client, _addr = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            channel = self.transport.open_channel(
                "direct-tcpip", self.remote, client.getpeername(), timeout=10
            )
        except (paramiko.SSHException, EOFError, OSError):
            client.close()
            return
        with self.lock:
            self.sockets.update((client, channel))
        try:
            while not self.stopping.is_set():
                readable, _w, _x = select.select([client, channel], [], [], 0.5)
                if client in readable:
                    data = client.recv(65536)
                    if not data:
                        break
                    channel.sendall(data)
                if channel in readable:
                    data = channel.recv(65536)
                    if not data:
                        break
                    client.sendall(data)
        except (OSError, EOFError, paramiko.SSHException):
            pass
        finally:
            with self.lock:
                self.sockets.discard(client)
                self.sockets.discard(channel)
            channel.close()
            client.close()

    def close(self) -> None:
        self.stopping.set()
        self.listener.close()
        self.thread.join(timeout=2)
        with self.lock:
            for item in list(self.sockets):
                with contextlib.suppress(Exception):
                    item.close()


@contextlib.contextmanager
def tunnel(conn: Connection, remote_port: int, remote_host: str = "127.0.0.1") -> Iterator[int]:
    """Forward a free local 127.0.0.1 port to remote_host:remote_port on the host; yields it."""
    if not conn.is_connected:
        raise ConnectionLost(f"{conn.host}:{conn.port}: not connected (use the factory first)")
    forwarder = _Forwarder(conn.transport, remote_host, remote_port)
    try:
        yield forwarder.local_port
    finally:
        forwarder.close()
