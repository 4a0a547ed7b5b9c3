"""Published training throughputs with pinned configs, and orch's estimate of each (pure).

The points live in data/throughput.yaml with their sources; tests/test_throughput_calibration.py
and bench/sizing_accuracy.py read them through `points()`. The memory twin is calibration.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.core.architectures import Architecture, from_fields, lookup
from orchestrator.core.sizing import Strategy, Workload
from orchestrator.core.throughput import PUBLISHED, training_seconds
from providers.base import GpuSpec
from providers.datacache import read_yaml

_DATA = PUBLISHED
# Tokens the estimate is taken over: large enough that no per-run constant matters.
_TOKENS = 10**9


@dataclass(frozen=True)
class Point:
    name: str
    source: str
    asserted: bool
    why: str  # why an unasserted point is not asserted
    gpu: str
    gpu_count: int
    strategy: Strategy
    compiled: bool
    measured_tokens_per_s: float
    published_params: int
    arch: Architecture
    workload: Workload

    def estimate_tokens_per_s(self, gpus: dict[str, GpuSpec]) -> float:
        """orch's training rate for the point's run (whole job, all GPUs)."""
        seconds = training_seconds(self.workload, _TOKENS, gpus[self.gpu], self.gpu_count,
                                   self.strategy, compiled=self.compiled)
        return _TOKENS / seconds

    def error(self, gpus: dict[str, GpuSpec]) -> float:
        """Estimated hours / measured hours - 1 (positive: orch expects it to take longer)."""
        return self.measured_tokens_per_s / self.estimate_tokens_per_s(gpus) - 1


def band() -> float:
    """The largest |error| an asserted point may have."""
    return float(_raw()["band"])


def _raw() -> dict[str, Any]:
    data: dict[str, Any] = read_yaml(_DATA)
    return data


def _shape(raw: dict[str, Any]) -> tuple[Architecture, int]:
    if "model" in raw:
        known = lookup(raw["model"])
        return known.architecture, known.published_params
    arch = from_fields(dict(raw["arch"]), where=f"{_DATA.name}:{raw['name']}")
    return arch, int(raw["published_params"])


def points() -> list[Point]:
    """Every recorded point, in file order; `source` keys resolved to their text."""
    data = _raw()
    sources: dict[str, str] = data["sources"]
    out = []
    for raw in data["points"]:
        arch, published = _shape(raw)
        fields: dict[str, Any] = dict(raw["workload"])
        if "lora_modules" in fields:
            fields["lora_modules"] = tuple(fields["lora_modules"])
        key = raw["source"].split(" ", 1)[0]
        source = f"{sources[key]}: {raw['source'][len(key):].strip()}" if key in sources \
            else raw["source"]
        out.append(Point(
            name=raw["name"], source=source, asserted=bool(raw["asserted"]),
            why=raw.get("why", ""), gpu=raw["gpu"], gpu_count=int(raw["gpu_count"]),
            strategy=Strategy(raw["strategy"]), compiled=bool(raw["compiled"]),
            measured_tokens_per_s=float(raw["tokens_per_s"]), published_params=published,
            arch=arch, workload=Workload(arch, **fields)))
    return out

