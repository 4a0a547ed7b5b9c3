"""What the collaborators of a job's runner share: options, the run's state, its bookkeeping.

`orchestrator.engine.runner.JobRunner` drives one claimed job with three collaborators,
`placement.Placement`, `hostsession.HostSession` and `teardown.Teardown`. What they share is
one explicit object per run, `RunState` (the instances held, one `Attempt` record each, the
stop signal, the SSH connections), with its `Ledger` (the job's record: status changes,
events, progress, cost so far); the instance one placement holds is a `Placed`. The
monitor thread that renews the lease and raises the stop signals (cancel, lease lost,
stalled, instance lost) is `monitor` here. Each collaborator is handed what it uses when it
is built: teardown needs only the run's state; placement and the host session also the
job's inputs and the teardown (to release what they cannot use).
"""

from __future__ import annotations

import fcntl
import logging
import os
import secrets
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path
from typing import Unpack

from orchestrator.core import money
from orchestrator.core.jobstatus import JobStatus
from orchestrator.core.paths import data_dir
from orchestrator.core.planning import DISK_GB
from orchestrator.core.scheduler import Placement
from orchestrator.core.settings import settings
from orchestrator.core.states import EventKind, StopKind
from orchestrator.engine import recovery
from orchestrator.engine.jobinputs import checkpoint_dir as checkpoint_dir  # re-exported
from orchestrator.engine.notifications import Notices
from orchestrator.engine.watchdog import Watchdog
from orchestrator.records.store import (
    Job,
    JobUpdate,
    LeaseLost,
    Store,
    StoreError,
    to_micros,
    utcnow,
)
from playbooks.base import PlaybookFailed
from playbooks.pipeline import DURABLE, PipelineRun
from playbooks.ssh import ConnectionFactory
from providers.base import Instance, InstanceState, NotFound, Offer, Provider

log = logging.getLogger("orchestrator.engine.runner")

# States the provider reports for a machine that will not come back for this job.
LOST = (InstanceState.INTERRUPTED, InstanceState.TERMINATED, InstanceState.FAILED)

# How to evaluate a job's model again without training it again (docs/playbooks.md).
EVAL_AGAIN = ("To run only the evaluation again, fix its cause and follow \"Re-running only "
              "the evaluation\" in docs/playbooks.md (the training is not repeated).")

# The Stop's reason; the job's record says in which phase, what stayed.
CANCELLED = StopKind.CANCELLED.value

# The pipeline phases whose completion is recorded in job.phase_done, in order (one list:
# playbooks.pipeline's); what a takeover resumes is orchestrator.engine.recovery's policy.
PHASES = DURABLE


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
    disk_gb: int = DISK_GB
    ssh_key: Path | None = None  # default: data_dir()/ssh/id_ed25519, created on first use
    # Per-phase no-progress deadlines (orchestrator/engine/watchdog.py); None: defaults +
    # ORCH_STALL_*.
    stall_s: Mapping[JobStatus, float] | None = None
    stall_retries: int = 1  # a stalled attempt is re-placed this often, then the job fails
    # Provider outages (orchestrator.engine.recovery): first wait, longest wait, and how long a job
    # waits out a continuous outage before it fails.
    backoff_s: float = recovery.BACKOFF_S
    backoff_max_s: float = recovery.BACKOFF_MAX_S
    outage_limit_s: float = recovery.OUTAGE_LIMIT_S
    # How long a slow training's rate is measured before a move is weighed (None: the
    # policy's, orchestrator/core/data/hostmemory.yaml `move.min_observed_s`).
    move_observed_s: float | None = None


class JobFailed(Exception):
    """The job cannot finish; the message is the failure reason shown to the user."""


class Deferred(Exception):
    """Requeue the job to try again at `not_before` (its providers are unavailable)."""

    def __init__(self, message: str, not_before: datetime) -> None:
        super().__init__(message)
        self.not_before = not_before


