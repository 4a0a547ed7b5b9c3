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
import ipaddress
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path
from typing import Any

from orchestrator import pricing, recovery
from orchestrator.paths import data_dir
from orchestrator.store import (
    Job,
    LeaseLost,
    Store,
    from_micros,
    to_micros,
    utcnow,
)
from playbooks import images
from providers.base import (
    AuthError,
    BalanceError,
    Billing,
    CapacityError,
    Instance,
    InstanceState,
    NotFound,
    Offer,
    Provider,
    ProviderError,
    QuotaError,
    Requirements,
    TransientError,
    host_root,
)

log = logging.getLogger(__name__)

HOURS_PER_MONTH = Decimal(730)
# States the provider reports for a machine that will not come back for this job.
_LOST = (InstanceState.INTERRUPTED, InstanceState.TERMINATED, InstanceState.FAILED)


@dataclass(frozen=True)
class Options:
    """How patient and how watchful the engine is (the defaults suit real clouds)."""

    poll_s: float = 5.0  # training progress polls
    watch_s: float = 2.0  # provider state checks (interruption detection)
    boot_deadline_s: float = 900.0  # create → provider says running with an SSH endpoint
    connect_deadline_s: float = 300.0  # SSH retries once running
    lease_s: float = 60.0
    max_placements: int = 5  # offers tried per attempt (capacity errors, dead hosts)
    max_attempts: int = 6  # interruptions survived before the job is failed
    disk_gb: int = 100
    ssh_key: Path | None = None  # default: data_dir()/ssh/id_ed25519, created on first use
    # Per-phase no-progress deadlines (orchestrator/watchdog.py); None: defaults + ORCH_STALL_*.
    stall_s: Mapping[str, float] | None = None
    stall_retries: int = 1  # a stalled attempt is re-placed this often, then the job fails
    # Provider outages (orchestrator.recovery): first wait, longest wait, and how long a job
    # waits out a continuous outage before it fails.
    backoff_s: float = recovery.BACKOFF_S
    backoff_max_s: float = recovery.BACKOFF_MAX_S
    outage_limit_s: float = recovery.OUTAGE_LIMIT_S


# How to evaluate a job's model again without training it again (docs/playbooks.md).
EVAL_AGAIN = ("To run only the evaluation again, fix its cause and follow \"Re-running only "
              "the evaluation\" in docs/playbooks.md (the training is not repeated).")


class JobFailed(Exception):
    """The job cannot finish; the message is the failure reason shown to the user."""


class _Deferred(Exception):
    """Requeue the job to try again at `not_before` (its providers are unavailable)."""

    def __init__(self, message: str, not_before: datetime) -> None:
        super().__init__(message)
        self.not_before = not_before


# The pipeline phases whose completion is recorded in job.phase_done, in order: a takeover
# on the same instance skips those done; once the last is done (artifacts copied back and
# the evaluation, if any, recorded) a takeover finishes the job without renting.
PHASES = ("training", "merging", "artifacts", "evaluating")


class _Stop(Exception):
    """The monitor stopped the pipeline: cancelled, or the instance was lost."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind  # cancelled | interrupted | stalled | lost


class Terminated(BaseException):
    """SIGTERM arrived: tear down, then exit (raised in the main thread by the handler)."""


@dataclass
class Progress:
    """What a live display shows; handed to the runner's `on_progress` callback."""

    job_id: str
    status: str
    attempt: int
    step: int | None = None
    total: int | None = None
    loss: float | None = None
    cost: Decimal = Decimal(0)
    started: float = field(default_factory=time.monotonic)
    message: str = ""


def failpoint(name: str) -> None:
    """Die like `kill -9` here when ORCH_FAILPOINT names this point (crash tests only)."""
    if os.environ.get("ORCH_FAILPOINT") == name:
        import signal

        os.kill(os.getpid(), signal.SIGKILL)


def owner_id(kind: str = "worker") -> str:
    """A lease owner name that says which process holds the job."""
    return f"{kind}:{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def ensure_key(path: Path | None = None) -> tuple[Path, str]:
    """orch's own SSH key pair (created 0600 on first use): (private key file, public line).

    Several workers may start at once on a fresh machine: the pair is generated under a lock
    into a temporary name and renamed into place, so each sees either no key or a whole one.
    """
    import fcntl
    import subprocess
    import tempfile

    path = path or data_dir() / "ssh" / "id_ed25519"
    pub = path.with_name(path.name + ".pub")
    if not (path.exists() and pub.exists()):
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(path.parent / ".keygen.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (path.exists() and pub.exists()):
                with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
                    fresh = Path(tmp) / "key"
                    # ssh-keygen writes the OpenSSH key format paramiko and sshd both read.
                    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C",
                                    "orch", "-f", str(fresh)], check=True,
                                   capture_output=True, stdin=subprocess.DEVNULL)
                    fresh.chmod(0o600)
                    fresh.with_name("key.pub").replace(pub)
                    fresh.replace(path)
    return path, pub.read_text().strip()


def checkpoint_dir(job_id: str) -> Path:
    """Local copies of a job's newest checkpoint (providers without a volume)."""
    return data_dir() / "checkpoints" / job_id


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def instance_cost(row: Any, until: datetime | None = None) -> tuple[Decimal, Decimal]:
    """(charged, amortised) for an instance row from create to terminate (or `until`)."""
    end = row.terminated_at or until or utcnow()
    hours = max(Decimal(0), Decimal(str((end - row.created_at).total_seconds())) / 3600)
    price = from_micros(row.price_per_hour_micros)
    billing = Billing(row.billing)
    if billing is Billing.MONTHLY:
        # price_per_hour of a monthly server row holds its monthly rent / 730.
        return Decimal(0), pricing.money(price * hours)
    return pricing.metered_cost(price, hours, billing), Decimal(0)


