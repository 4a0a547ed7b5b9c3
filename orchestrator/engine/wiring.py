"""Which providers this machine can use, built from credentials and local state.

A provider without credentials is left out with a note (never a traceback); `sim` is
available wherever its state directory exists, `dedicated` always (it is the `server` table).
Base URLs can be pointed elsewhere (`ORCH_VASTAI_URL`, `ORCH_RUNPOD_URL`) for emulators.
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.core.paths import data_dir
from orchestrator.core.settings import settings
from orchestrator.engine.market import cloud
from orchestrator.engine.runnable import QUICK_HTTP as QUICK_HTTP  # re-exported (tests)
from orchestrator.engine.runnable import cloud_keys
from orchestrator.records.store import Store
from providers.base import Provider
from providers.dedicated.compute import Dedicated
from providers.sim.compute import SimCloud


def sim_state_dir() -> Path:
    """Where the simulated cloud keeps its instances."""
    return data_dir() / "sim"


def sim_from_env() -> Provider:
    """The simulated cloud, shaped by the ORCH_SIM_* settings (docs/settings.md).

    ORCH_SIM_BOOT_S (seconds until an instance runs), ORCH_SIM_PREEMPT_AFTER_S (spot
    instances are preempted that long after create), ORCH_SIM_CAPACITY ("RTX 3090=0,H100
    PCIe=2": live instances per GPU model), ORCH_SIM_TRAIN_STEPS / ORCH_SIM_STEP_S (how long
    the stand-in trainer runs), ORCH_SIM_MODEL_BYTES / ORCH_SIM_DOWNLOAD_BPS (the base model's
    size and the hosts' download rate in bytes per second: `hf download` takes that long).
    """
    s = settings()
    given = {"train_steps": s.sim_train_steps, "train_step_seconds": s.sim_step_s,
             "model_size_bytes": s.sim_model_bytes,
             "download_bytes_per_second": s.sim_download_bps}
    host: dict[str, object] = {k: v for k, v in given.items() if v is not None}
    return SimCloud(sim_state_dir(), capacity=s.sim_capacity_by_gpu(),
                    boot_seconds=s.sim_boot_s, preempt_after_s=s.sim_preempt_after_s,
                    host_options=host)




def configured_providers(store: Store, *, sim: bool | None = None, quick: bool = False
                         ) -> tuple[dict[str, Provider], list[str]]:
    """(name -> provider, notes about the ones left out); `quick`: short HTTP timeouts."""
    found: dict[str, Provider] = {"dedicated": Dedicated(store)}
    if sim or (sim is None and sim_state_dir().exists()):
        found["sim"] = sim_from_env()
    keys, notes = cloud_keys()
    for name, key in keys.items():
        found[name] = cloud(name, key, quick)
    return found, notes
