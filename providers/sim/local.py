"""What the simulated cloud does on this machine itself: atomic state files, /proc lookups.

Its hosts are processes here, and its state is a file every orch process shares
(providers/sim/compute.py): these are the few helpers that touch either directly.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path


def write_atomic(path: Path, text: str) -> None:
    """Readers (other processes) see the old file or the new one, never a partial one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def proc_state(pid: int) -> str | None:
    """The process's state letter, or None when it does not exist."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            raw = handle.read().decode(errors="replace")
    except OSError:
        return None
    return raw[raw.rfind(")") + 2 :].split()[0]


def carries(pid: int, needle: bytes, what: str = "environ") -> bool:
    """Whether live `pid`'s environ (or cmdline) contains `needle` as one entry/argument."""
    if proc_state(pid) in (None, "Z", "X"):
        return False
    try:
        with open(f"/proc/{pid}/{what}", "rb") as handle:
            return needle in handle.read().split(b"\0")
    except OSError:
        return False


def read_pid(path: Path) -> int | None:
    """The number in a pid file, or None when there is none."""
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None
