"""GPU memory the host's own processes hold, as the driver accounts it.

On a real host, memory a process allocated on a GPU is in use until that process has exited:
nvidia-smi counts it, and the next process that asks for memory (vLLM's start-up check, torch)
finds it taken. vLLM V1 holds its memory in an engine process of its own (`VLLM::EngineCore`),
which outlives the API server's SIGTERM by the seconds its shutdown takes; a stop that returns
before that process is gone leaves the memory taken.

A stand-in that holds memory records it here, one file per process under the host's
`state/gpu-mem/` (its pid and kernel start time, so a pid reused later does not count); an
entry counts while that process runs, whatever ended it, as the driver frees a dead process's
memory. Besides these, `SimHostOptions.gpu_memory_held_mib` is memory another process holds
from before (a user's notebook), pid 4242.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from .common import Host, alive, process_starttime, write_atomic


@dataclass(frozen=True)
class Holder:
    """One process holding memory on some of the host's GPUs."""

    pid: int
    name: str
    mib: int  # on each of `gpus`
    gpus: tuple[int, ...]


def _folder(host: Host) -> Path:
    return host.state / "gpu-mem"


def hold(host: Host, name: str, mib: int, gpus: range | tuple[int, ...]) -> None:
    """Record that this process holds `mib` MiB on each of `gpus` until it exits."""
    folder = _folder(host)
    folder.mkdir(parents=True, exist_ok=True)
    pid = os.getpid()
    write_atomic(folder / f"{pid}.json", json.dumps(
        {"pid": pid, "starttime": process_starttime(pid), "name": name, "mib": int(mib),
         "gpus": list(gpus)}))


def release(host: Host) -> None:
    """This process gave its memory back (it also counts as given back once it exits)."""
    with contextlib.suppress(FileNotFoundError):
        (_folder(host) / f"{os.getpid()}.json").unlink()


def holders(host: Host) -> list[Holder]:
    """The host's processes that hold GPU memory now (not this process)."""
    found: list[Holder] = []
    folder = _folder(host)
    if not folder.is_dir():
        return found
    for path in sorted(folder.glob("*.json")):
        try:
            entry = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # being written or removed
        pid = int(entry["pid"])
        if pid == os.getpid():
            continue
        if not alive(pid, entry.get("starttime")):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()  # the driver freed it when the process ended
            continue
        found.append(Holder(pid, str(entry["name"]), int(entry["mib"]),
                            tuple(int(g) for g in entry["gpus"])))
    return found


def used_mib(host: Host, index: int) -> int:
    """MiB in use on GPU `index`: another process's from before, and the host's own."""
    total = int(host.options["gpu_memory_mib"])
    held = int(host.options.get("gpu_memory_held_mib") or 0)
    own = sum(h.mib for h in holders(host) if index in h.gpus)
    return min(total, held + own)
