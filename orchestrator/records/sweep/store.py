"""Sweeps in the database: submit a sweep's runs once, gate their start, report where they stand.

`submit_sweep` is idempotent, also under concurrency (two cron ticks overlapping): each run is
one job row whose `job.sweep_key` (sha256 of the sweep name and the run's resolved spec) has a
unique index, so a second insert of the same run fails with IntegrityError, which means "it is
there already" and is reported as the existing job's state.

`sweep_gate` says why a queued sweep job must wait now (`max_parallel` or `budget`); the
claim applies the same gate (`store.jobs.claim_next_gated`, re-exported here) in the same write
transaction as the claim so that two workers cannot both start the job that breaks a limit.

Money is integer micro-dollars throughout; dollars only for display.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import ROUND_HALF_EVEN
from typing import Any

from sqlalchemy import update
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from orchestrator.core import canonical
from orchestrator.core.jobstatus import JobStatus
from orchestrator.core.money import usd
from orchestrator.core.planning import Plan, make_plan
from orchestrator.core.scheduler import NoFit
from orchestrator.core.spec import JobSpec
from orchestrator.core.specidentity import spec_hash
from orchestrator.core.states import EventKind, SweepRunState
from orchestrator.core.sweepspec import LoadedSweep, SweepRun
from orchestrator.core.throughput import Measured, MeasuredKey
from orchestrator.records.columns import EventData, document_object
from orchestrator.records.readonly import measured_throughput
from orchestrator.records.store import (
    Event,
    Job,
    NotFoundError,
    Store,
    StoreError,
    Sweep,
    claim_next_gated,
    event_json,
    from_micros,
    to_micros,
    utcnow,
)
from orchestrator.records.store.jobs import check_move, sweep_usage
from orchestrator.records.sweep.propose import propose_trials
from orchestrator.records.sweep.runs import RunReport, named, run_rows
from orchestrator.records.sweep.trials import final_values
from orchestrator.records.sweep.trials import rung_rows as trial_rungs
from orchestrator.records.sweep.view import (
    RUNNING_STATUSES,
    build_status,
    first_event_data,
    gate,
    is_running,
    not_found,
    run_state,
    rung_rows,
)
from providers import retrying
from providers.base import Offer
from providers.dedicated.compute import RegisteredServer

# Run states reported by `orch sweep` (in summary order). `new` and `requeued` are what this
# call did; the others are what it found.
STATES: tuple[SweepRunState, ...] = tuple(SweepRunState)
R = SweepRunState
# SQLite's default limit on bound parameters is 999 (older builds); stay below it.
_IN_CHUNK = 500


# --- submit ----------------------------------------------------------------------------------


@dataclass
class SubmitReport:
    """The outcome of one `orch sweep FILE`."""

    name: str
    sweep_id: str | None  # None on a dry run of a sweep never submitted
    budget_micros: int | None
    max_parallel: int
    runs: list[RunReport] = field(default_factory=list)
    dry_run: bool = False
    duplicates: int = 0  # grid points dropped because another had the same resolved spec
    # Cost of the sweep's jobs that are not runs of this file (the grid was trimmed since).
    other_spent_micros: int = 0
    # What changed since the sweep was last submitted (an edited grid or base file).
    warnings: list[str] = field(default_factory=list)

    @property
    def counts(self) -> dict[SweepRunState, int]:
        """Runs per state, in STATES order (zero counts included)."""
        out = dict.fromkeys(STATES, 0)
        for r in self.runs:
            out[r.state] = out.get(r.state, 0) + 1
        return out

    @property
    def spent_micros(self) -> int:
        """What the sweep's jobs have cost so far."""
        return self.other_spent_micros + sum(r.cost_micros for r in self.runs)

    @property
    def estimated_micros(self) -> int:
        """Sum of the runs' cost estimates (runs that fit nowhere have none)."""
        return sum(r.est_cost_micros or 0 for r in self.runs)

    @property
    def over_budget(self) -> bool:
        """Whether the estimate of all runs exceeds the budget."""
        return self.budget_micros is not None and self.estimated_micros > self.budget_micros

    @property
    def held_back(self) -> int:
        """Runs the budget gate will keep queued if every run costs its estimate.

        Mirrors `sweep_gate`: finished runs count what they cost, running ones their cost so
        far plus their estimate; queued ones start in order while the total stays in budget
        (a run too dear is skipped and a cheaper later one may still start).
        """
        if self.budget_micros is None:
            return 0
        total = self.other_spent_micros
        waiting: list[RunReport] = []
        for r in self.runs:
            if r.state in (R.NEW, R.REQUEUED, R.QUEUED):
                total += r.cost_micros
                waiting.append(r)
            elif r.state == R.RUNNING:
                total += r.cost_micros + (r.est_cost_micros or 0)
            else:
                total += r.cost_micros
        held = 0
        for r in waiting:
            est = r.est_cost_micros or 0
            if total + est > self.budget_micros:
                held += 1
            else:
                total += est
        return held

    @property
    def idle(self) -> bool:
        """Nothing was submitted or requeued and nothing is wrong (a quiet cron tick)."""
        c = self.counts
        return not (c[R.NEW] or c[R.REQUEUED] or c[R.NOFIT])

    def summary(self) -> str:
        """One line: `NAME: N runs: 2 new, 3 succeeded, 1 running (budget $25.00, spent ...)`."""
        parts = [f"{n} {state}" for state, n in self.counts.items() if n]
        money = []
        if self.budget_micros is not None:
            money.append(f"budget {usd(from_micros(self.budget_micros))}")
        money.append(f"spent {usd(from_micros(self.spent_micros))}")
        money.append(f"estimated {usd(from_micros(self.estimated_micros))}")
        n = len(self.runs)
        line = (f"{self.name}: {n} run{'s' if n != 1 else ''}: {', '.join(parts)} "
                f"({', '.join(money)})")
        if self.over_budget:
            held = self.held_back
            line += (f"; over budget: {held} run{'s' if held != 1 else ''} held back"
                     if held else "; over budget by the estimate")
        if self.dry_run:
            line += " [dry run: nothing written]"
        return line

    def to_dict(self) -> dict[str, Any]:
        return {
            "sweep": self.name, "sweep_id": self.sweep_id, "dry_run": self.dry_run,
            "counts": self.counts, "idle": self.idle, "max_parallel": self.max_parallel,
            "budget": None if self.budget_micros is None
            else str(from_micros(self.budget_micros)),
            "spent": str(from_micros(self.spent_micros)),
            "estimated": str(from_micros(self.estimated_micros)),
            "over_budget": self.over_budget, "held_back": self.held_back,
            "duplicates": self.duplicates, "warnings": self.warnings,
            "runs": [r.to_dict() for r in self.runs],
        }


