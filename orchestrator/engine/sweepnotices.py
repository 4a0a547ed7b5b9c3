"""A sweep's notifications, sent by the run whose end decides them (`notifications.told`):
`sweep.finished` (with the best run by the sweep's objective) when its last run ends, and
`job.budget_reached` (scope sweep) when every run still queued waits on the sweep's budget.

Each is sent once per sweep: before sending, the sweep's runs' events are searched for it
(two workers ending the last two runs at the same moment could both send it; a receiver
dedupes on nothing then, which is rare and harmless: the second says the same).
"""

from __future__ import annotations

from typing import Any

from sqlmodel import col, select

from orchestrator.core import notifyspec
from orchestrator.core.notifyspec import NotifyTarget
from orchestrator.core.states import EventKind, SweepRunState
from orchestrator.records.store import Event, Job, Store, Sweep

_OPEN = (SweepRunState.RUNNING, SweepRunState.QUEUED)


def sweep_row(store: Store, sweep_id: str) -> Sweep | None:
    """The sweep `sweep_id` (None: not found)."""
    with store.session() as session:
        return session.get(Sweep, sweep_id)


def sweep_targets(store: Store, job: Job) -> list[NotifyTarget]:
    """The `notify:` targets of the sweep `job` belongs to (none outside a sweep)."""
    if job.sweep_id is None:
        return []
    sweep = sweep_row(store, job.sweep_id)
    return [] if sweep is None else notifyspec.targets_in(sweep.spec_json)


def _sent(store: Store, sweep_id: str, kind: EventKind) -> bool:
    """Whether any run of the sweep recorded `kind` already."""
    with store.session() as session:
        query = (select(Event.id).join(Job, col(Job.id) == col(Event.job_id))
                 .where(Job.sweep_id == sweep_id, Event.kind == kind).limit(1))
        return session.exec(query).first() is not None


def due(store: Store, job: Job) -> list[tuple[EventKind, dict[str, Any]]]:
    """The sweep events `job`'s end makes due (see the module docstring)."""
    from orchestrator.records.sweep.store import sweep_status

    if job.sweep_id is None:
        return []
    sweep = sweep_row(store, job.sweep_id)
    if sweep is None:
        return []
    status = sweep_status(store, sweep.name)
    runs = status["runs"]
    base = {"sweep_id": sweep.id, "name": sweep.name}
    found: list[tuple[EventKind, dict[str, Any]]] = []
    if not any(r["state"] in _OPEN for r in runs):
        if not _sent(store, sweep.id, EventKind.SWEEP_FINISHED):
            objective = status["objective"] or {}
            best = status["best"]
            found.append((EventKind.SWEEP_FINISHED, {
                **base, "runs": len(runs), "counts": status["counts"],
                "metric": objective.get("metric"), "spent_usd": status["spent"],
                "best": None if best is None else {
                    "job_id": best["job_id"], "name": best["name"], "value": best["metric"],
                    "params": best["params"]}}))
        return found
    queued = [r for r in runs if r["state"] == SweepRunState.QUEUED]
    running = [r for r in runs if r["state"] == SweepRunState.RUNNING]
    if queued and not running and all(r["waiting"] == "budget" for r in queued) \
            and not _sent(store, sweep.id, EventKind.JOB_BUDGET_REACHED):
        found.append((EventKind.JOB_BUDGET_REACHED, {
            **base, "scope": "sweep", "spent_usd": status["spent"],
            "budget_usd": status["budget"], "waiting": len(queued)}))
    return found
