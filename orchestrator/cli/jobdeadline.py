"""`orch show`'s deadline line for a job with `resources.deadline_hours` (issue 41).

What a user of the deadline contract asks first: when the job is due, whether it finished in
time (and by how much), and what the contract did: when it took on-demand to the end and by
which rule (docs/deadline.md names them), and whether it said early that the deadline would
be missed. The job's clock starts when it was submitted (`created_at`), as the engine's
policy counts it. Everything comes from the job row and its `deadline.*` events.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from orchestrator.cli.term import human_duration, human_time, iso_utc
from orchestrator.core.jobstatus import FINAL_STATUSES, JobStatus
from orchestrator.core.states import EventKind

if TYPE_CHECKING:
    from orchestrator.records.store.tables import Event, Job

_KINDS = (EventKind.DEADLINE_DECISION, EventKind.DEADLINE_MOVE)
# The rules' names as the text says them (core/deadline.py `Rule`; docs/deadline.md).
_RULES = {"safety_net": "the Safety Net", "drift": "drift", "attempts": "the attempt limit",
          "spot_not_worth": "spot not worth its cost", "cannot_meet": "the fastest way",
          "uniform_progress": "uniform progress"}


def summary(job: Job, events: Sequence[Event], now: datetime) -> dict[str, Any] | None:
    """The deadline as `orch show --json` gives it (None: the job has none).

    `outcome` is the verdict: `met` (succeeded by the deadline); `missed` (succeeded after
    it, failed at any time: nothing was delivered by then, or still running, or stopped,
    past it); `stopped` (cancelled or pruned before it: a decision, not a miss); `open`
    (running or queued, the deadline ahead); `planned` (a dry run: it never runs).
    `margin_s` is a measurement, whatever the verdict: the deadline less the job's end, or
    less now while it runs (negative: after the deadline)."""
    hours = job.spec().resources.deadline_hours
    if hours is None:
        return None
    due = job.created_at + timedelta(hours=hours)  # the store's times are aware UTC
    status = JobStatus(job.status)
    final = status in FINAL_STATUSES
    end = (job.finished_at or job.updated_at) if final else now
    margin = (due - end).total_seconds()
    if status is JobStatus.PLANNED:
        outcome = "planned"
    elif margin < 0 or status is JobStatus.FAILED:
        outcome = "missed"
    elif status is JobStatus.SUCCEEDED:
        outcome = "met"
    else:
        outcome = "stopped" if final else "open"
    taken = next((e for e in events if e.kind in _KINDS
                  and e.data().choice == "on_demand"), None)
    warned = next((e for e in events if e.kind == EventKind.DEADLINE_WILL_MISS), None)
    return {
        "hours": hours, "due_at": iso_utc(due), "outcome": outcome,
        "margin_s": None if outcome == "planned" else round(margin, 1),
        "decisions": sum(1 for e in events if e.kind in _KINDS),
        "on_demand_from": None if taken is None else {
            "at": iso_utc(taken.at), "rule": taken.data().rule, "kind": taken.kind},
        "will_miss": None if warned is None else {
            "at": iso_utc(warned.at), "miss_by_s": warned.data().miss_by_s},
    }


def line(s: dict[str, Any], job_id: str, status: str) -> str:
    """`  deadline: due 2026-12-07 20:57:44 UTC (4m after submit): met, 41s to spare;
    on-demand from 2026-12-07 20:55:18 UTC to the end (the Safety Net); 25 decision(s)
    (`orch logs JOB`)`."""
    text = (f"  deadline: due {human_time(_parse(s['due_at']))} "
            f"({_span(s['hours'] * 3600)} after submit): ")
    margin = s["margin_s"]
    outcome = s["outcome"]
    if outcome == "planned":
        text += "not run: the job was only planned (`orch submit --dry-run`)"
    elif outcome == "met":
        text += f"met, {_span(margin)} to spare"
    elif outcome == "open":
        text += f"{_span(margin)} left"
    elif outcome == "stopped":
        text += f"not judged: the job was {status} {_span(margin)} before it"
    elif margin < 0:
        late = _span(math.ceil(-margin))  # never "missed by 0s"
        text += f"missed by {late}" + {"failed": " (the job failed)",
                                       "cancelled": " (then cancelled)",
                                       "pruned": " (then pruned)"}.get(status, "")
    else:
        text += f"missed: the job failed {_span(margin)} before it"
    if (warned := s["will_miss"]) is not None and warned["miss_by_s"] is not None:
        text += (f"; at {human_time(_parse(warned['at']))} it expected to miss it by "
                 f"{_span(warned['miss_by_s'])} whatever it chose")
    if (taken := s["on_demand_from"]) is not None:
        rule = _RULES.get(str(taken["rule"]), str(taken["rule"] or "the policy"))
        text += f"; on-demand from {human_time(_parse(taken['at']))} to the end ({rule})"
    if s["decisions"]:
        text += f"; {s['decisions']} decision(s) and move(s) (`orch logs {job_id}`)"
    return text


def _span(seconds: float) -> str:
    return human_duration(max(0, int(seconds)))


def _parse(text: str) -> datetime:
    return datetime.fromisoformat(text)  # `Z` included (Python 3.11)
