"""A job's status and the moves between statuses that orch makes (standard library only).

`JobStatus` is a `StrEnum`, so a member equals its stored text (`JobStatus.QUEUED ==
"queued"`) and rows written before the enum existed read the same. `TRANSITIONS` lists, for
each status, the statuses a job may move to from it; the store checks every status change
against it in one place (`store.jobs.enter`), so a bug that would, say, revive a succeeded job
fails loudly instead of writing it.

The table is what the code does (engine, recovery, `orch cancel`, sweeps' retry):
- a worker claims a queued job (→ provisioning) and drives it through the active states in
  pipeline order, though a takeover resumes at a later phase and an attempt may re-enter the
  state it is in (training → training after a resume), so any active state may follow any;
- from an active state (or while re-placing, queued with a live lease) the worker may stop
  the job: succeeded, failed, cancelled, interrupted (→ queued to resume), or queued;
- `orch cancel` cancels a queued, planned or interrupted job at once;
- `orch sweep --retry-failed` puts a failed job back in the queue;
- a sweep's early stopping prunes an active job (final: nothing leaves pruned).
Nothing enters `planned` (it is only ever a new dry-run row) and nothing leaves succeeded or
cancelled. Kept free of imports so the fast read-only commands can use it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Literal


class JobStatus(StrEnum):
    """Where a job stands in its lifecycle (the `job.status` column)."""

    QUEUED = "queued"
    PLANNED = "planned"
    PROVISIONING = "provisioning"
    CONNECTING = "connecting"
    PREPARING = "preparing"
    TRAINING = "training"
    MERGING = "merging"
    EVALUATING = "evaluating"
    RELEASING = "releasing"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"
    # A sweep's early stopping stopped the run at a rung (docs/sweeps-search.md): final, like
    # succeeded; it keeps what it cost and delivers nothing.
    PRUNED = "pruned"


S = JobStatus
# Every status in lifecycle order (docs/schema.md's job-states table).
JOB_STATUSES: tuple[JobStatus, ...] = tuple(JobStatus)
# States in which a worker is driving the job (and may hold a paid instance).
ACTIVE_STATUSES: frozenset[JobStatus] = frozenset({
    S.PROVISIONING, S.CONNECTING, S.PREPARING, S.TRAINING, S.MERGING, S.EVALUATING, S.RELEASING,
})
# States after which nothing more happens to the job.
FINAL_STATUSES: frozenset[JobStatus] = frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED,
                                                  S.PRUNED})
# States in which a job counts against a sweep's max_parallel and `orch jobs --status running`
# lists it: a worker drives it (an interrupted job is being re-placed by its worker).
RUNNING_STATUSES: frozenset[JobStatus] = ACTIVE_STATUSES | {S.INTERRUPTED}
# States in which `orch cancel` cancels a job at once: no worker drives it to a stop.
CANCELLED_AT_ONCE: frozenset[JobStatus] = frozenset({S.QUEUED, S.PLANNED, S.INTERRUPTED})

_ACTIVE = ACTIVE_STATUSES
# Where a worker may take a job it drives (also while re-placing it, queued or interrupted).
_STOPS = frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED, S.INTERRUPTED, S.QUEUED})

TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    S.PLANNED: frozenset({S.CANCELLED}),
    S.QUEUED: _ACTIVE | _STOPS,
    # An active job may be pruned: the worker that recorded the rung decision stops it in
    # training; a takeover that finds the decision recorded completes it in the state the
    # claim left the job in.
    **{s: _ACTIVE | _STOPS | {S.PRUNED} for s in _ACTIVE},
    S.INTERRUPTED: frozenset({S.QUEUED, S.FAILED, S.CANCELLED, S.INTERRUPTED}),
    S.FAILED: frozenset({S.QUEUED}),
    S.SUCCEEDED: frozenset(),
    S.CANCELLED: frozenset(),
    S.PRUNED: frozenset(),
}


def parse_status(word: str) -> JobStatus:
    """The status `word` names; ValueError saying which words there are otherwise."""
    try:
        return JobStatus(word)
    except ValueError:
        raise ValueError(f"unknown job status {str(word)!r}; use one of "
                         f"{', '.join(JOB_STATUSES)}") from None


def allowed(current: JobStatus, new: JobStatus) -> bool:
    """Whether a job in `current` may move to `new` (both known statuses)."""
    return JobStatus(new) in TRANSITIONS[JobStatus(current)]


def in_order(statuses: frozenset[JobStatus]) -> tuple[JobStatus, ...]:
    """`statuses` in lifecycle order (for SQL `IN` lists and messages: a set has no order)."""
    return tuple(s for s in JobStatus if s in statuses)


def why_not(current: JobStatus, new: JobStatus) -> str:
    """The message for a refused move from `current` to `new`."""
    targets = sorted(TRANSITIONS[JobStatus(current)])
    can = ", ".join(targets) if targets else "nothing (it is final)"
    return f"a {current} job cannot become {new}; from {current} it may become: {can}"


def lease_state(owner: str | None, expires_at: datetime | None, now: datetime
                ) -> Literal["held", "lapsed"] | None:
    """Whether a worker's claim on a job still holds: `held` until `expires_at`, then
    `lapsed` (its worker stopped renewing it: dead, hung or cut off; any worker or
    `orch reconcile` may take the job over); None when no worker holds it."""
    if owner is None or expires_at is None:
        return None
    if expires_at.tzinfo is None:  # the store's naive datetimes are UTC
        expires_at = expires_at.replace(tzinfo=UTC)
    return "held" if expires_at >= now else "lapsed"


__all__ = [
    "ACTIVE_STATUSES", "CANCELLED_AT_ONCE", "FINAL_STATUSES", "JOB_STATUSES", "RUNNING_STATUSES",
    "TRANSITIONS", "JobStatus", "allowed", "in_order", "lease_state", "parse_status", "why_not",
]
