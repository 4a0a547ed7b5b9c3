"""Faults of the machine orch runs on, injected for real: a held database lock, a clock that
runs ahead, a full disk.

- `hold_sqlite_lock`: another process takes SQLite's write lock (`BEGIN IMMEDIATE`) and keeps
  it, as a long transaction, a backup or a user's `sqlite3` session would.
- `skewed_clock_env`: an `LD_PRELOAD` library (compiled here with the system's C compiler)
  that adds SKEWCLOCK_S seconds to CLOCK_REALTIME for the whole process, as a machine whose
  clock is off would (what libfaketime does, reduced to the one call CPython's `time.time`
  and `datetime.now` make: clock_gettime). Monotonic clocks are left alone, as on a real
  machine with a wrong wall clock.
- `SmallDisk`: a tmpfs of a few MiB mounted in a private mount namespace (`unshare -m`), held
  by a sleeping process, so nothing is mounted on the shared machine. Commands run inside it
  with the `enter()` prefix (nsenter); the test reaches its files through `path`
  (`/proc/PID/root/...`). SQLite must not be pointed at `path`: it resolves symbolic links
  in a database's name, and `/proc/PID/root` reads as `/`, which would put the database
  on the real disk. `fill()` writes until the kernel answers ENOSPC.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from datetime import datetime
from pathlib import Path

_HOLD = """
import sqlite3, sys, time
from datetime import UTC, datetime
con = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=60)
con.execute("BEGIN IMMEDIATE")
print("held", flush=True)
time.sleep(float(sys.argv[2]))
con.execute("COMMIT")
print(datetime.now(UTC).isoformat(), flush=True)
"""


class SqliteLock:
    """The write lock of SQLite file `db`, held by another process for `seconds`."""

    def __init__(self, db: Path, seconds: float) -> None:
        self._proc = subprocess.Popen([sys.executable, "-c", _HOLD, str(db), str(seconds)],
                                      stdout=subprocess.PIPE, text=True)
        assert self._proc.stdout is not None
        if self._proc.stdout.readline().strip() != "held":
            raise RuntimeError(f"could not take the write lock of {db}")

    def released(self, timeout: float = 120) -> datetime:
        """Wait for the holder to let go; when it did (UTC)."""
        out, _ = self._proc.communicate(timeout=timeout)
        return datetime.fromisoformat(out.strip())

_SKEW_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <time.h>
int clock_gettime(clockid_t id, struct timespec *tp) {
    static int (*real)(clockid_t, struct timespec *);
    if (!real) real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    int rc = real(id, tp);
    const char *s = getenv("SKEWCLOCK_S");
    if (rc == 0 && s && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE))
        tp->tv_sec += atol(s);
    return rc;
}
"""


def skewed_clock_env(folder: Path, seconds: int) -> dict[str, str]:
    """Environment variables that make a child process's wall clock run `seconds` ahead."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("the clock-skew fault needs a C compiler (apt-get install gcc)")
    folder.mkdir(parents=True, exist_ok=True)
    source, lib = folder / "skewclock.c", folder / "skewclock.so"
    source.write_text(_SKEW_C)
    subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(lib), str(source), "-ldl"],
                   check=True, capture_output=True)
    return {"LD_PRELOAD": str(lib), "SKEWCLOCK_S": str(seconds)}


class SmallDisk:
    """A `size`-byte tmpfs at `mount` inside a private mount namespace (see module doc)."""

    def __init__(self, mount: Path, size: int = 4 << 20) -> None:
        mount.mkdir(parents=True, exist_ok=True)
        self._proc = subprocess.Popen(
            ["unshare", "-m", "--propagation", "private", "sh", "-c",
             f"mount -t tmpfs -o size={size} orch-test {mount} && echo ready && exec sleep 3600"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self._proc.stdout is not None
        if self._proc.stdout.readline().strip() != "ready":
            self.close()
            why = self._proc.stderr.read() if self._proc.stderr else ""
            raise RuntimeError("cannot mount a tmpfs in a mount namespace (needs root or user "
                               f"namespaces): {why}")
        self.mount = mount  # the path inside the namespace
        self.path = Path(f"/proc/{self._proc.pid}/root{mount}")  # the same, from outside

    def enter(self, cwd: Path) -> list[str]:
        """The prefix that runs a command inside the disk's namespace, in `cwd`."""
        return ["nsenter", "-t", str(self._proc.pid), "-m", f"--wd={cwd}", "--"]

    def fill(self) -> int:
        """Write a filler file until the disk is full; the bytes written."""
        written = 0
        with open(self.path / "filler", "wb", buffering=0) as out:
            chunk = b"\0" * 65536
            try:
                while True:
                    written += out.write(chunk) or 0
            except OSError as exc:
                if exc.errno != 28:  # ENOSPC
                    raise
        return written

    def free(self) -> None:
        """Remove the filler: the disk has room again."""
        os.unlink(self.path / "filler")

    def close(self) -> None:
        self._proc.kill()
        self._proc.wait()
