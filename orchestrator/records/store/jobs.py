"""The store's jobs: create, claim (with the sweep gate), lease, move through statuses, cancel.

Every status change goes through `check_move` (the table in `orchestrator.core.jobstatus`): the
ORM path through `enter`, the conditional UPDATEs (claim, the one-statement claim of the
head of the queue, retry of a failed job) by checking their fixed move first. Claims are one
write transaction each, so two workers cannot both take a job or both start the sweep job
that breaks a limit.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Literal, Unpack

from sqlalchemy import String, column, or_, text, update
from sqlmodel import Session, col, select

from orchestrator.core.deadline import Choice
from orchestrator.core.jobstatus import (
    ACTIVE_STATUSES,
    CANCELLED_AT_ONCE,
    FINAL_STATUSES,
    RUNNING_STATUSES,
    JobStatus,
    allowed,
    in_order,
    why_not,
)
from orchestrator.core.states import EventKind
from orchestrator.records.store.database import StoreBase, db_now
from orchestrator.records.store.notanumber import event_json
from orchestrator.records.store.tables import (
    BILLINGS,
    CancelRequested,
    Event,
    IllegalTransition,
    InvalidValueError,
    Job,
    JobUpdate,
    LeaseLost,
    NotFoundError,
    Sweep,
    check_status,
    dumps,
    to_micros,
    utcnow,
)
from orchestrator.records.sweep.rules import Usage, gate, usage_of

S = JobStatus

# How many queued jobs one claim looks at past gated ones (one row at a time).
CLAIM_SCAN = 500


# --- the one place a status changes ----------------------------------------------------------


def check_move(job_id: str, current: JobStatus, new: JobStatus) -> None:
    """IllegalTransition unless a job in `current` may become `new` (jobstatus.TRANSITIONS)."""
    check_status(new)
    if not allowed(current, new):
        raise IllegalTransition(f"job {job_id}: {why_not(current, new)}")


def enter(job: Job, status: JobStatus, now: datetime, fields: JobUpdate | None = None) -> None:
    """Move `job` to `status` (checked), set `fields`, and close it out if `status` is final."""
    check_move(job.id, job.status, status)
    job.status = JobStatus(status)
    job.updated_at = now
    for key, value in (fields or {}).items():
        setattr(job, key, value)
    if status in FINAL_STATUSES:
        job.finished_at = now
        job.lease_owner = None
        job.lease_expires_at = None


def _state(session: Session, job: Job, status: JobStatus, now: datetime, message: str,
           data: Mapping[str, object] | None = None, fields: JobUpdate | None = None) -> None:
    """`enter` plus the job's `state` event, in the caller's transaction."""
    enter(job, status, now, fields)
    session.add(Event(job_id=job.id, at=now, kind=EventKind.STATE, message=message,
                      data_json=event_json({"status": job.status, **(data or {})})))


# --- claims ----------------------------------------------------------------------------------


def claim_in(session: Session, job_id: str, owner: str, lease_s: float,
             now: datetime) -> Job | None:
    """Within the caller's write transaction: queued → provisioning for `owner`, with its
    `state` event; None when the job is not claimable (taken, cancelled, or still leased)."""
    check_move(job_id, JobStatus.QUEUED, JobStatus.PROVISIONING)
    result = session.execute(
        update(Job)
        .where(col(Job.id) == job_id, col(Job.status) == S.QUEUED,
               col(Job.cancel_requested_at).is_(None),
               # A job briefly queued while its worker re-places it is still that
               # worker's: only an unowned (or lapsed) job can be claimed.
               or_(col(Job.lease_owner).is_(None), col(Job.lease_expires_at) < now),
               # Requeued with a backoff after a provider outage: not yet.
               or_(col(Job.not_before).is_(None), col(Job.not_before) <= now))
        .values(status=S.PROVISIONING, lease_owner=owner,
                lease_expires_at=now + timedelta(seconds=lease_s), updated_at=now))
    if not getattr(result, "rowcount", 0):
        return None
    job = session.get(Job, job_id)
    assert job is not None
    session.refresh(job)  # the UPDATE bypassed the session's copy
    if job.started_at is None:
        job.started_at = now
    session.add(Event(job_id=job_id, at=now, kind=EventKind.STATE,
                      message=f"provisioning (claimed by {owner})",
                      data_json=dumps({"status": S.PROVISIONING, "owner": owner,
                                        "attempt": job.attempt})))
    return job


def sweep_usage(session: Session, sweep_id: str, now: datetime) -> Usage | None:
    """The sweep's limits and what its jobs use of them now (None: no such sweep)."""
    sweep = session.get(Sweep, sweep_id)
    if sweep is None:
        return None
    jobs = session.exec(select(Job).where(Job.sweep_id == sweep_id))
    return usage_of(sweep.spec(), sweep.budget_micros, jobs, now)


