"""Ending an attempt or a job: losses, re-placement, release of instances, checkpoints.

`Teardown`, a collaborator of `orchestrator.engine.runner.JobRunner` over the run's shared
state (`runner_core.RunState`): whether a failure was the instance's loss, the re-placement
after an interruption or a stall, terminating a rented machine or releasing a kept one (its
secret files removed first), and deleting the job's volumes at its end. Failures that leave
money at stake are events, never swallowed.
"""

from __future__ import annotations

import shutil

from orchestrator.core.jobstatus import JobStatus
from orchestrator.core.states import EndReason, EventKind, Outcome, StopKind
from orchestrator.engine import recovery
from orchestrator.engine.jobinputs import artifacts_dir
from orchestrator.engine.runner_core import (
    LOST,
    PHASES,
    JobFailed,
    Placed,
    RunState,
    Stop,
    checkpoint_dir,
    failpoint,
    log,
)
from orchestrator.records.store import DatabaseBusy, DatabaseFull, Instance, LeaseLost, utcnow
from playbooks import checkpoints, secrets, ssh
from playbooks.base import Host, StepFailed
from providers import retried
from providers.base import KeepsMachine, NotFound, ProviderError

# How the instances of a run that ended so are closed (any other outcome: failed).
END_REASON_OF = {Outcome.SUCCEEDED: EndReason.RELEASED,
                 Outcome.CANCELLED: EndReason.CANCELLED,
                 Outcome.PRUNED: EndReason.RELEASED,
                 Outcome.REQUEUE: EndReason.REPLACED,
                 Outcome.DATABASE: EndReason.REPLACED}


