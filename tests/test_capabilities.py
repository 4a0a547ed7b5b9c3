"""Providers declare what they can do (`providers.base` capability protocols); the engine
asks those and never a provider's name (issue 13 §1).

Each adapter is checked against what it claims, and the engine's modules are read to prove
they hold no provider name, no private id format and no attribute probe.
"""

from __future__ import annotations

import re
from pathlib import Path

from test_engine import Rig, rig  # noqa: F401 - the fixture

from providers.base import (
    ContainerRental,
    HostKeyReporting,
    HostPathMapping,
    KeepsMachine,
    OptInOnly,
    Simulated,
    Volumes,
)
from providers.dedicated.compute import Dedicated, offer_id
from providers.runpod.compute import RunPod
from providers.vastai.compute import VastAI

ROOT = Path(__file__).resolve().parent.parent
CAPABILITIES = (KeepsMachine, Volumes, OptInOnly, Simulated, ContainerRental, HostKeyReporting,
                HostPathMapping)
# The engine and the parts it is assembled from (orchestrator/engine/runner.py's JobRunner).
ENGINE_MODULES = ("runner", "runner_core", "placement", "hostsession", "teardown", "recovery")


def _declared(provider: object) -> set[str]:
    return {c.__name__ for c in CAPABILITIES if isinstance(provider, c)}


def test_each_provider_declares_its_capabilities(rig: Rig) -> None:  # noqa: F811
    assert _declared(rig.cloud()) == {"Volumes", "OptInOnly", "Simulated", "HostKeyReporting",
                                      "HostPathMapping"}
    assert _declared(Dedicated(rig.store)) == {"KeepsMachine"}
    assert _declared(VastAI("k", base_url="http://127.0.0.1:9/api/v0")) == {"ContainerRental"}
    assert _declared(RunPod("k", base_url="http://127.0.0.1:9/v2")) == {"ContainerRental"}


def test_a_kept_server_owns_its_id_format(rig: Rig) -> None:  # noqa: F811
    dedicated = Dedicated(rig.store)
    assert dedicated.server_name(offer_id("box1")) == "box1"
    assert dedicated.server_name("box1") == "box1"  # an instance id is the server's name


def test_the_engine_names_no_provider_and_probes_no_attribute() -> None:
    pattern = re.compile(r'"sim"|"dedicated"|hasattr|getattr|server:')
    found = []
    for name in ENGINE_MODULES:
        path = ROOT / "orchestrator" / "engine" / f"{name}.py"
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                found.append(f"{path.name}:{number}: {line.strip()}")
    assert found == []
