"""Published memory figures with pinned configs, and orch's estimate of each (pure).

The points live in data/calibration.yaml with their sources; tests/test_calibration.py and
bench/sizing_accuracy.py read them through `points()`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.core.architectures import Architecture, from_fields
from orchestrator.core.sizing import (
    ADAPTER_GRADIENT,
    ADAPTER_OPTIMIZER,
    ADAPTER_WEIGHT,
    BF16,
    FP32,
    GIB,
    Strategy,
    Workload,
    estimate,
)
from providers.datacache import read_yaml

_DATA = Path(__file__).with_name("data") / "calibration.yaml"

# FSDP1 through accelerate upcasts the flat parameters to fp32, so the run kept fp32
# parameters (4) and gradients (4) and fp32 AdamW moments (8): 8 bytes per parameter more
# than the bf16 shards of orch's fsdp2 layout (2 + 2 + 4) [accelerate v0.33.0
# accelerator.py:1512-1552, "we follow DeepSpeed's strategy to hold the parameters in full
# precision"].
UPCAST_EXTRA_BYTES = FP32 + FP32 + 2 * FP32 - (2 + 2 + 4)
# PEFT before 0.12 created each LoRA adapter in its base layer's dtype (v0.10.0
# src/peft/tuners/lora/layer.py:114-122 `self.to(weight.device, dtype=weight.dtype)`; the
# fp32 `autocast_adapter_dtype` came with v0.12.0), and bf16 is what a bf16 model or a
# 4-bit base stored in bf16 (`bnb_4bit_quant_storage`) reports; torchtune builds its LoRA
# model in the recipe's `dtype: bf16`. Such a run kept bf16 adapters, gradients and AdamW
# moments (torch AdamW keeps them in the parameter's dtype): 2 + 2 + 4 bytes per adapter
# parameter where orch's PEFT >= 0.12 keeps 4 + 4 + 8. The share of each orch component:
BF16_ADAPTER_SHARE = {"adapters": BF16 / ADAPTER_WEIGHT, "gradients": BF16 / ADAPTER_GRADIENT,
                      "optimizer": 2 * BF16 / ADAPTER_OPTIMIZER["adamw"]}


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
    gpu_count: int = 1
    layout: Strategy = Strategy.SINGLE
    upcast_fp32: bool = False
    bf16_adapters: bool = False
    quant_state_sharded: bool = False
    held_out: bool = False
    measured_as: str = "unstated"  # allocated | reserved | nvidia-smi | statement | unstated
    why: str = ""  # why a point is not asserted
    before_gib: float | None = None  # orch's estimate before issue 36's recalibration
    prev_gib: float | None = None  # after its first part (full fine-tunes), r36-sizing 5485ec0

    def estimate_gib(self) -> float:
        """orch's figure for what the source measured (see `compare`)."""
        e = estimate(self.workload, self.gpu_count, self.layout)
        if self.compare == "state":
            c = e.components
            return (c["weights"] + c["gradients"] + c["optimizer"]) / GIB
        return (e.peak_bytes + self.run_difference_bytes(e.components)) / GIB

    def run_difference_bytes(self, components: dict[str, int]) -> float:
        """What the published run held on a GPU beyond (or below) what orch's render holds."""
        extra = 0.0
        g = self.gpu_count if self.sharded else 1
        if self.upcast_fp32:
            extra += UPCAST_EXTRA_BYTES * self.arch.params / g
        if self.bf16_adapters and self.workload.method != "full":
            # Where orch keeps them on the GPU (offloaded ones count 0 there).
            extra -= sum(components[c] * (1 - share) for c, share in BF16_ADAPTER_SHARE.items())
        if self.quant_state_sharded and self.sharded:
            # torchao's NF4Tensor shards its scales with its data (torchao/dtypes/
            # nf4tensor.py `_INNER_TENSOR_NAMES_FOR_SHARDING`); bitsandbytes' stay whole.
            extra -= components.get("quant_state", 0) * (1 - 1 / g)
        return extra

    @property
    def error(self) -> float:
        """(estimate - measured) / measured."""
        return self.estimate_gib() / self.measured_gib - 1

    @property
    def before_error(self) -> float | None:
        """The error before issue 36's recalibration (None where not recorded)."""
        return None if self.before_gib is None else self.before_gib / self.measured_gib - 1

    @property
    def prev_error(self) -> float | None:
        """The error at r36-sizing, before the sharded adapter terms (None if not recorded)."""
        return None if self.prev_gib is None else self.prev_gib / self.measured_gib - 1

    @property
    def sharded(self) -> bool:
        """True for a run that divides the model over several GPUs."""
        return self.gpu_count > 1 and self.layout not in (Strategy.SINGLE, Strategy.DDP)


def _point(raw: dict[str, Any]) -> Point:
    arch = from_fields(dict(raw["arch"]), where=f"{_DATA.name}:{raw['name']}")
    fields: dict[str, Any] = dict(raw["workload"])
    if "lora_modules" in fields:
        fields["lora_modules"] = tuple(fields["lora_modules"])
    return Point(
        name=raw["name"], source=raw["source"], kind=raw["kind"],
        asserted=bool(raw["asserted"]), measured_gib=float(raw["measured_gib"]),
        compare=raw["compare"], published_params=int(raw["published_params"]), arch=arch,
        workload=Workload(arch, **fields), gpu_count=int(raw.get("gpu_count", 1)),
        layout=Strategy(raw.get("layout", "single")),
        upcast_fp32=bool(raw.get("upcast_fp32", False)),
        bf16_adapters=bool(raw.get("bf16_adapters", False)),
        quant_state_sharded=bool(raw.get("quant_state_sharded", False)),
        held_out=bool(raw.get("held_out", False)),
        measured_as=str(raw.get("measured_as", "unstated")), why=str(raw.get("why", "")),
        before_gib=float(raw["before_gib"]) if "before_gib" in raw else None,
        prev_gib=float(raw["prev_gib"]) if "prev_gib" in raw else None)


def points() -> list[Point]:
    """Every recorded point, in file order."""
    return [_point(raw) for raw in read_yaml(_DATA)["points"]]
