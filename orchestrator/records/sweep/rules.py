"""A sweep's rules, shared by the claim path and the status views (standard library only).

Run states, the `max_parallel` / budget gate, and the objective's best run. The store's claim
(`store.jobs.claim_next_gated`) and `orch sweep show` (`sweep.view`) both decide with these
functions, so what the status says is waiting is what the claim holds back. Imports nothing
heavier than `jobstatus`: the claim path is in the store, the views must start fast.

Money is integer micro-dollars.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Union

from orchestrator.core.jobstatus import ACTIVE_STATUSES

if TYPE_CHECKING:
    from orchestrator.core.sweepspec import Objective
    from orchestrator.records.store.tables import Job

# States in which a job counts against max_parallel: a worker drives it (an interrupted job is
# being re-placed by its worker).
RUNNING_STATUSES: tuple[str, ...] = (*ACTIVE_STATUSES, "interrupted")
DEFAULT_MAX_PARALLEL = 4  # SweepSpec's default, for rows whose spec_json lacks it
GOALS: tuple[str, ...] = ("max", "min")


@dataclass
class JobRow:
    """The job columns the sweep rules and status read, as a plain row (read with sqlite3)."""

    id: str
    name: str
    status: str
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
    return job.status == "queued" and live_lease(job, now or datetime.now(UTC))


def run_state(job: JobLike, now: datetime | None = None) -> str:
    """The sweep view of a job's status, in the jobs' own words (issue 36 §6: `done` here
    was `succeeded` in `orch jobs`): succeeded, running (every state a worker drives, as
    `orch jobs --status running`), queued, failed, cancelled."""
    if job.status == "succeeded":
        return "succeeded"
    if is_running(job, now):
        return "running"
    return job.status  # queued, failed, cancelled (planned: never written by sweeps)


@dataclass
class Usage:
    """One sweep's limits and what its jobs use of them."""

    max_parallel: int
    budget_micros: int | None
    running: set[str]  # ids of the jobs a worker drives
    spent_micros: int  # sum of cost_micros over all its jobs
    running_est_micros: dict[str, int]  # est_cost_micros of the running jobs


def max_parallel_of(spec_json: str) -> int:
    """The sweep's max_parallel (the default when the stored spec lacks or garbles it)."""
    try:
        spec = json.loads(spec_json)
        max_parallel = int(spec.get("max_parallel") or DEFAULT_MAX_PARALLEL)
    except (ValueError, TypeError, AttributeError):
        max_parallel = DEFAULT_MAX_PARALLEL
    return max(1, max_parallel)


def usage_of(spec_json: str, budget_micros: int | None, jobs: Iterable[JobLike],
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
    return Usage(max_parallel_of(spec_json), budget_micros, running, spent, est)


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


def objective_of(spec: Mapping[str, Any]) -> dict[str, str] | None:
    """The stored spec's objective as `{"metric", "goal"}`, or None (absent or invalid).

    The same acceptance as `sweeps.Objective` (strict, no other keys, a non-empty metric,
    goal max or min, max by default) over the stored JSON, without building the model.
    """
    raw = spec.get("objective")
    if not raw:
        return None
    if not isinstance(raw, dict) or set(raw) - {"metric", "goal"}:
        return None
    metric, goal = raw.get("metric"), raw.get("goal", "max")
    if type(metric) is not str or not metric or type(goal) is not str or goal not in GOALS:
        return None
    return {"metric": metric, "goal": goal}


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