def _budget_micros(loaded: LoadedSweep) -> int | None:
    budget = loaded.spec.budget
    return None if budget is None else to_micros(budget, rounding=ROUND_HALF_EVEN)


def _find_sweep(session: Session, name: str) -> Sweep | None:
    return session.exec(select(Sweep).where(Sweep.name == name)).first()


def _sweep_named(session: Session, name: str) -> Sweep:
    """Sweep `name`; NotFoundError naming the known sweeps when there is none."""
    sweep = _find_sweep(session, name)
    if sweep is None:
        known = [s for s in session.exec(select(Sweep.name).order_by(col(Sweep.name)))]
        raise NotFoundError(str(not_found(name, known)))
    return sweep


def upsert_sweep(store: Store, name: str, spec_json: str, budget_micros: int | None) -> str:
    """The id of the sweep row `name`, created or updated to `spec_json` and the budget.

    Writes nothing when the row is already up to date (an idle cron tick stays read-only).
    """
    with store.session() as session:
        row = _find_sweep(session, name)
    if row is not None and row.spec_json == spec_json and row.budget_micros == budget_micros:
        return row.id

    def once() -> str:
        with store.transaction() as session:
            row = _find_sweep(session, name)
            if row is None:
                row = Sweep(name=name, spec_json=spec_json, budget_micros=budget_micros)
                session.add(row)
            else:
                row.spec_json = spec_json
                row.budget_micros = budget_micros
            session.flush()
            return row.id

    # IntegrityError: another process created the row between our read and our insert;
    # read again at once (it is there now).
    try:
        return retrying.policy(IntegrityError, attempts=3, wait=retrying.steps(0.0, 0.0))(once)
    except IntegrityError:
        raise StoreError(f"could not record sweep {name!r}: its row keeps changing; "
                         "try again") from None


def _jobs_by_key(store: Store, keys: list[str]) -> dict[str, Job]:
    out: dict[str, Job] = {}
    with store.session() as session:
        for i in range(0, len(keys), _IN_CHUNK):
            chunk = keys[i:i + _IN_CHUNK]
            for job in session.exec(select(Job).where(col(Job.sweep_key).in_(chunk))):
                assert job.sweep_key is not None
                out[job.sweep_key] = job
    return out


