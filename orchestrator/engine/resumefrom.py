"""Start a job from the checkpoint an earlier job of the same training kept.

When `resources.max_cost` stops a job, it keeps the newest checkpoint orch had copied off the
machine (`Teardown.keep_checkpoint`: in the job's artifacts directory); a job that failed
otherwise may have left its mirror (`checkpoint_dir`). Retrying that job with a higher budget
would train from step 0 again and pay again for what the checkpoint holds.
`orch submit job.yml --resume-from JOB` records a new job that uploads that checkpoint to its
first machine, as a re-placement after a preemption does (`JobHooks.restore`), and plans only
what is left: its estimate, its deadline and its `max_cost` are for the rest
(`LoadedJob.done`). The earlier job is left as it was: its record, its bill, its checkpoint.

Only the same training can continue (`specidentity.training_differences`): a checkpoint holds
optimizer state and a learning-rate schedule for one model, data and set of hyperparameters.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from orchestrator.core.jobstatus import FINAL_STATUSES, JobStatus
from orchestrator.core.spec import LoadedJob
from orchestrator.core.specidentity import training_differences
from orchestrator.engine.jobinputs import artifacts_dir, recorded_spec
from orchestrator.engine.runner_core import PHASES, checkpoint_dir
from orchestrator.records.store import Job, Store
from playbooks import checkpoints


class ResumeRefused(ValueError):
    """The job named cannot be resumed from; the message says why and what to do."""


@dataclass(frozen=True)
class ResumePoint:
    """A checkpoint another job kept: `root`/checkpoint-`step`, of `max_steps`."""

    job_id: str
    root: Path
    step: int
    max_steps: int

    @property
    def done(self) -> float:
        """The share of training the checkpoint holds."""
        return min(self.step / self.max_steps, 1.0)

    def record(self) -> dict[str, object]:
        """As `placement_json.resume_from` keeps it (records/columns.ResumeRecord)."""
        return {"job": self.job_id, "dir": str(self.root), "step": self.step,
                "max_steps": self.max_steps}

    def describe(self) -> str:
        return (f"resumes from {self.job_id}'s checkpoint at step {self.step} of "
                f"{self.max_steps} ({self.root / f'checkpoint-{self.step}'}): "
                f"{1 - self.done:.0%} of training left")


def find(store: Store, job_id: str, loaded: LoadedJob) -> ResumePoint:
    """The newest checkpoint job `job_id` kept, if `loaded` may continue it; ResumeRefused
    (saying why and what to do) otherwise."""
    job = store.find_job(job_id)
    if job is None:
        raise ResumeRefused(f"no job {job_id!r} in the history; `orch jobs` lists them")
    status = JobStatus(job.status)
    if status not in FINAL_STATUSES:
        raise ResumeRefused(f"{job_id} is {status}: resume from it once it has ended (it keeps "
                            f"a checkpoint when its budget stops it), or `orch cancel {job_id}`")
    if status is JobStatus.SUCCEEDED or (
            job.phase_done in PHASES[PHASES.index("artifacts"):]):
        raise ResumeRefused(f"{job_id} finished training: its model is in "
                            f"{job.artifacts_dir or artifacts_dir(job_id)}; nothing to resume")
    differ = training_differences(recorded_spec(job), loaded.spec)
    if differ:
        raise ResumeRefused(
            f"{job_id} trained something else, and a checkpoint continues only the same "
            "training (only resources.max_cost, deadline_hours, max_price_per_hour, spot, "
            "providers, servers, keep_warm, and name, eval, output, tracking, notify may "
            f"change); {job_id}'s job -> this file: {'; '.join(differ)}")
    found = [(step, root) for root in (artifacts_dir(job_id), checkpoint_dir(job_id))
             for step in checkpoints.local_steps(root)]
    if not found:
        raise ResumeRefused(
            f"{job_id} kept no checkpoint: orch keeps the newest one it had copied off the "
            "machine (LoRA and QLoRA adapters up to 2 GiB) when the budget stops a job, and "
            "none had been copied; submit without --resume-from to train from the start")
    step, root = max(found)
    return ResumePoint(job_id, root, step, _max_steps(job_id, root / f"checkpoint-{step}"))


def _max_steps(job_id: str, folder: Path) -> int:
    """The run's length as the trainer wrote it in the checkpoint (HF's trainer_state.json)."""
    path = folder / "trainer_state.json"
    try:
        total = json.loads(path.read_text()).get("max_steps")
    except (OSError, ValueError, AttributeError) as exc:
        raise ResumeRefused(f"{job_id}'s checkpoint cannot be read ({path}: {exc}); submit "
                            "without --resume-from to train from the start") from exc
    if not isinstance(total, int) or total <= 0:
        raise ResumeRefused(f"{path} gives no max_steps ({total!r}): orch cannot tell how much "
                            "is left; submit without --resume-from to train from the start")
    return total


def kept_root(job: Job) -> Path | None:
    """The folder holding the checkpoint `job` was submitted to resume from, if any."""
    resume = job.placement().resume_from
    if resume is None or not resume.dir:
        return None
    return Path(resume.dir)
