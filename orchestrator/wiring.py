"""Which providers this machine can use, built from credentials and local state.

A provider without credentials is left out with a note (never a traceback); `sim` is
available wherever its state directory exists, `dedicated` always (it is the `server` table).
Base URLs can be pointed elsewhere (`ORCH_VASTAI_URL`, `ORCH_RUNPOD_URL`) for emulators.
"""

from __future__ import annotations

import os
from pathlib import Path

from orchestrator.paths import data_dir
from orchestrator.store import Store
from providers import credentials
from providers.base import Provider


def sim_state_dir() -> Path:
    """Where the simulated cloud keeps its instances."""
    return data_dir() / "sim"


def configured_providers(store: Store, *, sim: bool | None = None
                         ) -> tuple[dict[str, Provider], list[str]]:
    """(name -> provider, notes about the ones left out)."""
    from providers.dedicated import Dedicated

    found: dict[str, Provider] = {"dedicated": Dedicated(store)}
    notes: list[str] = []
    if sim or (sim is None and sim_state_dir().exists()):
        from providers.sim import SimCloud

        found["sim"] = SimCloud(sim_state_dir())
    for name, env in (("vastai", "ORCH_VASTAI_URL"), ("runpod", "ORCH_RUNPOD_URL")):
        try:
            key = credentials.api_key(name)
        except credentials.CredentialsError as exc:
            notes.append(f"{name}: {exc}")
            continue
        if not key:
            notes.append(f"{name}: no API key ({credentials.ENV[name]} or "
                         f"{credentials.credentials_file()}); left out")
            continue
        url = os.environ.get(env)
        if name == "vastai":
            from providers.vastai import VastAI

            found[name] = VastAI(key, base_url=url) if url else VastAI(key)
        else:
            from providers.runpod import RunPod

            found[name] = RunPod(key, base_url=url) if url else RunPod(key)
    return found, notes
