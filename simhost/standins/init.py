"""`simhost-init`: the simulated host's PID 1 — it starts sshd and adopts every orphan.

It marks itself a child subreaper, so a detached job (`docker run -d`, `setsid nohup`) is
reparented to it instead of the machine's real init: the host's processes stay one process
tree that it reaps (so `kill -0` sees a finished job as gone) and that it can kill as a whole.

It also runs the host's short commands (`docker inspect`, `dpkg-query`, ...) for the
stand-in scripts (simhost/bin/_relay.py): it imports the stand-ins once, and for each
command forks a process that takes the caller's argv, environment, working directory, umask
and standard streams and runs it, so that a command does not pay the ~25 ms of imports a
fresh interpreter would (a simulated job runs ~60 commands). `SIMHOST_RELAY=0` turns it off.

Signals: SIGTERM / SIGINT stop the host, SIGUSR1 makes it die at once (the "host dies"
fault); both SIGKILL every process of the tree before exiting.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from .common import Host, cut_power, descendants, exit_with

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


class _Shutdown(Exception):
    pass


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}) failed")


def reap(clients: dict[int, socket.socket] | None = None) -> None:
    """Reap every child that has ended, without waiting for the others; a relayed command's
    exit status goes to its client (`clients`: pid -> connection), one line, then EOF."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = clients.pop(pid, None) if clients is not None else None
        if conn is not None:
            with contextlib.suppress(OSError):  # the client is gone: nobody to tell
                conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
            conn.close()


def kill_everything() -> None:
    """SIGKILL every process below this one until none is left, reaping as they die (a
    power cut: `cut_power`)."""
    me = os.getpid()
    for _ in range(200):
        pids = descendants(me)
        if not pids:
            break
        cut_power(pids)
        time.sleep(0.01)
        reap()
    reap()


def _listen() -> socket.socket | None:
    """The socket relayed commands come in on, once every stand-in is imported; None when
    relaying is off."""
    if os.environ.get("SIMHOST_RELAY") == "0":
        return None
    from importlib import import_module

    from . import _COMMANDS

    for module, _ in _COMMANDS.values():
        import_module(f"simhost.standins.{module}")
    import _relay  # simhost/bin, this script's folder

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(b"\0" + _relay.SOCKET.format(pid=os.getpid()).encode())
    listener.listen(64)
    return listener


# The bytes of a request's length, before its body (simhost/bin/_relay.py sends 8 too).
HEADER = 8


def serve_one(conn: socket.socket, start: Callable[[bytes, list[int]], None],
              takes: Callable[[bytes], bool] | None = None) -> None:
    """In a fork of a fork server (init here, tests/orchfork.py for orch): read one request
    (its length in HEADER bytes, its body, the caller's 3 standard streams as descriptors),
    fork a child that runs `start(body, fds)` (which never returns), send the child's pid and
    then its exit status on `conn`, one line each; then exit. A request `takes` refuses is
    answered "-" (the caller runs it itself)."""
    try:
        request = read_request(conn)
        if request is None:
            return  # the caller is gone
        body, fds = request
        if takes is not None and not takes(body):
            for fd in fds:
                os.close(fd)
            conn.sendall(b"-\n")
            return
        pid = os.fork()
        if pid == 0:
            conn.close()
            start(body, fds)
        for fd in fds:
            os.close(fd)
        conn.sendall(f"{pid}\n".encode())
        _, status = os.waitpid(pid, 0)
        conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
    finally:
        os._exit(0)


def read_request(conn: socket.socket) -> tuple[bytes, list[int]] | None:
    """One request: its length in HEADER bytes, its body, and the caller's 3 standard streams
    as descriptors (SCM_RIGHTS); None when the caller hung up before it was all there."""
    header, fds, _, _ = socket.recv_fds(conn, HEADER, 3)
    if len(header) < HEADER:
        for fd in fds:
            os.close(fd)
        return None
    size = int.from_bytes(header, "big")
    body = bytearray()
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            for fd in fds:
                os.close(fd)
            return None
        body += chunk
    return bytes(body), fds


def _relay(conn: socket.socket, clients: dict[int, socket.socket],
           inherited: list[int]) -> None:
    """In init: read one request and run it in a child of init, whose pid goes to the client
    now and whose exit status goes once `reap` has it (one fork a command; init's own loop
    reports it). A command init does not run is answered "-": the client runs it itself.
    `inherited`: init's descriptors that the command must not keep (listener, wake pipe)."""
    try:
        # A client sends its request as soon as it connects; a stalled one must not hold up
        # the host's other commands for long.
        conn.settimeout(5.0)
        request = read_request(conn)
        if request is None:
            conn.close()
            return
        body, fds = request
        try:
            if not _takes(body):
                conn.sendall(b"-\n")
                conn.close()
                return
            pid = os.fork()
            if pid == 0:
                _child(body, fds, [*inherited, conn.fileno(),
                                   *(c.fileno() for c in clients.values())])
        finally:
            for fd in fds:
                os.close(fd)
        conn.sendall(f"{pid}\n".encode())
    except Exception:  # noqa: BLE001 - init outlives any one request
        # Unanswered, the client runs the command itself (as with no init); answered with a
        # pid, it ends as "init stopped" once the connection closes, and the command runs on.
        conn.close()
        return
    clients[pid] = conn


