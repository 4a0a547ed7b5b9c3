"""Providers declare what they can do (`providers.base` capability protocols); the engine
asks those and never a provider's name (issue 13 §1).

Each adapter is checked against what it claims, and the engine's modules are read to prove
they hold no provider name, no private id format and no attribute probe.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from test_engine import Rig, rig  # noqa: F401 - the fixture

from orchestrator.engine import wiring
from providers.base import (
    ContainerRental,
    HostPathMapping,
    HubMirror,
    KeepsMachine,
    OptInOnly,
    PriceList,
    Simulated,
)
from providers.dedicated.compute import Dedicated, offer_id
from providers.runpod.compute import RunPod
from providers.vastai.compute import VastAI

ROOT = Path(__file__).resolve().parent.parent
CAPABILITIES = (KeepsMachine, OptInOnly, Simulated, ContainerRental, HostPathMapping, HubMirror,
                PriceList)
# The engine and the parts it is assembled from (orchestrator/engine/runner.py's JobRunner).
ENGINE_MODULES = ("runner", "runner_core", "placement", "hostsession", "teardown", "recovery")


def _declared(provider: object) -> set[str]:
    return {c.__name__ for c in CAPABILITIES if isinstance(provider, c)}


def test_each_provider_declares_its_capabilities(rig: Rig) -> None:  # noqa: F811
    assert _declared(rig.cloud()) == {"OptInOnly", "Simulated", "HostPathMapping", "HubMirror",
                                      "PriceList"}
    assert _declared(Dedicated(rig.store)) == {"KeepsMachine"}
    assert _declared(VastAI("k", base_url="http://127.0.0.1:9/api/v0")) == {"ContainerRental"}
    assert _declared(RunPod("k", base_url="http://127.0.0.1:9/v2")) == {"ContainerRental"}


def test_the_composition_root_names_each_adapter_by_its_own_name() -> None:
    """`wiring.ADAPTERS` is the one place a name meets its class: each class's `name` is its
    key, and what a name declares is its class's (the marker, without building it)."""
    for name in wiring.ADAPTERS:
        cls = wiring.adapter(name)
        assert cls is not None and cls.name == name  # type: ignore[attr-defined]
    assert wiring.CLOUDS == ("vastai", "runpod")
    assert [n for n in wiring.ADAPTERS if wiring.declares(n, OptInOnly)] == ["sim"]
    assert [n for n in wiring.ADAPTERS if wiring.declares(n, Simulated)] == ["sim"]
    assert wiring.adapter("cloud") is None and not wiring.declares("cloud", OptInOnly)
    # A price list only for a job that names its provider.
    assert wiring.price_lists(None) == [] and wiring.price_lists(["vastai"]) == []
    assert {o.provider for o in wiring.price_lists(["sim"])} == {"sim"}


def test_no_product_module_asks_for_the_simulated_cloud_by_name() -> None:
    """What `sim` needs is a capability it declares (issue 37 §2): outside the composition
    root's table of adapters no module of orchestrator/ spells its name as a string."""
    pattern = re.compile(r"""["']sim["']""")
    found = [(str(path.relative_to(ROOT)), line.strip())
             for path in sorted((ROOT / "orchestrator").rglob("*.py"))
             for line in path.read_text().splitlines() if pattern.search(line)]
    assert found == [("orchestrator/engine/wiring.py", '"vastai": _vastai, "runpod": _runpod, '
                      '"dedicated": _dedicated, "sim": _sim}')]


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


MARKERS = (OptInOnly, Simulated, ContainerRental)


def test_a_capability_with_nothing_to_call_is_a_nominal_marker() -> None:
    class LooksLikeOne:  # the dummy methods these markers once were
        def rents_containers(self) -> bool:
            return True

        def opt_in_note(self) -> str:
            return "opt-in"

        def simulated_by(self) -> str:
            return "stand-ins"

    assert [m.__name__ for m in MARKERS if isinstance(LooksLikeOne(), m)] == []
    # Declared by inheriting, as the adapters do.
    assert isinstance(type("Declared", (ContainerRental,), {})(), ContainerRental)


def test_no_method_is_a_dummy_that_only_returns_true() -> None:
    """A method of a provider (or of the engine) with no argument but self whose whole body
    is `return True` is a capability flag in disguise: declare a marker class
    (providers.base) instead. (playbooks' `Hooks` defaults are values a driver overrides.)"""
    found = []
    for package in ("providers", "orchestrator"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if not isinstance(node, ast.FunctionDef) or len(node.args.args) != 1:
                    continue
                body = [s for s in node.body if not (isinstance(s, ast.Expr)
                                                     and isinstance(s.value, ast.Constant))]
                if len(body) == 1 and isinstance(body[0], ast.Return) and \
                        isinstance(body[0].value, ast.Constant) and body[0].value.value is True:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert found == []
