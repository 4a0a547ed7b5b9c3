"""`orch worker`'s loop: requeue jobs whose worker died, end warm windows that closed, claim
the next queued job and run it, until stopped (or the queue is empty, or enough jobs ran).

The command parses its flags, calls `work` and renders the lines it reports; what a job
needs from the engine's timing is chosen here, by what its providers are (`Timings`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from orchestrator.core.jobstatus import JobStatus
from orchestrator.engine.runner import JobRunner
from orchestrator.engine.runner_core import Options
from orchestrator.engine.warm import end_expired
from orchestrator.records.store import DatabaseBusy, Job, Store
from providers.base import Provider, Simulated


def simulated_only(job: Job, providers: Mapping[str, Provider]) -> bool:
    """Whether every provider `job` may use (its `resources.providers`) is simulated here:
    its machines boot at once and cost nothing, so the engine may watch them closely."""
    named = job.spec().resources.providers or []
    return bool(named) and all(isinstance(providers.get(n), Simulated) for n in named)


@dataclass(frozen=True)
class Timings:
    """The engine's options for a job: `quick` where every provider it may use is
    simulated (short polls and lease), `normal` otherwise."""

    normal: Options
    quick: Options

    def of(self, job: Job, providers: Mapping[str, Provider]) -> Options:
        """The options to run `job` with."""
        return self.quick if simulated_only(job, providers) else self.normal


# (line, always): `always` lines (errors) are shown even to a quiet worker.
Say = Callable[[str, bool], None]


def work(store: Store, providers: Mapping[str, Provider], owner: str, timings: Timings, *,
         once: bool, max_jobs: int, poll: float, say: Say, current: list[str]) -> None:
    """Run queued jobs one at a time (see the module docstring); `current` holds the job
    being run, for whoever reports a stop. DatabaseFull ends it: nothing can be recorded."""
    done = 0
    while True:
        try:
            store.requeue_lapsed(f"; {owner} resumes it")
            # Machines kept warm past their window: terminated by whichever worker is here.
            for ended in end_expired(store, providers):
                say(f"warm instance {ended.warm.id} ({ended.warm.provider} "
                    f"{ended.warm.provider_instance_id}): "
                    + (ended.error or "window closed, terminated"), ended.error is not None)
            # The lease is taken with the claim: the next job's own timing decides it.
            queued = store.list_jobs(limit=1, status=JobStatus.QUEUED)
            lease_s = (timings.of(queued[0], providers) if queued else timings.normal).lease_s
            job = store.claim_next(owner, lease_s)
            if job is None:
                if once:
                    break
                time.sleep(poll)
                continue
            say(f"{job.id} {job.name}: started", False)
            current[:] = [job.id]
            finished = JobRunner(store, providers, owner, timings.of(job, providers),
                                 on_signal="requeue").run(job.id)
            current.clear()
        except DatabaseBusy as exc:  # a lock held past the whole wait: never the worker's end
            say(f"worker: {exc}; its job's instances were terminated and the job requeued (or "
                "it is when its lease lapses); going on", True)
            time.sleep(poll)
            continue
        say(f"{finished.id} {finished.name}: {finished.status}"
            + (f" ({finished.failure_reason.splitlines()[0]})"
               if finished.failure_reason else ""), False)
        done += 1
        if max_jobs and done >= max_jobs:
            break