def _next_claimable(session: Session, now: datetime, gated_sweeps: set[str],
                    gated_jobs: set[str]) -> Job | None:
    """The oldest queued job that nobody holds and that may start now, locked for this
    transaction; rows another worker is claiming are skipped, not waited for."""
    query = select(Job).where(
        col(Job.status) == S.QUEUED, col(Job.cancel_requested_at).is_(None),
        # A job briefly queued while its worker re-places it is still that worker's.
        or_(col(Job.lease_owner).is_(None), col(Job.lease_expires_at) < now),
        # Requeued with a backoff after a provider outage: not yet.
        or_(col(Job.not_before).is_(None), col(Job.not_before) <= now))
    if gated_sweeps:
        query = query.where(or_(col(Job.sweep_id).is_(None),
                                col(Job.sweep_id).not_in(sorted(gated_sweeps))))
    if gated_jobs:
        query = query.where(col(Job.id).not_in(sorted(gated_jobs)))
    # One row at a time, FOR UPDATE SKIP LOCKED on PostgreSQL (SQLite, where BEGIN IMMEDIATE
    # already serialises writers, ignores it): workers no longer queue up behind the lock of
    # the oldest row, and a scan never locks rows it does not claim.
    query = (query.order_by(col(Job.created_at), col(Job.id)).limit(1)
             .with_for_update(skip_locked=True))
    return session.exec(query).first()


# The head of the queue claimed in ONE statement on PostgreSQL (issue 23 §11): the oldest
# claimable job, locked FOR UPDATE SKIP LOCKED, moved queued -> provisioning with its `state`
# event and returned, in one round trip instead of the ~9 statements of the ORM path below (a
# claim's CPU, client and server, was mostly those statements' overhead). Only a job outside
# any sweep is claimed here: a sweep job at the head returns its sweep id and no job, and the
# caller takes the gated path, so max_parallel and the budget are judged exactly as before.
# The times are the server's clock (`db_now`) written in UTCDateTime's text form
# (`YYYY-MM-DDTHH:MM:SS.ffffffZ`, fixed width, so text comparison is time order); the event's
# data is `dumps({"attempt", "owner", "status"})` spelled out (sorted keys, no spaces), the
# owner JSON-quoted by Python. The conditions are `_next_claimable`'s and `claim_in`'s.
_TIME_TEXT = """to_char(({}) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')"""
_JOB_COLUMNS = list(Job.__table__.columns)  # type: ignore[attr-defined]
_CLAIM_HEAD = text(f"""
WITH clock AS (SELECT clock_timestamp() AS ts),
t AS (SELECT {_TIME_TEXT.format("ts")} AS now,
             {_TIME_TEXT.format("ts + make_interval(secs => CAST(:lease_s AS float8))")} AS until
      FROM clock),
head AS (
    SELECT job.id, job.sweep_id FROM job, t
    WHERE job.status = '{S.QUEUED}' AND job.cancel_requested_at IS NULL
      AND (job.lease_owner IS NULL OR job.lease_expires_at < t.now)
      AND (job.not_before IS NULL OR job.not_before <= t.now)
    ORDER BY job.created_at, job.id
    LIMIT 1
    FOR UPDATE OF job SKIP LOCKED),
claimed AS (
    UPDATE job SET status = '{S.PROVISIONING}', lease_owner = :owner, lease_expires_at = t.until,
                   updated_at = t.now, started_at = COALESCE(job.started_at, t.now)
    FROM head, t
    -- The row is locked by `head`; the status is checked again all the same.
    WHERE job.id = head.id AND head.sweep_id IS NULL AND job.status = '{S.QUEUED}'
    RETURNING job.*),
logged AS (
    INSERT INTO event (job_id, at, kind, message, data_json)
    SELECT id, updated_at, '{EventKind.STATE}', :message,
           '{{"attempt":' || attempt || ',"owner":' || :owner_json
           || ',"status":"{S.PROVISIONING}"}}'
    FROM claimed)
SELECT {", ".join(f"claimed.{c.name}" for c in _JOB_COLUMNS)}, head.id AS head_id
FROM head LEFT JOIN claimed ON claimed.id = head.id
""").columns(*_JOB_COLUMNS, column("head_id", String))


