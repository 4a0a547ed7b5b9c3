"""File transfer over SFTP: one channel per thread, every reply awaited with a deadline.

Uploads and downloads appear complete or not at all (written aside, then renamed).
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path, PurePosixPath

import paramiko
from fabric import Connection

from playbooks.ssh.errors import CommandTimeout, ConnectionLost, SSHError
from playbooks.ssh.limits import io_timeout

# paramiko's SFTP client pairs each reply with its request by reading the one channel: two
# threads on one client read each other's replies and both wait forever (issue 10 §1). So
# every thread gets an SFTP channel of its own on the shared connection, and every read on it
# has a deadline (the connection's `io_timeout`, unless the call gives one): a host that stops
# answering fails the call instead of hanging the job.

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
    limit = io_timeout(conn) if timeout is None else timeout
    client = _open_sftp(conn, limit)
    try:
        yield client
    except _Dropped as exc:
        _drop_sftp(conn)
        raise ConnectionLost(f"{what} on {conn.host}:{conn.port}: connection lost: "
                             f"{exc.__cause__}") from exc.__cause__
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


class _Dropped(Exception):
    """Internal: the channel closed under an SFTP call (a reset connection, issue 23 §2)."""


def _reraise_stall(exc: BaseException, sftp: paramiko.SFTPClient | None = None) -> None:
    """Inside `except OSError`: a timeout or a dropped connection is not a file error, let
    `_sftp` report it (CommandTimeout, ConnectionLost: the engine reconnects and retries).

    paramiko reports a connection reset mid-transfer as a plain `OSError("Socket is
    closed")` from the channel: what tells it apart from a file error is the closed channel.
    """
    if isinstance(exc, TimeoutError):
        raise _Stalled() from exc
    if sftp is not None:
        channel = sftp.get_channel()
        transport = channel.get_transport() if channel is not None else None
        if channel is None or channel.closed or transport is None or not transport.is_active():
            raise _Dropped() from exc


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
                _reraise_stall(exc, sftp)
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
                _reraise_stall(exc, sftp)
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
            _reraise_stall(exc, sftp)
            raise SSHError(f"reading {conn.host}:{remote} failed: {exc}") from exc


def _remove_quietly(conn: Connection, remote: str) -> None:
    """Best effort, on a fresh channel: a failed transfer leaves no temporary file behind."""
    with contextlib.suppress(SSHError, OSError):
        remove_files(conn, [remote], timeout=min(io_timeout(conn), 30.0))
