"""One run of a sweep: what `orch sweep` reports of it, and the rows that queue it.

Shared by the grid and random submit (`sweep.store`) and the tpe proposals
(`sweep.propose`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN
from typing import Any

from orchestrator.core.jobstatus import JobStatus
from orchestrator.core.planning import Plan
from orchestrator.core.spec import JobSpec
from orchestrator.core.specidentity import spec_hash
from orchestrator.core.states import EventKind, SweepRunState
from orchestrator.core.sweepspec import SweepRun
from orchestrator.records.store import Event, Job, event_json, from_micros, to_micros, utcnow


def _dumps(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class RunReport:
    """What `submit_sweep` did with, or found for, one run."""

    index: int
    name: str
    params: dict[str, Any]
    sweep_key: str
    state: SweepRunState
    job_id: str | None = None
    status: JobStatus | None = None  # the job row's status (None when there is no row)
    est_cost_micros: int | None = None
    cost_micros: int = 0
    message: str = ""  # nofit: why; requeued: the earlier failure

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index, "name": self.name, "params": self.params,
            "sweep_key": self.sweep_key, "state": self.state, "job_id": self.job_id,
            "status": self.status,
            "est_cost": None if self.est_cost_micros is None
            else str(from_micros(self.est_cost_micros)),
            "cost": str(from_micros(self.cost_micros)), "message": self.message or None,
        }


def named(spec: JobSpec, name: str) -> JobSpec:
    """`spec` as the run named `name` records it."""
    if name == spec.name:
        return spec
    return type(spec).model_validate({**spec.model_dump(mode="json", by_alias=True),
                                      "name": name})


def run_rows(sweep_id: str, sweep_name: str, run: SweepRun, plan: Plan, name: str,
             trial_number: int | None = None) -> tuple[Job, Event]:
    """The queued job row of a run (named `name`) and its first event, not yet added. The
    key stays the sweep file's (`run.sweep_key`), so a later tick finds it."""
    placement = plan.to_dict(alternatives=10_000)
    placement["job_file"] = str(run.job.path.resolve())
    p = plan.chosen
    now = utcnow()
    spec = named(run.job.spec, name)
    job = Job(
        name=spec.name, status=JobStatus.QUEUED, method=spec.method,
        base_model=spec.base_model.repo,
        spec_json=spec.model_dump_json(), spec_hash=spec_hash(spec), sweep_id=sweep_id,
        sweep_key=run.sweep_key, provider=p.offer.provider, gpu=p.offer.gpu,
        gpu_count=p.offer.gpu_count, billing=p.offer.billing.value,
        interruptible=p.offer.interruptible, est_hours=p.est_hours,
        est_cost_micros=to_micros(p.est_cost, rounding=ROUND_HALF_EVEN),
        placement_json=_dumps(placement), created_at=now, updated_at=now,
        trial_number=trial_number)
    what = f"run {run.index}" if trial_number is None else f"trial {trial_number}"
    event = Event(
        job_id=job.id, at=now, kind=EventKind.QUEUED,
        message=f"submitted by sweep {sweep_name} ({what}): {placement['why']}",
        data_json=event_json({"sweep": sweep_name, "sweep_id": sweep_id, "index": run.index,
                          "params": run.params, "param_order": list(run.params),
                          "file": placement["job_file"],
                          "placement": placement["placement"]}))
    return job, event


__all__ = ["RunReport", "run_rows"]
