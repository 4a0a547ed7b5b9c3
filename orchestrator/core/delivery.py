"""What a job delivers and where (`output:`), with its size, time and cost, for `orch plan`.

Pure: sizes from the model's shape, times from two transfer rates, cost from the chosen
placement's hourly rate (the host is billed while it sends). The rates are assumptions,
not measurements: a rented GPU host's uplink to the Hugging Face Hub (datacenter to CDN) and
its link to the machine running orch (often a home or office line). The plan says so.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any, NamedTuple

from orchestrator.core.spec import LoadedJob

# Assumed (see the module docstring); bytes per second.
HOST_TO_HUB_BYTES_PER_S = 100e6  # ~800 Mbit/s
HOST_TO_HERE_BYTES_PER_S = 12.5e6  # ~100 Mbit/s
BF16_BYTES = 2
# A copy to this machine above this size gets the cheaper route named in the plan (the limit
# above which a merged model must be sent somewhere on purpose: outputspec).
BIG_BYTES = 20 * 10**9


class Delivery(NamedTuple):
    """The job's results: sizes in bytes, where each goes, the time and cost of sending."""

    adapter_bytes: int  # the adapter (LoRA/QLoRA), or the full fine-tune's weights
    merged_bytes: int  # 0 unless output.merged
    local_bytes: int  # copied to this machine
    hub_bytes: int  # uploaded from the host
    hub_repo: str | None
    hours: float
    cost: Decimal

    def to_dict(self) -> dict[str, Any]:
        """The `orch plan --json` `delivery` object (its hours and cost are in the
        placement's `est_hours` and `est_cost`)."""
        return {"adapter_bytes": self.adapter_bytes, "merged_bytes": self.merged_bytes,
                "local_bytes": self.local_bytes, "hub_bytes": self.hub_bytes,
                "push_to_hub": self.hub_repo, "hours": round(self.hours, 4),
                "cost": str(self.cost.quantize(Decimal("0.0001"))),
                "cheaper": self.cheaper(),
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
        text = (", ".join(parts) + f"; ~{self.hours * 60:.0f} min, ~${self.cost:.2f} of host "
                "time at assumed link speeds (in the cost)")
        cheaper = self.cheaper()
        return text if cheaper is None else f"{text}. {cheaper}"

    def cheaper(self, with_cost: bool = True) -> str | None:
        """The cheaper route for a big copy to this machine, and why orch does not take it
        by itself (None: the copy is small, or there is none); `with_cost`: with dollars."""
        if self.local_bytes < BIG_BYTES or self.hours <= 0:
            return None
        hourly = self.cost / Decimal(str(round(self.hours, 6)))
        here_h = self.local_bytes / HOST_TO_HERE_BYTES_PER_S / 3600
        saved = hourly * Decimal(str(round(here_h, 6)))
        if self.hub_repo is not None:
            # Both: the Hub copy is sent anyway; the copy here is what costs.
            return (f"Cheaper: output.local: false leaves the {_gb(self.local_bytes)} on "
                    f"{self.hub_repo} only (saves ~{here_h * 60:.0f} min"
                    + (f", ~${saved:.2f}" if with_cost else "") + " of host time); "
                    "orch copies it here because output.local is unset")
        hub_h = self.local_bytes / HOST_TO_HUB_BYTES_PER_S / 3600
        hub_cost = hourly * Decimal(str(round(hub_h, 6)))
        return (f"Cheaper: output.push_to_hub: ORG/NAME with output.local: false uploads it "
                f"from the host instead (~{hub_h * 60:.0f} min"
                + (f", ~${hub_cost:.2f}" if with_cost else "") + " of host time, not "
                f"~{here_h * 60:.0f} min); orch does not pick a Hub repo (nor keeps a volume "
                "after the job) for you")


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
