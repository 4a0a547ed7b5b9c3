"""Start a job from the checkpoint an earlier job of the same training kept.

When `resources.max_cost` stops a job, it keeps the newest checkpoint orch had copied off the
machine (`Teardown.keep_checkpoint`: in the job's artifacts directory); a job that failed
otherwise may have left its mirror (`checkpoint_dir`). Retrying that job with a higher budget
would train from step 0 again and pay again for what the checkpoint holds.
`orch submit job.yml --resume-from JOB` records a new job that uploads that checkpoint to its
first machine, as a re-placement after a preemption does (`JobHooks.restore`), and plans only
what is left: its estimate, its deadline and its `max_cost` are for the rest
(`LoadedJob.done`). The earlier job is left as it was: its record, its bill, its checkpoint.

Only the same training can continue:
- the job files may differ only where `specidentity.RESUMABLE_ACROSS` allows, and the data
  must have the tokens it had (a checkpoint holds optimizer state, a learning-rate schedule
  and a position in the data for one model, data set and set of hyperparameters);
- the new job trains on the GPU count, layout and optimizer the checkpoint was written with
  (`pins`): the planner resolves `auto` per GPU, and another count changes the global batch
  (so the step count the checkpoint's position is in), another layout the checkpoint's format
  (ZeRO-3 and FSDP shard it), another optimizer the state's format (8-bit AdamW's is not
  AdamW's). They are written into the new job's spec, so every placement keeps them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from orchestrator.core.jobstatus import FINAL_STATUSES, JobStatus
from orchestrator.core.spec import JobSpec, LoadedJob
from orchestrator.core.specidentity import RESUMABLE_ACROSS, training_differences
from orchestrator.core.states import EventKind
from orchestrator.engine.jobinputs import Inputs, InputsError, artifacts_dir, recorded_spec
from orchestrator.engine.runner_core import PHASES, JobFailed, checkpoint_dir
from orchestrator.records.columns import ResumeRecord, document_object
from orchestrator.records.store import Job, Store
from playbooks import checkpoints, train


class ResumeRefused(ValueError):
    """The job named cannot be resumed from; the message says why and what to do."""


@dataclass(frozen=True)
class ResumePoint:
    """A checkpoint another job kept: `root`/checkpoint-`step`, of `max_steps`, written on
    `pins` (the spec fields the new job must train with)."""

    job_id: str
    root: Path
    step: int
    max_steps: int
    pins: dict[str, dict[str, object]] = field(default_factory=dict)

    @property
    def done(self) -> float:
        """The share of training the checkpoint holds."""
        return min(self.step / self.max_steps, 1.0)

    def record(self) -> dict[str, object]:
        """As `placement_json.resume_from` keeps it (records/columns.ResumeRecord)."""
        return {"job": self.job_id, "dir": str(self.root), "step": self.step,
                "max_steps": self.max_steps, "pins": self.pins}

    def describe(self) -> str:
        """One line for the user: where it resumes from and what it is held to."""
        return (f"resumes from {self.job_id}'s checkpoint at step {self.step} of "
                f"{self.max_steps} ({self.root / f'checkpoint-{self.step}'}): "
                f"{1 - self.done:.0%} of training left, on {self.describe_pins()}, as it was "
                "written")

    def apply(self, loaded: LoadedJob) -> LoadedJob:
        """`loaded` held to the checkpoint: its pins in the spec, what is left to train."""
        data = loaded.spec.model_dump(mode="python")
        if loaded.spec.method == "full":
            data.pop("lora", None)  # as `recorded_spec` reads one back: a full job sets none
        for section, values in self.pins.items():
            data[section] = {**data[section], **values}
        try:
            spec = JobSpec.model_validate(data)
        except ValidationError as exc:
            problems = "; ".join(e["msg"] for e in exc.errors())
            raise ResumeRefused(f"this file cannot train as {self.job_id}'s checkpoint was "
                                f"written ({self.describe_pins()}): {problems}") from None
        return loaded._replace(spec=spec, done=self.done)

    def describe_pins(self) -> str:
        """`1 GPU(s), layout single, optimizer adamw`."""
        r, t = self.pins.get("resources", {}), self.pins.get("training", {})
        return (f"{r.get('gpu_count')} GPU(s), layout {r.get('layout')}, optimizer "
                f"{t.get('optimizer')}")


def find(store: Store, job_id: str, loaded: LoadedJob) -> ResumePoint:
    """The newest checkpoint job `job_id` kept, if `loaded` may continue it; ResumeRefused
    (saying why and what to do) otherwise."""
    job = store.find_job(job_id)
    if job is None:
        raise ResumeRefused(f"no job {job_id!r} in the history; `orch jobs` lists them")
    status = JobStatus(job.status)
    if status not in FINAL_STATUSES:
        raise ResumeRefused(f"{job_id} is {status}: resume from it once it has ended (a job "
                            "its budget stops keeps its newest checkpoint; cancelling it "
                            "deletes them)")
    if status is JobStatus.SUCCEEDED or (
            job.phase_done in PHASES[PHASES.index("artifacts"):]):
        raise ResumeRefused(f"{job_id} finished training: its model is in "
                            f"{job.artifacts_dir or artifacts_dir(job_id)}; nothing to resume")
    _same_training(job, loaded)
    found = [(step, root) for root in (artifacts_dir(job_id), checkpoint_dir(job_id))
             for step in checkpoints.local_steps(root)]
    if not found:
        why = ("a cancelled job's checkpoints are deleted" if status is JobStatus.CANCELLED
               else "orch keeps the newest checkpoint it had copied off the machine (LoRA and "
               "QLoRA adapters up to 2 GiB) when the budget stops a job, and none is here")
        raise ResumeRefused(f"{job_id} kept no checkpoint on this machine ({why}); submit "
                            "without --resume-from to train from the start")
    step, root = max(found)
    pins = _pins(store, job, step)
    _fits_pins(job_id, loaded, pins)
    folder = root / f"checkpoint-{step}"
    max_steps = _complete(job_id, folder, step, adapter=loaded.spec.method != "full")
    return ResumePoint(job_id, root, step, max_steps, pins)


# The spec fields the planner resolves per machine that a checkpoint depends on (`pins`).
PINNED = (("resources", "gpu_count"), ("resources", "layout"), ("training", "optimizer"))


def _same_training(job: Job, loaded: LoadedJob) -> None:
    """ResumeRefused unless `loaded` trains what `job` trained. The pinned fields are `auto`
    in a job file that leaves them to the planner (and pinned in a job that resumed too):
    they are checked against the pins (`_fits_pins`)."""
    differ = training_differences(recorded_spec(job), loaded.spec, ignore=PINNED)
    if differ:
        may = ", ".join(".".join(p) for p in RESUMABLE_ACROSS)
        raise ResumeRefused(
            f"{job.id} trained something else: a checkpoint continues only the same training. "
            f"{job.id}'s job -> this file: {'; '.join(differ)}. Set these back (only {may} "
            "may change), or submit without --resume-from to train from the start")
    tokens = document_object(job.placement_json).get("tokens")
    before = tokens.get("per_epoch") if isinstance(tokens, dict) else None
    if isinstance(before, int) and before != loaded.dataset.tokens:
        raise ResumeRefused(
            f"{job.id} trained on {before:,} tokens per epoch, this file's data has "
            f"{loaded.dataset.tokens:,} ({loaded.dataset.source}): the data changed, and the "
            "checkpoint's place in it would be wrong; submit without --resume-from to train "
            "from the start")


def _fits_pins(job_id: str, loaded: LoadedJob, pins: dict[str, dict[str, object]]) -> None:
    """ResumeRefused when the file sets a pinned field to another value than the checkpoint
    was written with (`auto`, or unset, takes the pin)."""
    given = loaded.spec.model_dump(mode="python")
    clash = [f"{section}.{key}: {value} as trained -> {given[section][key]} in this file"
             for section, values in pins.items() for key, value in values.items()
             if given[section][key] not in (None, "auto", value)]
    if clash:
        raise ResumeRefused(f"{job_id}'s checkpoint was written with other settings: "
                            f"{'; '.join(clash)}. Leave them to the planner (auto) or set "
                            "them as trained, or submit without --resume-from")


def _pins(store: Store, job: Job, step: int) -> dict[str, dict[str, object]]:
    """The GPU count, layout and optimizer the checkpoint at `step` was written with, as
    recorded when it was copied off its machine (not `job`'s last placement: a job is
    placed again after a preemption, and can be stopped before the new machine trains)."""
    for event in store.events_after(job.id, kinds=(EventKind.CHECKPOINT_MIRRORED,)):
        data = event.data()
        if data.step == step and data.pins:
            return data.pins
    raise ResumeRefused(
        f"{job.id}'s checkpoint at step {step} was copied by an orch that did not record the "
        "GPU count, layout and optimizer it was written with, and resuming it with others "
        "fails or silently misreads it; submit without --resume-from to train from the start")


def _complete(job_id: str, folder: Path, step: int, adapter: bool) -> int:
    """The run's length (max_steps) if `folder` is a checkpoint the trainer can resume from,
    by the check a host's copy gets (`train.checkpoint_problem`); ResumeRefused otherwise."""
    def read(name: str) -> bytes | None:
        path = folder / name
        return path.read_bytes() if path.is_file() else None

    try:
        entries = {p.name: p.stat() for p in folder.iterdir()}
        problem = train.checkpoint_problem(entries, read, step, adapter)
        total = json.loads(read("trainer_state.json") or b"{}").get("max_steps")
    except (OSError, ValueError, AttributeError) as exc:
        raise ResumeRefused(f"{job_id}'s checkpoint {folder} cannot be read ({exc}); submit "
                            "without --resume-from to train from the start") from exc
    if problem is None and (not isinstance(total, int) or total <= 0):
        problem = f"trainer_state.json gives no max_steps ({total!r})"
    if problem is not None:
        raise ResumeRefused(f"{job_id}'s checkpoint {folder} cannot be resumed from: "
                            f"{problem}; submit without --resume-from to train from the start")
    assert isinstance(total, int)
    return total


