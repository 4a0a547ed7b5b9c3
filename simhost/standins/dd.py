"""`dd`: the disk write/read test of orch's host check, at the host's simulated disk speed.

What is simulated is what orch runs (playbooks/hostcheck.py): a write of zeros that is
flushed before dd reports (`if=/dev/zero of=FILE bs=1M count=N conv=fdatasync`) and a read of
that file that bypasses the page cache (`if=FILE of=/dev/null bs=1M iflag=direct`). The file
is written sparse (its size counts as used in `df`, as the real bytes would) and the command
takes `bytes / disk_*_bytes_per_second` seconds; the report on stderr is GNU coreutils dd's
(src/dd.c `print_xfer_stats`: "%jd bytes (%s, %s) copied, %s, %s", the time as "%g s"), also
when SIGINT cuts it short (`timeout -s INT`), with what was done by then.
A write larger than the free space stops at it with dd's "No space left on device". Operands
dd does not know fail as dd fails them ("unrecognized operand", exit 1); the ones orch never
uses are not simulated (exit 2, so a playbook that starts using one fails in the tests).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from .common import Host, SimError, say
from .disks import mount_for

# `dd` on a PCIe 4 NVMe when the host sets no speed (flushed write / direct read).
DEFAULT_WRITE_BPS = 2.0e9
DEFAULT_READ_BPS = 3.0e9
_SUFFIXES = {"": 1, "c": 1, "w": 2, "b": 512, "K": 1024, "k": 1024, "M": 1024**2, "G": 1024**3,
             "kB": 1000, "MB": 1000**2, "GB": 1000**3}
_KNOWN = ("if", "of", "bs", "count", "conv", "oflag", "iflag", "status", "ibs", "obs", "skip",
          "seek", "cbs", "iseek", "oseek")
_SIMULATED = ("if", "of", "bs", "count", "conv", "oflag", "iflag", "status")


def _bytes(text: str) -> int:
    for suffix in sorted(_SUFFIXES, key=len, reverse=True):
        number = text[: len(text) - len(suffix)] if suffix else text
        if text.endswith(suffix) and number.isdigit():
            return int(number) * _SUFFIXES[suffix]
    raise SimError(f"dd: invalid number: '{text}'", 1)


def _human(n: float, base: int, units: tuple[str, ...]) -> str:
    value, unit = float(n), units[0]
    for unit in units:
        if value < base or unit == units[-1]:
            break
        value /= base
    return f"{value:.0f} {unit}" if value >= 10 or unit == units[0] else f"{value:.1f} {unit}"


def _started_ago() -> float:
    """Seconds since this process started (exec'd), from /proc: the stand-in's Python
    start-up, which a real dd (a C program up in a millisecond) does not have. On a loaded
    machine it reached a quarter of a second and made a 110 MB/s disk read as slower than the
    check's cut-off (1.5x what 125 MB/s needs), so it counts towards the simulated time."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


def _run(block: int, size: int, speed: float, target: Path | None = None) -> int:
    """Take `size / speed` seconds from the process's start, then report; interrupted
    (SIGINT: `timeout -s INT`), report what was done by then and end by the signal, as GNU
    dd does. The bytes done."""
    started = time.monotonic() - _started_ago()
    try:
        time.sleep(max(0.0, size / speed - (time.monotonic() - started)))
    except KeyboardInterrupt:
        elapsed = time.monotonic() - started
        done = min(size, int(speed * elapsed))
        if target is not None:
            with open(target, "r+b") as handle:
                handle.truncate(done)
        _report(-(-done // block), done, elapsed)
        raise
    _report(-(-size // block), size, size / speed)
    return size


def _report(records: int, done: int, seconds: float) -> None:
    si = _human(done, 1000, ("B", "kB", "MB", "GB", "TB"))
    iec = _human(done, 1024, ("B", "KiB", "MiB", "GiB", "TiB"))
    rate = _human(done / seconds if seconds > 0 else 0, 1000, ("B", "kB", "MB", "GB", "TB"))
    say(f"{records}+0 records in", f"{records}+0 records out",
        f"{done} bytes ({si}, {iec}) copied, {seconds:g} s, {rate}/s", err=True)


def _operands(argv: list[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for arg in argv:
        key, eq, value = arg.partition("=")
        if not eq or key not in _KNOWN:
            raise SimError(f"dd: unrecognized operand '{arg}'\nTry 'dd --help' for more "
                           "information.", 1)
        if key not in _SIMULATED:
            raise SimError(f"simhost: dd {key}= is not simulated", 2)
        found[key] = value
    return found


def dd(host: Host, argv: list[str]) -> int:
    """`dd if=/dev/zero of=F bs=B count=N [conv=fdatasync]` or `dd if=F of=/dev/null bs=B
    [iflag=direct]` (see the module docstring)."""
    ops = _operands(argv)
    block = _bytes(ops.get("bs", "512"))
    opts = host.options
    if ops.get("if") == "/dev/zero" and ops.get("of") not in (None, "/dev/null"):
        if "count" not in ops:
            raise SimError("simhost: dd from /dev/zero without count= is not simulated", 2)
        target = host.writable(Path(ops["of"]))
        want = block * _bytes(ops["count"])
        avail = int(mount_for(host, target)["avail"]) + (
            target.stat().st_size if target.exists() else 0)
        done = min(want, avail)
        speed = float(opts.get("disk_write_bytes_per_second") or DEFAULT_WRITE_BPS)
        with open(target, "wb") as handle:  # sparse: no real bytes on this machine's disk
            handle.truncate(done)
        _run(block, done, speed, target)
        if done < want:
            raise SimError(f"dd: error writing '{ops['of']}': No space left on device", 1)
        return 0
    if ops.get("of") == "/dev/null" and ops.get("if") not in (None, "/dev/zero"):
        source = Path(ops["if"])
        if not source.is_file():
            raise SimError(f"dd: failed to open '{ops['if']}': No such file or directory", 1)
        size = source.stat().st_size
        if "count" in ops:
            size = min(size, block * _bytes(ops["count"]))
        _run(block, size, float(opts.get("disk_read_bytes_per_second") or DEFAULT_READ_BPS))
        return 0
    raise SimError("simhost: only `dd if=/dev/zero of=FILE count=N` and `dd if=FILE "
                   "of=/dev/null` are simulated", 2)