def _claim_head(store: StoreBase, owner: str, lease_s: float) -> tuple[Job | None, bool]:
    """PostgreSQL: claim the head of the queue in one statement (`_CLAIM_HEAD`).

    (the job claimed, None) and whether there was a claimable head at all: (None, True) is a
    sweep job at the head, left for the gated path.
    """
    check_move("(the oldest queued job)", JobStatus.QUEUED, JobStatus.PROVISIONING)
    with store.statement() as session:
        row = session.execute(
            select(Job, column("head_id", String)).from_statement(_CLAIM_HEAD),
            {"owner": owner, "owner_json": json.dumps(owner), "lease_s": lease_s,
             "message": f"provisioning (claimed by {owner})"}).first()
    if row is None:
        return None, False
    return row[0], True


def claim_next_gated(store: StoreBase, owner: str, lease_s: float) -> Job | None:
    """Claim the oldest queued job that may start now (sweep gates), or None.

    A sweep job held back by the sweep's gate (`sweep.rules.gate`) is skipped and the next
    one tried (its whole sweep when the sweep runs `max_parallel` jobs). The gate and the
    claim are one write transaction (BEGIN IMMEDIATE on SQLite; the sweep row is locked FOR
    UPDATE elsewhere), so two workers cannot both start the job that breaks max_parallel or
    the budget. A queued job whose lease is still live is being re-placed by its worker after
    an interruption and is not claimed. Lease times are the database's (`db_now`).

    On PostgreSQL a job outside any sweep at the head of the queue is claimed in one
    statement (`_claim_head`); SQLite, where BEGIN IMMEDIATE serialises claims anyway, and a
    sweep job at the head take the path below.
    """
    if store.engine.dialect.name == "postgresql":
        job, found = _claim_head(store, owner, lease_s)
        if job is not None or not found:
            return job
    with store.transaction() as session:
        now = db_now(session)
        usage: dict[str, Usage | None] = {}
        gated_sweeps: set[str] = set()
        gated_jobs: set[str] = set()
        for _ in range(CLAIM_SCAN):
            job = _next_claimable(session, now, gated_sweeps, gated_jobs)
            if job is None:
                return None
            if job.sweep_id is not None:
                if job.sweep_id not in usage:
                    # Serialise claims per sweep on databases with row locks (no-op on SQLite).
                    session.exec(select(Sweep.id).where(Sweep.id == job.sweep_id)
                                 .with_for_update()).first()
                    usage[job.sweep_id] = sweep_usage(session, job.sweep_id, now)
                why = gate(usage[job.sweep_id], job)
                if why == "max_parallel":
                    gated_sweeps.add(job.sweep_id)
                    continue
                if why is not None:
                    gated_jobs.add(job.id)
                    continue
            claimed = claim_in(session, job.id, owner, lease_s, now)
            if claimed is not None:
                return claimed
            gated_jobs.add(job.id)  # changed under us (cancelled): try the next one
    return None


# --- the store's job methods -----------------------------------------------------------------


