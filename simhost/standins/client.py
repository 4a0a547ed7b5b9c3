"""The compiled stand-in client (simhost/bin/relay.c), which a host's bin/ commands are.

A command a playbook runs on a simulated host starts a process, as on a real host. Started
as `python -S -E simhost/bin/<name>`, that process costs ~10 ms of CPU before it can hand
the command to the host's init (simhost/bin/_relay.py), and a test run starts ~9,000 of
them; the compiled client does the same in well under 1 ms, and becomes that same Python
process (exec) for a command init does not run or when no init answers. It is compiled once
per machine, user, interpreter and checkout with the system's C compiler into a private
folder under the temporary directory, and hard-linked (else copied) into each host's bin/.
Without a C compiler, or with SIMHOST_CLIENT=python in the environment of the process that
prepares the host, the host's commands are the shell wrappers that start Python instead.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path


def _private_dir() -> Path | None:
    """$TMPDIR/simhost-UID, made 0700; None when it is not this user's alone."""
    import tempfile

    folder = Path(tempfile.gettempdir()) / f"simhost-{os.getuid()}"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        info = folder.lstat()
    except OSError:
        return None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        return None  # someone else's, or open to others: never run what it holds
    return folder


def _c_string(value: str) -> str:
    """`value` as a C string literal (octal escapes for anything but plain ASCII)."""
    out = []
    for byte in os.fsencode(value):
        char = chr(byte)
        out.append(char if 0x20 <= byte < 0x7F and char not in '"\\?' else f"\\{byte:03o}")
    return '"' + "".join(out) + '"'


def compiled(bin_dir: Path) -> Path | None:
    """The client of `bin_dir` (simhost/bin: relay.c and the scripts it falls back to) for
    this interpreter, compiled on first use; None when there is none (SIMHOST_CLIENT=python,
    no C compiler, or it did not compile: then the host's commands start Python, as before
    the client existed)."""
    if os.environ.get("SIMHOST_CLIENT") == "python":
        return None
    import hashlib

    source = (bin_dir / "relay.c").read_bytes()
    defines = [f"-DSIMHOST_PYTHON={_c_string(sys.executable)}",
               f"-DSIMHOST_BIN_DIR={_c_string(str(bin_dir))}"]
    key = hashlib.sha256(b"\0".join([source, *(d.encode() for d in defines)])).hexdigest()[:16]
    folder = _private_dir()
    if folder is None:
        return None
    target = folder / f"relay-{key}"
    if target.exists():
        return target
    import shutil
    import subprocess

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    partial = folder / f".relay-{key}-{os.getpid()}"
    built = subprocess.run([cc, "-O2", "-Wall", "-Werror", *defines, "-o", str(partial),
                            str(bin_dir / "relay.c")], capture_output=True, text=True)
    if built.returncode != 0:
        partial.unlink(missing_ok=True)
        print(f"simhost: the command client did not compile, commands start Python "
              f"instead:\n{built.stderr}", file=sys.stderr)
        return None
    os.replace(partial, target)  # atomic: hosts prepared at the same time share one
    return target


def install(client: Path, target: Path) -> None:
    """Make `target` (a host's bin/<name>) the client: a hard link, else a copy."""
    try:
        if target.stat().st_ino == client.stat().st_ino:
            return
    except FileNotFoundError:
        pass
    partial = target.with_name(f".{target.name}.{os.getpid()}")
    partial.unlink(missing_ok=True)
    try:
        os.link(client, partial)
    except OSError:  # another file system
        import shutil

        shutil.copy2(client, partial)
    os.replace(partial, target)
