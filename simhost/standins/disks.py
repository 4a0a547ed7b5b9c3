"""`lsblk` and `df`: a root disk and (unless disabled) one NVMe disk mounted at `nvme_path`.

Model files written by the `hf` stand-in are tiny but carry their real (logical) size in the
safetensors header; the NVMe's free space is its configured free bytes minus the logical size
of everything stored on it, so a "full disk" behaves like one.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

from .common import Host, SimError, is_within, say

TYPE_CHECKING = False  # see common.py: typing is not imported at run time
if TYPE_CHECKING:
    from typing import Any

ROOT_TOTAL = 100 * 2**30
ROOT_AVAIL = 40 * 2**30


def logical_size(path: Path) -> int:
    """The size a file stands for: a safetensors shard's declared size, else its real size."""
    try:
        size = path.stat().st_size
    except OSError:
        return 0
    if path.suffix != ".safetensors" or size < 8:
        return size
    try:
        with open(path, "rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            if length > 10_000_000:
                return size
            header = json.loads(handle.read(length))
        return int(header.get("__metadata__", {}).get("simhost_logical_bytes", size))
    except (OSError, ValueError, struct.error):
        return size


def nvme_path(host: Host) -> Path | None:
    """Where the NVMe disk is mounted on this host, or None for a host without one."""
    mount = host.options.get("nvme_mount")
    return host.path(mount) if mount else None


def nvme_used(host: Host) -> int:
    """Logical bytes stored on the NVMe disk."""
    root = nvme_path(host)
    if root is None or not root.exists():
        return 0
    total = 0
    for folder, _dirs, files in os.walk(root):
        for name in files:
            total += logical_size(Path(folder) / name)
    return total


def mounts(host: Host) -> list[dict[str, Any]]:
    """The mounted filesystems: source, fstype, size, used, avail, target (bytes)."""
    rows: list[dict[str, Any]] = [
        {
            "source": "/dev/vda1",
            "fstype": "ext4",
            "size": ROOT_TOTAL,
            "used": ROOT_TOTAL - ROOT_AVAIL,
            "avail": ROOT_AVAIL,
            "target": "/",
        }
    ]
    root = nvme_path(host)
    if root is not None:
        opts = host.options
        total = int(opts["disk_total_bytes"])
        free = int(opts["disk_free_bytes"] if opts["disk_free_bytes"] is not None else total)
        avail = max(0, free - nvme_used(host))
        rows.append(
            {
                "source": "/dev/nvme0n1",
                "fstype": "ext4",
                "size": total,
                "used": total - avail,
                "avail": avail,
                "target": str(root),
            }
        )
    return rows


def mount_for(host: Host, path: str | os.PathLike[str]) -> dict[str, Any]:
    """The filesystem holding `path` (the longest mount target containing it)."""
    best = mounts(host)[0]
    for row in mounts(host)[1:]:
        if is_within(path, row["target"]):
            best = row
    return best


def _human(n: int) -> str:
    value = float(n)
    for unit in ("B", "K", "M", "G", "T", "P"):
        if value < 1024 or unit == "P":
            text = f"{value:.1f}".rstrip("0").rstrip(".") if unit != "B" else str(int(value))
            return f"{text}{unit}"
        value /= 1024
    return str(n)  # pragma: no cover


def df(host: Host, argv: list[str]) -> int:
    """`df [-B1|-BSIZE|-k|-h] [--output=FIELDS] [PATH...]`."""
    block: int | None = 1024
    fields = ["source", "size", "used", "avail", "pcent", "target"]
    custom = False
    paths: list[str] = []
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg == "-h" or arg == "--human-readable":
            block = None
        elif arg == "-k":
            block = 1024
        elif arg.startswith("-B") or arg.startswith("--block-size"):
            value = arg[2:] if arg.startswith("-B") else arg.partition("=")[2]
            value = value or args.pop(0)
            scale = {"K": 1024, "M": 1024**2, "G": 1024**3}
            block = int(value[:-1] or 1) * scale[value[-1]] if value[-1] in scale else int(value)
        elif arg.startswith("--output"):
            fields = arg.partition("=")[2].split(",")
            custom = True
        elif arg in ("-P", "--portability", "-l", "--local", "-T"):
            if arg == "-T":
                fields.insert(1, "fstype")
        elif arg.startswith("-"):
            raise SimError(f"df: invalid option -- '{arg}'", 1)
        else:
            paths.append(arg)
    if block is None:
        size_title = "Size"
    elif block == 1:
        size_title = "1B-blocks"
    else:
        size_title = f"{block // 1024}K-blocks" if block % 1024 == 0 else f"{block}B-blocks"
    titles = {
        "source": "Filesystem",
        "fstype": "Type",
        "size": size_title,
        "used": "Used",
        "avail": "Avail" if custom or block is None else "Available",
        "pcent": "Use%",
        "target": "Mounted on",
    }
    for field in fields:
        if field not in titles:
            raise SimError(f"df: option --output: field '{field}' unknown", 1)
    if paths:
        rows = []
        for path in paths:
            if not os.path.exists(path):
                raise SimError(f"df: {path}: No such file or directory", 1)
            rows.append(mount_for(host, path))
    else:
        rows = mounts(host)

    def cell(row: dict[str, Any], field: str) -> str:
        if field == "pcent":
            return f"{-(-row['used'] * 100 // max(1, row['size']))}%"
        if field in ("size", "used", "avail"):
            value = int(row[field])
            return _human(value) if block is None else str(-(-value // block))
        return str(row[field])

    say(" ".join(titles[f] for f in fields))
    for row in rows:
        say(" ".join(cell(row, f) for f in fields))
    return 0


def lsblk(host: Host, argv: list[str]) -> int:
    """`lsblk [-J] [-b] [-d] [-n] [-o COLUMNS]` (NAME,SIZE,TYPE,TRAN,FSTYPE,MOUNTPOINT(S),MODEL)."""
    as_json = in_bytes = no_deps = no_header = False
    columns = ["NAME", "SIZE", "TYPE", "MOUNTPOINTS"]
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg in ("-o", "--output"):
            columns = [c.strip().upper() for c in args.pop(0).split(",")]
        elif arg.startswith("--output="):
            columns = [c.strip().upper() for c in arg.partition("=")[2].split(",")]
        elif arg.startswith("-") and not arg.startswith("--"):
            flags = arg[1:]
            as_json |= "J" in flags
            in_bytes |= "b" in flags
            no_deps |= "d" in flags
            no_header |= "n" in flags
        elif arg in ("--json", "--bytes", "--nodeps", "--noheadings"):
            as_json |= arg == "--json"
            in_bytes |= arg == "--bytes"
            no_deps |= arg == "--nodeps"
            no_header |= arg == "--noheadings"
        else:
            raise SimError(f"lsblk: {arg}: not a block device", 32)
    devices: list[dict[str, Any]] = [
        {
            "NAME": "vda",
            "SIZE": ROOT_TOTAL,
            "TYPE": "disk",
            "TRAN": None,
            "FSTYPE": None,
            "MOUNTPOINTS": [None],
            "MODEL": None,
            "children": [
                {
                    "NAME": "vda1",
                    "SIZE": ROOT_TOTAL,
                    "TYPE": "part",
                    "TRAN": None,
                    "FSTYPE": "ext4",
                    "MOUNTPOINTS": ["/"],
                    "MODEL": None,
                }
            ],
        }
    ]
    nvme = nvme_path(host)
    if nvme is not None:
        devices.append(
            {
                "NAME": "nvme0n1",
                "SIZE": int(host.options["disk_total_bytes"]),
                "TYPE": "disk",
                "TRAN": "nvme",
                "FSTYPE": "ext4",
                "MOUNTPOINTS": [str(nvme)],
                "MODEL": "SAMSUNG MZQL23T8HCLS-00A07",
            }
        )

    def shape(device: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for column in columns:
            key = "MOUNTPOINTS" if column == "MOUNTPOINT" else column
            if key not in device:
                raise SimError(f"lsblk: unknown column: {column}", 1)
            value = device[key]
            if key == "SIZE" and not in_bytes:
                value = _human(value)
            if column == "MOUNTPOINT":
                value = value[0]
            out[column.lower()] = value
        if device.get("children") and not no_deps:
            out["children"] = [shape(child) for child in device["children"]]
        return out

    shaped = [shape(d) for d in devices]
    if as_json:
        say(json.dumps({"blockdevices": shaped}, indent=3))
        return 0
    if not no_header:
        say(" ".join(columns))

    def lines(device: dict[str, Any], prefix: str = "") -> None:
        cells = []
        for column in columns:
            value = device[column.lower()]
            if isinstance(value, list):
                value = ",".join(v for v in value if v) or ""
            cells.append(
                prefix + str(value) if column == "NAME" else ("" if value is None else str(value))
            )
        say(" ".join(cells))
        for child in device.get("children", []):
            lines(child, "└─")

    for device in shaped:
        lines(device)
    return 0
