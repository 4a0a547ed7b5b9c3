"""`orch show`'s deadline line for a job with `resources.deadline_hours` (issue 41).

What a user of the deadline contract asks first: when the job is due, whether it finished in
time (and by how much), and what the contract did: when it took on-demand to the end and by
which rule (docs/deadline.md names them), and whether it said early that the deadline would
be missed. The job's clock starts when it was submitted (`created_at`), as the engine's
policy counts it. Everything comes from the job row and its `deadline.*` events.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from orchestrator.cli.term import human_duration, human_time, iso_utc
from orchestrator.core.jobstatus import FINAL_STATUSES, JobStatus
from orchestrator.core.states import EventKind

if TYPE_CHECKING:
    from orchestrator.records.store.tables import Event, Job

_KINDS = (EventKind.DEADLINE_DECISION, EventKind.DEADLINE_MOVE)


def summary(job: Job, events: Sequence[Event], now: datetime) -> dict[str, Any] | None:
    """The deadline as `orch show --json` gives it (None: the job has none).

    `outcome`: `met` or `missed` once the job succeeded; `missed` when it failed (no model
    by the deadline, whenever it failed); `stopped` when it was cancelled or pruned (a
    decision, not a miss); `open` while it runs before the deadline, `missed` once it runs
    past it. `margin_s`: the deadline less the job's end (negative: after it), or the time
    left while it runs."""
    hours = job.spec().resources.deadline_hours
    if hours is None:
        return None
    due = _utc(job.created_at) + timedelta(hours=hours)
    end = None if job.finished_at is None else _utc(job.finished_at)
    margin: float | None
    if job.status == JobStatus.SUCCEEDED and end is not None:
        margin = (due - end).total_seconds()
        outcome = "met" if margin >= 0 else "missed"
    elif JobStatus(job.status) in FINAL_STATUSES:
        margin = None if end is None else (due - end).total_seconds()
        outcome = "missed" if job.status == JobStatus.FAILED else "stopped"
    else:
        margin = (due - _utc(now)).total_seconds()
        outcome = "open" if margin >= 0 else "missed"
    taken = next((e for e in events if e.kind in _KINDS
                  and e.data().choice == "on_demand"), None)
    warned = next((e for e in events if e.kind == EventKind.DEADLINE_WILL_MISS), None)
    return {
        "hours": hours, "due_at": iso_utc(due), "outcome": outcome,
        "margin_s": None if margin is None else round(margin, 1),
        "decisions": sum(1 for e in events if e.kind == EventKind.DEADLINE_DECISION),
        "on_demand_from": None if taken is None else {
            "at": iso_utc(taken.at), "rule": taken.data().rule, "kind": taken.kind},
        "will_miss": None if warned is None else {
            "at": iso_utc(warned.at), "miss_by_s": warned.data().miss_by_s},
    }


def line(s: dict[str, Any], job_id: str, status: str) -> str:
    """`  deadline: due 2026-12-08 09:00 UTC (8 h after submit): met, 42m to spare; on-demand
    from 08:10 UTC (safety net); 12 decisions (`orch logs JOB`)`."""
    text = (f"  deadline: due {human_time(_parse(s['due_at']))} ({_span(s['hours'] * 3600)} after "
            "submit): ")
    margin = s["margin_s"]
    outcome = s["outcome"]
    if outcome == "met":
        text += f"met, {_span(margin)} to spare"
    elif outcome == "open":
        text += f"{_span(margin)} left"
    elif outcome == "stopped":
        text += f"not judged: the job was {status} before it finished"
    elif margin is not None and margin < 0:
        text += f"missed by {_span(-margin)}" + (" (the job failed)" if status == "failed"
                                                 else "")
    else:  # failed in time: no model by the deadline all the same
        text += "missed: the job failed"
    if (warned := s["will_miss"]) is not None and warned["miss_by_s"] is not None:
        text += (f"; said at {human_time(_parse(warned['at']))} that it would miss it by "
                 f"{_span(warned['miss_by_s'])} whatever happened")
    if (taken := s["on_demand_from"]) is not None:
        rule = str(taken["rule"] or "the policy").replace("_", " ")
        text += f"; on-demand from {human_time(_parse(taken['at']))} to the end ({rule})"
    if s["decisions"]:
        text += f"; {s['decisions']} decision(s) (`orch logs {job_id}`)"
    return text


def _span(seconds: float) -> str:
    return human_duration(max(0, round(seconds)))


def _parse(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _utc(value: datetime) -> datetime:
    # The store hands back naive datetimes on some dialects; they are UTC by convention.
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
