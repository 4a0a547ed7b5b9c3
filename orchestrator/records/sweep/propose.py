"""`orch sweep FILE` for a `tpe` sweep: propose the next trials from the recorded ones.

Under the sweep row's lock (one write transaction that locks the row first: BEGIN IMMEDIATE
on SQLite, SELECT ... FOR UPDATE on PostgreSQL), read the sweep's trials, propose as many as
there are free slots (`max_parallel` less the trials queued or running, at most the trials
left) with `core.search.propose`, and insert each as a queued job with its trial number.
A proposal is a function of the records, the seed and the trial number, and
`(sweep_id, trial_number)` and `sweep_key` are unique: two overlapping ticks never start a
trial twice (the second insert fails: the trial is there already), and a kill -9 before the
commit leaves nothing, so the next tick proposes the same trials again (none is lost).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN

from sqlalchemy.exc import IntegrityError
from sqlmodel import select

from orchestrator.core import search
from orchestrator.core.planning import make_plan
from orchestrator.core.scheduler import NoFit
from orchestrator.core.settings import settings
from orchestrator.core.spec import SpecError
from orchestrator.core.states import SweepRunState
from orchestrator.core.sweepspec import LoadedSweep, run_for
from orchestrator.core.throughput import Measured, MeasuredKey
from orchestrator.records.columns import ObjectiveRecord
from orchestrator.records.store import Event, Job, Store, Sweep, to_micros
from orchestrator.records.sweep.rules import run_state
from orchestrator.records.sweep.runs import RunReport, run_rows
from orchestrator.records.sweep.trials import Trial, trials_in, trials_of
from providers.base import Offer
from providers.dedicated.compute import RegisteredServer

R = SweepRunState


def _failpoint(name: str) -> None:
    """Die like `kill -9` here when ORCH_FAILPOINT names this point (crash tests only)."""
    if settings().failpoint == name:
        os.kill(os.getpid(), signal.SIGKILL)


def _objective(loaded: LoadedSweep) -> ObjectiveRecord | None:
    o = loaded.spec.objective
    return None if o is None else ObjectiveRecord(metric=o.metric, goal=o.goal)


def free_slots(loaded: LoadedSweep, known: Sequence[Trial]) -> int:
    """How many trials a tick may propose now: free `max_parallel` slots, trials left."""
    spec = loaded.spec
    assert spec.search is not None and spec.search.trials is not None
    busy = sum(1 for t in known if t.record.state in (search.TrialState.PENDING,
                                                      search.TrialState.RUNNING))
    return max(0, min(spec.max_parallel - busy, spec.search.trials - len(known)))


def _proposals(loaded: LoadedSweep, known: Sequence[Trial]) -> list[dict[str, object]]:
    spec = loaded.spec
    assert spec.search is not None and spec.search.trials is not None
    assert spec.objective is not None  # load_sweep refuses tpe without one
    return search.propose(loaded.space, [t.record for t in known], seed=spec.search.seed,
                          n=free_slots(loaded, known), goal=spec.objective.goal,
                          total=spec.search.trials,
                          prune_goal=spec.early_stop.goal if spec.early_stop else None)


def _report(t: Trial, state: SweepRunState | None = None) -> RunReport:
    job = t.job
    return RunReport(t.record.number, job.name, dict(t.record.params), job.sweep_key or "",
                     state or run_state(job), job.id, job.status, job.est_cost_micros,
                     job.cost_micros)


@dataclass
class _Proposed:
    """A trial proposed by this tick: its report and, unless it fits nowhere, its rows."""

    report: RunReport
    rows: tuple[Job, Event] | None = None


def _plan(loaded: LoadedSweep, known: Sequence[Trial], sweep_id: str | None,
          servers: list[RegisteredServer], measured: Mapping[MeasuredKey, Measured],
          listed: Sequence[Offer]) -> list[_Proposed]:
    """The proposals for the free slots, each resolved and planned (not written)."""
    first = max((t.record.number for t in known), default=-1) + 1
    out: list[_Proposed] = []
    for number, params in enumerate(_proposals(loaded, known), start=first):
        try:
            run = run_for(loaded, params, number)
            plan = make_plan(run.job, servers, measured, listed=listed)
        except (NoFit, SpecError) as exc:
            message = str(exc) if isinstance(exc, NoFit) else "; ".join(exc.problems)
            out.append(_Proposed(RunReport(number, f"{loaded.spec.name}-{number:03d}", params,
                                           "", R.NOFIT, message=message)))
            break  # the next numbers wait: a trial number is never skipped
        est = to_micros(plan.chosen.est_cost, rounding=ROUND_HALF_EVEN)
        if sweep_id is None:
            out.append(_Proposed(RunReport(number, run.job.spec.name, params, run.sweep_key,
                                           R.NEW, est_cost_micros=est)))
            continue
        job, event = run_rows(sweep_id, loaded.spec.name, run, plan, run.job.spec.name,
                              trial_number=number)
        out.append(_Proposed(RunReport(number, job.name, params, run.sweep_key, R.NEW,
                                       job.id, job.status, est), (job, event)))
    return out


def propose_trials(store: Store, loaded: LoadedSweep, sweep_id: str | None, *,
                   servers: list[RegisteredServer],
                   measured: Mapping[MeasuredKey, Measured], listed: Sequence[Offer] = (),
                   dry_run: bool = False) -> list[RunReport]:
    """Every trial of the tpe sweep after this tick: the recorded ones and those proposed
    now (`new`; with `dry_run` proposed and reported, nothing written)."""
    objective = _objective(loaded)
    if dry_run or sweep_id is None:
        known = [] if sweep_id is None else trials_of(store, sweep_id, objective)
        return [_report(t) for t in known] + [
            p.report for p in _plan(loaded, known, None, servers, measured, listed)]
    try:
        with store.transaction() as session:
            # The sweep row's lock: a tick that overlaps waits here, then sees these trials.
            session.exec(select(Sweep).where(Sweep.id == sweep_id).with_for_update()).one()
            known = trials_in(session, sweep_id, objective)
            new = _plan(loaded, known, sweep_id, servers, measured, listed)
            for p in new:
                if p.rows is not None:
                    session.add(p.rows[0])
                    session.flush()  # IntegrityError: another tick inserted this trial
                    session.add(p.rows[1])
            _failpoint("sweep-proposed")  # proposed, not committed: the next tick again
        _failpoint("sweep-queued")  # committed: the workers' queue has them
    except IntegrityError:
        # Another tick proposed these numbers first (without the lock's wait: a database
        # that does not lock the row): its trials stand, reported as recorded.
        new = []
    recorded = trials_of(store, sweep_id, objective)
    mine = {p.report.job_id for p in new}
    return [_report(t, R.NEW if t.job.id in mine else None) for t in recorded] + [
        p.report for p in new if p.rows is None]


__all__ = ["free_slots", "propose_trials"]
