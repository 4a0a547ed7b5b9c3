"""What every part of a job's runner shares: its options, its stop signals, its bookkeeping.

`orchestrator.engine.runner.JobRunner` is assembled from the parts in `placement`, `hostsession` and
`teardown`, each a mixin over `RunnerCore`: the state they share (the store, the providers, the
stop signal, the instances held) and the bookkeeping every part uses (status changes, events,
progress) live here, with the monitor thread that renews the lease and raises the stop
signals (cancel, lease lost, stalled, instance lost). Methods one part calls in another are
declared here and implemented there.
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
from decimal import Decimal
from pathlib import Path
from typing import Any

from orchestrator.core.paths import data_dir
from orchestrator.core.planning import DISK_GB
from orchestrator.engine import recovery
from orchestrator.engine.jobinputs import Inputs
from orchestrator.engine.watchdog import Watchdog
from orchestrator.records.store import Job, LeaseLost, Store, StoreError
from playbooks.base import PlaybookFailed
from playbooks.pipeline import DURABLE
from playbooks.ssh import ConnectionFactory
from providers.base import Instance, InstanceState, NotFound, Offer, Provider

log = logging.getLogger("orchestrator.engine.runner")

# States the provider reports for a machine that will not come back for this job.
LOST = (InstanceState.INTERRUPTED, InstanceState.TERMINATED, InstanceState.FAILED)

# How to evaluate a job's model again without training it again (docs/playbooks.md).
EVAL_AGAIN = ("To run only the evaluation again, fix its cause and follow \"Re-running only "
              "the evaluation\" in docs/playbooks.md (the training is not repeated).")

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
    stall_s: Mapping[str, float] | None = None
    stall_retries: int = 1  # a stalled attempt is re-placed this often, then the job fails
    # Provider outages (orchestrator.engine.recovery): first wait, longest wait, and how long a job
    # waits out a continuous outage before it fails.
    backoff_s: float = recovery.BACKOFF_S
    backoff_max_s: float = recovery.BACKOFF_MAX_S
    outage_limit_s: float = recovery.OUTAGE_LIMIT_S


class JobFailed(Exception):
    """The job cannot finish; the message is the failure reason shown to the user."""


class Deferred(Exception):
    """Requeue the job to try again at `not_before` (its providers are unavailable)."""

    def __init__(self, message: str, not_before: datetime) -> None:
        super().__init__(message)
        self.not_before = not_before


class Stop(Exception):
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


def checkpoint_dir(job_id: str) -> Path:
    """Local copies of a job's newest checkpoint (providers without a volume)."""
    return data_dir() / "checkpoints" / job_id


def describe_failure(exc: BaseException) -> str:
    """A failure reason for the user: a playbook's fault and stderr tail, else the error."""
    if isinstance(exc, PlaybookFailed):
        tail = f"\n{exc.stderr_tail.strip()[-800:]}" if exc.stderr_tail.strip() else ""
        return f"{exc} (fault: {exc.fault.value}){tail}"
    return f"{type(exc).__name__}: {exc}"


class RunnerCore:
    """The state and bookkeeping shared by the runner's parts (see module doc)."""

    store: Store
    providers: dict[str, Provider]
    owner: str
    opts: Options
    on_progress: Callable[[Progress], None] | None
    on_signal: str  # cancel (orch submit) | requeue (orch worker)
    job_id: str
    inputs: Inputs  # the job's file, model and data, loaded once per run
    _disk: int | None  # GB of disk the job needs (set with `inputs`); None: not loaded
    public_key: str
    progress: Progress | None
    _stop: Stop | None
    _stop_lock: threading.Lock
    _factory: ConnectionFactory
    _watching: tuple[str, str] | None  # (provider, instance id) the monitor watches
    _held: dict[int, tuple[str, str | None]]  # instance row -> (provider, id)
    _watchdog: Watchdog
    _stalls: int
    _secrets_base: dict[int, str]  # instance row -> orch's directory on a kept server
    _losses: dict[int, float]  # step -> training loss recorded as a metric in this run

    # --- implemented by the other parts (engine, teardown) ----------------------------------

    def _costs(self) -> tuple[Decimal, Decimal, Decimal]:
        raise NotImplementedError

    def _hourly_rate(self, offer: Offer) -> Decimal | None:
        raise NotImplementedError

    def _close_row(self, row_id: int, reason: str) -> None:
        raise NotImplementedError

    def _release(self, row_id: int, reason: str) -> None:
        raise NotImplementedError

    def _instance_lost(self, provider: Provider, inst: Instance) -> str | None:
        raise NotImplementedError

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
                        self._signal(Stop("lost", "lease lost"))
                        return
                    if job.cancel_requested_at is not None:
                        self._signal(Stop("cancelled", "cancelled by `orch cancel`"))
                stalled = self._watchdog.overdue()
                if stalled is not None:
                    self._signal(Stop("stalled", stalled))
                watching = self._watching
                if watching is not None:
                    provider = self.providers[watching[0]]
                    try:
                        inst = provider.get(watching[1])
                    except NotFound:
                        self._signal(Stop("interrupted", f"{watching[0]} instance "
                                           f"{watching[1]} is gone"), watching)
                        continue
                    if inst.state in LOST:
                        self._signal(Stop("interrupted", f"{watching[0]} instance "
                                           f"{watching[1]} {inst.state.value}: "
                                           f"{inst.message or inst.raw_status}"), watching)
                self._notify()
            except StoreError as exc:  # the monitor outlives a locked or full database; the
                # pipeline's next write meets the same error and reports it, once
                log.info("monitor of job %s: %s", self.job_id, exc)
            except Exception:  # and any other hiccup
                log.exception("monitor of job %s", self.job_id)

    def _signal(self, stop: Stop, about: tuple[str, str] | None = None) -> None:
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

