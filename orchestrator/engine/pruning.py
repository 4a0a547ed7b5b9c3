"""Early stopping of a sweep trial while it trains: ask at each rung, record once, stop.

`Pruning`, a collaborator of `hostsession.HostSession` for one run: when the job belongs to
a sweep with `early_stop:` and its training progress crosses the step of a rung not decided
yet, it asks `core.search.decide` with the sweep's trial records (`records.sweep.trials`)
and the job's curve of the early-stop metric, records the rung checks once
(`sweep_rung`, keyed by job and rung), and on a prune raises `Stop(PRUNED)`: the run then
ends as a cancel does (the training's machine released, nothing merged, evaluated or
delivered) and the runner records the job `pruned` with what it cost. The decision is
recorded before the stop (invariant 1): a worker killed in between leaves the stored
decision, and the worker that takes the job over completes the stop (`check_stored`)
instead of training on.
"""

from __future__ import annotations

import math

from orchestrator.core import divergence, search
from orchestrator.core.divergence import Diverged
from orchestrator.core.jobstatus import JobStatus
from orchestrator.core.searchspec import EarlyStopSpec
from orchestrator.core.states import StopKind
from orchestrator.engine.runner_core import Ledger, RunState, Stop, failpoint
from orchestrator.engine.teardown import Teardown
from orchestrator.records.columns import ObjectiveRecord, PruneRecord
from orchestrator.records.store import JobUpdate, Sweep, SweepRung
from orchestrator.records.sweep import trials


def describe(p: PruneRecord) -> str:
    """`pruned at 15 % of its steps (step 9): train.loss 1.42, needed 1.31 or better`."""
    share = p.resource / search.RESOURCE * 100
    needed = "" if p.cutoff is None else f", needed {p.cutoff:.4g} or better"
    return (f"pruned at {share:g} % of its steps (step {p.step}): {p.metric} "
            f"{p.value:.4g}{needed}")


class Pruning:
    """The early stopping of one run (a no-op for a job outside a sweep with early_stop)."""

    def __init__(self, state: RunState) -> None:
        self.state = state
        self.early_stop: EarlyStopSpec | None = None
        self.objective: ObjectiveRecord | None = None
        self.sweep_id: str | None = None
        self.study = ""
        self.decided: set[int] = set()  # resources with a recorded check
        job = state.ledger.job()
        if job.sweep_id is None:
            return
        with state.store.session() as session:
            sweep = session.get(Sweep, job.sweep_id)
            if sweep is None:
                return
            spec = sweep.spec()
            self.sweep_id, self.study = sweep.id, sweep.name
        self.early_stop, self.objective = spec.early_stop, spec.objective
        with state.store.session() as session:
            rows = trials.rung_rows(session, [job.id]).get(job.id, [])
        self.decided = {r.resource for r in rows}

    @property
    def metric(self) -> str | None:
        """The intermediate metric the sweep stops by (None: no early stopping)."""
        return None if self.early_stop is None else self.early_stop.metric

    def check_stored(self) -> None:
        """Stop now if a rung already decided to prune this job (a takeover after kill -9)."""
        if self.early_stop is None:
            return
        row = trials.stored_prune(self.state.store, self.state.job_id)
        if row is not None:
            self._stop(row)

    def on_progress(self, step: int | None, total: int | None) -> None:
        """Training reached `step` of `total`: check the rungs it crossed since the last."""
        es = self.early_stop
        if es is None or step is None or not total:
            return
        pending = [r for r in search.rung_resources(es) if r not in self.decided]
        if not pending or step < search.rung_step(pending[0], total):
            return
        self._decide(total, finished=False)

    def finished(self, total: int | None) -> None:
        """Training ended before every rung was checked: record its rung values, so that
        it competes at those rungs (never pruned: it is done)."""
        if self.early_stop is None or not total:
            return
        if all(r in self.decided for r in search.rung_resources(self.early_stop)):
            return
        self._decide(total, finished=True)

    def diverged(self, gone: Diverged, total: int | None) -> None:
        """The run diverged (core/divergence): in a sweep with early_stop it is pruned now,
        as optuna's pruners prune a trial whose report is NaN at any step, and a warm
        machine is parked for the next trial. Elsewhere a no-op: the job fails.

        The prune is recorded first, as a rung's is (a takeover completes it: `check_stored`),
        at the share of its steps where it stopped (`pruned at 17 %`), with a NULL value: the
        search then ranks it below every other trial, whatever it passed before."""
        es = self.early_stop
        if es is None or not total:
            return
        rungs = search.rung_resources(es)
        pending = [r for r in rungs if r not in self.decided]
        at = rungs.index(pending[0]) if pending else len(rungs)
        # Past every recorded check (the key is job and resource), within the run.
        resource = min(search.RESOURCE, max(math.ceil(gone.last * search.RESOURCE / total),
                                            max(self.decided, default=0) + 1))
        decision = search.Prune(at, resource, gone.last, es.metric, math.nan, math.nan)
        row = trials.record_rungs(self.state.store, self.state.job_id, decision, es.metric,
                                  [], total)
        if row is not None:
            failpoint("pruned-decided")
            self._stop(row, f"{divergence.REASON_PREFIX} {gone.what()}")

    def _decide(self, total: int, *, finished: bool) -> None:
        es, store, job_id = self.early_stop, self.state.store, self.state.job_id
        assert es is not None and self.sweep_id is not None
        points = trials.curve(store, job_id, es.metric)
        pending = [r for r in search.rung_resources(es) if r not in self.decided]
        if search.rung_value(points, search.rung_step(pending[0], total)) is None:
            return  # past the rung's step, but its report (an eval loss) is not in yet
        known = trials.trials_of(store, self.sweep_id, self.objective)
        mine = next((t for t in known if t.job.id == job_id), None)
        if mine is None:
            return
        decision = search.decide(es, [t.record for t in known], mine.record.number, points,
                                 total, study_name=self.study, finished=finished)
        row = trials.record_rungs(store, job_id, decision, es.metric, points, total)
        with store.session() as session:
            self.decided = {r.resource for r in
                            trials.rung_rows(session, [job_id]).get(job_id, [])}
        if row is not None and not finished:
            failpoint("pruned-decided")  # decided, not stopped: the takeover completes it
            self._stop(row)

    def _stop(self, row: SweepRung, why: str = "") -> None:
        record = trials.prune_record(row)
        said = describe(record) + (f" ({why})" if why else "")
        self.state.ledger.event("sweep.pruned", said, record.model_dump())
        raise Stop(StopKind.PRUNED, said)


def record_pruned(ledger: Ledger, teardown: Teardown, reason: str, fields: JobUpdate) -> None:
    """The run's end after a prune: `pruned`, with what it cost (`fields`), the rung that
    decided it in the state event's data, and what became of its machines."""
    row = trials.stored_prune(ledger.store, ledger.job_id)
    data: dict[str, object] = {"reason": reason}
    if row is not None:
        data["pruned"] = trials.prune_record(row).model_dump()
    message = "; ".join([reason, "nothing delivered", *teardown.ended])
    fields["failure_reason"] = None
    ledger.set(JobStatus.PRUNED, message, data, **fields)
    failpoint("pruned")
    teardown.delete_checkpoints()


__all__ = ["Pruning", "describe", "record_pruned"]
