"""Published memory figures with pinned configs, and orch's estimate of each (pure).

The points live in data/calibration.yaml with their sources; tests/test_calibration.py and
bench/sizing_accuracy.py read them through `points()`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.core.architectures import Architecture, from_fields
from orchestrator.core.sizing import GIB, Workload, estimate
from orchestrator.core.yamlpos import load_data

_DATA = Path(__file__).with_name("data") / "calibration.yaml"


@dataclass(frozen=True)
class Point:
    name: str
    source: str
    kind: str  # measurement | statement
    asserted: bool
    measured_gib: float
    compare: str  # peak | state
    published_params: int
    arch: Architecture
    workload: Workload

    def estimate_gib(self) -> float:
        """orch's figure for what the source measured (see `compare`)."""
        e = estimate(self.workload)
        if self.compare == "state":
            c = e.components
            return (c["weights"] + c["gradients"] + c["optimizer"]) / GIB
        return e.peak_bytes / GIB

    @property
    def error(self) -> float:
        """(estimate - measured) / measured."""
        return self.estimate_gib() / self.measured_gib - 1


def points() -> list[Point]:
    """Every recorded point, in file order."""
    out = []
    for raw in load_data(_DATA.read_text())["points"]:
        arch = from_fields(dict(raw["arch"]), where=f"{_DATA.name}:{raw['name']}")
        fields: dict[str, Any] = dict(raw["workload"])
        out.append(Point(
            name=raw["name"], source=raw["source"], kind=raw["kind"],
            asserted=bool(raw["asserted"]), measured_gib=float(raw["measured_gib"]),
            compare=raw["compare"], published_params=int(raw["published_params"]), arch=arch,
            workload=Workload(arch, **fields)))
    return out