class Teardown:
    """Interruptions, release and clean-up (the end of an attempt, and of the job)."""

    def __init__(self, state: RunState) -> None:
        self.state = state
        self.ledger = state.ledger
        self.stalls = 0  # attempts the watchdog stopped in this run
        # What this run ended, as said to the user ("sim instance i-1 terminated").
        self.ended: list[str] = []
        self.keep_mirror = False  # keep_checkpoint could not move it: the mirror is kept

    def instance_lost(self, placed: Placed) -> str | None:
        """Why the instance is gone (the pipeline error was its loss), or None if it is fine."""
        stop = self.state.stop
        if stop is not None and stop.kind is StopKind.INTERRUPTED:
            return str(stop)
        self.state.check_stop()
        provider, inst = placed.provider, placed.inst
        try:
            now = retried.look_up(provider, inst.instance_id)
        except NotFound:
            return f"{inst.provider} instance {inst.instance_id} is gone"
        if now is not None and now.state in LOST:
            return (f"{inst.provider} instance {inst.instance_id} {now.state.value}: "
                    f"{now.message or now.raw_status}")
        return None

    def stalled(self, placed: Placed, stop: Stop) -> None:
        """The watchdog stopped a silent attempt: re-place it, or fail after stall_retries."""
        self.stalls += 1
        self.ledger.event("watchdog.stalled", str(stop), {"instance": placed.inst.instance_id,
                                                          "stalls": self.stalls})
        if recovery.stalls_exhausted(self.stalls, self.state.opts.stall_retries):
            self.state.clear_stop()
            raise JobFailed(f"stopped by the watchdog: {stop}")
        self.interrupted(placed, f"stopped by the watchdog: {stop}", EndReason.REPLACED)

    def interrupted(self, placed: Placed, why: str,
                    reason: EndReason = EndReason.INTERRUPTED) -> None:
        """The attempt's instance is lost (or given up, `reason` REPLACED): record it,
        release it, queue the job to resume."""
        self.state.clear_stop(unwatch=True)
        self.state.factory.close_all()
        job = self.ledger.job()
        self.ledger.set(JobStatus.INTERRUPTED, why, {"instance": placed.inst.instance_id},
                        interruptions=job.interruptions + 1)
        self.release(placed.row_id, reason)
        self.ledger.set(JobStatus.QUEUED, "re-placing to resume from the last checkpoint",
                        attempt=job.attempt + 1)
        self.state.notices.emit(EventKind.JOB_PREEMPTED, {
            "reason": why, "instance": placed.inst.instance_id})

    def moved(self, placed: Placed, why: str) -> None:
        """The deadline policy moves the job off this (spot) machine, its choice already
        committed: release the machine, then queue the job to be placed on on-demand (not
        an interruption: break before make, docs/deadline.md)."""
        self.state.clear_stop(unwatch=True)
        self.state.factory.close_all()
        self.release(placed.row_id, EndReason.MOVED)
        failpoint("move-released")
        self.ledger.set(JobStatus.QUEUED, f"re-placing on on-demand to resume from the last "
                        f"checkpoint: {why}", {"instance": placed.inst.instance_id},
                        attempt=self.ledger.job().attempt + 1)

    def close_row(self, row_id: int, reason: EndReason) -> None:
        """Close an instance row (terminated now) with what it cost."""
        self.state.store.close_instance(row_id, reason, utcnow())
        self.state.held.pop(row_id, None)

    def release(self, row_id: int, reason: EndReason) -> None:
        """Terminate (or release) one instance and close its row with its cost."""
        held = self.state.held.get(row_id)
        if held is None:
            return
        name, iid = held.provider, held.instance_id
        provider = self.state.providers.get(name)
        kept = isinstance(provider, KeepsMachine)  # released, never destroyed
        if kept:
            self._stop_runs(row_id)
            self._scrub_secrets(row_id)
        if iid is not None and provider is not None:
            try:
                retried.terminate(provider, iid)
            except ProviderError as exc:
                self.ledger.event("teardown.failed", f"could not terminate {name} {iid}: "
                                  f"{exc}; `orch reconcile` will retry")
                return
        self.close_row(row_id, reason)
        self.state.held.pop(row_id, None)
        self.ended.append(f"{name} instance {iid} {'released' if kept else 'terminated'}")
        self.ledger.event(EventKind.INSTANCE_RELEASED if kept else EventKind.INSTANCE_TERMINATED,
                          f"{name} instance {iid} {'released' if kept else 'terminated'}"
                          f" ({reason})", {"instance": iid, "reason": reason})

    def _stop_runs(self, row_id: int) -> None:
        """Stop the job's detached runs (training, merge) on a server we keep, before it is
        released: a cancel, a prune or a failure ends them as a rented machine's termination
        does (`docker rm -f`, or the wrapper's stop), whatever the phase."""
        held = self.state.held.get(row_id)
        run = None if held is None else held.pipeline
        if held is None or run is None or run.tj is None:
            return  # no pipeline, or it ended (its runs removed) or never prepared one
        held.pipeline = None
        row = self.reachable_row(row_id)
        if row is None:
            return
        try:
            host = self.connect_again(row)
            for kind in ("train", "merge"):
                run.tj.handle(kind).stop(host)
        except (ssh.SSHError, StepFailed) as exc:
            self.ledger.event("teardown.failed", f"could not stop the job's training on "
                              f"{row.host}: {exc}; it is released with the training running")
            return
        self.ledger.event("training.stopped", "stopped the job's training on the kept server "
                          "before releasing it", {"instance": held.instance_id})

    def _scrub_secrets(self, row_id: int) -> None:
        """Remove HF_TOKEN's files from a server we keep, before it is released (issue 10 §6).

        Rented machines are destroyed with their disks; a monthly server is not. The pipeline's
        connection may have been closed (cancel, watchdog): connect again with the pinned key.
        """
        held = self.state.held.get(row_id)
        if held is None or not held.secrets_base:
            return
        base, held.secrets_base = held.secrets_base, None  # scrubbed once, whatever comes of it
        row = self.reachable_row(row_id)
        if row is None:
            return
        try:
            removed = secrets.scrub(self.connect_again(row), base)
        except (ssh.SSHError, StepFailed) as exc:
            self.ledger.event("secrets.left", f"could not remove secret files from {row.host}: "
                              f"{exc}; `orch reconcile` retries")
            return
        if removed:
            self.ledger.event("secrets.removed", f"removed {len(removed)} secret file(s) from "
                              "the server", {"files": len(removed)})

    def reachable_row(self, row_id: int) -> Instance | None:
        """Instance row `row_id` of this job when it knows where its machine is (address and
        pinned host key), else None."""
        row = next((r for r in self.state.store.instances_of(self.state.job_id) if r.id == row_id),
                   None)
        return row if row is not None and row.host and row.port and row.host_key else None

    def connect_again(self, row: Instance) -> Host:
        """A new SSH connection to `row`'s machine with its pinned host key (the pipeline's
        may have been closed: a cancel, the watchdog). SSH errors propagate."""
        assert row.host and row.port and row.host_key
        return Host(self.state.factory.connect(row.host, row.port, row.ssh_user or "root",
                                               row.host_key))

    def release_all(self, outcome: Outcome) -> None:
        """Release every instance this run holds, as the run's `outcome` says."""
        if outcome is Outcome.LOST:
            return  # the new owner drives these instances now
        reason = END_REASON_OF.get(outcome, EndReason.FAILED)
        for row_id in list(self.state.held):
            try:
                self.release(row_id, reason)
            except (DatabaseBusy, DatabaseFull) as exc:
                # Terminated, but its row could not be closed: the next attempt's adoption
                # (or `orch reconcile`) closes it once the database takes writes again.
                log.info("instance row %s: terminated, row left open: %s", row_id, exc)
            except Exception:  # keep tearing the others down; reconcile finds what is left
                log.exception("teardown of instance row %s", row_id)

    def keep_checkpoint(self) -> str:
        """At a budget stop: move the newest checkpoint orch had copied off the machine (the
        mirror) into the job's artifacts directory, and say so for the failure reason. It is
        home already, so keeping it bills nothing, where fetching a newer one from the
        machine would bill the copy's seconds past the cap. Once the trained model is home
        (the artifacts phase done) that is what the job keeps: no older checkpoint beside
        it, and its `delivered` event stays the last one."""
        job_id = self.state.job_id
        job = self.ledger.job()
        if job.lease_owner != self.ledger.owner:  # another worker has the job: not ours
            raise LeaseLost(f"job {job_id} is no longer leased to {self.ledger.owner}")
        if job.phase_done in PHASES[PHASES.index("artifacts"):]:
            return f"the trained model had been copied home: it is kept in {job.artifacts_dir}"
        home = artifacts_dir(job_id)
        steps = checkpoints.local_steps(checkpoint_dir(job_id))
        if not steps:
            # A run before this one (its end unrecorded, or a retried failed job) kept it.
            kept = checkpoints.local_steps(home)
            if kept:
                return (f"its newest checkpoint (step {kept[0]}) is kept in "
                        f"{home / f'checkpoint-{kept[0]}'} (`orch submit JOB_FILE "
                        f"--resume-from {job_id}` with a higher max_cost continues from it)")
            return ("nothing delivered: no checkpoint had been copied off the machine (orch "
                    "copies those up to 2 GiB, LoRA and QLoRA adapters, as training saves them)")
        step = steps[0]
        source = checkpoint_dir(job_id) / f"checkpoint-{step}"
        target = home / f"checkpoint-{step}"
        part = home / f"checkpoint-{step}.part"  # never a half copy that looks whole
        try:
            home.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(part, ignore_errors=True)
            shutil.move(source, part)
            shutil.rmtree(target, ignore_errors=True)  # a copy an earlier run kept
            part.rename(target)
        except OSError as exc:  # the failure is recorded all the same; the copy stays
            if source.is_dir():  # not moved (or half copied to another disk): keep the mirror
                shutil.rmtree(part, ignore_errors=True)
                self.keep_mirror = True
            where = source if source.is_dir() else part
            return f"keeping checkpoint-{step} in {target} failed ({exc}): it is left in {where}"
        for older in checkpoints.local_steps(home):  # an earlier run's, now stale
            if older != step:
                shutil.rmtree(home / f"checkpoint-{older}", ignore_errors=True)
        total = self.ledger.progress.total
        at = f"step {step}" + (f" of {total}" if total else "")
        self.ledger.event(EventKind.DELIVERED, f"checkpoint at {at}: {target} (the budget "
                          "stopped training; the trainer's checkpoint, optimizer state "
                          "included)", {"places": [{"what": "checkpoint", "where": "local",
                                                    "location": str(target)}]})
        return (f"its newest checkpoint ({at}) is kept in {target} (`orch submit JOB_FILE "
                f"--resume-from {job_id}` with a higher max_cost continues from it)")

    def delete_checkpoints(self) -> None:
        """Delete orch's local copy of the job's checkpoints: the job is finished (unless
        keeping its newest failed: that copy is then all the user has)."""
        if self.keep_mirror:
            return
        shutil.rmtree(checkpoint_dir(self.state.job_id), ignore_errors=True)

