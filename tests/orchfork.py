"""`orch` commands for tests, each a real process forked from one that has imported orch once.

An `orch` command that opens the database spends 0.5-0.7 s of CPU importing SQLAlchemy,
pydantic and orch's ~870 modules before it does anything; the suite runs ~650 of them, 40%
of its CPU (issue 24 §4). `run(args, env=..., cwd=...)` stands in for
`subprocess.run([ORCH, *args], env=..., cwd=..., capture_output=True, text=True)`: a server
process (one per test process, started on first use) imports orch once and forks for each
command a child that takes the command's environment, working directory, argv and standard
streams and runs the console script's `main()`, exiting with its status as `orch` would.

What differs from `subprocess.run` of the console script, and why it does not matter here:
modules were imported before the command's environment was set (orch caches only its static
data files, and reads only the READ_AT_IMPORT variables at import, which tests/test_orchfork.py
checks: a command that sets one of them differently runs as the console script), so what a
process takes from its environment at start (TZ, the locale) is set again here; the process
is not a child of the test (its pid is not the caller's child) and runs in the server's
process group. `spawn(args, env=..., cwd=...)` stands in for
`subprocess.Popen([ORCH, *args], ..., stdout=PIPE, stderr=PIPE, text=True)` the same way, for
tests that wait on, signal or kill a running command. Tests that read its terminal, limit
its resources or check what it imports keep starting the console script themselves.

`ORCH_TEST_FORK=0` runs every command as a plain subprocess instead.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# The request's framing and the handler are the simulated hosts' own (their init runs the
# hosts' short commands the same way): one length-prefixed body, the 3 streams as descriptors.
from simhost.standins.init import HEADER, reap, serve_one

ORCH = str(Path(sys.executable).parent / "orch")


def forks(env: Mapping[str, str]) -> bool:
    """Whether a command with environment `env` goes through the fork server: not with
    ORCH_TEST_FORK=0, nor when `env` gives a READ_AT_IMPORT variable another value than the
    server's (it read its own when it imported orch)."""
    return (os.environ.get("ORCH_TEST_FORK", "1") != "0"
            and _read_at_import(env) == _server().read_at_import)


def run(args: list[str], *, env: dict[str, str] | None = None, cwd: str | Path | None = None,
        input: str | None = None, timeout: float | None = None, check: bool = False
        ) -> subprocess.CompletedProcess[str]:
    """`orch *args` as `subprocess.run(..., capture_output=True, text=True)` would run it."""
    done = _run([ORCH, *args], env, cwd, input, timeout)
    if check:
        done.check_returncode()
    return done


def spawn(args: list[str], *, env: dict[str, str] | None = None,
          cwd: str | Path | None = None) -> Spawned | subprocess.Popen[str]:
    """`orch *args` started as `subprocess.Popen(..., stdout=PIPE, stderr=PIPE, text=True)`
    would start it (stdin at its end): a process the test waits on, signals or kills."""
    argv = [ORCH, *args]
    environment = dict(os.environ if env is None else env)
    if not forks(environment):
        return subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    conn, pid, rest, out_r, err_r, feeder = _start(argv, environment, cwd, "", None)
    feeder.join(timeout=5)
    return Spawned(argv, conn, pid, rest, out_r, err_r)