def source(resume: ResumeRecord | None, local: Path) -> tuple[Path, str] | None:
    """Where a new machine of a job gets its checkpoint from, and how to say it: orch's copy
    of the job's own (`local`), else the one it was submitted to resume from (`resume`) while
    that is there; None: neither."""
    if checkpoints.local_steps(local):
        return local, "the local copy"
    if resume is not None and resume.dir and resume.step and (
            Path(resume.dir) / f"checkpoint-{resume.step}").is_dir():
        return Path(resume.dir), resume.dir
    return None


def require_source(inputs: Inputs, job_id: str) -> None:
    """InputsError, before anything is rented, when a job submitted to resume from another's
    checkpoint has neither it nor a copy of its own: its budget was sized for the rest."""
    resume = inputs.resume
    if resume is None or not (resume.step and resume.max_steps) or source(
            resume, checkpoint_dir(job_id)) is not None:
        return
    kept = Path(resume.dir or "") / f"checkpoint-{resume.step}"
    raise InputsError(f"job {job_id} resumes from {kept} (kept by job {resume.job}), which is "
                      "gone: submit the job file again without --resume-from to train from "
                      "the start")


def check_resumed(resume: ResumeRecord | None, step: int, problems: Sequence[str]) -> None:
    """JobFailed when a job submitted to continue from a checkpoint at a step (`resume`:
    planned and budgeted for the rest) would resume from an earlier one (`step`, 0 for none):
    training it all again is not what was asked for or paid for. Before training starts."""
    if resume is None or not resume.step or step >= resume.step:
        return
    moved = f" (moved aside: {'; '.join(problems)})" if problems else ""
    raise JobFailed(f"it was to resume from {resume.job}'s checkpoint at step {resume.step}, "
                    f"but the machine's newest resumable checkpoint is at step {step}{moved}; "
                    "nothing was trained. Submit the job file again without --resume-from to "
                    "train from the start")
