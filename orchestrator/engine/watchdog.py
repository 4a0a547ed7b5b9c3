"""The job watchdog: a phase that makes no progress for its deadline fails the attempt.

A lease proves the worker is alive, not that the job is (issue 10 §1): a pipeline blocked on
a host that stopped answering kept its lease renewed forever while the GPU was billed. The
engine tells the watchdog when the job enters a phase and whenever it makes progress; its
monitor thread asks `overdue()` and stops the attempt when a phase went silent for too long.

Progress signals: the job enters a new state, a playbook step completes (skipped, changed,
ok or failed), the training step advances, or the engine records an event (a checkpoint
mirrored, artifacts copied). Each phase's deadline is longer than the longest single step
timeout inside it, so a step that fails on its own timeout says so first; the watchdog
catches what no step timeout covers.

Deadlines (seconds) are settings, like the other ORCH_* knobs (docs/settings.md):
ORCH_STALL_PREPARING_S, ORCH_STALL_TRAINING_S, ORCH_STALL_MERGING_S,
ORCH_STALL_EVALUATING_S, ORCH_STALL_RELEASING_S.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

from orchestrator.core.jobstatus import JobStatus
from orchestrator.core.settings import Settings, settings

# Phases the watchdog guards, with their default deadlines. Connecting has its own
# boot/connect deadlines in the engine; queued/provisioning do not hold a host.
DEFAULT_DEADLINES_S: dict[JobStatus, float] = {
    # The model download step may take 4 h (model_cache.DEFAULT_DOWNLOAD_TIMEOUT_S).
    JobStatus.PREPARING: 4 * 3600 + 900,
    # No new training step for this long: image pull, dataset upload and model loading
    # before the first step each complete as playbook steps, which count as progress.
    JobStatus.TRAINING: 2 * 3600,
    JobStatus.MERGING: 4 * 3600 + 900,  # merge.MERGE_TIMEOUT_S + margin
    JobStatus.EVALUATING: 4 * 3600 + 900,  # the lm-eval step's 4 h + margin
    # Artifacts copied back: a merged 70B model is ~140 GB, hours on a slow link, and the
    # copy reports no progress of its own.
    JobStatus.RELEASING: 6 * 3600,
}


def env_name(phase: str) -> str:
    """The environment variable that overrides `phase`'s deadline."""
    return f"ORCH_STALL_{phase.upper()}_S"


def deadlines(chosen: Settings | None = None) -> dict[JobStatus, float]:
    """The default deadlines with the ORCH_STALL_<PHASE>_S settings that are set (`chosen`,
    by default orch's settings)."""
    given = (chosen or settings()).stall_deadlines()
    return {**DEFAULT_DEADLINES_S, **{JobStatus(phase): s for phase, s in given.items()}}


class Watchdog:
    """Tracks the current phase and the time of the last progress signal (thread-safe)."""

    def __init__(self, deadlines: Mapping[JobStatus, float],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.deadlines = dict(deadlines)
        self._clock = clock
        self._lock = threading.Lock()
        self._phase: JobStatus | None = None
        self._last = clock()

    def phase(self, name: JobStatus) -> None:
        """The job entered `name` (a job status); entering a phase is progress."""
        with self._lock:
            self._phase = name
            self._last = self._clock()

    def progress(self) -> None:
        """Something moved: a step completed, the training step advanced, an event."""
        with self._lock:
            self._last = self._clock()

    def overdue(self) -> str | None:
        """Why the attempt is stalled, or None while the current phase is within its deadline."""
        with self._lock:
            phase, last = self._phase, self._last
        if phase is None or phase not in self.deadlines:
            return None
        limit = self.deadlines[phase]
        silent = self._clock() - last
        if silent < limit:
            return None
        return (f"no progress while {phase} for {silent:.0f}s (deadline {limit:.0f}s, "
                f"{env_name(phase)}): the host stopped answering or the job hangs")