def _job_by_key(store: Store, key: str) -> Job | None:
    with store.session() as session:
        return session.exec(select(Job).where(Job.sweep_key == key)).first()


def _existing(run: SweepRun, job: Job, state: SweepRunState | None = None,
              message: str = "") -> RunReport:
    return RunReport(run.index, job.name, run.params, run.sweep_key, state or run_state(job),
                     job.id, job.status, job.est_cost_micros, job.cost_micros, message)


def requeue_failed(store: Store, job_id: str, why: str, spec: JobSpec | None = None) -> bool:
    """Put a failed job back in the queue (attempt + 1, reason cleared); False if not failed.

    With `spec` (the run as the sweep file says it now) the job runs with it when it is the
    same job (its hash is the recorded one): what the hash leaves out, such as
    `training.stop_on_nan`, `keep_warm` or `notify`, can only change this way, since an
    edit of those keeps the run's key and so its failed job.
    One conditional UPDATE, so of two processes retrying at once only one requeues.
    """
    now = utcnow()
    check_move(job_id, JobStatus.FAILED, JobStatus.QUEUED)
    with store.transaction() as session:
        job = session.get(Job, job_id)
        if job is None or job.status != JobStatus.FAILED:
            return False
        previous = job.failure_reason
        # The run as the sweep file says it now, when it is the same job.
        fresh = (spec.model_dump_json() if spec is not None
                 and spec_hash(spec) == job.spec_hash else None)
        result = session.execute(
            update(Job).where(col(Job.id) == job_id, col(Job.status) == JobStatus.FAILED)
            .values(status=JobStatus.QUEUED, attempt=job.attempt + 1, failure_reason=None,
                    finished_at=None, lease_owner=None, lease_expires_at=None,
                    cancel_requested_at=None, updated_at=now,
                    **({"spec_json": fresh} if fresh is not None else {})))
        if not getattr(result, "rowcount", 0):
            return False
        session.add(Event(job_id=job_id, at=now, kind=EventKind.REQUEUED,
                          message=f"{why} (was failed: {previous or 'no reason recorded'})",
                          data_json=event_json({"status": JobStatus.QUEUED,
                                            "previous_reason": previous})))
        return True


def _insert_run(store: Store, sweep_id: str, sweep_name: str, run: SweepRun, plan: Plan,
                name: str) -> Job:
    """Insert the run's queued job (named `name`) and its first event; IntegrityError if its
    key exists."""
    job, event = run_rows(sweep_id, sweep_name, run, plan, name)
    with store.transaction() as session:
        session.add(job)
        session.flush()  # IntegrityError here when another process inserted the run first
        session.add(event)
    return job


def _measured(store: Store) -> Mapping[MeasuredKey, Measured]:
    try:
        return measured_throughput(store.engine.url.render_as_string(hide_password=False))
    except Exception:  # an estimate aid only: never a reason not to submit
        return {}


