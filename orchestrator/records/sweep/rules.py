"""A sweep's rules, shared by the claim path and the status views (no SQLAlchemy).

Run states, the `max_parallel` / budget gate, and the objective's best run. The store's claim
(`store.jobs.claim_next_gated`) and `orch sweep show` (`sweep.view`) both decide with these
functions, so what the status says is waiting is what the claim holds back. Imports nothing
heavier than `jobstatus` and the JSON columns' models: the claim path is in the store, the
views must start without SQLAlchemy.

Money is integer micro-dollars.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Union

# RUNNING_STATUSES: the states in which a job counts against max_parallel (re-exported).
from orchestrator.core.jobstatus import RUNNING_STATUSES as RUNNING_STATUSES
from orchestrator.core.jobstatus import JobStatus
from orchestrator.core.states import SweepRunState
from orchestrator.records.columns import SweepSpecRecord

if TYPE_CHECKING:
    from orchestrator.core.sweepspec import Objective
    from orchestrator.records.store.tables import Job

DEFAULT_MAX_PARALLEL = 4  # SweepSpec's default, for rows whose spec_json lacks it


@dataclass
class JobRow:
    """The job columns the sweep rules and status read, as a plain row (read with sqlite3)."""

    id: str
    name: str
    status: JobStatus
    lease_owner: str | None
    lease_expires_at: datetime | None
    cost_micros: int
    est_cost_micros: int | None
    failure_reason: str | None
    provider: str | None
    gpu: str | None
    gpu_count: int | None
    finished_at: datetime | None = None


# A store `Job` (the claim path, other databases) or a `JobRow` (sqlite3): both have the
# columns above. The store's type is named for the type checker only; at run time this module
# stays free of SQLAlchemy.
JobLike = Union[JobRow, "Job"]


# --- states and the gate -----------------------------------------------------------------


def live_lease(job: JobLike, now: datetime) -> bool:
    """Whether a worker holds the job's lease now."""
    return job.lease_owner is not None and (job.lease_expires_at is None
                                            or job.lease_expires_at > now)


def is_running(job: JobLike, now: datetime | None = None) -> bool:
    """Whether a worker drives the job now (a queued job still leased is being re-placed)."""
    if job.status in RUNNING_STATUSES:
        return True
    return job.status == JobStatus.QUEUED and live_lease(job, now or datetime.now(UTC))


def run_state(job: JobLike, now: datetime | None = None) -> SweepRunState:
    """The sweep view of a job's status, in the jobs' own words (issue 36 §6: `done` here
    was `succeeded` in `orch jobs`): succeeded, running (every state a worker drives, as
    `orch jobs --status running`), queued, failed, cancelled, pruned."""
    if job.status == JobStatus.SUCCEEDED:
        return SweepRunState.SUCCEEDED
    if is_running(job, now):
        return SweepRunState.RUNNING
    if job.status in (JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.PRUNED):
        return SweepRunState(job.status.value)
    return SweepRunState.QUEUED  # queued (planned: never written by sweeps)


@dataclass
class Usage:
    """One sweep's limits and what its jobs use of them."""

    max_parallel: int
    budget_micros: int | None
    running: set[str]  # ids of the jobs a worker drives
    spent_micros: int  # sum of cost_micros over all its jobs
    running_est_micros: dict[str, int]  # est_cost_micros of the running jobs


def max_parallel_of(spec: SweepSpecRecord) -> int:
    """The sweep's max_parallel (the default when the stored spec lacks or garbles it)."""
    return max(1, spec.max_parallel or DEFAULT_MAX_PARALLEL)


def usage_of(spec: SweepSpecRecord, budget_micros: int | None, jobs: Iterable[JobLike],
             now: datetime) -> Usage:
    """What the sweep's `jobs` use of its limits at `now`."""
    running: set[str] = set()
    est: dict[str, int] = {}
    spent = 0
    for job in jobs:
        spent += job.cost_micros or 0
        if is_running(job, now):
            running.add(job.id)
            est[job.id] = job.est_cost_micros or 0
    return Usage(max_parallel_of(spec), budget_micros, running, spent, est)


def gate(usage: Usage | None, job: JobLike) -> str | None:
    """Why `job` must wait: "max_parallel", "budget", or None (see sweep.store.sweep_gate)."""
    if usage is None:
        return None
    others = usage.running - {job.id}
    if len(others) >= usage.max_parallel:
        return "max_parallel"
    if usage.budget_micros is not None:
        committed = (usage.spent_micros
                     + sum(v for k, v in usage.running_est_micros.items() if k != job.id)
                     + (job.est_cost_micros or 0))
        if committed > usage.budget_micros:
            return "budget"
    return None


# --- objective and best run ------------------------------------------------------------------


def best_of(rows: Iterable[tuple[str, float | None]], goal: str) -> str | None:
    """The run id with the best metric for `goal` (ties: the earliest); None if none."""
    best: tuple[str, float] | None = None
    for run_id, value in rows:
        if value is None or math.isnan(value):
            continue  # not finished, or the eval did not produce the metric
        if best is None or (value > best[1] if goal == "max" else value < best[1]):
            best = (run_id, value)
    return None if best is None else best[0]


def best_run(rows: Iterable[tuple[str, float | None]], objective: Objective) -> str | None:
    """The run id with the best metric for `objective` (ties: the earliest); None if none."""
    return best_of(rows, objective.goal)