class Stop(Exception):
    """The monitor stopped the pipeline: cancelled, or the instance was lost."""

    def __init__(self, kind: StopKind, message: str, *, given_up: bool = False) -> None:
        super().__init__(message)
        self.kind = kind
        self.given_up = given_up  # INTERRUPTED by orch's own choice: not a preemption


class Terminated(BaseException):
    """SIGTERM arrived: tear down, then exit (raised in the main thread by the handler)."""


@dataclass
class Progress:
    """What a live display shows; handed to the runner's `on_progress` callback."""

    job_id: str
    status: JobStatus
    attempt: int
    step: int | None = None
    total: int | None = None
    loss: float | None = None
    cost: Decimal = Decimal(0)
    started: float = field(default_factory=time.monotonic)
    message: str = ""


def failpoint(name: str) -> None:
    """Die like `kill -9` here when ORCH_FAILPOINT names this point (crash tests only)."""
    if settings().failpoint == name:
        os.kill(os.getpid(), signal.SIGKILL)


def owner_id(kind: str = "worker") -> str:
    """A lease owner name that says which process holds the job."""
    return f"{kind}:{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def ensure_key(path: Path | None = None) -> tuple[Path, str]:
    """orch's own SSH key pair (created 0600 on first use): (private key file, public line).

    Several workers may start at once on a fresh machine: the pair is generated under a lock
    into a temporary name and renamed into place, so each sees either no key or a whole one.
    """
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


def instance_cost(row: money.CostedInstance,
                  until: datetime | None = None) -> tuple[Decimal, Decimal]:
    """(charged, amortised) for an instance row from create to terminate (or `until`)."""
    return money.instance_cost(row, until or utcnow())


def describe_failure(exc: BaseException) -> str:
    """A failure reason for the user: a playbook's fault and stderr tail, else the error."""
    if isinstance(exc, PlaybookFailed):
        tail = f"\n{exc.stderr_tail.strip()[-800:]}" if exc.stderr_tail.strip() else ""
        return f"{exc} (fault: {exc.fault.value}){tail}"
    return f"{type(exc).__name__}: {exc}"


@dataclass(frozen=True)
class Placed:
    """The instance one placement holds: its row in the store, its provider, the instance."""

    row_id: int
    provider: Provider
    inst: Instance
    warm: bool = False  # taken warm from an earlier job (docs/warm.md): no volume of this job
    adopted: bool = False  # this job's machine, taken over: its trainer may run there


@dataclass
class Attempt:
    """One instance this run holds, by its row in the store: what the end of the attempt
    (teardown, parking it warm, scrubbing a kept server) needs to know about it."""

    row_id: int
    provider: str
    instance_id: str | None = None  # None until the provider's create returns one
    offer: Offer | None = None  # the offer it was rented as (None: adopted after a takeover)
    secrets_base: str | None = None  # orch's directory on a kept server (scrubbed at release)
    job_dir: str | None = None  # this job's directory on it (removed before it is parked)
    # The pipeline running on it until its phases end: what a kept machine's release stops
    # first (a rented one's detached runs end with the machine).
    pipeline: PipelineRun | None = None


