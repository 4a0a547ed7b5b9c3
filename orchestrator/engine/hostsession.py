"""The host session of one attempt: connect to the instance, run the job's phases on it.

`HostSession`, a collaborator of `orchestrator.engine.runner.JobRunner` over the run's shared
state (`runner_core.RunState`): wait for the instance, pin its host key (in the server registry
too when the provider keeps the machine), open SSH, and run `playbooks.pipeline.PHASES` with
`JobHooks`, which persist each phase in the job's record (status, `phase_done`, metrics,
throughput), mirror checkpoints when the provider has no volume, keep the training log, and
turn failures into the engine's verdicts.
"""

from __future__ import annotations

import ipaddress
import math
import secrets
import socket
import time
from dataclasses import replace

from tenacity import RetryCallState

from orchestrator.core import checkpointing, divergence, throughput
from orchestrator.core.jobstatus import JobStatus
from orchestrator.core.states import EndReason, EventKind, RowState, StopKind
from orchestrator.engine import hostchecks, recovery, resumefrom, slowhost, trainlog
from orchestrator.engine.jobinputs import Checkpoints, Inputs
from orchestrator.engine.pruning import Pruning
from orchestrator.engine.runner_core import (
    EVAL_AGAIN,
    LOST,
    PHASES,
    JobFailed,
    Placed,
    RunState,
    Stop,
    checkpoint_dir,
    describe_failure,
    failpoint,
    log,
)
from orchestrator.engine.teardown import Teardown
from orchestrator.engine.warm import Warm
from orchestrator.records.store import JobUpdate, LeaseLost
from playbooks import checkpoints, hostcheck, images, pipeline, ssh, train
from playbooks.base import Host, HostPaths, PlaybookFailed, StepFailed, StepReport
from playbooks.hostreport import HostReport
from playbooks.pipeline import PhaseName, PipelineRun
from providers import retrying
from providers.base import (
    Instance,
    KeepsMachine,
    NotFound,
    Simulated,
    TransientError,
    host_root,
    keeps_machine,
)

# Statuses whose start is a crash-test failpoint (ORCH_FAILPOINT=<status>).
_FAILPOINTS = frozenset({JobStatus.TRAINING, JobStatus.MERGING, JobStatus.EVALUATING})

# Times one attempt connects again after its SSH connection dropped (issue 23 §2).
SSH_RETRIES = 3

# What a `nan` loss means, in a `train.not_finite` event (docs/schema.md, `event`).
NOT_FINITE_LOSS = ("the run has likely diverged (every step since the last log had a NaN "
                   "loss: with bf16 or fp32 its weights are NaN and stay so): a lower "
                   "learning rate, warm-up or gradient clipping are the usual fixes")
NOT_FINITE_EVAL = ("the run diverged, or the held-out examples have no trained token "
                   "(all prompt, or cut off by sequence_len)")


def _same(a: float | None, b: float | None) -> bool:
    """Equal, a NaN counting as equal to a NaN (the trainer's `nan`, read at every poll)."""
    return a == b or (a is not None and b is not None and math.isnan(a) and math.isnan(b))


def connection_dropped(exc: BaseException) -> bool:
    """Whether `exc` is an SSH connection that dropped under a command or transfer (a reset,
    a broken pipe): connecting again and re-running the idempotent step may work. Not a
    host that never answered (`HostUnreachable`: re-placed) nor a step's own timeout."""
    if isinstance(exc, PlaybookFailed):
        exc = exc.__cause__ if exc.__cause__ is not None else exc
    return isinstance(exc, ssh.ConnectionLost)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


# The port asked for the eval server of a simulated host (every simulated host shares this
# machine's 127.0.0.1), drawn at random below Linux's default ephemeral range (32768-60999):
# a port the kernel hands out for bind(0) is soon handed out again, to an SSH tunnel's local
# end or another job's pick. Drawn as the evaluation starts (`JobHooks.eval_port`), which
# takes the next free one if something listens there by then (`playbooks.evalport`).
_PICK_RANGE = (20000, 32000)


