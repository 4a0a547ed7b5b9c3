"""Run `orch` as a real process on a pseudo-terminal of a chosen size (or piped)."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import shutil
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def orch_exe() -> str:
    return shutil.which("orch", path=str(Path(sys.executable).parent)) or "orch"


def run_tty(env: dict[str, str], *args: str, cols: int = 80, rows: int = 40,
            timeout: float = 120, typed: str = "") -> tuple[int, str]:
    """`orch ARGS` with stdin/stdout/stderr on a pty `cols` wide; (exit code, raw output).
    `typed` is typed at the terminal up front (it waits in the line buffer to be read)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    # No COLUMNS: the width must come from the terminal itself.
    env = {k: v for k, v in env.items() if k not in ("COLUMNS", "LINES")}
    proc = subprocess.Popen([orch_exe(), *args], stdin=slave, stdout=slave, stderr=slave,
                            env=env, cwd=ROOT, close_fds=True)
    os.close(slave)
    if typed:
        os.write(master, typed.encode())
    chunks: list[bytes] = []
    end = time.monotonic() + timeout
    try:
        while time.monotonic() < end:
            ready, _, _ = select.select([master], [], [], 0.5)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the other side closed
                break
            if not data:
                break
            chunks.append(data)
        code = proc.wait(timeout=max(1.0, end - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    # The pty turns \n into \r\n; undo that so tests see what the program wrote.
    return code, b"".join(chunks).decode("utf-8", "replace").replace("\r\n", "\n")


def visible(text: str) -> str:
    """`text` without ANSI escape sequences."""
    return ANSI.sub("", text)


def widest(text: str) -> int:
    """The widest line a terminal would show (each \\r starts the line over)."""
    return max((len(visible(part)) for line in text.split("\n") for part in line.split("\r")),
               default=0)