class Ledger:
    """The job's record as this run writes it: status changes, events, progress, cost so far.

    Every change goes to the store first; the watchdog hears of it (a status starts a
    phase's deadline, an event is progress) and the live display (`on_progress`) is told.
    """

    def __init__(self, store: Store, job_id: str, owner: str, providers: Mapping[str, Provider],
                 watchdog: Watchdog, progress: Progress,
                 on_progress: Callable[[Progress], None] | None, disk_gb: int) -> None:
        self.store = store
        self.job_id = job_id
        self.owner = owner
        self.providers = providers
        self.watchdog = watchdog
        self.progress = progress
        self.on_progress = on_progress
        # GB of disk (or volume) asked of a provider: the configured size until the job's
        # inputs are loaded, then what the job needs (at least that): volumes are billed by it.
        self.disk_gb = disk_gb

    def job(self) -> Job:
        return self.store.get_job(self.job_id)

    def set(self, status: JobStatus, message: str = "", data: Mapping[str, object] | None = None,
            **fields: Unpack[JobUpdate]) -> Job:
        """Move the job to `status` (with `fields`) and tell the watchdog and the display."""
        job = self.store.set_status(self.job_id, self.owner, status, message, data, **fields)
        self.watchdog.phase(status)
        self.progress.status = status
        self.progress.attempt = job.attempt
        self.progress.message = message
        self.notify()
        return job

    def placing(self, placement: Placement, message: str) -> Job:
        """The job is being placed on `placement`: its status, event and the plan it follows."""
        offer = placement.offer
        return self.set(JobStatus.PROVISIONING, message, {"placement": placement.to_dict()},
                        provider=offer.provider, gpu=offer.gpu, gpu_count=offer.gpu_count,
                        billing=offer.billing.value, interruptible=offer.interruptible,
                        est_hours=placement.est_hours,
                        est_cost_micros=to_micros(placement.est_cost, rounding=ROUND_HALF_EVEN))

    def event(self, kind: str, message: str, data: Mapping[str, object] | None = None) -> None:
        """Record an event (progress for the watchdog; shown unless it is a training step)."""
        self.store.add_event(self.job_id, kind, message, data)
        self.watchdog.progress()
        if kind != EventKind.TRAIN_PROGRESS:
            self.progress.message = message
            self.notify()

    def notify(self) -> None:
        if self.on_progress is None:
            return
        try:
            self.progress.cost, _ = self.costs()
            self.on_progress(self.progress)
        except Exception:
            log.debug("progress display failed", exc_info=True)

    def costs(self) -> tuple[Decimal, Decimal]:
        """(charged, amortised rent) of the job so far: what its instances billed."""
        charged = amortised = Decimal(0)
        now = utcnow()
        for row in self.store.instances_of(self.job_id):
            c, a = instance_cost(row, now)
            charged += c
            amortised += a
        return money.money(charged), money.money(amortised)


class RunState:
    """What placement, host session and teardown share while this process runs one claimed
    job (one `JobRunner.run`, over as many placements as interruptions need: the job's
    `attempt` counts those).

    The stop signal is raised by the monitor thread and read by the pipeline's thread: both
    go through `signal` / `check_stop` / `clear_stop` under one lock.
    """

    def __init__(self, ledger: Ledger, providers: Mapping[str, Provider], opts: Options,
                 public_key: str, factory: ConnectionFactory) -> None:
        self.ledger = ledger
        self.store = ledger.store
        self.job_id = ledger.job_id
        self.providers = dict(providers)
        self.opts = opts
        self.public_key = public_key  # orch's key, authorised on every instance rented
        self.factory = factory  # every SSH connection of the run (closed to stop at once)
        self.stop: Stop | None = None
        self._stop_lock = threading.Lock()
        self.watching: tuple[str, str] | None = None  # (provider, instance id) the monitor asks
        self.held: dict[int, Attempt] = {}  # the instances this run holds, by row id
        self.notices: Notices = Notices(self.store, self.job_id, "", ())  # webhooks
        self.budget_told = False  # job.budget_reached sent (engine/budget.py): once a run
        # Asked by the monitor thread every tick (the deadline contract's check).
        self.ticks: list[Callable[[], None]] = []
        # The trainer's `save_steps` on the machine the job is on (None: none yet): the
        # host session renders it, the deadline contract weighs a preemption's loss by it.
        self.save_steps: int | None = None

    def tell(self, kind: EventKind, message: str, data: Mapping[str, object]) -> None:
        """An event the user should hear of as it happens (`NOTIFIED`): one event in the
        history (shown like any other, with its webhook id when a `notify:` target wants
        it), recorded before the webhook is sent."""
        self.notices.emit(kind, data, record=lambda d: self.ledger.event(kind, message, d))

    def hold(self, row_id: int, provider: str, instance_id: str | None = None,
             offer: Offer | None = None) -> Attempt:
        """Hold instance row `row_id` (released at the end unless handed on); a row held
        already learns its instance id (and offer) if given."""
        held = self.held.get(row_id)
        if held is None:
            held = self.held[row_id] = Attempt(row_id, provider)
        held.instance_id = instance_id or held.instance_id
        held.offer = offer or held.offer
        return held

    def signal(self, stop: Stop, about: tuple[str, str] | None = None) -> None:
        """Stop the pipeline (the first signal wins): its SSH connections close at once."""
        with self._stop_lock:
            if self.stop is not None:
                return
            if about is not None and self.watching != about:
                # The engine already handled this instance's loss and moved on (a slow
                # provider.get raced `Teardown.interrupted`): a stale report must not stop the
                # next placement, which failed the job on a busy machine (issue 10 §8).
                return
            self.stop = stop
        self.watching = None
        # Whatever the pipeline is blocked on over SSH fails now instead of at its timeout.
        self.factory.close_all()

    def check_cancel(self) -> None:
        """`check_stop`, after reading `orch cancel`'s flag from the database: what checks
        this before it starts (a phase, a playbook step, a rental, parking the machine) never
        starts once a cancel was committed, without waiting for the monitor's next look."""
        if self.stop is None and self.store.cancel_requested(self.job_id):
            self.signal(Stop(StopKind.CANCELLED, CANCELLED))
        self.check_stop()

    def check_stop(self) -> None:
        stop = self.stop
        if stop is None:
            return
        if stop.kind is StopKind.LOST:
            raise LeaseLost(str(stop))
        raise stop

    def clear_stop(self, *, unwatch: bool = False) -> None:
        """Forget the stop signal (handled); with `unwatch`, also the instance watched, in the
        same step, so that a late report about that instance is ignored."""
        with self._stop_lock:
            self.stop = None
            if unwatch:
                self.watching = None