class JobsMixin(StoreBase):
    """Jobs and their lifecycle (part of `store.Store`)."""

    def create_job(
        self,
        *,
        name: str,
        status: JobStatus,
        method: str,
        base_model: str,
        spec_json: str,
        spec_hash: str,
        placement: Mapping[str, object] | None,
        provider: str | None,
        gpu: str | None,
        gpu_count: int | None,
        billing: str | None,
        interruptible: bool | None,
        est_hours: float | None,
        est_cost: Decimal | None,
        event_kind: str,
        event_message: str,
        event_data: Mapping[str, object] | None,
        sweep_id: str | None = None,
        sweep_key: str | None = None,
    ) -> Job:
        """Insert a job and its first event in one transaction (both or neither)."""
        status = check_status(status)
        if billing is not None and billing not in BILLINGS:
            raise InvalidValueError(
                f"billing must be one of {', '.join(BILLINGS)} (got {billing!r})"
            )
        if len(spec_hash) != 64 or any(c not in "0123456789abcdef" for c in spec_hash):
            raise InvalidValueError("spec_hash must be a sha256 hex digest (64 lowercase hex)")
        try:
            json.loads(spec_json)
        except ValueError as exc:
            raise InvalidValueError(f"spec_json is not valid JSON: {exc}") from exc
        # An estimate: rounding to the nearest micro-dollar loses nothing that matters.
        est_micros = None if est_cost is None else to_micros(est_cost, rounding=ROUND_HALF_EVEN)
        now = utcnow()
        job = Job(
            name=name,
            status=status,
            method=method,
            base_model=base_model,
            spec_json=spec_json,
            spec_hash=spec_hash,
            sweep_id=sweep_id,
            sweep_key=sweep_key,
            provider=provider,
            gpu=gpu,
            gpu_count=gpu_count,
            billing=billing,
            interruptible=interruptible,
            est_hours=est_hours,
            est_cost_micros=est_micros,
            placement_json=None if placement is None else dumps(placement),
            created_at=now,
            updated_at=now,
        )
        with self.transaction() as session:
            session.add(job)
            # The job row goes in first (the event's foreign key needs it); anything that
            # fails after this point rolls the job back with the event.
            session.flush()
            session.add(
                Event(
                    job_id=job.id,
                    at=now,
                    kind=event_kind,
                    message=event_message,
                    data_json=None if event_data is None else event_json(event_data),
                )
            )
        return job

    def find_job(self, job_id: str) -> Job | None:
        """The job, or None when there is no such job."""
        with self.session() as session:
            return session.get(Job, job_id)

    def get_job(self, job_id: str) -> Job:
        """The job with this id; NotFoundError if there is none."""
        with self.session() as session:
            job = session.get(Job, job_id)
        if job is None:
            raise NotFoundError(f"job {job_id!r} not found; list recent jobs with `orch jobs`")
        return job

    def list_jobs(self, limit: int = 50,
                  status: JobStatus | Literal["running"] | None = None) -> list[Job]:
        """The newest `limit` jobs, optionally only those in `status` (`running`: every
        state a worker drives, as the running column of `orch sweeps` counts)."""
        query = select(Job)
        if status == "running":
            query = query.where(col(Job.status).in_(in_order(RUNNING_STATUSES)))
        elif status is not None:
            query = query.where(col(Job.status) == check_status(status))
        query = query.order_by(col(Job.created_at).desc(), col(Job.id).desc()).limit(limit)
        with self.session() as session:
            return list(session.exec(query))

    def expired_leases(self, now: datetime | None = None) -> list[Job]:
        """Jobs in a running state whose worker's lease ran out (the worker died), judged
        by the database's clock unless `now` is given."""
        with self.session() as session:
            now = now or db_now(session)
            query = select(Job).where(col(Job.status).in_(in_order(ACTIVE_STATUSES)),
                                      col(Job.lease_expires_at).is_not(None),
                                      col(Job.lease_expires_at) < now)
            return list(session.exec(query))

    def requeue_lapsed(self, note: str = "") -> list[Job]:
        """Requeue every job whose worker's lease lapsed (the worker died, or stopped on a
        locked or full database before it could record the end); the jobs requeued."""
        done = []
        for job in self.expired_leases():
            if self.requeue(job.id, f"worker {job.lease_owner or '?'} lost its lease while "
                                    f"the job was {job.status}{note}"):
                done.append(job)
        return done

    def requeue(self, job_id: str, reason: str) -> bool:
        """Put a job whose worker died back in the queue (to resume); False if it moved on."""
        with self.transaction() as session:
            job = session.get(Job, job_id)
            if job is None or job.status not in ACTIVE_STATUSES:
                return False
            enter(job, S.QUEUED, utcnow(), {"attempt": job.attempt + 1, "lease_owner": None,
                                            "lease_expires_at": None})
            session.add(Event(job_id=job_id, at=job.updated_at, kind=EventKind.REQUEUED,
                              message=reason))
            return True

    def claim_job(self, job_id: str, owner: str, lease_s: float) -> Job | None:
        """Take a queued job for `owner` (one conditional UPDATE); None if someone else has it."""
        with self.transaction() as session:
            return claim_in(session, job_id, owner, lease_s, db_now(session))

    def claim_next(self, owner: str, lease_s: float) -> Job | None:
        """Claim the oldest queued job that may start now, or None.

        Sweep jobs wait while their sweep runs `max_parallel` jobs or the next one would
        exceed its budget (records/sweep/rules.py); those are skipped, not blocking others.
        """
        return claim_next_gated(self, owner, lease_s)

    def renew_lease(self, job_id: str, owner: str, lease_s: float) -> Job | None:
        """Extend `owner`'s lease; None when the job is no longer `owner`'s."""
        with self.transaction() as session:
            now = db_now(session)
            result = session.execute(
                update(Job)
                .where(col(Job.id) == job_id, col(Job.lease_owner) == owner)
                .values(lease_expires_at=now + timedelta(seconds=lease_s)))
            if not getattr(result, "rowcount", 0):
                return None
            return session.get(Job, job_id)

    def set_status(self, job_id: str, owner: str, status: JobStatus, message: str = "",
                   data: Mapping[str, object] | None = None,
                   **fields: Unpack[JobUpdate]) -> Job:
        """Move `owner`'s job to `status` (plus `fields`, the columns a status change may
        carry: `tables.JobUpdate`) with a `state` event, atomically.

        LeaseLost when the job is no longer `owner`'s: a worker that lost its lease must
        not overwrite what the new owner does.
        Success is refused (CancelRequested) once `orch cancel` asked the job to stop: the
        row is read locked (PostgreSQL; SQLite's write lock serialises anyway), so a cancel
        either commits first and is seen here, or comes after the job succeeded.
        """
        status = check_status(status)
        now = utcnow()
        with self.transaction() as session:
            job = session.get(Job, job_id, with_for_update=status == JobStatus.SUCCEEDED)
            if job is None or job.lease_owner != owner:
                raise LeaseLost(f"job {job_id} is no longer driven by {owner}")
            if status == JobStatus.SUCCEEDED and job.cancel_requested_at is not None:
                raise CancelRequested(f"job {job_id}: cancel requested before it succeeded")
            _state(session, job, status, now, message or status, data, fields)
            return job

    def cancel_requested(self, job_id: str) -> bool:
        """Whether `orch cancel` (or `orch sweep cancel`) asked job `job_id` to stop."""
        with self.session() as session:
            at = session.exec(select(Job.cancel_requested_at).where(col(Job.id) == job_id)).first()
        return at is not None

    def request_cancel(self, job_id: str) -> Job:
        """Ask for a job to stop: a queued job is cancelled at once, a running one flagged."""
        with self.transaction() as session:
            # The time once the write lock is held: stamped before a wait for it, the flag
            # said "asked at T" while the worker, still writing, started steps after T.
            now = utcnow()
            # Locked: a worker's move to succeeded (set_status) either sees this flag or
            # commits first, and then the job is final here.
            job = session.get(Job, job_id, with_for_update=True)
            if job is None:
                raise NotFoundError(f"job {job_id!r} not found; list recent jobs with `orch jobs`")
            if job.status in FINAL_STATUSES:
                return job
            if job.cancel_requested_at is None:
                job.cancel_requested_at = now
            if job.status in CANCELLED_AT_ONCE:
                _state(session, job, JobStatus.CANCELLED, now,
                       "cancelled before it started" if job.started_at is None
                       else f"cancelled while {job.status} to resume")
            else:
                session.add(Event(job_id=job_id, at=now, kind=EventKind.CANCEL_REQUESTED,
                                  message="cancel requested; the worker tears down"))
            job.updated_at = now
            return job

    def cancel_sweep_runs(self, sweep_id: str, reason: str) -> tuple[list[str], list[str]]:
        """Cancel every unfinished run of a sweep in ONE write transaction: (cancelled now,
        flagged for their workers to stop). The first statement flags every unfinished run
        with one UPDATE, which takes their row locks, so no worker can claim one of them
        from then on (a claim requires `cancel_requested_at IS NULL`): cancelling run by run
        raced with workers that claimed, and billed, the next run meanwhile."""
        unfinished = ((col(Job.sweep_id) == sweep_id)
                      & col(Job.status).not_in(in_order(FINAL_STATUSES)))
        with self.transaction() as session:
            now = utcnow()  # once the write lock is held (see request_cancel)
            session.execute(update(Job).where(unfinished, col(Job.cancel_requested_at).is_(None))
                            .values(cancel_requested_at=now))
            cancelled, flagged = [], []
            for job in session.exec(select(Job).where(unfinished).order_by(col(Job.id))):
                if job.status in CANCELLED_AT_ONCE:
                    _state(session, job, JobStatus.CANCELLED, now, reason)
                    cancelled.append(job.id)
                else:
                    session.add(Event(job_id=job.id, at=now, kind=EventKind.CANCEL_REQUESTED,
                                      message=f"{reason}; the worker tears down"))
                    job.updated_at = now
                    flagged.append(job.id)
            return cancelled, flagged

    def cancel_orphan(self, job_id: str, reason: str) -> bool:
        """Cancel a job nobody drives (lease expired or none); False if a worker holds it."""
        now = utcnow()
        with self.transaction() as session:
            job = session.get(Job, job_id)
            if job is None or job.status in FINAL_STATUSES:
                return False
            if job.lease_expires_at is not None and job.lease_expires_at > db_now(session):
                return False
            _state(session, job, JobStatus.CANCELLED, now, reason)
            return True

    # --- columns that change without a status change (each says what it sets) ---------------

    def _change(self, job_id: str, fields: JobUpdate) -> None:
        with self.transaction() as session:
            job = session.get(Job, job_id)
            if job is None:
                raise NotFoundError(f"job {job_id!r} not found")
            for key, value in fields.items():
                setattr(job, key, value)
            job.updated_at = utcnow()

    def set_outage_since(self, job_id: str, since: datetime) -> None:
        """The job's providers became unavailable at `since` (the outage limit runs from it)."""
        self._change(job_id, {"outage_since": since})

    def mark_placed(self, job_id: str) -> None:
        """The job holds a machine again: its outage (if any) is over, it is not deferred,
        and no phase is done on the new machine yet."""
        self._change(job_id, {"outage_since": None, "not_before": None, "phase_done": None})

    def record_deadline(self, job_id: str, owner: str, choice: Choice | None, kind: EventKind,
                        message: str, data: Mapping[str, object]) -> None:
        """The deadline policy's standing `choice` and its event, in one transaction (a move
        is committed before the machine it leaves is released); LeaseLost if not `owner`'s."""
        with self.transaction() as session:
            job = session.get(Job, job_id)
            if job is None or job.lease_owner != owner:
                raise LeaseLost(f"job {job_id} is no longer driven by {owner}")
            now = utcnow()
            job.deadline_choice = choice
            job.updated_at = now
            session.add(Event(job_id=job_id, at=now, kind=kind, message=message,
                              data_json=event_json(data)))

    def mark_phase_done(self, job_id: str, phase: str, *,
                        artifacts_dir: str | None = None) -> None:
        """`phase` of the pipeline is durable (a takeover resumes after it); with
        `artifacts_dir`, where the job's artifacts were copied back."""
        fields: JobUpdate = {"phase_done": phase}
        if artifacts_dir is not None:
            fields["artifacts_dir"] = artifacts_dir
        self._change(job_id, fields)
