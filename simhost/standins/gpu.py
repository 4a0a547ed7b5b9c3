"""`nvidia-smi`: the GPUs the host was configured with (SimHostOptions.gpu_*)."""

from __future__ import annotations

import hashlib
import os

from . import gpumem
from .common import Host, SimError, say

_COMPUTE_CAP = {"B200": "10.0", "H200": "9.0", "H100": "9.0", "GH200": "9.0", "L40": "8.9"}
_COMPUTE_CAP_MORE = {"RTX 4090": "8.9", "L4": "8.9", "A100": "8.0", "A10": "8.6", "RTX 3090": "8.6"}

_UNITS = {"memory.total": "MiB", "memory.used": "MiB", "memory.free": "MiB", "utilization.gpu": "%"}


def _compute_cap(model: str) -> str:
    for table in (_COMPUTE_CAP, _COMPUTE_CAP_MORE):
        for key, value in table.items():
            if key in model:
                return value
    return "8.0"


def _gpu_values(host: Host, index: int) -> dict[str, str]:
    opts = host.options
    uuid = hashlib.sha1(f"{host.dir}:{index}".encode()).hexdigest()
    memory = int(opts["gpu_memory_mib"])
    held = gpumem.used_mib(host, index)
    return {
        "index": str(index),
        "name": opts["gpu_model"],
        "uuid": f"GPU-{uuid[:8]}-{uuid[8:12]}-{uuid[12:16]}-{uuid[16:20]}-{uuid[20:32]}",
        "memory.total": str(memory),
        "memory.used": str(held),
        "memory.free": str(memory - held),
        "driver_version": opts["driver_version"],
        "pci.bus_id": f"00000000:{0x18 + index * 0x10:02X}:00.0",
        "utilization.gpu": "0",
        "temperature.gpu": "34",
        "compute_cap": _compute_cap(opts["gpu_model"]),
        "count": str(opts["gpu_count"]),
        "persistence_mode": "Enabled",
    }


def nvidia_smi(host: Host, argv: list[str]) -> int:
    """`--query-gpu=F --format=csv[,noheader][,nounits]`, `-L`, `-i N`, or the summary table."""
    opts = host.options
    if os.environ.get("SIMHOST_CONTAINER") and not os.environ.get("SIMHOST_GPUS"):
        # A container started without --gpus gets no driver utilities injected.
        raise SimError('exec: "nvidia-smi": executable file not found in $PATH', 127)
    if opts["driver_broken"]:
        raise SimError(
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
            "Make sure that the latest NVIDIA driver is installed and running.",
            9,
        )
    query: list[str] | None = None
    apps: list[str] | None = None
    fmt: set[str] = set()
    indexes = list(range(int(opts["gpu_count"])))
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg.startswith("--query-gpu"):
            value = arg.split("=", 1)[1] if "=" in arg else args.pop(0)
            query = [f.strip() for f in value.split(",") if f.strip()]
        elif arg.startswith("--format"):
            value = arg.split("=", 1)[1] if "=" in arg else args.pop(0)
            fmt = {f.strip() for f in value.split(",")}
        elif arg in ("-i", "--id") or arg.startswith("--id="):
            value = arg.split("=", 1)[1] if "=" in arg else args.pop(0)
            indexes = [int(v) for v in value.split(",")]
        elif arg.startswith("--query-compute-apps"):
            value = arg.split("=", 1)[1] if "=" in arg else args.pop(0)
            apps = [f.strip() for f in value.split(",") if f.strip()]
        elif arg in ("-L", "--list-gpus"):
            for i in indexes:
                v = _gpu_values(host, i)
                say(f"GPU {i}: {v['name']} (UUID: {v['uuid']})")
            return 0
        elif arg == "--version":
            say(
                f"NVIDIA-SMI version  : {opts['driver_version']}",
                f"DRIVER version      : {opts['driver_version']}",
                f"CUDA Version        : {opts['cuda_version']}",
            )
            return 0
        else:
            raise SimError(f'Invalid combination of input arguments: "{arg}"', 2)
    if apps is not None:
        return _compute_apps(host, apps, fmt)
    if query is None:
        _summary(host, indexes)
        return 0
    if "csv" not in fmt:
        raise SimError('"--query-gpu" requires "--format=csv"', 2)
    known = _gpu_values(host, 0)
    for field in query:
        if field not in known:
            raise SimError(f'Field "{field}" is not a valid field to query.', 2)
    if "noheader" not in fmt:
        say(", ".join(f + (f" [{_UNITS[f]}]" if f in _UNITS else "") for f in query))
    for i in indexes:
        if not 0 <= i < int(opts["gpu_count"]):
            raise SimError(f"No devices were found (index {i})", 6)
        values = _gpu_values(host, i)
        cells = []
        for field in query:
            unit = _UNITS.get(field)
            cells.append(values[field] + (f" {unit}" if unit and "nounits" not in fmt else ""))
        say(", ".join(cells))
    return 0


# `--query-compute-apps`: the process holding `gpu_memory_held_mib` (a fixed pid and name),
# then the host's own processes that hold memory (`gpumem`).
_HELD_PID, _HELD_NAME = 4242, "python3"


def _compute_apps(host: Host, fields: list[str], fmt: set[str]) -> int:
    """`--query-compute-apps=pid,process_name,used_memory[,gpu_uuid,...] --format=csv`."""
    if "csv" not in fmt:
        raise SimError('"--query-compute-apps" requires "--format=csv"', 2)
    known = ("pid", "process_name", "used_memory", "gpu_uuid", "gpu_bus_id", "gpu_name")
    for name in fields:
        if name not in known:
            raise SimError(f'Field "{name}" is not a valid field to query.', 2)
    if "noheader" not in fmt:
        say(", ".join(f + (" [MiB]" if f == "used_memory" else "") for f in fields))
    if os.environ.get("SIMHOST_CONTAINER") or host.options.get("container_image"):
        # nvidia-smi in a container (a `docker run`, or the rental itself) lists no process
        # of another PID namespace: the driver reports host pids, which it cannot map.
        return 0
    held = int(host.options.get("gpu_memory_held_mib") or 0)
    owners = gpumem.holders(host)
    for i in range(int(host.options["gpu_count"])):
        v = _gpu_values(host, i)
        rows = [(_HELD_PID, _HELD_NAME, held)] if held else []
        rows += [(h.pid, h.name, h.mib) for h in owners if i in h.gpus]
        for pid, name, mib in rows:
            row = {"pid": str(pid), "process_name": name,
                   "used_memory": str(mib) + ("" if "nounits" in fmt else " MiB"),
                   "gpu_uuid": v["uuid"], "gpu_bus_id": v["pci.bus_id"], "gpu_name": v["name"]}
            say(", ".join(row[f] for f in fields))
    return 0


def _summary(host: Host, indexes: list[int]) -> None:
    opts = host.options
    say(
        "+---------------------------------------------------------------------------+",
        f"| NVIDIA-SMI {opts['driver_version']:<14} Driver Version: {opts['driver_version']:<14}"
        f" CUDA Version: {opts['cuda_version']:<5}|",
        "|---------------------------------------------------------------------------|",
    )
    for i in indexes:
        v = _gpu_values(host, i)
        say(f"| {i:>3}  {v['name']:<36} {v['memory.used']:>6}MiB / {v['memory.total']:>6}MiB |")
    say("+---------------------------------------------------------------------------+")
