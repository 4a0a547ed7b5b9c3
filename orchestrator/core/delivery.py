"""What a job delivers and where (`output:`), with its size, time and cost, for `orch plan`.

Pure: sizes from the model's shape, times from two transfer rates, cost from the chosen
placement's hourly rate (the host is billed while it sends). The rates are assumptions,
not measurements: a rented GPU host's uplink to the Hugging Face Hub (datacenter to CDN) and
its link to the machine running orch (often a home or office line). The plan says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from orchestrator.core.spec import LoadedJob

# Assumed (see the module docstring); bytes per second.
HOST_TO_HUB_BYTES_PER_S = 100e6  # ~800 Mbit/s
HOST_TO_HERE_BYTES_PER_S = 12.5e6  # ~100 Mbit/s
BF16_BYTES = 2


@dataclass(frozen=True)
class Delivery:
    """The job's results: sizes in bytes, where each goes, the time and cost of sending."""

    adapter_bytes: int  # the adapter (LoRA/QLoRA), or the full fine-tune's weights
    merged_bytes: int  # 0 unless output.merged
    local_bytes: int  # copied to this machine
    hub_bytes: int  # uploaded from the host
    hub_repo: str | None
    hours: float
    cost: Decimal

    def to_dict(self) -> dict[str, Any]:
        """The `orch plan --json` `delivery` object."""
        return {"adapter_bytes": self.adapter_bytes, "merged_bytes": self.merged_bytes,
                "local_bytes": self.local_bytes, "hub_bytes": self.hub_bytes,
                "push_to_hub": self.hub_repo, "hours": round(self.hours, 4),
                "cost": str(self.cost.quantize(Decimal("0.0001"))),
                "assumed_bytes_per_s": {"host_to_hub": HOST_TO_HUB_BYTES_PER_S,
                                        "host_to_here": HOST_TO_HERE_BYTES_PER_S}}

    def describe(self) -> str:
        """One line for `orch plan`."""
        parts = [f"{_gb(self.local_bytes)} to this machine"]
        if self.hub_repo is not None:
            parts.append(f"{_gb(self.hub_bytes)} from the host to {self.hub_repo}")
        if self.merged_bytes and not (self.local_bytes >= self.merged_bytes
                                      or self.hub_bytes >= self.merged_bytes):
            parts.append(f"merged model ({_gb(self.merged_bytes)}) stays on the host")
        return (", ".join(parts) + f"; ~{self.hours * 60:.0f} min, ~${self.cost:.2f} of host "
                "time at assumed link speeds")


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n < 10**9 else f"{n / 1e9:.1f} GB"


def plan_delivery(job: LoadedJob, trainable_params: int, hourly: Decimal) -> Delivery:
    """The delivery of `job` on a host billed `hourly` dollars an hour."""
    spec, out = job.spec, job.spec.output
    params = job.architecture.params
    adapter = (trainable_params if spec.method != "full" else params) * BF16_BYTES
    merged = params * BF16_BYTES if out.merged else 0
    local = 0 if out.local is False else adapter + (merged if out.merged_local() else 0)
    hub = 0 if out.push_to_hub is None else (merged if out.merged else adapter)
    seconds = local / HOST_TO_HERE_BYTES_PER_S + hub / HOST_TO_HUB_BYTES_PER_S
    hours = seconds / 3600
    return Delivery(adapter, merged, local, hub, out.push_to_hub, hours,
                    hourly * Decimal(str(round(hours, 6))))
