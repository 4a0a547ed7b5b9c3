"""The job lifecycle: place, provision, connect, run the pipeline, release; resume; teardown.

One `JobRunner` drives one claimed job (DESIGN.md, "Data flow of one job"):

  provisioning  the instance row is written FIRST, then provider.create (tagged with the job)
  connecting    wait for the provider to say running, pin the host key, open SSH
  preparing     GPU check, Container Toolkit, base model on NVMe (playbooks.pipeline.prepare)
  training      detached on the host; polled; reattached by job id after any reconnect
  merging       adapter merge, then the artifacts are copied back (before any evaluation)
  evaluating    vLLM (Docker hosts) or lm-eval's hf backend (containers); metrics rows; a
                failure ends the job "evaluation failed: ..." with its artifacts kept
  releasing     spot/on-demand terminated, a monthly server released
  succeeded | failed(reason) | cancelled;  interrupted → queued → provisioning (resume)

Every state change is committed (with its event) before the side effect it announces
(Invariant 1). A monitor thread renews the worker's lease, watches for `orch cancel` and asks
the provider about the instance every `watch_s` seconds: when the provider says the machine
is gone or preempted, the SSH connections are closed at once so whatever the pipeline was
doing fails fast, and the job is re-placed (the same or the next cheapest tier that fits) and
resumes from the last valid checkpoint on the job's volume. Whatever happens, the `finally`
of `run` terminates every instance this runner created (monthly servers are released).

`JobRunner` composes the run from collaborators that share one `runner_core.RunState`:
`placement.Placement` (adopt or rent), `hostsession.HostSession` (connect, run the phases)
and `teardown.Teardown` (losses, release, volumes); the loop that ties them together, the
outage waits and the job's final record are here.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Literal

from orchestrator.core import money
from orchestrator.core.jobstatus import JobStatus
from orchestrator.core.paths import data_dir, private_dir
from orchestrator.core.settings import settings
from orchestrator.core.states import EndReason, EventKind, Outcome, StopKind
from orchestrator.core.utc import iso_z
from orchestrator.engine import budget, hostchecks, recovery, resumefrom
from orchestrator.engine.deadlines import Contract
from orchestrator.engine.hostsession import HostSession
from orchestrator.engine.jobinputs import InputsError, artifacts_dir, load_inputs
from orchestrator.engine.notifications import Notices, placed_on, told
from orchestrator.engine.placement import Placement
from orchestrator.engine.pruning import record_pruned
from orchestrator.engine.runner_core import (
    CANCELLED,
    PHASES,
    Deferred,
    JobFailed,
    Ledger,
    Options,
    Placed,
    Progress,
    RunState,
    Stop,
    Terminated,
    checkpoint_dir,
    describe_failure,
    ensure_key,
    failpoint,
    instance_cost,
    log,
    monitor,
    owner_id,
)
from orchestrator.engine.teardown import Teardown
from orchestrator.engine.warm import Warm
from orchestrator.engine.watchdog import Watchdog, deadlines
from orchestrator.records.store import (
    CancelRequested,
    DatabaseBusy,
    DatabaseFull,
    Job,
    JobUpdate,
    LeaseLost,
    Store,
    to_micros,
    utcnow,
)
from playbooks.hostcheck import HostRejected
from playbooks.ssh import ConnectionFactory
from providers.base import Provider

# What callers import from here (the runner's collaborators live in runner_core, placement,
# hostsession and teardown).
__all__ = ["PHASES", "JobFailed", "JobRunner", "Options", "Progress",
           "Terminated", "checkpoint_dir", "ensure_key", "failpoint", "instance_cost",
           "owner_id"]

S = JobStatus
# At most this long the run waits, once the job is finished and recorded, for its monitor
# thread to end the tick it is in: a tick's provider call may retry for up to the provider
# API's 120-s deadline (providers/http.py). After Ctrl-C or SIGTERM, a short wait only.
MONITOR_JOIN_S = 150.0
MONITOR_JOIN_STOPPED_S = 2.0


class JobRunner:
    """Drives one job that `owner` has claimed, to a final state (see module doc)."""

    def __init__(self, store: Store, providers: Mapping[str, Provider], owner: str,
                 options: Options | None = None,
                 on_progress: Callable[[Progress], None] | None = None,
                 on_signal: Literal["cancel", "requeue"] = "cancel") -> None:
        self.store = store
        self.providers = dict(providers)
        self.owner = owner
        self.opts = options or Options()
        self.on_progress = on_progress
        self.on_signal = on_signal  # cancel (orch submit) | requeue (orch worker)
        self._not_before = utcnow()  # when a deferred job may be claimed again

    def run(self, job_id: str) -> Job:
        """Drive the claimed job to succeeded, failed or cancelled (or requeued on SIGTERM)."""
        job = self.store.get_job(job_id)
        ledger = Ledger(self.store, job_id, self.owner, self.providers,
                        Watchdog(self.opts.stall_s if self.opts.stall_s is not None
                                 else deadlines()),
                        Progress(job_id, job.status, job.attempt), self.on_progress,
                        self.opts.disk_gb)
        try:
            # Checkpoint copies and training logs live under the data folder: the user's alone.
            private_dir(data_dir())
            key_path, public_key = ensure_key(self.opts.ssh_key)
        except Exception as exc:  # OSError, CalledProcessError: fail the job, do not strand it
            return self._fail_early(ledger, f"cannot create orch's data folder or SSH key: {exc}")
        chosen = settings()
        factory = ConnectionFactory(key_path, connect_timeout=10,
                                    connect_deadline=self.opts.connect_deadline_s,
                                    command_timeout_s=chosen.ssh_command_timeout_s,
                                    io_timeout_s=chosen.ssh_io_timeout_s)
        state = RunState(ledger, self.providers, self.opts, public_key, factory)
        state.notices = Notices.of_job(self.store, job)
        teardown = Teardown(state)
        done = threading.Event()
        watcher = threading.Thread(target=monitor, args=(state, done), daemon=True,
                                   name=f"orch-monitor-{job_id}")
        watcher.start()
        outcome, reason = Outcome.FAILED, "the engine stopped unexpectedly"
        db_error: DatabaseBusy | DatabaseFull | None = None
        join_s = MONITOR_JOIN_S
        try:
            outcome, reason = self._drive(state, teardown), ""
        except (DatabaseBusy, DatabaseFull) as exc:
            # Nothing can be recorded: tear the instances down (money first), requeue the job
            # if the database lets us, and let the caller report it (issue 23 §1, §7).
            outcome, reason, db_error = Outcome.DATABASE, str(exc), exc
        except LeaseLost:
            outcome, reason = Outcome.LOST, "another worker took the job over"
        except JobFailed as exc:
            outcome, reason = Outcome.FAILED, str(exc)
        except Deferred as exc:
            outcome, reason = Outcome.DEFERRED, str(exc)
            self._not_before = exc.not_before
        except Stop as exc:
            outcome, reason = Outcome.of_stop(exc.kind), str(exc)
        except (KeyboardInterrupt, Terminated) as exc:
            what = "Ctrl-C" if isinstance(exc, KeyboardInterrupt) else "SIGTERM"
            join_s = MONITOR_JOIN_STOPPED_S
            outcome = Outcome.REQUEUE if self.on_signal == "requeue" else Outcome.CANCELLED
            reason = f"stopped by {what}"
            raise
        except Exception as exc:  # a bug or an unexpected fault: fail, never leak the machine
            log.exception("job %s", job_id)
            outcome, reason = Outcome.FAILED, f"internal error: {type(exc).__name__}: {exc}"
        finally:
            done.set()
            teardown.release_all(outcome)
            factory.close_all()
            db_error = self._finish(ledger, teardown, outcome, reason) or db_error
            told(state.notices, self.store, job_id)
            # The monitor ends its tick (a deadline or budget check, a provider's answer)
            # before the run returns: a daemon thread still running when `orch worker
            # --once` exits races the interpreter's exit hooks (weakref.finalize's, which
            # SQLAlchemy's generated functions register, fails with "dictionary changed size
            # during iteration" when a thread adds one meanwhile: seen once in CI).
            watcher.join(join_s)
        if db_error is not None:
            raise db_error
        return self.store.get_job(job_id)

    def _fail_early(self, ledger: Ledger, reason: str) -> Job:
        """Fail a claimed job before anything was rented (nothing to tear down)."""
        with contextlib.suppress(LeaseLost):
            ledger.set(S.FAILED, reason, {"reason": reason}, failure_reason=reason)
        return self.store.get_job(ledger.job_id)

    def _finish(self, ledger: Ledger, teardown: Teardown, kind: Outcome,
                reason: str) -> DatabaseBusy | DatabaseFull | None:
        """Record how the attempt ended; the database error that prevented it, if any (the
        job then keeps its lease until it lapses, and the next orch process requeues it)."""
        try:
            self._record_end(ledger, teardown, kind, reason)
        except (DatabaseBusy, DatabaseFull) as exc:
            # The caller reports `exc` (one line); the job's lease lapses and the next orch
            # process that opens the database requeues it.
            log.info("job %s: could not record its end (%s): %s", ledger.job_id, kind, exc)
            return exc
        return None

    def _record_end(self, ledger: Ledger, teardown: Teardown, kind: Outcome,
                    reason: str) -> None:
        if kind in (Outcome.LOST, Outcome.SUCCEEDED):
            return
        if kind is Outcome.DATABASE:
            # Rows whose instance was terminated while the database refused the write.
            teardown.release_all(kind)
        cost, amortised = ledger.costs()
        fields: JobUpdate = {"cost_micros": to_micros(cost),
                             "amortised_micros": to_micros(amortised)}
        try:
            if kind is Outcome.DEFERRED:
                deferred: JobUpdate = {**fields, "lease_owner": None, "lease_expires_at": None,
                                       "not_before": self._not_before}
                ledger.set(S.QUEUED, reason, {"not_before": iso_z(self._not_before)},
                           **deferred)
                return
            if kind in (Outcome.REQUEUE, Outcome.DATABASE):
                why = "worker stopping" if kind is Outcome.REQUEUE else "database unavailable"
                ledger.set(S.INTERRUPTED, f"{why}: {reason}; requeued to resume", **fields)
                ledger.set(S.QUEUED, "waiting for a worker to resume it", lease_owner=None,
                           lease_expires_at=None, attempt=ledger.job().attempt + 1)
                if kind is Outcome.DATABASE:
                    # The database takes writes again: close the rows of the instances
                    # terminated while it did not (else the resuming worker does).
                    teardown.release_all(kind)
                return
            if kind is Outcome.PRUNED:
                record_pruned(ledger, teardown, reason, fields)
                return
            # Cancelled, or failed (also a stall or a loss that escaped re-placement).
            status = S.CANCELLED if kind is Outcome.CANCELLED else S.FAILED
            if status is S.CANCELLED:
                reason = cancel_summary(ledger, teardown, reason)
            elif teardown.state.budget_told:  # max_cost stopped it: keep what is home
                reason = f"{reason}; {teardown.keep_checkpoint()}"
            fields["failure_reason"] = reason if status is S.FAILED else None
            ledger.set(status, reason, {"reason": reason}, **fields)
            teardown.delete_checkpoints()
        except LeaseLost:
            pass

    def _drive(self, state: RunState, teardown: Teardown) -> Outcome:
        ledger = state.ledger
        try:
            inputs = load_inputs(ledger.job())
            resumefrom.require_source(inputs, state.job_id)
        except InputsError as exc:
            raise JobFailed(str(exc)) from exc
        ledger.disk_gb = inputs.disk_gb(self.opts.disk_gb)
        warm = Warm(state, inputs, teardown)
        placement = Placement(state, inputs, teardown, warm)
        session = HostSession(state, inputs, teardown, warm)
        contract = Contract(state, inputs, requeue=self.on_signal == "requeue")
        state.ticks.append(contract.tick)
        state.ticks.append(budget.Cap(state, inputs.loaded.spec.resources.max_cost).tick)
        placement.check_before_renting()
        tried: set[tuple[str, str]] = set()
        replacing = False  # the last attempt lost its machine: the next placement re-places
        while True:
            job = ledger.job()
            gave_up = contract.out_of_attempts(job, self.opts.max_attempts)
            if gave_up is not None:
                raise JobFailed(gave_up)
            adopted = contract.after_adopt(placement.adopt(), teardown, placement)
            session.pruning.check_stored()  # a prune recorded before a kill -9: complete it
            if recovery.nothing_left(job.phase_done, PHASES):
                # Everything was done before a crash: finish without renting.
                if adopted is not None:
                    teardown.release(adopted.row_id, EndReason.RELEASED)
                ledger.event("resume", "artifacts were already copied back; finishing")
                return self._succeed(ledger, teardown, warm)
            try:
                if adopted is None:
                    contract.before_renting(placement, tried)
                placed = adopted or placement.place(tried)
            except recovery.ProvidersUnavailable as exc:
                self._outage(state, str(exc), exc.retry_after)
                tried.clear()  # after the wait, the offers that failed are worth a try again
                continue
            except JobFailed:
                if adopted is None and contract.spot_went(placement):
                    continue  # the policy asked again: spot is gone now
                raise
            contract.placed(placed)
            if replacing and adopted is None:
                state.notices.emit(EventKind.JOB_REPLACED, {"placement": placed_on(placed.inst)})
            replacing = not self._attempt(state, session, teardown, placed, tried)
            if replacing:
                continue
            # Cancelled in releasing: Stop, and the finally of `run` terminates the machine
            # (never parked; park_instance refuses a cancelled job in its own transaction).
            state.check_cancel()
            warm.park_or_release(placed)  # kept warm for the next job, or terminated
            failpoint("after-terminate")
            return self._succeed(ledger, teardown, warm)

    def _attempt(self, state: RunState, session: HostSession, teardown: Teardown,
                 placed: Placed, tried: set[tuple[str, str]]) -> bool:
        """Run the pipeline on the placed instance: True when it finished, False when the
        attempt was lost (interrupted, stalled, or the host failed its check) and the job is
        to be re-placed."""
        try:
            session.run(placed)
        except HostRejected as exc:  # not an interruption: no attempt is counted
            hostchecks.rejected(state, teardown, placed, exc, tried)
            return False
        except Stop as stop:
            if stop.kind is StopKind.PRUNED:  # kept warm for the next trial, or released
                session.park_pruned(placed)
                raise
            if stop.kind is StopKind.STALLED:
                teardown.stalled(placed, stop)
                return False
            if stop.kind is StopKind.MOVED:
                teardown.moved(placed, str(stop))
                return False
            if stop.kind is not StopKind.INTERRUPTED:
                raise
            teardown.interrupted(placed, str(stop),
                                 EndReason.REPLACED if stop.given_up else EndReason.INTERRUPTED)
            return False
        except Exception as exc:
            if isinstance(exc, JobFailed | LeaseLost | DatabaseBusy | DatabaseFull):
                raise
            stalled = state.stop
            if stalled is not None and stalled.kind is StopKind.STALLED:
                # The watchdog closed the connections: this error is the stall's.
                teardown.stalled(placed, stalled)
                return False
            if stalled is not None and stalled.kind is StopKind.MOVED:  # the move's
                teardown.moved(placed, str(stalled))
                return False
            lost = teardown.instance_lost(placed)
            if lost is None:
                raise JobFailed(describe_failure(exc)) from exc
            teardown.interrupted(placed, lost)
            return False
        if state.stop is not None and state.stop.kind is StopKind.MOVED:
            state.clear_stop()  # the pipeline finished before the move stopped it: done
        return True

    def _succeed(self, ledger: Ledger, teardown: Teardown, warm: Warm) -> Outcome:
        cost, amortised = ledger.costs()
        teardown.delete_checkpoints()
        try:
            ledger.set(S.SUCCEEDED, f"succeeded; cost {money.usd(cost)}", {"cost": str(cost)},
                       cost_micros=to_micros(cost), amortised_micros=to_micros(amortised))
        except CancelRequested as exc:  # asked to stop after the last check: it wins
            warm.unpark()
            raise Stop(StopKind.CANCELLED, CANCELLED) from exc
        return Outcome.SUCCEEDED

    def _outage(self, state: RunState, why: str, asked_s: float | None = None) -> None:
        """No placement because providers are unavailable: wait (foreground) or requeue
        with a backoff (worker); fail once the outage outlasts the job's limit."""
        ledger = state.ledger
        job = ledger.job()
        now = utcnow()
        since = job.outage_since or now
        age = (now - since).total_seconds()
        plan = recovery.outage_wait(job, age, asked_s, self.opts.backoff_s,
                                    self.opts.backoff_max_s, self.opts.outage_limit_s)
        if plan is None:
            limit = recovery.outage_limit_s(job, self.opts.outage_limit_s)
            raise JobFailed(f"{why}; gave up after {age:.0f}s of provider outage (limit "
                            f"{limit:.0f}s)")
        wait, limit = plan.wait_s, plan.limit_s
        if job.outage_since is None:
            self.store.set_outage_since(ledger.job_id, now)
        message = (f"{why}; the job stays queued and is retried in {wait:.0f}s (fails after "
                   f"{limit:.0f}s of outage)")
        if self.on_signal == "requeue":  # a worker: let it run other jobs meanwhile
            raise Deferred(message, now + timedelta(seconds=wait))
        # `orch submit` in the foreground: wait here, holding the lease.
        ledger.set(S.QUEUED, message, {"retry_in_s": wait})
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            state.check_stop()
            time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))


def cancel_summary(ledger: Ledger, teardown: Teardown, reason: str) -> str:
    """What a cancel did, for the job's record and `orch cancel`: in which phase, what of the
    results is home, and what became of the machines ("cancelled in evaluating; adapter
    kept at PATH; sim instance i-1 terminated")."""
    job = ledger.job()
    parts = [f"{reason} in {job.status}"]
    places = [p for e in ledger.store.events(ledger.job_id) if e.kind == EventKind.DELIVERED
              for p in e.data().places or ()]
    home = [f"{p.what} kept at {p.location}" for p in places if p.where == "local"]
    if job.phase_done in PHASES[PHASES.index("artifacts"):] and home:
        parts += home
    elif any(artifacts_dir(ledger.job_id).glob("*")):
        parts.append(f"a partial copy of the results left in {artifacts_dir(ledger.job_id)} "
                     "(no manifest: incomplete)")
    else:
        parts.append("nothing had been copied back")
    parts += teardown.ended
    left = [r for r in ledger.store.instances_of(ledger.job_id) if r.terminated_at is None]
    parts += [f"{r.provider} instance {r.provider_instance_id} not terminated yet: run "
              "`orch reconcile`" for r in left]
    return "; ".join(parts)