class JobRunner:
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
        self._stop: _Stop | None = None
        self._stop_lock = threading.Lock()
        self._factory: Any = None
        self._watching: tuple[str, str] | None = None  # (provider, instance id) to watch
        self._held: dict[int, tuple[str, str | None]] = {}  # instance row -> (provider, id)
        self._not_before = utcnow()  # when a deferred job may be claimed again
        self.progress: Progress | None = None
        from orchestrator.watchdog import Watchdog, deadlines_from_env

        self._watchdog = Watchdog(self.opts.stall_s if self.opts.stall_s is not None
                                  else deadlines_from_env())
        self._stalls = 0
        self._secrets_base: dict[int, str] = {}  # instance row -> orch's directory on the host

    # --- the whole job ---------------------------------------------------------------------

    def run(self, job_id: str) -> Job:
        """Drive the claimed job to succeeded, failed or cancelled (or requeued on SIGTERM)."""
        from playbooks.ssh import ConnectionFactory

        job = self.store.get_job(job_id)
        self.job_id = job_id
        self.progress = Progress(job_id, job.status, job.attempt)
        try:
            key_path, self.public_key = ensure_key(self.opts.ssh_key)
        except Exception as exc:  # OSError, CalledProcessError: fail the job, do not strand it
            return self._fail_early(f"cannot create orch's SSH key: {exc}")
        self._factory = ConnectionFactory(key_path, connect_timeout=10,
                                          connect_deadline=self.opts.connect_deadline_s)
        done = threading.Event()
        monitor = threading.Thread(target=self._monitor, args=(done,), daemon=True,
                                   name=f"orch-monitor-{job_id}")
        monitor.start()
        outcome: tuple[str, str] = ("failed", "the engine stopped unexpectedly")
        try:
            outcome = self._drive()
        except LeaseLost:
            outcome = ("lost", "another worker took the job over")
        except JobFailed as exc:
            outcome = ("failed", str(exc))
        except _Deferred as exc:
            outcome = ("deferred", str(exc))
            self._not_before = exc.not_before
        except _Stop as exc:
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
            self._finish(*outcome)
        return self.store.get_job(job_id)

    def _fail_early(self, reason: str) -> Job:
        """Fail a claimed job before anything was rented (nothing to tear down)."""
        with contextlib.suppress(LeaseLost):
            self._set("failed", reason, {"reason": reason}, failure_reason=reason)
        return self.store.get_job(self.job_id)

    def _finish(self, kind: str, reason: str) -> None:
        if kind in ("lost", "succeeded"):
            return
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
            if kind == "requeue":
                self._set("interrupted", f"worker stopping: {reason}; requeued to resume",
                          **fields)
                self._set("queued", "waiting for a worker to resume it", lease_owner=None,
                          lease_expires_at=None, attempt=self._job().attempt + 1)
                return
            status = "cancelled" if kind == "cancelled" else "failed"
            self._set(status, reason, {"reason": reason},
                      failure_reason=reason if status == "failed" else None, **fields)
            self._delete_volumes()
        except LeaseLost:
            pass

    def _drive(self) -> tuple[str, str]:
        job = self._job()
        from orchestrator.jobinputs import InputsError, load_inputs

        try:
            self.inputs = load_inputs(job)
        except InputsError as exc:
            raise JobFailed(str(exc)) from exc
        tried: set[tuple[str, str]] = set()
        while True:
            job = self._job()
            if job.interruptions >= self.opts.max_attempts:
                raise JobFailed(f"gave up after {job.interruptions} interruptions (preempted or "
                                "lost hosts); see `orch show " + job.id + "`")
            adopted = self._adopt()
            if job.phase_done == PHASES[-1]:
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
                host = self._connect(row_id, provider, inst)
                self._pipeline(host, row_id, provider, inst)
            except _Stop as stop:
                if stop.kind == "stalled":
                    self._stalled(row_id, provider, inst, stop)
                    continue
                if stop.kind != "interrupted":
                    raise
                self._interrupted(row_id, provider, inst, str(stop))
                continue
            except Exception as exc:
                if isinstance(exc, JobFailed | LeaseLost):
                    raise
                stalled = self._stop
                if stalled is not None and stalled.kind == "stalled":
                    # The watchdog closed the connections: this error is the stall's.
                    self._stalled(row_id, provider, inst, stalled)
                    continue
                lost = self._instance_lost(provider, inst)
                if lost is None:
                    raise JobFailed(_reason(exc)) from exc
                self._interrupted(row_id, provider, inst, lost)
                continue
            self._release(row_id, "released")
            failpoint("after-terminate")
            return self._succeed()

    def _succeed(self) -> tuple[str, str]:
        cost, storage, amortised = self._costs()
        self._delete_volumes()
        self._set("succeeded", f"succeeded; cost {pricing.usd(cost + storage)}",
                  {"cost": str(cost + storage)},
                  cost_micros=to_micros(cost + storage), storage_micros=to_micros(storage),
                  amortised_micros=to_micros(amortised))
        return "succeeded", ""

    def _outage(self, why: str, asked_s: float | None = None) -> None:
        """No placement because providers are unavailable: wait (foreground) or requeue
        with a backoff (worker); fail once the outage outlasts the job's limit."""
        from datetime import timedelta

        job = self._job()
        now = utcnow()
        since = job.outage_since or now
        age = (now - since).total_seconds()
        limit = recovery.outage_limit_s(job, self.opts.outage_limit_s)
        if age >= limit:
            raise JobFailed(f"{why}; gave up after {age:.0f}s of provider outage (limit "
                            f"{limit:.0f}s)")
        wait = recovery.backoff_s(age, self.opts.backoff_s, self.opts.backoff_max_s)
        if asked_s is not None:  # never sooner than the provider asked (429 Retry-After)
            wait = max(wait, min(asked_s, limit - age))
        if job.outage_since is None:
            self.store.update_job_fields(self.job_id, outage_since=now)
        message = (f"{why}; the job stays queued and is retried in {wait:.0f}s (fails after "
                   f"{limit:.0f}s of outage)")
        if self.on_signal == "requeue":  # a worker: let it run other jobs meanwhile
            raise _Deferred(message, now + timedelta(seconds=wait))
        # `orch submit` in the foreground: wait here, holding the lease.
        self._set("queued", message, {"retry_in_s": wait})
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            self._check_stop()
            time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))

    # --- placement and provisioning --------------------------------------------------------------

    def _adopt(self) -> tuple[int, Provider, Instance] | None:
        """After a takeover: reuse the job's instance if it is still running, else clean up."""
        rows = [r for r in self.store.instances_of(self.job_id) if r.terminated_at is None]
        adopted: tuple[int, Provider, Instance] | None = None
        for row in rows:
            provider = self.providers.get(row.provider)
            if provider is None or row.id is None:
                continue
            if row.provider_instance_id is None:
                # Created, maybe, but the id never reached the database: find it by its tag.
                found = self._tagged(provider, row.provider)
                if not found:
                    self._close_row(row.id, "failed")
                    continue
                row = self.store.update_instance(row.id, provider_instance_id=found[0])
            assert row.provider_instance_id is not None and row.id is not None
            try:
                inst = provider.get(row.provider_instance_id)
            except NotFound:
                self._close_row(row.id, "interrupted")
                continue
            except ProviderError:
                inst = None
            self._held[row.id] = (row.provider, row.provider_instance_id)
            if adopted is None and inst is not None and inst.state not in _LOST:
                self._event("instance.adopted", f"reattaching to {row.provider} instance "
                            f"{row.provider_instance_id} after a takeover")
                adopted = (row.id, provider, inst)
            else:
                self._release(row.id, "interrupted")
        # Instances tagged with this job that no row knows (a crash inside create). Only
        # the providers this job can use or has used are asked: another provider being down
        # must not stall this job (sweeping those is `orch reconcile`'s work).
        mine = set(self._usable()) | {r.provider for r in rows}
        for name, provider in self.providers.items():
            if name in mine:
                self._orphan_sweep(provider, name)
        return adopted

    def _usable(self) -> list[str]:
        """The configured providers this job may be placed on."""
        from orchestrator.planning import constraints_from

        named = constraints_from(self.inputs.loaded).providers
        return [name for name in self.providers
                if (named is None or name in named)
                # the simulated cloud only runs jobs that ask for it
                and not (name == "sim" and (named is None or "sim" not in named))]

    def _tagged(self, provider: Provider, name: str) -> list[str]:
        if name == "dedicated" or recovery.OUTAGES.down(provider):
            return []  # a provider in an outage is swept by `orch reconcile` later
        try:
            return [i.instance_id for i in provider.list(self.job_id)]
        except TransientError:
            recovery.OUTAGES.mark(provider, self.opts.backoff_s)
            return []
        except ProviderError:
            return []

    def _candidates(self) -> list[Any]:
        """Placements over live offers of the job's providers, cheapest first."""
        from orchestrator import scheduler
        from orchestrator.planning import constraints_from, total_tokens, workload_from
        from providers import catalog

        loaded = self.inputs.loaded
        constraints = constraints_from(loaded)
        named = constraints.providers
        offers: list[Offer] = []
        notes: list[str] = []
        unavailable: list[str] = []
        asked_wait: float | None = None  # the longest Retry-After a provider sent
        for name in self._usable():
            provider = self.providers[name]
            down = recovery.OUTAGES.down(provider)
            if down:
                unavailable.append(f"{name}: unavailable (an outage seen moments ago; asked "
                                   f"again in {down:.0f}s)")
                continue
            answered = True
            for count in (1, 2, 4, 8):
                if count > constraints.max_gpus:
                    break
                spot = {"required": True, "never": False}.get(constraints.spot)
                req = Requirements(gpu_count=count, min_gpu_memory_bytes=0,
                                   gpus=constraints.gpus, interruptible=spot,
                                   max_price_per_hour=constraints.max_price_per_hour,
                                   disk_gb=self.opts.disk_gb,
                                   min_cuda=images.min_cuda(
                                       self.inputs.loaded.spec.trainer.image))
                try:
                    offers += provider.offers(req)
                except (AuthError, BalanceError, QuotaError) as exc:
                    notes.append(f"{name}: {exc}")
                    break
                except TransientError as exc:  # after the adapter's retries: an outage
                    unavailable.append(f"{name}: provider unavailable ({exc})")
                    if exc.retry_after is not None:
                        asked_wait = max(asked_wait or 0.0, exc.retry_after)
                    recovery.OUTAGES.mark(provider, max(self.opts.backoff_s,
                                                        exc.retry_after or 0.0))
                    answered = False
                    break
                except ProviderError as exc:
                    notes.append(f"{name}: offers unavailable ({exc})")
                    break
            if answered:
                recovery.OUTAGES.clear(provider)
        for note in notes + unavailable:
            self._event("offers.note", note)
        # Dedicated servers answer every GPU count they can serve: keep each offer once
        # (a Vast.ai machine's spot and on-demand offers share an id: both are kept).
        offers = list({(o.provider, o.offer_id, o.gpu_count, o.interruptible): o
                       for o in offers}.values())
        w = workload_from(loaded)
        ranking = scheduler.rank(w, total_tokens(loaded), offers, catalog.gpus(), constraints,
                                 measured=self.inputs.measured)
        if not ranking.placements:
            if unavailable:
                # Not a verdict on the job: what the unavailable providers offer is unknown.
                raise recovery.ProvidersUnavailable("; ".join(unavailable + notes),
                                                    retry_after=asked_wait)
            if not offers:
                which = ", ".join(sorted(named)) if named else ", ".join(
                    n for n in sorted(self.providers) if n != "sim")
                raise JobFailed(f"no offers from {which or 'any provider'}"
                                + (f" ({'; '.join(notes)})" if notes else "")
                                + "; add credentials (VAST_API_KEY, RUNPOD_API_KEY), register "
                                "a server with `orch servers add`, or try the simulated cloud "
                                "with `resources.providers: [sim]`")
            raise JobFailed(scheduler.no_fit_message(w, offers, ranking, constraints))
        return list(ranking.placements)

    def _place(self, tried: set[tuple[str, str]]) -> tuple[int, Provider, Instance]:
        placements = [p for p in self._candidates()
                      if (p.offer.provider, p.offer.offer_id) not in tried]
        failures: list[str] = []
        transient = 0
        for placement in placements[: self.opts.max_placements]:
            offer = placement.offer
            tried.add((offer.provider, offer.offer_id))
            provider = self.providers[offer.provider]
            self._check_stop()
            job = self._set("provisioning", _placing(offer),
                            {"placement": placement.to_dict()},
                            provider=offer.provider, gpu=offer.gpu, gpu_count=offer.gpu_count,
                            billing=offer.billing.value, interruptible=offer.interruptible,
                            est_hours=placement.est_hours,
                            est_cost_micros=to_micros(placement.est_cost,
                                                      rounding=ROUND_HALF_EVEN))
            hourly = offer.price_per_hour
            if hourly is None and offer.monthly_price is not None:
                hourly = offer.monthly_price / HOURS_PER_MONTH  # the amortisation rate
            row = self.store.add_instance(
                self.job_id, provider=offer.provider, offer_id=offer.offer_id, gpu=offer.gpu,
                gpu_count=offer.gpu_count, billing=offer.billing.value,
                interruptible=offer.interruptible, price_per_hour=hourly or Decimal(0),
                attempt=job.attempt)
            assert row.id is not None
            self._held[row.id] = (offer.provider, None)
            try:
                # A rental is created from the image it runs: the cloud variant (sshd on
                # PUBLIC_KEY); a monthly server ignores it and runs the trainer in Docker.
                inst = provider.create(offer, self.public_key, self.job_id,
                                       image=images.for_host(
                                           self.inputs.loaded.spec.trainer.image, "container"),
                                       disk_gb=self.opts.disk_gb)
            except CapacityError as exc:
                failures.append(f"{offer.provider} {offer.offer_id}: {exc}")
                self._event("provision.capacity", f"{offer.provider} {offer.gpu} "
                            f"x{offer.gpu_count}: {exc}; trying the next offer")
                self._close_row(row.id, "capacity")
                continue
            except TransientError as exc:
                failures.append(f"{offer.provider} {offer.offer_id}: {exc}")
                transient += 1
                self._event("provision.transient", f"{offer.provider}: {exc} (after retries); "
                            "trying the next offer")
                self._orphan_sweep(provider, offer.provider)
                self._close_row(row.id, "failed")
                continue
            except (AuthError, BalanceError, QuotaError) as exc:
                self._close_row(row.id, "failed")
                raise JobFailed(f"{offer.provider}: {exc}") from exc
            failpoint("after-create")
            price = inst.price_per_hour if inst.price_per_hour is not None else hourly
            if offer.billing is Billing.MONTHLY:
                price = hourly  # the rent is paid: the row keeps the amortisation rate
            self.store.update_instance(
                row.id, provider_instance_id=inst.instance_id, state=inst.state.value,
                price_per_hour_micros=to_micros(price or Decimal(0), rounding=ROUND_HALF_EVEN))
            self._held[row.id] = (offer.provider, inst.instance_id)
            self._event("instance.created",
                        f"registered server {inst.instance_id} claimed (rent already paid: no "
                        f"marginal cost; {pricing.usd(price)}/h amortised)"
                        if offer.registered else f"{offer.provider} instance "
                        f"{inst.instance_id} at {pricing.usd(price)}/h",
                        {"instance": inst.instance_id, "price_per_hour": str(price)})
            # Placed: the outage (if any) is over, and phases done on an earlier instance
            # are not on this one.
            self.store.update_job_fields(self.job_id, outage_since=None, not_before=None,
                                         phase_done=None)
            return row.id, provider, inst
        if failures and transient == len(failures):
            raise recovery.ProvidersUnavailable("no placement could be provisioned, the "
                                                "providers are unavailable: "
                                                + "; ".join(failures))
        raise JobFailed("no placement could be provisioned: " + "; ".join(failures)
                        if failures else "no placement left to try (all failed before)")

    def _orphan_sweep(self, provider: Provider, name: str) -> None:
        """Terminate instances tagged with this job that no instance row knows: a create
        that failed after retries, or a crash inside create, may still have rented one."""
        known = {r.provider_instance_id for r in self.store.instances_of(self.job_id)}
        for iid in self._tagged(provider, name):
            if iid not in known:
                self._event("instance.orphan", f"terminating untracked {name} instance "
                            f"{iid} tagged with this job")
                with contextlib.suppress(ProviderError):
                    provider.terminate(iid)

    # --- connecting -----------------------------------------------------------------------------

    def _connect(self, row_id: int, provider: Provider, inst: Instance) -> Any:
        from playbooks import ssh
        from playbooks.base import Host, HostPaths

        self._set("connecting", f"waiting for {inst.provider} instance {inst.instance_id}")
        self._watching = None
        deadline = time.monotonic() + self.opts.boot_deadline_s
        while not inst.reachable:
            self._check_stop()
            if inst.state in _LOST:
                why = inst.message or inst.raw_status
                raise _Stop("interrupted", f"{inst.provider} instance {inst.instance_id} "
                            f"{inst.state.value} before it booted: {why}")
            if time.monotonic() > deadline:
                self._release(row_id, "unreachable")
                raise _Stop("interrupted", f"{inst.provider} instance {inst.instance_id} not "
                            f"running after {self.opts.boot_deadline_s:.0f}s")
            time.sleep(min(1.0, self.opts.watch_s))
            try:
                inst = provider.get(inst.instance_id)
            except NotFound as exc:
                raise _Stop("interrupted", f"{inst.provider} instance {inst.instance_id} "
                            "vanished while booting") from exc
            except TransientError:
                continue
        assert inst.ssh_host and inst.ssh_port
        host_key = inst.host_key or self._known_host_key(row_id, inst)
        if host_key is None:
            host_key = ssh.format_host_key(ssh.trust_on_first_use(
                inst.ssh_host, inst.ssh_port, deadline=self.opts.connect_deadline_s))
            if inst.provider == "dedicated":
                self.store.set_server_host_key(inst.instance_id.removeprefix("server:"),
                                               host_key)
        self.store.update_instance(row_id, host=inst.ssh_host, port=inst.ssh_port,
                                   ssh_user=inst.ssh_user, host_key=host_key,
                                   state=inst.state.value)
        self._watching = (inst.provider, inst.instance_id)
        try:
            conn = self._factory.connect(inst.ssh_host, inst.ssh_port, inst.ssh_user, host_key)
        except ssh.HostUnreachable as exc:
            self._release(row_id, "unreachable")
            raise _Stop("interrupted", f"SSH to {inst.provider} instance {inst.instance_id} "
                        f"failed: {exc}") from exc
        self._event("connected", f"ssh {inst.ssh_user}@{inst.ssh_host}:{inst.ssh_port} "
                    f"(host key {ssh.fingerprint(ssh.parse_host_key(host_key))})")
        # Simulated machines keep the server's filesystem under a directory and their
        # provider says where; a real provider has no such capability: paths as they are.
        return Host(conn, HostPaths(host_root(provider, inst)), command_timeout=3600)

    def _known_host_key(self, row_id: int, inst: Instance) -> str | None:
        for row in self.store.instances_of(self.job_id):
            if row.id == row_id and row.host_key:
                return row.host_key
        if inst.provider == "dedicated":
            name = inst.instance_id.removeprefix("server:")
            for server in self.store.list_servers():
                if server.name == name:
                    return server.host_key
        return None

    # --- the pipeline ---------------------------------------------------------------------------

    def _pipeline(self, host: Any, row_id: int, provider: Provider, inst: Instance) -> None:
        from playbooks import artifacts, merge, pipeline
        from playbooks.base import PlaybookFailed, run_playbook

        job = self._job()
        pj = self.inputs.pipeline_job(job, inst, vllm_port=_free_port()
                                      if _is_loopback(inst.ssh_host or "") else 8000,
                                      poll_s=self.opts.poll_s)
        emit = self._emit
        self._set("preparing", "GPU check, Container Toolkit, base model to NVMe")
        try:
            cache, runner = pipeline.prepare(host, pj, emit)
        except PlaybookFailed as exc:
            if exc.playbook == "gpu" and inst.provider == "dedicated":
                # Not chosen again until fixed: `orch servers check NAME` clears it.
                self.store.record_server_check(inst.instance_id, error=exc.reason)
                self._event("server.failed_check", f"server {inst.instance_id} failed its GPU "
                            f"check and will not be used until `orch servers check "
                            f"{inst.instance_id}` passes: {exc.reason}")
            raise
        self._check_stop()
        assert cache.layout is not None
        if inst.provider == "dedicated":  # a server we keep: its secrets go when the job ends
            self._secrets_base[row_id] = cache.layout.base
        tj = pipeline.train_job(pj, cache.layout, cache.model_dir, runner, host.paths)
        done = PHASES[:PHASES.index(job.phase_done) + 1] if job.phase_done in PHASES else ()
        if "training" in done:  # a takeover on the same instance after training ended
            train_seconds = job.train_seconds or 0.0
            self._event("resume", f"{job.phase_done} already done on this instance; "
                        "resuming after it")
        else:
            train_seconds = self._train(host, job, pj, tj, provider, inst)
        if "merging" not in done:
            self._set("merging", "merging the adapter into the base model"
                      if tj.adapter else "nothing to merge (full fine-tune)",
                      train_seconds=train_seconds, tokens=self.inputs.tokens,
                      phase_done="training")
            failpoint("merging")
            run_playbook("merge", merge.steps(tj, poll_s=min(self.opts.poll_s, 2.0)), host,
                         emit)
            self.store.update_job_fields(self.job_id, phase_done="merging")
        self._check_stop()
        if "artifacts" not in done:
            # The trained model comes back before evaluation starts: nothing that fails after
            # training (an eval set, lm-eval on the host) may lose what the GPU hours paid for.
            fetched = artifacts.fetch(host, tj.output_dir, pj.artifacts_dir,
                                      include_merged=pj.include_merged)
            self._event("artifacts", f"{len(fetched.copied)} files copied to "
                        f"{pj.artifacts_dir}", {"copied": len(fetched.copied),
                                                "skipped": len(fetched.skipped)})
            self.store.update_job_fields(self.job_id, artifacts_dir=pj.artifacts_dir,
                                         phase_done="artifacts")
            self._record_throughput(inst, train_seconds)
        spec = self.inputs.loaded.spec
        if spec.eval.eval_set or spec.eval.tasks:
            self._check_stop()
            self._evaluate(host, pj, tj, cache.layout, inst, provider)
        # Durable: a crash from here on finishes the job without renting again.
        self.store.update_job_fields(self.job_id, phase_done=PHASES[-1])
        self._check_stop()
        self._set("releasing", "artifacts copied to " + pj.artifacts_dir
                  + "; releasing the instance")
        failpoint("releasing")

    def _train(self, host: Any, job: Job, pj: Any, tj: Any, provider: Provider,
               inst: Instance) -> float:
        """Start (or resume, or reattach to) training and wait for it; its seconds."""
        from playbooks import train
        from playbooks.base import run_playbook

        emit = self._emit
        self._set("training", "training (detached on the host)")
        failpoint("training")
        status = train.status(host, tj)
        mirrored = not hasattr(provider, "volume_dir")  # no volume: keep checkpoints here
        local = checkpoint_dir(self.job_id)
        if status.state is not train.TrainState.RUNNING and (
                job.attempt > 0 or status.state is train.TrainState.FAILED):
            if mirrored:
                from playbooks import checkpoints

                restored = checkpoints.restore(host, tj, local)
                if restored is not None:
                    self._event("checkpoint.restored", f"uploaded checkpoint-{restored} "
                                "from the local copy to the new instance", {"step": restored})
            reached = self.progress.step if self.progress else None  # on the lost instance
            info = train.prepare_resume(host, tj)
            lost = info.lost_steps or 0
            if reached is not None:
                # A fresh machine has no log of the earlier run: count from what we saw.
                lost = max(lost, reached - info.step)
            if info.step or lost:
                self._event("resume", f"resuming from step {info.step} "
                            f"({info.checkpoint or 'no checkpoint'}); {lost} steps to redo",
                            {"step": info.step, "lost_steps": lost,
                             "moved_aside": list(info.moved_aside)})
            if lost:
                self._set("training", f"resumed from step {info.step}",
                          lost_steps=job.lost_steps + lost)
        started = time.monotonic()
        run_playbook("train", train.steps(tj), host, emit)
        next_mirror = 0
        while True:
            self._check_stop()
            step = self.progress.step if self.progress else None
            if mirrored and step is not None and step >= next_mirror:
                next_mirror = step + max(1, pj.config.save_steps)
                self._mirror(host, tj, local)
            # Short waits, so a cancel or a lost instance is noticed between polls too.
            status = train.wait(host, tj, self._on_train_progress, poll_s=self.opts.poll_s,
                                deadline=time.monotonic() + max(self.opts.watch_s,
                                                                self.opts.poll_s),
                                on_tail=self._keep_train_log)
            if status.state is not train.TrainState.RUNNING:
                break
        train_seconds = time.monotonic() - started
        if status.state is train.TrainState.FAILED:
            self._check_stop()
            if self._instance_lost(provider, inst) is None:
                tail = train.log_tail(host, tj, 30).strip()[-1500:]
                raise JobFailed(f"training exited with {status.exit_code}; the last lines of "
                                f"its log:\n{tail}")
            raise _Stop("interrupted", "training stopped with its host")
        self._check_stop()
        return train_seconds

    def _evaluate(self, host: Any, pj: Any, tj: Any, layout: Any, inst: Instance,
                  provider: Provider) -> None:
        """Evaluate the copied-back model; a failure fails the job, keeping its artifacts."""
        from playbooks import evaluate, merge

        self._set("evaluating", "serving the model with vLLM and scoring the evaluation"
                  if tj.runner == "docker" else "scoring the model with lm-eval (hf backend)")
        failpoint("evaluating")
        try:
            result = evaluate.evaluate(host, pj.job_id, merge.merged_dir(tj), layout,
                                       pj.vllm_image, pj.vllm_port, pj.config.sequence_len,
                                       self.inputs.eval_rows(), tasks=pj.eval_tasks,
                                       emit=self._emit,
                                       # A rented machine is destroyed next; a registered
                                       # server is kept, so its GPU must be freed.
                                       stop_after=inst.provider == "dedicated",
                                       runner=tj.runner, native_wrap=tj.native.wrap)
        except Exception as exc:
            if isinstance(exc, JobFailed | LeaseLost | _Stop) or \
                    self._instance_lost(provider, inst) is not None:
                raise  # not the evaluation's fault: a lost host is an interruption
            reason = (f"evaluation failed: {_reason(exc)}\nThe trained model is kept in "
                      f"{pj.artifacts_dir}. {EVAL_AGAIN}")
            self._event("evaluation.failed", reason, {"artifacts_dir": pj.artifacts_dir})
            raise JobFailed(reason) from exc
        if result.metrics:
            self.store.add_metrics(self.job_id, result.metrics)
            self._event("metrics", ", ".join(f"{k}={v:g}" for k, v in
                                             sorted(result.metrics.items())),
                        dict(result.metrics))

    def _mirror(self, host: Any, tj: Any, local: Path) -> None:
        from playbooks import checkpoints

        copied = checkpoints.mirror(host, tj, local)
        if copied is not None and copied.copied:
            self._event("checkpoint.mirrored", f"checkpoint-{copied.step} copied off the host "
                        f"({copied.bytes / 1e6:.1f} MB)", {"step": copied.step,
                                                           "bytes": copied.bytes})

    def _record_throughput(self, inst: Instance, seconds: float) -> None:
        # Only an uninterrupted run on a real machine measures the hardware: the simulated
        # cloud trains at whatever speed its stand-in is told to.
        job = self._job()
        if inst.provider == "sim" or job.interruptions or seconds <= 0 or not job.gpu:
            return
        from orchestrator import throughput

        size = throughput.size_class(self.inputs.loaded.architecture.params)
        self.store.add_throughput(self.job_id, job.gpu, job.gpu_count or 1, job.method, size,
                                  self.inputs.tokens / seconds)

    def _keep_train_log(self, text: str) -> None:
        # `orch logs ID --train` reads this copy; it outlives the instance.
        from orchestrator import trainlog

        try:
            trainlog.save(self.job_id, text)
        except OSError as exc:  # a full disk must not fail the job
            log.warning("cannot keep the training log of %s: %s", self.job_id, exc)

    def _on_train_progress(self, p: Any) -> None:
        assert self.progress is not None
        if p.step == self.progress.step and p.loss == self.progress.loss:
            return  # each short wait reports the current step again
        self.progress.step, self.progress.total, self.progress.loss = p.step, p.total, p.loss
        if p.loss is not None:
            self.store.add_metrics(self.job_id, {"train.loss": p.loss}, step=p.step)
        self._event("train.progress", f"step {p.step}/{p.total}"
                    + (f" loss {p.loss:.4f}" if p.loss is not None else ""),
                    {"step": p.step, "total": p.total, "loss": p.loss})
        self._notify()

    def _emit(self, report: Any) -> None:
        self._watchdog.progress()  # a playbook step completed
        self.store.add_event(self.job_id, report.kind, f"{report.playbook}/{report.step}"
                             + (f": {report.message}" if report.message else ""), report.data())

    # --- interruptions and teardown -------------------------------------------------------------

    def _instance_lost(self, provider: Provider, inst: Instance) -> str | None:
        """Why the instance is gone (the pipeline error was its loss), or None if it is fine."""
        if self._stop is not None and self._stop.kind == "interrupted":
            return str(self._stop)
        self._check_stop()
        for _ in range(3):
            try:
                now = provider.get(inst.instance_id)
            except NotFound:
                return f"{inst.provider} instance {inst.instance_id} is gone"
            except ProviderError:
                time.sleep(1)
                continue
            if now.state in _LOST:
                return (f"{inst.provider} instance {inst.instance_id} {now.state.value}: "
                        f"{now.message or now.raw_status}")
            return None
        return None

    def _stalled(self, row_id: int, provider: Provider, inst: Instance, stop: _Stop) -> None:
        """The watchdog stopped a silent attempt: re-place it, or fail after stall_retries."""
        self._stalls += 1
        self._event("watchdog.stalled", str(stop), {"instance": inst.instance_id,
                                                    "stalls": self._stalls})
        if self._stalls > self.opts.stall_retries:
            with self._stop_lock:
                self._stop = None
            raise JobFailed(f"stopped by the watchdog: {stop}")
        self._interrupted(row_id, provider, inst, f"stopped by the watchdog: {stop}")

    def _interrupted(self, row_id: int, provider: Provider, inst: Instance, why: str) -> None:
        with self._stop_lock:  # together: a late report about this instance is then ignored
            self._stop = None
            self._watching = None
        self._factory.close_all()
        job = self._job()
        self._set("interrupted", why, {"instance": inst.instance_id},
                  interruptions=job.interruptions + 1)
        self._release(row_id, "interrupted")
        self._set("queued", "re-placing to resume from the last checkpoint",
                  attempt=job.attempt + 1)

    def _release(self, row_id: int, reason: str) -> None:
        """Terminate (or release) one instance and close its row with its cost."""
        held = self._held.get(row_id)
        if held is None:
            return
        name, iid = held
        provider = self.providers.get(name)
        if name == "dedicated":
            self._scrub_secrets(row_id)
        if iid is not None and provider is not None:
            for attempt in range(3):
                try:
                    provider.terminate(iid)
                    break
                except NotFound:
                    break
                except ProviderError as exc:
                    if attempt == 2:
                        self._event("teardown.failed", f"could not terminate {name} {iid}: "
                                    f"{exc}; `orch reconcile` will retry")
                        return
                    time.sleep(1 + attempt)
        self._close_row(row_id, reason)
        self._held.pop(row_id, None)
        self._event("instance.released" if name == "dedicated" else "instance.terminated",
                    f"{name} instance {iid} {'released' if name == 'dedicated' else 'terminated'}"
                    f" ({reason})", {"instance": iid, "reason": reason})

    def _scrub_secrets(self, row_id: int) -> None:
        """Remove HF_TOKEN's files from a server we keep, before it is released (issue 10 §6).

        Rented machines are destroyed with their disks; a monthly server is not. The pipeline's
        connection may have been closed (cancel, watchdog): connect again with the pinned key.
        """
        base = self._secrets_base.pop(row_id, None)
        if not base:
            return
        from playbooks import secrets, ssh
        from playbooks.base import Host, StepFailed

        row = next((r for r in self.store.instances_of(self.job_id) if r.id == row_id), None)
        if row is None or not (row.host and row.port and row.host_key):
            return
        try:
            conn = self._factory.connect(row.host, row.port, row.ssh_user or "root",
                                         row.host_key)
            removed = secrets.scrub(Host(conn), base)
        except (ssh.SSHError, StepFailed) as exc:
            self._event("secrets.left", f"could not remove secret files from {row.host}: "
                        f"{exc}; `orch reconcile` retries")
            return
        if removed:
            self._event("secrets.removed", f"removed {len(removed)} secret file(s) from the "
                        "server", {"files": len(removed)})

    def _close_row(self, row_id: int, reason: str) -> None:
        now = utcnow()
        row = self.store.update_instance(row_id, terminated_at=now, state="terminated",
                                         end_reason=reason)
        charged, amortised = instance_cost(row, now)
        self.store.update_instance(row_id, cost_micros=to_micros(charged),
                                   amortised_micros=to_micros(amortised))
        self._held.pop(row_id, None)

    def _teardown_all(self, outcome: str) -> None:
        if outcome == "lost":
            return  # the new owner drives these instances now
        for row_id in list(self._held):
            try:
                self._release(row_id, {"succeeded": "released", "cancelled": "cancelled",
                                       "requeue": "interrupted"}.get(outcome, "failed"))
            except Exception:  # keep tearing the others down; reconcile finds what is left
                log.exception("teardown of instance row %s", row_id)

    def _delete_volumes(self) -> None:
        import shutil

        shutil.rmtree(checkpoint_dir(self.job_id), ignore_errors=True)
        for provider in self.providers.values():
            delete = getattr(provider, "delete_volume", None)
            if delete is not None:
                with contextlib.suppress(Exception):
                    delete(self.job_id)

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
                rate = getattr(provider, "volume_per_gb_month", None)
                if rate and name in used:
                    hours = Decimal(str((now - job.started_at).total_seconds())) / 3600
                    storage += pricing.money(Decimal(self.opts.disk_gb) * rate * hours
                                             / HOURS_PER_MONTH)
        return pricing.money(charged), storage, pricing.money(amortised)

    # --- the monitor thread ---------------------------------------------------------------------

    def _monitor(self, done: threading.Event) -> None:
        period = max(0.2, min(self.opts.watch_s, self.opts.lease_s / 3))
        last_lease = 0.0
        while not done.wait(period):
            try:
                if time.monotonic() - last_lease >= self.opts.lease_s / 3:
                    job = self.store.renew_lease(self.job_id, self.owner, self.opts.lease_s)
                    last_lease = time.monotonic()
                    if job is None:
                        self._signal(_Stop("lost", "lease lost"))
                        return
                    if job.cancel_requested_at is not None:
                        self._signal(_Stop("cancelled", "cancelled by `orch cancel`"))
                stalled = self._watchdog.overdue()
                if stalled is not None:
                    self._signal(_Stop("stalled", stalled))
                watching = self._watching
                if watching is not None:
                    provider = self.providers[watching[0]]
                    try:
                        inst = provider.get(watching[1])
                    except NotFound:
                        self._signal(_Stop("interrupted", f"{watching[0]} instance "
                                           f"{watching[1]} is gone"), watching)
                        continue
                    if inst.state in _LOST:
                        self._signal(_Stop("interrupted", f"{watching[0]} instance "
                                           f"{watching[1]} {inst.state.value}: "
                                           f"{inst.message or inst.raw_status}"), watching)
                self._notify()
            except Exception:  # the monitor must outlive a database hiccup
                log.exception("monitor of job %s", self.job_id)

    def _signal(self, stop: _Stop, about: tuple[str, str] | None = None) -> None:
        with self._stop_lock:
            if self._stop is not None:
                return
            if about is not None and self._watching != about:
                # The engine already handled this instance's loss and moved on (a slow
                # provider.get raced `_interrupted`): a stale report must not stop the next
                # placement, which failed the job on a busy machine (issue 10 §8).
                return
            self._stop = stop
        self._watching = None
        # Whatever the pipeline is blocked on over SSH fails now instead of at its timeout.
        self._factory.close_all()

    def _check_stop(self) -> None:
        stop = self._stop
        if stop is None:
            return
        if stop.kind == "lost":
            raise LeaseLost(str(stop))
        raise stop

    # --- bookkeeping ------------------------------------------------------------------------------

    def _job(self) -> Job:
        return self.store.get_job(self.job_id)

    def _set(self, status: str, message: str = "", data: dict[str, Any] | None = None,
             **fields: Any) -> Job:
        job = self.store.set_status(self.job_id, self.owner, status, message, data, **fields)
        self._watchdog.phase(status)
        if self.progress is not None:
            self.progress.status = status
            self.progress.attempt = job.attempt
            self.progress.message = message
            self._notify()
        return job

    def _event(self, kind: str, message: str, data: dict[str, Any] | None = None) -> None:
        self.store.add_event(self.job_id, kind, message, data)
        self._watchdog.progress()
        if self.progress is not None and kind != "train.progress":
            self.progress.message = message
            self._notify()

    def _notify(self) -> None:
        if self.on_progress is None or self.progress is None:
            return
        try:
            cost, storage, _ = self._costs()
            self.progress.cost = cost + storage
            self.on_progress(self.progress)
        except Exception:
            log.debug("progress display failed", exc_info=True)


def _placing(offer: Offer) -> str:
    """The provisioning message: a registered server is claimed, not rented (issue 12 §4)."""
    if offer.registered:
        return (f"claiming registered server {offer.offer_id.removeprefix('server:')} "
                f"({offer.gpu} x{offer.gpu_count}, no marginal cost)")
    return (f"renting {offer.provider} {offer.gpu} x{offer.gpu_count} "
            f"({'spot' if offer.interruptible else 'on-demand'})")


def _reason(exc: BaseException) -> str:
    from playbooks.base import PlaybookFailed

    if isinstance(exc, PlaybookFailed):
        tail = f"\n{exc.stderr_tail.strip()[-800:]}" if exc.stderr_tail.strip() else ""
        return f"{exc} (fault: {exc.fault.value}){tail}"
    return f"{type(exc).__name__}: {exc}"