def _child(body: bytes, fds: list[int], close: list[int]) -> None:
    """The forked command: none of init's descriptors nor another client's connection,
    init's signal handlers undone; then the command (never returns)."""
    try:
        for fd in close:
            with contextlib.suppress(OSError):
                os.close(fd)
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGHUP,
                    signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        _start_relayed(body, fds)
    finally:
        os._exit(255)  # never back into init's loop, whatever failed before the command


def _request(body: bytes) -> tuple[str, list[str], str, int, dict[str, str]]:
    """The request _relay.encode made: name, argv's length, argv, cwd, umask, environment."""
    fields = [os.fsdecode(f) for f in body.split(b"\0")]
    count = int(fields[1])
    env = dict(e.split("=", 1) for e in fields[4 + count:])
    return fields[0], fields[2:2 + count], fields[2 + count], int(fields[3 + count]), env


def _takes(body: bytes) -> bool:
    """Whether the request is a command init runs (the compiled client asks about every
    command; the Python one asks only about these)."""
    import _relay  # simhost/bin

    name, argv, *_ = _request(body)
    return bool(_relay.relayable(name, argv))


def _start_relayed(body: bytes, fds: list[int]) -> None:
    _command(*_request(body), fds)


def _command(name: str, argv: list[str], cwd: str, umask: int, env: dict[str, str],
             fds: list[int]) -> None:
    """Become `name argv` as `python -S -E simhost/bin/<name>` would start: its streams,
    environment, working directory, umask, argv; then run it and exit with its status."""
    import io

    import simhost.standins

    from . import main
    from .common import BIN_DIR

    simhost.standins.RELAYED = True

    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(env)
    time.tzset()
    os.chdir(cwd)
    os.umask(umask)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.argv = [str(BIN_DIR / name), *argv]
    # Streams as the interpreter opens them under -E (UTF-8: the C locale is coerced).
    sys.stdin = io.TextIOWrapper(open(0, "rb", closefd=False), encoding="utf-8")
    sys.stdout = io.TextIOWrapper(open(1, "wb", closefd=False), encoding="utf-8")
    sys.stderr = io.TextIOWrapper(open(2, "wb", closefd=False), encoding="utf-8",
                                  errors="backslashreplace", line_buffering=True)
    exit_with(lambda: main(name, argv))


def main(argv: list[str]) -> int:
    """simhost-init HOST_DIR SSHD_CONFIG SSHD_LOG PARENT_PID(0 = outlive the parent)."""
    host_dir, config, log, parent = argv[0], argv[1], argv[2], int(argv[3])
    host = Host(Path(host_dir))
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    if parent:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before we asked to follow it
            return 0
    stopping = False

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        if stopping:
            return
        stopping = True
        raise _Shutdown

    sshd = os.environ.get("SIMHOST_SSHD", "/usr/sbin/sshd")
    try:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGHUP):
            signal.signal(sig, on_signal)
        # Before sshd: the host counts as booted once sshd answers (SimHost.start), and the
        # sim provider reads a host without init.pid as powered off. Written after sshd, a
        # loaded machine left a window where a new instance was "interrupted before it booted".
        (host.state / "init.pid").write_text(f"{os.getpid()}\n")
        null = os.open(os.devnull, os.O_RDWR)
        logfd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.posix_spawn(
            sshd,
            [sshd, "-D", "-f", config, "-E", log],
            os.environ,
            file_actions=[
                (os.POSIX_SPAWN_DUP2, null, 0),
                (os.POSIX_SPAWN_DUP2, logfd, 1),
                (os.POSIX_SPAWN_DUP2, logfd, 2),
            ],
        )
        os.close(null)
        os.close(logfd)
        # Until it listens, a stand-in finds no socket and runs the command itself.
        listener = _listen()
        if listener is None:
            while True:
                try:
                    os.wait()
                except ChildProcessError:
                    time.sleep(0.5)  # sshd gone and nothing detached: keep the host "powered"
        # A child's exit wakes the loop (SIGCHLD written to a pipe), so orphans are reaped as
        # soon as they end, as the blocking wait above does: `kill -0` then sees them gone.
        woken, wake = os.pipe()
        os.set_blocking(wake, False)
        signal.set_wakeup_fd(wake)
        signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)
        clients: dict[int, socket.socket] = {}  # relayed command's pid -> its client
        while True:  # keeps the host "powered" also once sshd is gone and nothing runs
            ready = select.select([listener.fileno(), woken], [], [], 5.0)[0]
            if woken in ready:
                os.read(woken, 512)
            if listener.fileno() in ready:
                conn, _ = listener.accept()
                # Not inherited by the command, nor by what it leaves running (a
                # container's supervisor, after `docker run -d`).
                _relay(conn, clients, [listener.fileno(), woken, wake])
            reap(clients)
    except _Shutdown:
        pass
    kill_everything()
    with contextlib.suppress(FileNotFoundError):
        (host.state / "init.pid").unlink()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