def monitor(state: RunState, done: threading.Event) -> None:
    """The monitor thread: renew the lease, and signal a cancel, a lost lease, a stall or a
    lost instance to the pipeline, until `done`."""
    opts, ledger = state.opts, state.ledger
    period = max(0.2, min(opts.watch_s, opts.lease_s / 3))
    last_lease = 0.0
    while not done.wait(period):
        try:
            if time.monotonic() - last_lease >= opts.lease_s / 3:
                job = state.store.renew_lease(state.job_id, ledger.owner, opts.lease_s)
                last_lease = time.monotonic()
                if job is None:
                    state.signal(Stop(StopKind.LOST, "lease lost"))
                    return
                cancelled = job.cancel_requested_at is not None
            else:
                # Every tick (`watch_s`, 2 s by default), not only at the lease's renewal (a
                # third of the lease, 20 s): a cancel stops what runs now (issue 36 §7); the
                # pipeline also reads it before each phase and step (`check_cancel`).
                cancelled = state.store.cancel_requested(state.job_id)
            if cancelled:
                state.signal(Stop(StopKind.CANCELLED, CANCELLED))
            stalled = ledger.watchdog.overdue()
            if stalled is not None:
                state.signal(Stop(StopKind.STALLED, stalled))
            watching = state.watching
            if watching is not None and not _watch(state, watching):
                continue
            for tick in state.ticks:
                tick()
            ledger.notify()
        except StoreError as exc:  # the monitor outlives a locked or full database; the
            # pipeline's next write meets the same error and reports it, once
            log.info("monitor of job %s: %s", state.job_id, exc)
        except Exception:  # and any other hiccup
            log.exception("monitor of job %s", state.job_id)


def _watch(state: RunState, watching: tuple[str, str]) -> bool:
    """Ask the provider about the watched instance and signal its loss; False: it is gone."""
    name, iid = watching
    try:
        inst = state.providers[name].get(iid)
    except NotFound:
        state.signal(Stop(StopKind.INTERRUPTED, f"{name} instance {iid} is gone"), watching)
        return False
    if inst.state in LOST:
        state.signal(Stop(StopKind.INTERRUPTED, f"{name} instance {iid} {inst.state.value}: "
                        f"{inst.message or inst.raw_status}"), watching)
    return True
