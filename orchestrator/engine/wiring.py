"""Which providers this machine can use, built from credentials and local state.

A provider without credentials is left out with a note (never a traceback); `sim` is
available wherever its state directory exists, `dedicated` always (it is the `server` table).
Base URLs can be pointed elsewhere (`ORCH_VASTAI_URL`, `ORCH_RUNPOD_URL`) for emulators.
"""

from __future__ import annotations

import os
from pathlib import Path

from orchestrator.core.paths import data_dir
from orchestrator.engine.market import cloud
from orchestrator.engine.runnable import QUICK_HTTP as QUICK_HTTP  # re-exported (tests)
from orchestrator.engine.runnable import cloud_keys
from orchestrator.records.store import Store
from providers.base import Provider


def sim_state_dir() -> Path:
    """Where the simulated cloud keeps its instances."""
    return data_dir() / "sim"


def _number(name: str) -> float | None:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: give a number") from None


def sim_from_env() -> Provider:
    """The simulated cloud, shaped by ORCH_SIM_* variables (see docs/architecture.md).

    ORCH_SIM_BOOT_S (seconds until an instance runs), ORCH_SIM_PREEMPT_AFTER_S (spot
    instances are preempted that long after create), ORCH_SIM_CAPACITY ("RTX 3090=0,H100
    PCIe=2": live instances per GPU model), ORCH_SIM_TRAIN_STEPS / ORCH_SIM_STEP_S (how long
    the stand-in trainer runs), ORCH_SIM_MODEL_BYTES / ORCH_SIM_DOWNLOAD_BPS (the base model's
    size and the hosts' download rate in bytes per second: `hf download` takes that long).
    """
    from providers.sim.compute import SimCloud

    capacity: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in os.environ.get("ORCH_SIM_CAPACITY",
                                                               "").split(","))):
        gpu, sep, count = part.rpartition("=")
        if not sep or not count.strip().isdigit():
            raise ValueError(f"ORCH_SIM_CAPACITY: {part!r}: use GPU=COUNT, e.g. 'RTX 3090=0'")
        capacity[gpu.strip()] = int(count)
    host: dict[str, object] = {}
    steps, step_s = _number("ORCH_SIM_TRAIN_STEPS"), _number("ORCH_SIM_STEP_S")
    if steps is not None:
        host["train_steps"] = int(steps)
    if step_s is not None:
        host["train_step_seconds"] = step_s
    size, rate = _number("ORCH_SIM_MODEL_BYTES"), _number("ORCH_SIM_DOWNLOAD_BPS")
    if size is not None:
        host["model_size_bytes"] = int(size)
    if rate is not None:
        host["download_bytes_per_second"] = rate
    return SimCloud(sim_state_dir(), capacity=capacity,
                    boot_seconds=_number("ORCH_SIM_BOOT_S") or 0.0,
                    preempt_after_s=_number("ORCH_SIM_PREEMPT_AFTER_S"), host_options=host)




def configured_providers(store: Store, *, sim: bool | None = None, quick: bool = False
                         ) -> tuple[dict[str, Provider], list[str]]:
    """(name -> provider, notes about the ones left out); `quick`: short HTTP timeouts."""
    from providers.dedicated.compute import Dedicated

    found: dict[str, Provider] = {"dedicated": Dedicated(store)}
    if sim or (sim is None and sim_state_dir().exists()):
        found["sim"] = sim_from_env()
    keys, notes = cloud_keys()
    for name, key in keys.items():
        found[name] = cloud(name, key, quick)
    return found, notes
