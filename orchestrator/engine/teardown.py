"""Ending an attempt or a job: losses, re-placement, release of instances, volumes.

The teardown part of `orchestrator.engine.runner.JobRunner` (see `runner_core`): whether a failure
was the instance's loss, the re-placement after an interruption or a stall, terminating a
rented machine or releasing a kept one (its secret files removed first), and deleting the
job's volumes at its end. Failures that leave money at stake are events, never swallowed.
"""

from __future__ import annotations

import shutil

from orchestrator.engine import recovery
from orchestrator.engine.runner_core import LOST, JobFailed, RunnerCore, Stop, checkpoint_dir, log
from orchestrator.records.store import DatabaseBusy, DatabaseFull
from playbooks import secrets, ssh
from playbooks.base import Host, StepFailed
from providers import retried
from providers.base import (
    Instance,
    KeepsMachine,
    NotFound,
    Provider,
    ProviderError,
    Volumes,
)


class TeardownMixin(RunnerCore):
    """Interruptions, release and clean-up (the end of a `JobRunner` attempt)."""

    def _instance_lost(self, provider: Provider, inst: Instance) -> str | None:
        """Why the instance is gone (the pipeline error was its loss), or None if it is fine."""
        if self._stop is not None and self._stop.kind == "interrupted":
            return str(self._stop)
        self._check_stop()
        try:
            now = retried.look_up(provider, inst.instance_id)
        except NotFound:
            return f"{inst.provider} instance {inst.instance_id} is gone"
        if now is not None and now.state in LOST:
            return (f"{inst.provider} instance {inst.instance_id} {now.state.value}: "
                    f"{now.message or now.raw_status}")
        return None

    def _stalled(self, row_id: int, provider: Provider, inst: Instance, stop: Stop) -> None:
        """The watchdog stopped a silent attempt: re-place it, or fail after stall_retries."""
        self._stalls += 1
        self._event("watchdog.stalled", str(stop), {"instance": inst.instance_id,
                                                    "stalls": self._stalls})
        if recovery.stalls_exhausted(self._stalls, self.opts.stall_retries):
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
        kept = isinstance(provider, KeepsMachine)  # released, never destroyed
        if kept:
            self._scrub_secrets(row_id)
        if iid is not None and provider is not None:
            try:
                retried.terminate(provider, iid)
            except ProviderError as exc:
                self._event("teardown.failed", f"could not terminate {name} {iid}: "
                            f"{exc}; `orch reconcile` will retry")
                return
        self._close_row(row_id, reason)
        self._held.pop(row_id, None)
        self._event("instance.released" if kept else "instance.terminated",
                    f"{name} instance {iid} {'released' if kept else 'terminated'}"
                    f" ({reason})", {"instance": iid, "reason": reason})

    def _scrub_secrets(self, row_id: int) -> None:
        """Remove HF_TOKEN's files from a server we keep, before it is released (issue 10 §6).

        Rented machines are destroyed with their disks; a monthly server is not. The pipeline's
        connection may have been closed (cancel, watchdog): connect again with the pinned key.
        """
        base = self._secrets_base.pop(row_id, None)
        if not base:
            return
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

    def _teardown_all(self, outcome: str) -> None:
        if outcome == "lost":
            return  # the new owner drives these instances now
        for row_id in list(self._held):
            try:
                self._release(row_id, {"succeeded": "released", "cancelled": "cancelled",
                                       "requeue": "interrupted", "database": "interrupted"}
                              .get(outcome, "failed"))
            except (DatabaseBusy, DatabaseFull) as exc:
                # Terminated, but its row could not be closed: the next attempt's adoption
                # (or `orch reconcile`) closes it once the database takes writes again.
                log.info("instance row %s: terminated, row left open: %s", row_id, exc)
            except Exception:  # keep tearing the others down; reconcile finds what is left
                log.exception("teardown of instance row %s", row_id)

    def _delete_volumes(self) -> None:
        """Delete the job's checkpoint copies: orch's local one and the providers' volumes.

        A volume that cannot be deleted is still billed: the failure is an event naming the
        volume and what to do (it is not retried automatically: no sweep knows volumes yet).
        """
        shutil.rmtree(checkpoint_dir(self.job_id), ignore_errors=True)
        for name, provider in self.providers.items():
            if not isinstance(provider, Volumes):
                continue
            try:
                provider.delete_volume(self.job_id)
            except Exception as exc:  # any failure leaves storage billed: report, go on
                log.warning("job %s: cannot delete its %s volume: %s", self.job_id, name, exc)
                self._event("volume.delete_failed", f"could not delete the job's {name} "
                            f"volume ({provider.volume_dir(self.job_id)}): {exc}; it is "
                            f"still billed: delete it with {name} (its console or API)",
                            {"provider": name, "error": str(exc)})

