"""A search sweep's trials as orch records them: the job rows, their metrics, their rung checks.

orch's records are the truth the search reads (docs/sweeps-search.md, "Records"): a trial is
a job row of the sweep (its number `job.trial_number`, or the run index of its `queued`
event for grid and random sweeps), its params are that event's, its objective the final
metric, and its checks at the rungs of early stopping are `sweep_rung` rows. A rung is
decided once: the rows of one decision are inserted in one transaction keyed by (job,
resource), so a second insert (another worker, a replay after kill -9) fails and the stored
decision stands (`record_rungs` returns it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from orchestrator.core import divergence
from orchestrator.core.jobstatus import ACTIVE_STATUSES, JobStatus
from orchestrator.core.search import (
    Decision,
    Prune,
    RungRecord,
    TrialRecord,
    TrialState,
    rung_step,
    rung_value,
)
from orchestrator.core.states import EventKind, RungDecision
from orchestrator.records.columns import EventData, ObjectiveRecord, PruneRecord, event_data
from orchestrator.records.store import (
    Event,
    Job,
    Metric,
    Store,
    SweepRung,
    nan_if_null,
    real_or_null,
    utcnow,
)

# SQLite's default limit on bound parameters is 999 (older builds); stay below it.
_IN_CHUNK = 500


@dataclass(frozen=True)
class Trial:
    """One trial: its job row, its record as the search sees it, its rung rows."""

    job: Job
    record: TrialRecord
    rungs: tuple[SweepRung, ...]
    objective: float | None  # the final objective metric, when the run reported it


def trial_state(job: Job, value: float | None) -> TrialState:
    """The search's view of a job's status (queued: pending; active or interrupted:
    running; succeeded with its objective: complete; pruned, or failed as diverged: pruned;
    anything else: failed)."""
    status = JobStatus(job.status)
    if status in (JobStatus.QUEUED, JobStatus.PLANNED):
        return TrialState.PENDING
    if status in ACTIVE_STATUSES or status == JobStatus.INTERRUPTED:
        return TrialState.RUNNING
    if status == JobStatus.PRUNED:
        return TrialState.PRUNED
    if status == JobStatus.FAILED and (job.failure_reason or "").startswith(
            divergence.REASON_PREFIX):
        # Stopped as diverged (a sweep without early_stop): evidence against its params, as
        # a pruned trial with no rung value is to the search; a failure is not evidence.
        return TrialState.PRUNED
    if status == JobStatus.SUCCEEDED and value is not None and math.isfinite(value):
        return TrialState.COMPLETE
    return TrialState.FAILED


def _chunks(ids: Sequence[str]) -> list[Sequence[str]]:
    return [ids[i:i + _IN_CHUNK] for i in range(0, len(ids), _IN_CHUNK)]


def final_values(session: Session, ids: Sequence[str], name: str) -> dict[str, float]:
    """Each job's final (step NULL) value of `name`, the newest recorded; NaN for NULL."""
    out: dict[str, float] = {}
    for chunk in _chunks(ids):
        query = (select(Metric).where(col(Metric.job_id).in_(chunk), Metric.name == name,
                                      col(Metric.step).is_(None)).order_by(col(Metric.id)))
        for m in session.exec(query):
            out[m.job_id] = nan_if_null(m.value)  # NaN (NULL): the trial failed to score
    return out


def rung_rows(session: Session, ids: Sequence[str]) -> dict[str, list[SweepRung]]:
    """Each job's rung rows, by resource."""
    out: dict[str, list[SweepRung]] = {}
    for chunk in _chunks(ids):
        query = (select(SweepRung).where(col(SweepRung.job_id).in_(chunk))
                 .order_by(col(SweepRung.job_id), col(SweepRung.resource)))
        for row in session.exec(query):
            out.setdefault(row.job_id, []).append(row)
    return out


