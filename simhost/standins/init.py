"""`simhost-init`: the simulated host's PID 1 — it starts sshd and adopts every orphan.

It marks itself a child subreaper, so a detached job (`docker run -d`, `setsid nohup`) is
reparented to it instead of the machine's real init: the host's processes stay one process
tree that it reaps (so `kill -0` sees a finished job as gone) and that it can kill as a whole.

Signals: SIGTERM / SIGINT stop the host, SIGUSR1 makes it die at once (the "host dies"
fault); both SIGKILL every process of the tree before exiting.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType

from .common import Host, descendants, signal_all

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


class _Shutdown(Exception):
    pass


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}) failed")


def _reap() -> None:
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def kill_everything() -> None:
    """SIGKILL every process below this one until none is left, reaping as they die."""
    me = os.getpid()
    for _ in range(200):
        pids = descendants(me)
        if not pids:
            break
        signal_all(pids)
        time.sleep(0.01)
        _reap()
    _reap()


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
        (host.state / "init.pid").write_text(f"{os.getpid()}\n")
        while True:
            try:
                os.wait()
            except ChildProcessError:
                time.sleep(0.5)  # sshd gone and nothing detached: keep the host "powered"
    except _Shutdown:
        pass
    kill_everything()
    with contextlib.suppress(FileNotFoundError):
        (host.state / "init.pid").unlink()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
