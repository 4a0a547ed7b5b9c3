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
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from orchestrator.core import money
from orchestrator.core.paths import data_dir, private_dir
from orchestrator.engine import recovery
from orchestrator.engine.hostsession import SessionMixin
from orchestrator.engine.jobinputs import InputsError, load_inputs
from orchestrator.engine.placement import PlacementMixin
from orchestrator.engine.runner_core import (
    PHASES,
    Deferred,
    JobFailed,
    Options,
    Progress,
    Stop,
    Terminated,
    checkpoint_dir,
    describe_failure,
    ensure_key,
    failpoint,
    log,
    owner_id,
)
from orchestrator.engine.teardown import TeardownMixin
from orchestrator.engine.watchdog import Watchdog, deadlines_from_env
from orchestrator.records.store import (
    DatabaseBusy,
    DatabaseFull,
    Job,
    LeaseLost,
    Store,
    to_micros,
    utcnow,
)
from playbooks.ssh import ConnectionFactory
from providers.base import Offer, Provider, Volumes

# What callers import from here (the runner's parts live in runner_core, placement,
# hostsession and teardown).
__all__ = ["PHASES", "JobFailed", "JobRunner", "Options", "Progress",
           "Terminated", "checkpoint_dir", "ensure_key", "failpoint", "instance_cost",
           "owner_id"]


def instance_cost(row: Any, until: datetime | None = None) -> tuple[Decimal, Decimal]:
    """(charged, amortised) for an instance row from create to terminate (or `until`)."""
    return money.instance_cost(row, until or utcnow())