class Spawned:
    """A forked `orch` process, used as a `subprocess.Popen` with both streams piped is: its
    `pid` is the real process's (signals go straight to it); its status comes from the
    server, which is its parent."""

    def __init__(self, argv: list[str], conn: socket.socket, pid: int, tail: bytes,
                 out_r: int, err_r: int) -> None:
        self.args, self.pid = argv, pid
        self.returncode: int | None = None
        self.stdout = open(out_r, encoding="utf-8", errors="replace")  # noqa: SIM115
        self.stderr = open(err_r, encoding="utf-8", errors="replace")  # noqa: SIM115
        self._conn, self._said = conn, tail

    def poll(self) -> int | None:
        """Its exit status once it ended, else None (at once)."""
        if self.returncode is None:
            self._read_status(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Its exit status, once it ends (TimeoutExpired past `timeout`)."""
        if self.returncode is None and not self._read_status(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """Both streams to their end and the exit status (TimeoutExpired past `timeout`)."""
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        read: dict[str, str] = {}
        readers = [threading.Thread(target=lambda n=n, f=f: read.__setitem__(n, f.read()),
                                    daemon=True)
                   for n, f in (("out", self.stdout), ("err", self.stderr))]
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        self.stdout.close()
        self.stderr.close()
        return read["out"], read["err"]

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # as Popen: an ended process is not signalled
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _read_status(self, timeout: float | None) -> bool:
        """Read what the server says within `timeout`; whether the status came."""
        import select

        while not self._said.endswith(b"\n"):
            if not select.select([self._conn], [], [], timeout)[0]:
                return False
            chunk = self._conn.recv(64)
            if not chunk:
                raise RuntimeError("the orch fork server said no exit status")
            self._said += chunk
        self.returncode = int(self._said)
        self._conn.close()
        return True


def _start(argv: list[str], environment: dict[str, str], cwd: str | Path | None,
           input: str, timeout: float | None
           ) -> tuple[socket.socket, int, bytes, int, int, threading.Thread]:
    """Hand the command to the server: the connection, the process's pid, what the server
    said after it, the read ends of stdout and stderr, and the thread writing stdin."""
    request = {"argv": argv, "env": environment,
               "cwd": str(cwd if cwd is not None else os.getcwd())}
    stdin_r, stdin_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(_server().path)
        body = json.dumps(request).encode()
        socket.send_fds(conn, [len(body).to_bytes(HEADER, "big") + body],
                        [stdin_r, out_w, err_w])
    finally:
        for fd in (stdin_r, out_w, err_w):
            os.close(fd)
    feeder = threading.Thread(target=_feed, args=(stdin_w, input), daemon=True)
    feeder.start()
    pid_line, rest = _line(conn, timeout)
    return conn, int(pid_line), rest, out_r, err_r, feeder


def _run(argv: list[str], env: dict[str, str] | None, cwd: str | Path | None,
         input: str | None, timeout: float | None) -> subprocess.CompletedProcess[str]:
    environment = dict(os.environ if env is None else env)
    if not forks(environment):
        return subprocess.run(argv, env=env, cwd=cwd, input=input, timeout=timeout,
                              capture_output=True, text=True)
    conn, pid, rest, out_r, err_r, feeder = _start(argv, environment, cwd, input or "",
                                                   timeout)
    proc = Spawned(argv, conn, pid, rest, out_r, err_r)
    try:
        out, err = proc.communicate(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()  # as subprocess.run kills the child it timed out
        expired = subprocess.TimeoutExpired(argv, timeout or 0)
        expired.pid = pid  # type: ignore[attr-defined]  # for tests/test_orchfork.py
        raise expired from None
    finally:
        conn.close()
        feeder.join(timeout=5)
    assert proc.returncode is not None
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def _feed(fd: int, text: str) -> None:
    try:
        if text:
            os.write(fd, text.encode())
    except BrokenPipeError:
        pass
    finally:
        os.close(fd)


def _line(conn: socket.socket, timeout: float | None) -> tuple[str, bytes]:
    """The first line the server sends (the command's pid), and what came after it."""
    conn.settimeout(timeout)
    data = b""
    while b"\n" not in data:
        chunk = conn.recv(64)
        if not chunk:
            raise RuntimeError("the orch fork server closed the connection")
        data += chunk
    line, rest = data.split(b"\n", 1)
    return line.decode(), rest


class _Server:
    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="orchfork-")
        self.path = os.path.join(self.dir, "sock")
        # stdin stays a pipe from here: the server exits when this process does.
        self.read_at_import = _read_at_import(os.environ)  # the server's, which it inherits
        self.proc = subprocess.Popen([sys.executable, __file__, self.path],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        said = self.proc.stdout.readline().strip()
        if said != "ready":
            raise RuntimeError(f"the orch fork server did not start: {said!r}")


def _read_at_import(env: Mapping[str, str]) -> dict[str, str | None]:
    return {name: env.get(name) for name in READ_AT_IMPORT}


_lock = threading.Lock()
_started: _Server | None = None


def _server() -> _Server:
    global _started
    with _lock:
        if _started is None or _started.proc.poll() is not None:
            _started = _Server()
        return _started


# --- the server --------------------------------------------------------------------------

PACKAGES = ("orchestrator", "providers", "playbooks", "simhost")
# What orch's modules read from the environment when imported: nothing since every ORCH_*
# variable is read by orch's settings when a command runs (orchestrator/core/settings.py). A
# command whose environment gave one of these another value than the server had would run as
# the console script, so it read its own. tests/test_orchfork.py checks that import_all reads
# exactly these.
READ_AT_IMPORT: frozenset[str] = frozenset()


def import_all() -> None:
    """What orch commands import, once: every module of orch (importing runs no command and
    registers nothing) and the migrations' alembic."""
    import importlib
    import pkgutil

    import alembic.command  # noqa: F401
    import alembic.config  # noqa: F401

    for name in PACKAGES:
        package = importlib.import_module(name)
        for module in pkgutil.walk_packages(package.__path__, f"{name}."):
            importlib.import_module(module.name)


def _serve(path: str) -> None:
    # As the console script: its folder first on sys.path (not tests/, this file's).
    sys.path[0] = str(Path(sys.executable).parent)
    import_all()
    import gc

    # What is loaded now is shared with every fork; kept out of the collector's passes, a
    # child's collections do not touch (and so copy) the pages it shares with this process.
    gc.freeze()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    print("ready", flush=True)
    with selectors.DefaultSelector() as sel:
        sel.register(listener, selectors.EVENT_READ)
        sel.register(sys.stdin, selectors.EVENT_READ)
        while True:
            for key, _ in sel.select(1.0):
                if key.fileobj is sys.stdin:
                    if not os.read(sys.stdin.fileno(), 1024):
                        return  # the test process is gone
                    continue
                conn, _ = listener.accept()
                if os.fork() == 0:
                    listener.close()
                    # One command: the process that runs it, its pid and status reported.
                    serve_one(conn, lambda body, fds: _command(json.loads(body), fds))
                conn.close()
            reap()  # the finished handlers


def _command(request: dict[str, Any], fds: list[int]) -> None:
    """Become `orch` as the console script starts it: streams, environment, cwd, argv."""
    import io

    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    # What a process takes from its environment when it starts: the C library's time zone
    # (TZ) and Python's LC_CTYPE (set from the environment at interpreter start-up).
    import locale
    import time

    time.tzset()
    try:
        ctype = locale.setlocale(locale.LC_CTYPE, "")
    except locale.Error:
        ctype = locale.setlocale(locale.LC_CTYPE, "C")
    if ctype in ("C", "POSIX") and os.environ.get("PYTHONCOERCECLOCALE") != "0":
        # PEP 538, as the interpreter does at start: the C locale becomes C.UTF-8, also in
        # the environment its children inherit.
        for name in ("C.UTF-8", "C.utf8", "UTF-8"):
            try:
                locale.setlocale(locale.LC_CTYPE, name)
            except locale.Error:
                continue
            os.environ["LC_CTYPE"] = name
            break
    os.chdir(request["cwd"])
    sys.argv = list(request["argv"])
    for sig in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    # The streams' encoding as the interpreter picks it: PYTHONIOENCODING, else the locale's
    # (UTF-8 here: a C locale was coerced above).
    encoding, _, io_errors = os.environ.get("PYTHONIOENCODING", "").partition(":")
    encoding = encoding or locale.getpreferredencoding(False)

    def stream(fd: int, mode: str, errors: str, line: bool) -> io.TextIOWrapper:
        raw = io.open(fd, mode, buffering=0 if unbuffered and "w" in mode else -1,  # noqa: UP020
                      closefd=False)
        return io.TextIOWrapper(raw, encoding=encoding, errors=errors, line_buffering=line,
                                write_through=unbuffered and "w" in mode)

    sys.stdin = sys.__stdin__ = stream(0, "rb", io_errors or "strict", False)
    sys.stdout = sys.__stdout__ = stream(1, "wb", io_errors or "strict", os.isatty(1))
    sys.stderr = sys.__stderr__ = stream(2, "wb", "backslashreplace", True)
    code = 0
    try:
        from orchestrator.cli.app import main

        main()
    except SystemExit as exc:
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        code = 128 + signal.SIGINT
    except BaseException:  # as the interpreter: the traceback, exit 1
        import traceback

        traceback.print_exc()
        code = 1
    try:
        import atexit

        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code & 0xFF)


if __name__ == "__main__":
    try:
        _serve(sys.argv[1])
    finally:  # its socket and folder go with it (the forked commands do not come here)
        import shutil

        shutil.rmtree(os.path.dirname(sys.argv[1]), ignore_errors=True)