def _free_port() -> int:
    for _ in range(64):
        port = _PICK_RANGE[0] + secrets.randbelow(_PICK_RANGE[1] - _PICK_RANGE[0])
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # that range is crowded: any port the kernel gives
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class HostSession:
    """Connecting and running the pipeline (the middle of an attempt)."""

    def __init__(self, state: RunState, inputs: Inputs, teardown: Teardown,
                 warm: Warm) -> None:
        self.state = state
        self.ledger = state.ledger
        self.inputs = inputs
        self.teardown = teardown
        self.warm = warm
        self.losses: dict[int, float] = {}  # step -> training loss recorded as a metric
        self.eval_losses: dict[int, float] = {}  # step -> eval loss recorded as a metric
        self.not_finite_told: set[str] | None = None  # metrics a train.not_finite named
        self.pruning = Pruning(state)  # a sweep's early stopping (a no-op outside one)
        self.pipeline_run: PipelineRun | None = None  # the phases running on the machine

    def run(self, placed: Placed) -> None:
        """Connect and run the pipeline; connect again after a dropped connection.

        A reset or broken connection to a host the provider still runs is not the host's
        fault: connect again and run the pipeline again, at most SSH_RETRIES times (every
        step checks before it acts, finished phases are skipped and training is reattached
        by job id, so only the interrupted step is redone). A host that stays unreachable,
        or drops the connection every time, is released and the job re-placed.
        """
        inst = placed.inst

        def again(exc: BaseException) -> bool:
            return (connection_dropped(exc) and self.state.stop is None
                    and self.teardown.instance_lost(placed) is None)

        def before_sleep(retry: RetryCallState) -> None:
            exc = retry.outcome.exception() if retry.outcome else None
            self.ledger.event("ssh.reconnect", f"{describe_failure(exc) if exc else '?'}; "
                              f"connecting to {inst.provider} instance {inst.instance_id} again "
                              f"(retry {retry.attempt_number} of {SSH_RETRIES})",
                              {"instance": inst.instance_id, "retry": retry.attempt_number})

        try:
            for attempt in retrying.policy(again, attempts=SSH_RETRIES + 1,
                                           wait=retrying.backoff(0.5, 5.0),
                                           before_sleep=before_sleep):
                with attempt:
                    self._pipeline(self._connect(placed), placed)
        except Exception as exc:
            if again(exc):  # dropped every time: the host's network is not usable
                raise self._unreachable(placed, exc) from exc
            raise

    def _connect(self, placed: Placed) -> Host:
        """Wait until the instance runs, pin its host key, open SSH: the pipeline's Host."""
        row_id, provider, inst = placed.row_id, placed.provider, placed.inst
        self.ledger.set(JobStatus.CONNECTING,
                        f"waiting for {inst.provider} instance {inst.instance_id}")
        self.state.watching = None
        deadline = time.monotonic() + self.state.opts.boot_deadline_s
        while not inst.reachable:
            self.state.check_stop()
            if inst.state in LOST:
                why = inst.message or inst.raw_status
                raise Stop(StopKind.INTERRUPTED, f"{inst.provider} instance {inst.instance_id} "
                           f"{inst.state.value} before it booted: {why}")
            if time.monotonic() > deadline:
                self.teardown.release(row_id, EndReason.UNREACHABLE)
                raise Stop(StopKind.INTERRUPTED, f"{inst.provider} instance {inst.instance_id} not "
                           f"running after {self.state.opts.boot_deadline_s:.0f}s")
            time.sleep(min(1.0, self.state.opts.watch_s))
            try:
                inst = provider.get(inst.instance_id)
            except NotFound as exc:
                raise Stop(StopKind.INTERRUPTED, f"{inst.provider} instance {inst.instance_id} "
                           "vanished while booting") from exc
            except TransientError:
                continue
        assert inst.ssh_host and inst.ssh_port
        # From here the monitor watches the instance: one preempted (or cancelled) while
        # its SSH comes up stops the connect at its next attempt, and the job is re-placed
        # as after any preemption, instead of retrying a dead port for the whole connect
        # deadline and releasing it as unreachable (the bench's one such miss, issue 41).
        self.state.watching = (inst.provider, inst.instance_id)
        stopped = self._stopped
        kept = keeps_machine(provider)
        # No provider reports a host key: the one seen at first contact is pinned (in the
        # instance row, or the server registry for a kept server) and must match ever after.
        host_key = self._known_host_key(row_id, inst, kept)
        if host_key is None:
            try:
                host_key = ssh.format_host_key(ssh.trust_on_first_use(
                    inst.ssh_host, inst.ssh_port, deadline=self.state.opts.connect_deadline_s,
                    give_up=stopped))
            except ssh.HostUnreachable as exc:  # e.g. TCP accepted, no SSH banner ever
                raise self._unreachable(placed, exc) from exc
            if kept is not None:  # the server outlives the job: its registry pins the key
                self.state.store.set_server_host_key(kept.server_name(inst.instance_id), host_key)
        self.state.store.record_address(row_id, host=inst.ssh_host, port=inst.ssh_port,
                                        ssh_user=inst.ssh_user, host_key=host_key,
                                        state=RowState(inst.state.value))
        try:
            conn = self.state.factory.connect(inst.ssh_host, inst.ssh_port, inst.ssh_user,
                                              host_key, give_up=stopped)
        except ssh.HostUnreachable as exc:
            raise self._unreachable(placed, exc) from exc
        self.ledger.event("connected", f"ssh {inst.ssh_user}@{inst.ssh_host}:{inst.ssh_port} "
                          f"(host key {ssh.fingerprint(ssh.parse_host_key(host_key))})")
        # Simulated machines keep the server's filesystem under a directory and their
        # provider says where; a real provider has no such capability: paths as they are.
        return Host(conn, HostPaths(host_root(provider, inst)), command_timeout=3600)

    def _stopped(self) -> bool:
        """Whether the monitor has signalled a stop (the SSH retries' `give_up`)."""
        return self.state.stop is not None

    def _unreachable(self, placed: Placed, exc: Exception) -> Stop:
        """A host that stays unreachable over SSH: release it; the job is re-placed. The
        monitor's reason comes first (preempted, cancelled): a spot machine taken while SSH
        was retried is an interruption, which the preemption rate counts, not `unreachable`."""
        self.state.check_stop()
        inst = placed.inst
        self.teardown.release(placed.row_id, EndReason.UNREACHABLE)
        return Stop(StopKind.INTERRUPTED, f"SSH to {inst.provider} instance {inst.instance_id} "
                    f"failed: {exc}")

    def _known_host_key(self, row_id: int, inst: Instance,
                        kept: KeepsMachine | None) -> str | None:
        for row in self.state.store.instances_of(self.state.job_id):
            if row.id == row_id and row.host_key:
                return row.host_key
        if kept is not None:
            name = kept.server_name(inst.instance_id)
            for server in self.state.store.list_servers():
                if server.name == name:
                    return server.host_key
        return None

    def _pipeline(self, host: Host, placed: Placed) -> None:
        """Run the job's phases on `host`, resuming after those a takeover found done."""
        inst = placed.inst
        job = self.ledger.job()
        keeper = keeps_machine(placed.provider)
        kept = keeper is not None
        spot = hostchecks.spot_risk(self.state, placed)
        # A takeover (or a reconnect) of a spot machine: the trainer there was given these.
        given = self._given_checkpoints(inst) if spot is not None else None
        rendered = self.inputs.rendered(job, inst, spot, given)
        # The port asked for the eval server is vLLM's default, 8000; a loopback host's is
        # drawn as the evaluation starts (`JobHooks.eval_port`).
        pj = self.inputs.pipeline_job(job, inst, vllm_port=8000,
                                      poll_s=self.state.opts.poll_s,
                                      # a kept server may have more GPUs than the job uses
                                      exact_count=not kept, rendered=rendered)
        # What the deadline contract weighs a preemption's loss by: this machine's interval.
        every = rendered.checkpoints
        self.state.save_steps = every.save_steps
        if spot is not None and given is None:  # say why a spot machine checkpoints more often
            young = every.interval.young_s
            self.ledger.event(
                EventKind.CHECKPOINT_INTERVAL,
                f"on spot ({spot.preemptions_per_hour:.2f} preemptions/h): "
                f"{every.describe()}",
                {"instance": inst.instance_id, "save_steps": every.save_steps,
                 "seconds": round(every.interval.seconds, 1), "keep": every.keep,
                 "write_s": every.interval.write_s,
                 "young_s": young if young is not None and math.isfinite(young) else None})
        if keeper is not None:  # its disk outlives the job: say where the outputs stay
            pj = replace(pj, kept_on=keeper.server_name(inst.instance_id))
        if hostchecks.wanted(self.state, placed, kept):  # a fresh rental: check it first
            pj = replace(pj, host_check=hostchecks.spec_for(self.state, self.inputs, pj, placed))
        done = recovery.phases_done(job.phase_done, PHASES)
        # A later attempt resumes; so does a job's first that starts from a checkpoint
        # another job kept (`orch submit --resume-from`).
        resume = job.attempt > 0 or self.inputs.resume is not None
        run = PipelineRun(host, pj, done=done, resume=resume,
                          train_seconds=job.train_seconds or 0.0)
        self.pipeline_run = run
        held = self.state.held.get(placed.row_id)
        if held is not None:
            held.pipeline = run
        # Where we are connected, not the placement's instance (its address may only have
        # been learnt while connecting): a loopback host shares this machine's ports.
        pipeline.run_phases(run, JobHooks(self, placed, pj.config.save_steps, rendered.pins(),
                                          _is_loopback(host.conn.host or "")))
        if held is not None:
            held.pipeline = None  # every detached run ended: nothing to stop at the release
        stop = self.state.stop
        if stop is not None and stop.kind is StopKind.BUDGET:
            # The cap was reached as the last phase ended: the results are home, so the job
            # is done, not failed; only the release is left to pay (engine/budget.py).
            self.state.clear_stop()
        self.state.check_cancel()
        self.ledger.set(JobStatus.RELEASING, "artifacts copied to " + pj.artifacts_dir
                        + "; releasing the instance")
        failpoint(JobStatus.RELEASING)

    def _given_checkpoints(self, inst: Instance) -> Checkpoints | None:
        """The checkpoints an earlier session of this job gave the trainer on `inst` (None:
        none did). A takeover renders the job again, and the spot GPU's preemption rate may
        have moved since: the running trainer keeps the config it started with, so its
        `save_steps` is what the mirror is paced by and the deadline weighs a preemption by,
        and the config on the host is not rewritten under it."""
        for e in reversed(self.state.store.events_after(
                self.state.job_id, kinds=(EventKind.CHECKPOINT_INTERVAL,))):
            d = e.data()
            if d.instance == inst.instance_id and d.save_steps and d.keep and d.seconds:
                return Checkpoints(checkpointing.Interval(d.seconds, d.write_s, d.young_s),
                                   d.save_steps, d.keep)
        return None

    def on_train_progress(self, p: train.Progress) -> None:
        progress = self.ledger.progress
        new = [(step, loss) for step, loss in p.losses
               if not _same(self.losses.get(step), loss)]
        evals = [(step, loss) for step, loss in p.eval_losses
                 if not _same(self.eval_losses.get(step), loss)]
        if (p.step == progress.step and _same(p.loss, progress.loss)
                and not new and not evals):
            return  # each short wait reports the current step again
        progress.step, progress.total, progress.loss = p.step, p.total, p.loss
        for step, loss in new:  # every step's loss the log showed, not only the latest
            self.state.store.add_metrics(self.state.job_id, {"train.loss": loss}, step=step)
            self.losses[step] = loss
        for step, loss in evals:  # the held-out split's loss: what early stopping may rank by
            self.state.store.add_metrics(self.state.job_id, {"train.eval_loss": loss}, step=step)
            self.eval_losses[step] = loss
        self._tell_not_finite([("train.loss", s, v) for s, v in new]
                              + [("train.eval_loss", s, v) for s, v in evals])
        self.ledger.event("train.progress", f"step {p.step}/{p.total}"
                          + (f" loss {p.loss:.4f}" if p.loss is not None else ""),
                          {"step": p.step, "total": p.total, "loss": p.loss})
        self.ledger.notify()
        self.pruning.on_progress(p.step, p.total)  # Stop(PRUNED) when it lost at a rung
        if self.inputs.loaded.spec.training.stop_on_nan and new:
            gone = divergence.diverged(self.losses)
            if gone is not None:
                self.pruning.diverged(gone, p.total)  # a sweep trial with early_stop: pruned
                raise JobFailed(gone.reason())  # its machine released as on any failure

    def _tell_not_finite(self, reports: list[tuple[str, int, float]]) -> None:
        """Say once per job and metric that the trainer logged it as not a number: the run
        goes on (an eval loss of `nan` can also be a held-out split with no trained token),
        but the user paying for it should know before the end."""
        bad = [(name, step, value) for name, step, value in reports if not math.isfinite(value)]
        if not bad:
            return
        if self.not_finite_told is None:  # a takeover: what an earlier worker said
            self.not_finite_told = {e.data().metric or "" for e in self.state.store.events_after(
                self.state.job_id, kinds=(EventKind.TRAIN_NOT_FINITE,))}
        for name, step, value in sorted(bad, key=lambda r: r[1]):
            if name in self.not_finite_told:
                continue
            self.not_finite_told.add(name)
            why = (NOT_FINITE_LOSS if name == "train.loss" else NOT_FINITE_EVAL)
            stops = (divergence.NAN_LOGS if name == "train.loss"
                     and self.inputs.loaded.spec.training.stop_on_nan else None)
            self.state.tell(EventKind.TRAIN_NOT_FINITE,
                            divergence.told(name, value, step, why, stops, self.state.job_id),
                            {"metric": name, "step": step, "value": str(value), "reason": why,
                             "stops_after": stops})

    def park_pruned(self, placed: Placed) -> None:
        """Early stopping pruned the run on `placed`: with keep_warm, stop its training and
        park the machine for the sweep's next trial; else (or when the machine does not
        answer) it is released with the run's other instances."""
        run = self.pipeline_run
        if run is None or not self.warm.parks(placed):
            return
        try:
            run.train_job.handle("train").stop(run.host)
        except (ssh.SSHError, StepFailed, OSError) as exc:
            log.info("job %s: cannot stop the pruned training: %s", self.state.job_id, exc)
            return  # terminated with the run's end: the training goes with the machine
        self.warm.park_or_release(placed)

    def training_ended(self) -> None:
        """Training ran to its end: its last eval loss is a final metric (a sweep's
        objective may be train.eval_loss) and it competes at the rungs it passed."""
        if self.eval_losses:
            last = self.eval_losses[max(self.eval_losses)]
            self.state.store.add_metrics(self.state.job_id, {"train.eval_loss": last})
        self.pruning.finished(self.ledger.progress.total)

    def emit(self, report: StepReport) -> None:
        self.ledger.watchdog.progress()  # a playbook step completed
        self.state.store.add_event(self.state.job_id, report.kind,
                                   f"{report.playbook}/{report.step}"
                                   + (f": {report.message}" if report.message else ""),
                                   report.data())
        # The next step (a model download, the training's start) does not begin after a
        # cancel: raising here ends the playbook between its steps.
        self.state.check_cancel()