def trials_in(session: Session, sweep_id: str,
              objective: ObjectiveRecord | None) -> list[Trial]:
    """The sweep's trials in trial-number order, read in the caller's session."""
    jobs = list(session.exec(select(Job).where(Job.sweep_id == sweep_id)
                             .order_by(col(Job.created_at), col(Job.id))))
    ids = [j.id for j in jobs]
    first: dict[str, EventData] = {}  # each job's first `queued` event: its index, params
    for chunk in _chunks(ids):
        query = (select(Event.job_id, Event.data_json).where(col(Event.job_id).in_(chunk))
                 .where(col(Event.kind) == EventKind.QUEUED).order_by(col(Event.id)))
        for job_id, text in session.exec(query):
            if job_id not in first:
                first[job_id] = event_data(text)
    values = final_values(session, ids, objective.metric) if objective else {}
    rungs = rung_rows(session, ids)
    out: list[Trial] = []
    for position, job in enumerate(jobs):
        data = first.get(job.id)
        number = job.trial_number if job.trial_number is not None else (
            data.index if data is not None and data.index is not None else position)
        value = values.get(job.id)
        mine = tuple(rungs.get(job.id, ()))
        record = TrialRecord(number, data.ordered_params() if data else {},
                             trial_state(job, value), value,
                             tuple(RungRecord(r.rung, r.resource, nan_if_null(r.value))
                                   for r in mine))
        out.append(Trial(job, record, mine, value))
    return sorted(out, key=lambda t: t.record.number)


def trials_of(store: Store, sweep_id: str, objective: ObjectiveRecord | None) -> list[Trial]:
    """The sweep's trials (`trials_in` in a session of its own)."""
    with store.session() as session:
        return trials_in(session, sweep_id, objective)


def curve(store: Store, job_id: str, metric: str) -> list[tuple[int, float]]:
    """The (step, value) reports of `metric` a running job made, by step."""
    with store.session() as session:
        query = (select(Metric.step, Metric.value)
                 .where(Metric.job_id == job_id, Metric.name == metric,
                        col(Metric.step).is_not(None)).order_by(col(Metric.step)))
        # NULL is a report that was not a number (a diverged run's `nan`): the search reads
        # it as NaN, which no rung ranks above a number.
        return [(int(s), nan_if_null(v)) for s, v in session.exec(query) if s is not None]


def stored_prune(store: Store, job_id: str) -> SweepRung | None:
    """The rung at which the job's early stopping decided to prune it, if one did."""
    with store.session() as session:
        query = select(SweepRung).where(SweepRung.job_id == job_id,
                                        SweepRung.decision == RungDecision.PRUNE)
        return session.exec(query).first()


def record_rungs(store: Store, job_id: str, decision: Decision, metric: str,
                 points: Sequence[tuple[int, float]], total_steps: int) -> SweepRung | None:
    """Record a decision's rung checks once; the prune that stands (this one, or one another
    process recorded first), or None when the job goes on."""
    rows: dict[int, SweepRung] = {}
    now = utcnow()
    for r in decision.recorded:
        found = rung_value(points, rung_step(r.resource, total_steps))
        step = found[0] if found is not None else rung_step(r.resource, total_steps)
        rows[r.resource] = SweepRung(job_id=job_id, resource=r.resource, rung=r.rung, step=step,
                                     metric=metric, value=real_or_null(r.value),
                                     decision=RungDecision.CONTINUE, decided_at=now)
    if isinstance(decision, Prune):
        rows[decision.resource] = SweepRung(
            job_id=job_id, resource=decision.resource, rung=decision.rung, step=decision.step,
            metric=decision.metric, value=real_or_null(decision.value),
            cutoff=None if decision.cutoff is None else real_or_null(decision.cutoff),
            decision=RungDecision.PRUNE, decided_at=now)
    if rows:
        try:
            with store.transaction() as session:
                session.add_all(list(rows.values()))
        except IntegrityError:
            pass  # decided already (another worker, or this one before a kill -9)
    return stored_prune(store, job_id)


def prune_record(row: SweepRung) -> PruneRecord:
    """The `pruned` state event's data from the rung row that decided it."""
    return PruneRecord(rung=row.rung, resource=row.resource, step=row.step, metric=row.metric,
                       value=nan_if_null(row.value), cutoff=row.cutoff)


__all__ = ["Trial", "curve", "final_values", "prune_record", "record_rungs", "rung_rows",
           "stored_prune", "trial_state", "trials_in", "trials_of"]