def submit_sweep(store: Store, loaded: LoadedSweep, *, retry_failed: bool = False,
                 dry_run: bool = False, listed: Sequence[Offer] = ()) -> SubmitReport:
    """Record the sweep and queue each of its runs not yet recorded; report every run.

    With `retry_failed`, failed runs are queued again (cancelled ones are left alone: a
    cancel is a decision). A run no offer can take is reported as `nofit`, not raised. With
    `dry_run` nothing is written; `new` / `requeued` then say what would happen. `listed`:
    the price lists of the providers the runs name (`planning.make_plan`).
    """
    spec = loaded.spec
    budget = _budget_micros(loaded)
    with store.session() as session:
        row = _find_sweep(session, spec.name)
    before = _Recorded.of(store, row)
    if dry_run:
        sweep_id = None if row is None else row.id
    else:
        sweep_id = upsert_sweep(store, spec.name, loaded.spec_json, budget)
    report = SubmitReport(name=spec.name, sweep_id=sweep_id, budget_micros=budget,
                          max_parallel=spec.max_parallel, dry_run=dry_run,
                          duplicates=loaded.duplicates)
    existing = _jobs_by_key(store, [r.sweep_key for r in loaded.runs])
    servers: list[RegisteredServer] | None = None
    measured: Mapping[MeasuredKey, Measured] | None = None
    for run in loaded.runs:
        job = existing.get(run.sweep_key)
        if job is not None:
            if retry_failed and job.status == JobStatus.FAILED:
                if dry_run:
                    report.runs.append(_existing(run, job, R.REQUEUED, job.failure_reason or ""))
                    continue
                if requeue_failed(store, job.id, "requeued by `orch sweep --retry-failed`",
                                  named(run.job.spec, job.name)):
                    again = store.get_job(job.id)
                    report.runs.append(_existing(run, again, R.REQUEUED,
                                                 job.failure_reason or ""))
                    continue
                job = store.get_job(job.id)  # another process requeued it first
            report.runs.append(_existing(run, job))
            continue
        if servers is None:
            servers, measured = store.registered(), _measured(store)
        try:
            plan = make_plan(run.job, servers, measured, listed=listed)
        except NoFit as exc:
            report.runs.append(RunReport(run.index, run.job.spec.name, run.params,
                                         run.sweep_key, R.NOFIT, message=str(exc)))
            continue
        if dry_run:
            report.runs.append(RunReport(
                run.index, run.job.spec.name, run.params, run.sweep_key, R.NEW,
                est_cost_micros=to_micros(plan.chosen.est_cost, rounding=ROUND_HALF_EVEN)))
            continue
        assert sweep_id is not None
        try:
            created = _insert_run(store, sweep_id, spec.name, run, plan, before.name_for(run))
        except IntegrityError:
            found = _job_by_key(store, run.sweep_key)
            if found is None:
                raise  # not the sweep_key: a real integrity problem
            report.runs.append(_existing(run, found))
            continue
        report.runs.append(_existing(run, created, R.NEW))
    if loaded.sampler == "tpe":  # its runs are proposed now, from the recorded ones
        report.runs += propose_trials(store, loaded, sweep_id, servers=store.registered(),
                                      measured=_measured(store), listed=listed,
                                      dry_run=dry_run)
    keys = {r.sweep_key for r in report.runs}
    report.other_spent_micros = sum(j.cost_micros for j in before.jobs if j.sweep_key not in keys)
    report.warnings = before.changes(loaded) if loaded.runs else []
    return report


@dataclass
class _Recorded:
    """What the database held of a sweep before this submit: its file and its jobs."""

    spec_json: str | None
    jobs: list[Job]
    given: set[str] = field(default_factory=set)  # names this submit gave to new runs

    @classmethod
    def of(cls, store: Store, row: Sweep | None) -> _Recorded:
        if row is None:
            return cls(None, [])
        with store.session() as session:
            jobs = list(session.exec(select(Job).where(Job.sweep_id == row.id)
                                     .order_by(col(Job.created_at), col(Job.id))))
        return cls(row.spec_json, jobs)

    def name_for(self, run: SweepRun) -> str:
        """The run's name `<sweep>-<index>`, or, when an earlier grid gave that name to
        another run, the next number no job of the sweep has: names stay unique."""
        name = run.job.spec.name
        taken = {j.name for j in self.jobs if j.sweep_key != run.sweep_key} | self.given
        if name not in taken:
            return name
        prefix = name.rsplit("-", 1)[0]
        numbers = [int(n.rsplit("-", 1)[1]) for n in taken | {name}
                   if n.startswith(prefix + "-") and n.rsplit("-", 1)[1].isdigit()]
        fresh = f"{prefix}-{max(numbers) + 1:03d}"
        self.given.add(fresh)
        return fresh

    def changes(self, loaded: LoadedSweep) -> list[str]:
        """Warnings: runs recorded earlier that the file no longer has, and what changed."""
        keys = {r.sweep_key for r in loaded.runs}
        stale = [j for j in self.jobs if j.sweep_key not in keys]
        if not stale:
            return []
        what = _diff(document_object(self.spec_json), document_object(loaded.spec_json),
                     ("grid", "random"))
        if what:
            what = f"changed in the sweep file: {what}"
        else:  # the sweep file is the same: the base job file changed
            old = document_object(stale[-1].spec_json)
            what = _diff(old, loaded.runs[0].job.spec.model_dump(mode="json"),
                         ("name", *loaded.runs[0].params), base=True)
            what = f"changed in the base job file: {what or 'its resolved values'}"
        spent = sum(j.cost_micros for j in stale)
        n = len(stale)
        return [f"{n} run{'s' if n != 1 else ''} recorded earlier {'are' if n != 1 else 'is'} "
                f"not in the sweep any more ({what}): "
                f"{', '.join(j.name for j in stale[:8])}{' ...' if n > 8 else ''}; "
                f"they stay in this sweep's spent ({usd(from_micros(spent))}) and best"]


def _flat(value: Any) -> dict[str, Any]:
    """`value`'s leaves by dotted key (`training.learning_rate`)."""
    return {".".join(path): leaf for path, leaf in canonical.leaves(value).items()}


