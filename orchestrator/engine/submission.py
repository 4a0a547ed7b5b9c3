"""Record a job for running: plan it, then insert the queued (or planned) row and its event.

Shared by `orch submit` and sweeps, so every job row carries the same placement blob: the
ranked placements (for `orch show`) and the job file's absolute path, which the engine
resolves the recorded spec against when a worker picks the job up.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from orchestrator.core.datafiles import DatasetSize
from orchestrator.core.hubsize import HubDatasetRef
from orchestrator.core.jobstatus import JobStatus
from orchestrator.core.planning import Plan, make_plan
from orchestrator.core.spec import LoadedJob
from orchestrator.core.states import EventKind
from orchestrator.engine.wiring import price_lists
from orchestrator.records.store import Job, Store

if TYPE_CHECKING:  # at run time only its methods are called: `orch submit` starts faster
    from orchestrator.engine.resumefrom import ResumePoint


def hub_size_record(ref: HubDatasetRef, size: DatasetSize) -> dict[str, object]:
    """One Hub dataset's published size as `placement_json.hub_sizes` keeps it."""
    return {"repo": ref.repo, "revision": ref.revision, "subset": ref.subset,
            "split": ref.split, "format": ref.format, "tokens": size.tokens,
            "rows": size.rows, "source": size.source}


def record_job(store: Store, loaded: LoadedJob, *, status: JobStatus = JobStatus.QUEUED,
               plan: Plan | None = None, message: str | None = None,
               sweep_id: str | None = None, sweep_key: str | None = None,
               data: Mapping[str, object] | None = None,
               resume: ResumePoint | None = None) -> tuple[Job, Plan]:
    """Plan `loaded` (scheduler.NoFit if nothing fits) and insert it; (job row, plan).
    `resume`: the checkpoint another job kept that it starts from (`loaded` held to it:
    `ResumePoint.apply`), kept in its placement for the worker."""
    plan = plan or make_plan(loaded, store.registered(),
                             listed=price_lists(loaded.spec.resources.providers))
    placement = plan.to_dict(alternatives=10_000)
    placement["job_file"] = str(loaded.path.resolve())
    if loaded.hub_sizes:
        placement["hub_sizes"] = [hub_size_record(ref, size) for ref, size in loaded.hub_sizes]
    message = message or f"{status}: {placement['why']}"
    if resume is not None:
        placement["resume_from"] = resume.record()
        message = f"{message}; {resume.describe()}"
    p = plan.chosen
    job = store.create_job(
        name=loaded.spec.name, status=status, method=loaded.spec.method,
        base_model=loaded.spec.base_model.repo, spec_json=loaded.spec.model_dump_json(),
        spec_hash=loaded.spec_hash, placement=placement, provider=p.offer.provider,
        gpu=p.offer.gpu, gpu_count=p.offer.gpu_count, billing=p.offer.billing.value,
        interruptible=p.offer.interruptible, est_hours=p.est_hours, est_cost=p.est_cost,
        event_kind=EventKind(status.value),
        event_message=message,
        event_data={"file": str(loaded.path), "placement": placement["placement"],
                    **({"resume_from": resume.record()} if resume is not None else {}),
                    **(data or {})},
        sweep_id=sweep_id, sweep_key=sweep_key)
    return job, plan