class JobRunner(PlacementMixin, SessionMixin, TeardownMixin):
    """Drives one job that `owner` has claimed, to a final state (see module doc)."""

    def __init__(self, store: Store, providers: Mapping[str, Provider], owner: str,
                 options: Options | None = None,
                 on_progress: Callable[[Progress], None] | None = None,
                 on_signal: str = "cancel") -> None:
        self.store = store
        self.providers = dict(providers)
        self.owner = owner
        self.opts = options or Options()
        self.on_progress = on_progress
        self.on_signal = on_signal  # cancel (orch submit) | requeue (orch worker)
        self._stop: Stop | None = None
        self._stop_lock = threading.Lock()
        self._watching: tuple[str, str] | None = None  # (provider, instance id) to watch
        self._held: dict[int, tuple[str, str | None]] = {}  # instance row -> (provider, id)
        self._not_before = utcnow()  # when a deferred job may be claimed again
        self.progress: Progress | None = None
        self._watchdog = Watchdog(self.opts.stall_s if self.opts.stall_s is not None
                                  else deadlines_from_env())
        self._stalls = 0
        self._secrets_base: dict[int, str] = {}  # instance row -> orch's directory on the host
        self._disk: int | None = None

    def run(self, job_id: str) -> Job:
        """Drive the claimed job to succeeded, failed or cancelled (or requeued on SIGTERM)."""
        job = self.store.get_job(job_id)
        self.job_id = job_id
        self.progress = Progress(job_id, job.status, job.attempt)
        self._losses = {}
        try:
            # Checkpoint copies and training logs live under the data folder: the user's alone.
            private_dir(data_dir())
            key_path, self.public_key = ensure_key(self.opts.ssh_key)
        except Exception as exc:  # OSError, CalledProcessError: fail the job, do not strand it
            return self._fail_early(f"cannot create orch's data folder or SSH key: {exc}")
        self._factory = ConnectionFactory(key_path, connect_timeout=10,
                                          connect_deadline=self.opts.connect_deadline_s)
        done = threading.Event()
        monitor = threading.Thread(target=self._monitor, args=(done,), daemon=True,
                                   name=f"orch-monitor-{job_id}")
        monitor.start()
        outcome: tuple[str, str] = ("failed", "the engine stopped unexpectedly")
        db_error: DatabaseBusy | DatabaseFull | None = None
        try:
            outcome = self._drive()
        except (DatabaseBusy, DatabaseFull) as exc:
            # Nothing can be recorded: tear the instances down (money first), requeue the job
            # if the database lets us, and let the caller report it (issue 23 §1, §7).
            outcome, db_error = ("database", str(exc)), exc
        except LeaseLost:
            outcome = ("lost", "another worker took the job over")
        except JobFailed as exc:
            outcome = ("failed", str(exc))
        except Deferred as exc:
            outcome = ("deferred", str(exc))
            self._not_before = exc.not_before
        except Stop as exc:
            outcome = (exc.kind, str(exc))
        except (KeyboardInterrupt, Terminated) as exc:
            what = "Ctrl-C" if isinstance(exc, KeyboardInterrupt) else "SIGTERM"
            outcome = ("requeue" if self.on_signal == "requeue" else "cancelled",
                       f"stopped by {what}")
            raise
        except Exception as exc:  # a bug or an unexpected fault: fail, never leak the machine
            log.exception("job %s", job_id)
            outcome = ("failed", f"internal error: {type(exc).__name__}: {exc}")
        finally:
            done.set()
            self._teardown_all(outcome[0])
            self._factory.close_all()
            db_error = self._finish(*outcome) or db_error
        if db_error is not None:
            raise db_error
        return self.store.get_job(job_id)

    def _fail_early(self, reason: str) -> Job:
        """Fail a claimed job before anything was rented (nothing to tear down)."""
        with contextlib.suppress(LeaseLost):
            self._set("failed", reason, {"reason": reason}, failure_reason=reason)
        return self.store.get_job(self.job_id)

    def _finish(self, kind: str, reason: str) -> DatabaseBusy | DatabaseFull | None:
        """Record how the attempt ended; the database error that prevented it, if any (the
        job then keeps its lease until it lapses, and the next orch process requeues it)."""
        try:
            self._record_end(kind, reason)
        except (DatabaseBusy, DatabaseFull) as exc:
            # The caller reports `exc` (one line); the job's lease lapses and the next orch
            # process that opens the database requeues it.
            log.info("job %s: could not record its end (%s): %s", self.job_id, kind, exc)
            return exc
        return None

    def _record_end(self, kind: str, reason: str) -> None:
        if kind in ("lost", "succeeded"):
            return
        if kind == "database":
            # Rows whose instance was terminated while the database refused the write.
            self._teardown_all(kind)
        cost, storage, amortised = self._costs()
        fields: dict[str, Any] = {"cost_micros": to_micros(cost + storage),
                                  "storage_micros": to_micros(storage),
                                  "amortised_micros": to_micros(amortised)}
        try:
            if kind == "deferred":
                self._set("queued", reason, {"not_before": self._not_before.isoformat()},
                          lease_owner=None, lease_expires_at=None, not_before=self._not_before,
                          **fields)
                return
            if kind in ("requeue", "database"):
                why = "worker stopping" if kind == "requeue" else "database unavailable"
                self._set("interrupted", f"{why}: {reason}; requeued to resume", **fields)
                self._set("queued", "waiting for a worker to resume it", lease_owner=None,
                          lease_expires_at=None, attempt=self._job().attempt + 1)
                if kind == "database":
                    # The database takes writes again: close the rows of the instances
                    # terminated while it did not (else the resuming worker does).
                    self._teardown_all(kind)
                return
            status = "cancelled" if kind == "cancelled" else "failed"
            self._set(status, reason, {"reason": reason},
                      failure_reason=reason if status == "failed" else None, **fields)
            self._delete_volumes()
        except LeaseLost:
            pass

    def _drive(self) -> tuple[str, str]:
        job = self._job()
        try:
            self.inputs = load_inputs(job)
        except InputsError as exc:
            raise JobFailed(str(exc)) from exc
        self._disk = self.inputs.disk_gb(self.opts.disk_gb)
        self._check_before_renting()
        tried: set[tuple[str, str]] = set()
        while True:
            job = self._job()
            gave_up = recovery.out_of_attempts(job, self.opts.max_attempts)
            if gave_up is not None:
                raise JobFailed(gave_up)
            adopted = self._adopt()
            if recovery.nothing_left(job.phase_done, PHASES):
                # Everything was done before a crash: finish without renting.
                if adopted is not None:
                    self._release(adopted[0], "released")
                self._event("resume", "artifacts were already copied back; finishing")
                return self._succeed()
            try:
                row_id, provider, inst = adopted or self._place(tried)
            except recovery.ProvidersUnavailable as exc:
                self._outage(str(exc), exc.retry_after)
                tried.clear()  # after the wait, the offers that failed are worth a try again
                continue
            try:
                self._session(row_id, provider, inst)
            except Stop as stop:
                if stop.kind == "stalled":
                    self._stalled(row_id, provider, inst, stop)
                    continue
                if stop.kind != "interrupted":
                    raise
                self._interrupted(row_id, provider, inst, str(stop))
                continue
            except Exception as exc:
                if isinstance(exc, JobFailed | LeaseLost | DatabaseBusy | DatabaseFull):
                    raise
                stalled = self._stop
                if stalled is not None and stalled.kind == "stalled":
                    # The watchdog closed the connections: this error is the stall's.
                    self._stalled(row_id, provider, inst, stalled)
                    continue
                lost = self._instance_lost(provider, inst)
                if lost is None:
                    raise JobFailed(describe_failure(exc)) from exc
                self._interrupted(row_id, provider, inst, lost)
                continue
            self._release(row_id, "released")
            failpoint("after-terminate")
            return self._succeed()

    def _succeed(self) -> tuple[str, str]:
        cost, storage, amortised = self._costs()
        self._delete_volumes()
        self._set("succeeded", f"succeeded; cost {money.usd(cost + storage)}",
                  {"cost": str(cost + storage)},
                  cost_micros=to_micros(cost + storage), storage_micros=to_micros(storage),
                  amortised_micros=to_micros(amortised))
        return "succeeded", ""

    def _outage(self, why: str, asked_s: float | None = None) -> None:
        """No placement because providers are unavailable: wait (foreground) or requeue
        with a backoff (worker); fail once the outage outlasts the job's limit."""
        job = self._job()
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
            self.store.update_job_fields(self.job_id, outage_since=now)
        message = (f"{why}; the job stays queued and is retried in {wait:.0f}s (fails after "
                   f"{limit:.0f}s of outage)")
        if self.on_signal == "requeue":  # a worker: let it run other jobs meanwhile
            raise Deferred(message, now + timedelta(seconds=wait))
        # `orch submit` in the foreground: wait here, holding the lease.
        self._set("queued", message, {"retry_in_s": wait})
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            self._check_stop()
            time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))

    def _close_row(self, row_id: int, reason: str) -> None:
        now = utcnow()
        row = self.store.update_instance(row_id, terminated_at=now, state="terminated",
                                         end_reason=reason)
        charged, amortised = instance_cost(row, now)
        self.store.update_instance(row_id, cost_micros=to_micros(charged),
                                   amortised_micros=to_micros(amortised))
        self._held.pop(row_id, None)

    def _costs(self) -> tuple[Decimal, Decimal, Decimal]:
        """(compute charged, volume storage, amortised rent) of the job so far."""
        charged = amortised = Decimal(0)
        now = utcnow()
        rows = self.store.instances_of(self.job_id)
        for row in rows:
            c, a = instance_cost(row, now)
            charged += c
            amortised += a
        storage = Decimal(0)
        job = self._job()
        if job.started_at is not None:
            used = {r.provider for r in rows}
            for name, provider in self.providers.items():
                rate = provider.volume_per_gb_month if isinstance(provider, Volumes) else None
                if rate and name in used:
                    storage += money.volume_cost(self._disk_gb(), rate,
                                                 money.hours_between(job.started_at, now))
        return money.money(charged), storage, money.money(amortised)

    def _hourly_rate(self, offer: Offer) -> Decimal | None:
        """An offer's hourly price; a monthly server's is its amortisation rate."""
        hourly = offer.price_per_hour
        if hourly is None and offer.monthly_price is not None:
            hourly = offer.monthly_price / money.HOURS_PER_MONTH
        return hourly