def _diff(old: dict[str, Any], new: dict[str, Any], keys: tuple[str, ...],
          base: bool = False) -> str:
    """`key: old -> new` for the dotted keys that differ: inside `keys` (a sweep file's grid)
    or, with `base`, outside them (a base job file, whose grid keys vary by design)."""
    a, b = _flat(old), _flat(new)
    inside = [k for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)
              and any(k == p or k.startswith(p + ".") for p in keys) != base]
    return "; ".join(f"{k}: {a.get(k, '-')} -> {b.get(k, '-')}" for k in inside[:6])


# --- the gate --------------------------------------------------------------------------------


def sweep_gate(source: Session | Store, job: Job) -> str | None:
    """Why this sweep job must wait now: "max_parallel", "budget", or None (it may start).

    max_parallel: the sweep's running jobs (other than this one) number max_parallel or more.
    budget: spent (cost_micros of all the sweep's jobs) + the running jobs' estimates + this
    job's estimate exceeds the sweep's budget. Jobs outside a sweep are never gated.
    """
    if job.sweep_id is None:
        return None
    now = utcnow()
    if isinstance(source, Store):
        with source.session() as session:
            return gate(sweep_usage(session, job.sweep_id, now), job)
    return gate(sweep_usage(source, job.sweep_id, now), job)


# --- status ----------------------------------------------------------------------------------


def sweep_status(store: Store, name: str) -> dict[str, Any]:
    """A sweep's runs (params, state, metric, cost) and its best run by the objective.

    Through the store (any database); on SQLite the CLI reads `sweep.view.sweep_status`
    with sqlite3 instead, and both build the same dict (`sweep.view.build_status`).
    NotFoundError when no sweep has that name.
    """
    now = utcnow()
    with store.session() as session:
        sweep = _sweep_named(session, name)
        jobs = list(session.exec(select(Job).where(Job.sweep_id == sweep.id)
                                 .order_by(col(Job.created_at), col(Job.id))))
        ids = [j.id for j in jobs]
        first: dict[str, EventData] = {}
        for i in range(0, len(ids), _IN_CHUNK):
            query = (select(Event.job_id, Event.data_json)
                     .where(col(Event.job_id).in_(ids[i:i + _IN_CHUNK]))
                     .where(col(Event.kind) == EventKind.QUEUED).order_by(col(Event.id)))
            first.update(first_event_data(session.exec(query)))
        objective = sweep.spec().objective
        metrics = final_values(session, ids, objective.metric) if objective else {}
        rungs = rung_rows((r.job_id, r.resource, r.rung, r.step, r.metric, r.value,
                           r.decision, r.cutoff)
                          for rows in trial_rungs(session, ids).values() for r in rows)
        return build_status(sweep_id=sweep.id, sweep_name=sweep.name,
                            created_at=sweep.created_at, spec_json=sweep.spec_json,
                            budget_micros=sweep.budget_micros, jobs=jobs, first=first,
                            metrics=metrics, now=now, rungs=rungs)


def cancel_sweep(store: Store, name: str) -> dict[str, Any]:
    """Cancel sweep `name`'s queued and running runs at once (`Store.cancel_sweep_runs`).

    Running runs whose worker is gone (lease expired) are cancelled too, as `orch cancel`
    does; their instances are left to `orch reconcile`. NotFoundError for an unknown name.
    """
    with store.session() as session:
        sweep = _sweep_named(session, name)
    cancelled, flagged = store.cancel_sweep_runs(sweep.id, f"sweep {name} cancelled")
    orphans = [j for j in flagged if store.cancel_orphan(j, f"sweep {name} cancelled; "
                                                          "no worker held the job")]
    return {"sweep": name, "sweep_id": sweep.id, "cancelled": cancelled + orphans,
            "stopping": [j for j in flagged if j not in orphans]}


def list_sweeps(store: Store) -> list[dict[str, Any]]:
    """Every sweep's status (as `sweep_status`), by name."""
    with store.session() as session:
        names = list(session.exec(select(Sweep.name).order_by(col(Sweep.name))))
    return [sweep_status(store, n) for n in names]


__all__ = [
    "RUNNING_STATUSES", "STATES", "RunReport", "SubmitReport", "cancel_sweep", "claim_next_gated",
    "is_running", "list_sweeps", "requeue_failed", "run_state", "submit_sweep",
    "sweep_gate", "sweep_status", "upsert_sweep",
]