class JobHooks(pipeline.Hooks):
    """`playbooks.pipeline.Hooks` for a job the engine drives on one instance."""

    def __init__(self, session: HostSession, placed: Placed, save_steps: int,
                 pins: dict[str, dict[str, object]], loopback: bool = False) -> None:
        self.session = session
        self.pins = pins  # how this machine trains: recorded with each checkpoint copied off
        self.loopback = loopback
        self.ledger = session.ledger
        self.inputs = session.inputs
        self.placed = placed
        self.provider = placed.provider
        self.inst = placed.inst
        self.kept = keeps_machine(placed.provider)
        self.parks = session.warm.parks(placed)  # kept warm after the job (keep_warm)
        self.local = checkpoint_dir(self.ledger.job_id)
        self.next_mirror = 0
        opts = session.state.opts
        self.wait_s: float | None = max(opts.watch_s, opts.poll_s)
        # A rental training far below its plan is moved when that pays (never a kept server).
        self.slow = None if self.kept is not None else slowhost.SlowWatch(
            self.ledger, placed, slowhost.planned_seconds(self.inputs.est_train_hours,
                                                          self.inputs.loaded.done),
            save_steps, opts.move_observed_s)

    def check_stop(self) -> None:
        self.session.state.check_cancel()

    def status(self, status: PhaseName, message: str, *, train_seconds: float | None = None,
               phase_done: PhaseName | None = None) -> None:
        self.session.state.check_cancel()  # no phase starts once a cancel is committed
        entered = JobStatus(status)  # a phase that announces itself is named as its status
        fields: JobUpdate = {}
        if train_seconds is not None:
            fields["train_seconds"] = train_seconds
        if phase_done is not None:
            fields["phase_done"] = phase_done
        if entered is JobStatus.MERGING:  # training done: what it measured goes with it
            fields["tokens"] = self.inputs.tokens
            self.session.training_ended()
        self.ledger.set(entered, message, None, **fields)
        if entered in _FAILPOINTS:
            failpoint(entered)

    def event(self, kind: str, message: str, data: dict[str, object] | None = None) -> None:
        self.ledger.event(kind, message, data)

    def emit(self, report: StepReport) -> None:
        self.session.emit(report)
        if report.playbook == hostcheck.PLAYBOOK:
            failpoint("host-check")  # crash tests: kill -9 in the middle of a host check

    def phase_done(self, phase: PhaseName, *, artifacts_dir: str | None = None) -> None:
        self.ledger.store.mark_phase_done(self.ledger.job_id, phase, artifacts_dir=artifacts_dir)

    def host_checked(self, run: PipelineRun, report: HostReport) -> None:
        hostchecks.checked(self.ledger, self.placed, report, kept=self.kept is not None,
                           image=images.for_host(run.job.trainer_image, "docker"))

    def prepare_failed(self, exc: PlaybookFailed) -> None:
        if exc.playbook == "gpu" and self.kept is not None and self.session.state.stop is None:
            # (Not when a stop closed the connection under the check: not the server's fault.)
            # Not chosen again until fixed: `orch servers check NAME` clears it.
            name = self.kept.server_name(self.inst.instance_id)
            self.ledger.store.record_server_check(name, error=exc.reason)
            self.ledger.event("server.failed_check", f"server {name} failed its GPU check and "
                              f"will not be used until `orch servers check {name}` passes: "
                              f"{exc.reason}")

    def prepared(self, run: PipelineRun) -> None:
        state = self.session.state
        held = state.held.get(self.placed.row_id)
        if held is None:  # released meanwhile: nothing left to clean up on it
            return
        if self.kept is not None:  # a server we keep: its secrets go when the job ends
            held.secrets_base = run.layout.base
        # What a machine kept warm is cleaned of before the next job (its artifacts are home).
        held.job_dir = run.layout.job_dir(self.ledger.job_id)

    def restore(self, run: PipelineRun) -> None:
        # A no-op without local copies (the first attempt, or a takeover on the same machine),
        # unless the job starts from a checkpoint another job kept (`--resume-from`).
        source, where = resumefrom.source(self.inputs.resume, self.local) or (
            self.local, "the local copy")
        restored = checkpoints.restore(run.host, run.train_job, source)
        if restored is not None:
            self.ledger.event("checkpoint.restored", f"uploaded checkpoint-{restored} from "
                              f"{where} to the new instance", {"step": restored})

    def resumed(self, run: PipelineRun, info: train.ResumeInfo) -> None:
        resumefrom.check_resumed(self.inputs.resume, info.step, info.problems)
        reached = self.ledger.progress.step  # on the lost instance
        lost = info.lost_steps or 0
        if reached is not None:
            # A fresh machine has no log of the earlier run: count from what we saw.
            lost = max(lost, reached - info.step)
        if info.step or lost:
            self.ledger.event("resume", f"resuming from step {info.step} "
                              f"({info.checkpoint or 'no checkpoint'}); {lost} steps to redo",
                              {"step": info.step, "lost_steps": lost,
                               "moved_aside": list(info.moved_aside)})
        if lost:
            self.ledger.set(JobStatus.TRAINING, f"resumed from step {info.step}",
                            lost_steps=self.ledger.job().lost_steps + lost)
        # The lost machine's losses past the checkpoint are redone here: they are not this
        # run's newest (a `nan` of theirs must not count towards stopping a diverged run).
        for seen in (self.session.losses, self.session.eval_losses):
            for step in [s for s in seen if s > info.step]:
                del seen[step]

    def mirror(self, run: PipelineRun) -> None:
        step = self.ledger.progress.step
        if step is None or step < self.next_mirror:
            return
        self.next_mirror = step + max(1, run.job.config.save_steps)
        copied = checkpoints.mirror(run.host, run.train_job, self.local)
        if copied is not None and copied.copied:
            self.ledger.event(EventKind.CHECKPOINT_MIRRORED,
                              f"checkpoint-{copied.step} copied off the host "
                              f"({copied.bytes / 1e6:.1f} MB)",
                              {"step": copied.step, "bytes": copied.bytes,
                               "pins": self.pins})

    def train_progress(self, progress: train.Progress) -> None:
        self.session.on_train_progress(progress)
        if self.slow is not None:
            self.slow.sample(progress.step, progress.total)

    def train_log(self, text: str) -> None:
        # `orch logs ID --train` reads this copy; it outlives the instance.
        try:
            trainlog.save(self.ledger.job_id, text)
        except OSError as exc:  # a full disk must not fail the job
            log.warning("cannot keep the training log of %s: %s", self.ledger.job_id, exc)

    def training_failed(self, run: PipelineRun) -> None:
        if self.session.teardown.instance_lost(self.placed) is None:
            status = run.status
            code = status.exit_code if status is not None else None
            tail = train.log_tail(run.host, run.train_job, 30).strip()[-1500:]
            raise JobFailed(f"training exited with {code}; the last lines of its log:\n{tail}")
        raise Stop(StopKind.INTERRUPTED, "training stopped with its host")

    def trained(self, run: PipelineRun) -> None:
        # Only an uninterrupted run on a real machine measures the hardware: a simulated
        # cloud trains at whatever speed its stand-in is told to.
        job = self.ledger.job()
        seconds = run.train_seconds
        # Nor a resumed one (`--resume-from`): its seconds hold the trainer's skip through
        # the data it had trained, which its tokens do not.
        if isinstance(self.provider, Simulated) or job.interruptions or seconds <= 0 \
                or not job.gpu or self.inputs.resume is not None:
            return
        inputs = self.inputs
        size = throughput.size_class(inputs.loaded.architecture.params)
        self.ledger.store.add_throughput(self.ledger.job_id, job.gpu, job.gpu_count or 1,
                                         job.method, size, inputs.tokens / seconds)
        if self.kept is None:  # a rental: its machine's speed is remembered (issue 40)
            hostchecks.ran(self.ledger, self.placed,
                           slowhost.planned_seconds(inputs.est_train_hours), seconds,
                           inputs.tokens)

    def eval_rows(self, run: PipelineRun) -> list[dict[str, object]] | None:
        return self.inputs.eval_rows()

    def eval_port(self, run: PipelineRun) -> int:
        # On loopback, drawn as the evaluation starts, not with the pipeline: another job on
        # this machine's ports could take it during the training in between.
        return _free_port() if self.loopback else run.job.vllm_port

    def evaluated(self, run: PipelineRun) -> None:
        if run.metrics:
            self.ledger.store.add_metrics(self.ledger.job_id, run.metrics)
            self.ledger.event("metrics", ", ".join(f"{k}={v:g}" for k, v in
                                                   sorted(run.metrics.items())),
                          dict(run.metrics))

    def evaluation_failed(self, run: PipelineRun, exc: Exception) -> None:
        """A failure fails the job, keeping its artifacts; a lost host is an interruption."""
        if isinstance(exc, JobFailed | LeaseLost | Stop) or \
                self.session.teardown.instance_lost(self.placed) is not None:
            return  # raised as it is: not the evaluation's fault
        artifacts_dir = run.job.artifacts_dir
        reason = (f"evaluation failed: {describe_failure(exc)}\nThe trained model is kept "
                  f"in {artifacts_dir}. {EVAL_AGAIN}")
        self.ledger.event("evaluation.failed", reason, {"artifacts_dir": artifacts_dir})
        raise JobFailed(reason) from exc

    def stop_after_eval(self) -> bool:
        # A rented machine is destroyed next; a kept server's GPU must be freed, and so must
        # a machine kept warm for the next job.
        return self.kept is not None or self.parks
