"""A recorded job turned back into what the engine runs: the validated spec and the pipeline's
plain values.

The database keeps the resolved spec (`job.spec_json`) and the job file's absolute path
(`placement_json.job_file`); a worker, possibly started long after `orch submit`, resolves
the spec against that path again, so dataset and eval files are read from where the job file
names them. Secrets (HF_TOKEN) come from the worker's environment, never from the database.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from orchestrator.core import checkpointing, evalsizing, savers, sizing, trackingspec
from orchestrator.core.datafiles import DatasetSize
from orchestrator.core.datasetspec import DatasetSpec
from orchestrator.core.hubsize import HubDatasetRef, HubSizer
from orchestrator.core.paths import data_dir, default_db_url
from orchestrator.core.planning import eval_work, host_disk_gb, total_tokens, workload_from
from orchestrator.core.settings import settings
from orchestrator.core.sizing import CrossEntropy, Workload
from orchestrator.core.spec import JobSpec, LoadedJob, SpecError, resolve
from orchestrator.core.userfiles import lines
from orchestrator.records.columns import ResumeRecord, document_object
from orchestrator.records.store import Job
from playbooks import images
from playbooks.axolotl import TrainConfigInput
from playbooks.axolotl_data import DatasetEntry
from playbooks.datasources import DataSource
from providers import catalog
from providers.base import Instance

if TYPE_CHECKING:
    from orchestrator.core.throughput import Measured, MeasuredKey
    from playbooks.axolotl import TrainConfigInput
    from playbooks.pipeline import PipelineJob
    from playbooks.vllm import Serving


@dataclass(frozen=True)
class Checkpoints:
    """How often the trainer checkpoints on a machine and how many it keeps."""

    interval: checkpointing.Interval  # in training seconds
    save_steps: int  # the interval in optimizer steps
    keep: int  # save_total_limit

    def describe(self) -> str:
        """`a checkpoint every 2.4 min (...): every 781 steps, the newest 19 kept`."""
        steps = "every step" if self.save_steps == 1 else f"every {self.save_steps} steps"
        return (f"a checkpoint {self.interval.describe()}: {steps}, the newest {self.keep} "
                "kept")


@dataclass(frozen=True)
class Rendered:
    """What the job trains with on one machine: the layout, its settings, its checkpoints."""

    strategy: str
    workload: Workload
    checkpoints: Checkpoints
    gpu_count: int

    def pins(self) -> dict[str, dict[str, object]]:
        """The job-file values that render this again: what a checkpoint written here needs
        of the machine that resumes it (`checkpoint.mirrored`'s `pins`, engine/resumefrom)."""
        return {"resources": {"gpu_count": self.gpu_count, "layout": self.strategy},
                "training": {"optimizer": str(self.workload.optimizer)}}


class InputsError(Exception):
    """The recorded job cannot be run (its files moved, say); the message says which."""


# Host RAM taken as enough at run time (see `Inputs.pipeline_job`): the planner checked it.
PLACED_RAM = 1 << 62


@dataclass(frozen=True)
class Inputs:
    """The recorded job, resolved again, and what the engine derives from it."""

    loaded: LoadedJob
    tokens: int
    est_train_hours: float | None
    measured: dict[MeasuredKey, Measured]  # throughput learned from finished jobs
    # The checkpoint another job kept that this one starts from (`orch submit --resume-from`,
    # engine/resumefrom.py); `loaded.done` is what it holds.
    resume: ResumeRecord | None = None

    def eval_rows(self) -> list[dict[str, object]] | None:
        """The eval set's rows, or None when the job has no eval set."""
        spec = self.loaded.spec
        if spec.eval.eval_set is None:
            return None
        path = self.loaded.path.parent / spec.eval.eval_set
        # Regular files only, streamed: resolve() checked it, but it may have changed since.
        return [json.loads(line) for line in lines(path) if line.strip()]

    def disk_gb(self, minimum: int) -> int:
        """Disk (GB) the job's host needs (`planning.host_disk_gb`, which `orch plan` prices
        a volume at). A RunPod volume is created at this size, and the model cache goes on
        it (a 70B model would fill the 50 GB container disk)."""
        return host_disk_gb(self.loaded, minimum)

    def checkpoint_interval(self, spot: checkpointing.Spot | None = None,
                            w: Workload | None = None,
                            strategy: str = sizing.Strategy.SINGLE) -> checkpointing.Interval:
        """Training seconds between checkpoints: `ORCH_CHECKPOINT_EVERY_S`, or on a spot
        machine (`spot`) Young's optimum for its preemption rate and the checkpoint of this
        job as trained with `w` and `strategy` (default: its settings with orch's fallbacks,
        on one GPU), never longer (core/checkpointing)."""
        return self._interval_keep(spot, w, strategy)[0]

    def checkpoint_bytes(self, w: Workload | None = None,
                         strategy: str = sizing.Strategy.SINGLE) -> int:
        """One checkpoint's bytes, trained with `w` and `strategy` (see checkpoint_interval)."""
        return sizing.checkpoint_bytes(w or savers.fallback(workload_from(self.loaded)),
                                       sizing.Strategy(strategy))

    def checkpoints(self, gpu_count: int, spot: checkpointing.Spot | None = None,
                    w: Workload | None = None,
                    strategy: str = sizing.Strategy.SINGLE) -> Checkpoints:
        """How the trainer checkpoints on a machine of `gpu_count` GPUs (`spot`: a spot
        machine at that risk), trained with `w` and `strategy`: the interval
        (`checkpoint_interval`), its steps (`save_steps`: about one checkpoint per interval
        of the estimated training) and how many it keeps (`save_total_limit`: more at a
        spot machine's shorter interval, so each stays on the host as long as at the
        longest, core/checkpointing.kept). Everything the host session renders and the
        deadline policy weighs, computed once."""
        every, keep = self._interval_keep(spot, w, strategy)
        return Checkpoints(every, self._steps_between(gpu_count, every.seconds), keep)

    def _interval_keep(self, spot: checkpointing.Spot | None, w: Workload | None,
                       strategy: str) -> tuple[checkpointing.Interval, int]:
        """The interval and the checkpoints kept (see `checkpoints`)."""
        longest = settings().checkpoint_every_s
        if spot is None:
            return checkpointing.interval(longest), checkpointing.KEEP
        size = self.checkpoint_bytes(w, strategy)
        every = checkpointing.interval(longest, spot, size)
        return every, checkpointing.kept(every, longest, size)

    def save_steps(self, gpu_count: int, spot: checkpointing.Spot | None = None,
                   w: Workload | None = None, strategy: str = sizing.Strategy.SINGLE) -> int:
        """Checkpoint interval in optimizer steps (`checkpoints(...).save_steps`)."""
        return self.checkpoints(gpu_count, spot, w, strategy).save_steps

    def _steps_between(self, gpu_count: int, every_s: float) -> int:
        """Optimizer steps in `every_s` of the estimated training; without an estimate a
        tenth of the steps (at most 500)."""
        t = self.loaded.spec.training
        per_step = t.sequence_len * t.micro_batch_size * t.gradient_accumulation_steps
        steps = max(1, self.tokens // max(1, per_step * gpu_count))
        if not self.est_train_hours:
            return max(1, min(500, steps // 10))
        per_checkpoint = steps * every_s / (self.est_train_hours * 3600)
        return max(1, min(steps, int(per_checkpoint)))

    def rendered(self, job: Job, inst: Instance, spot: checkpointing.Spot | None = None,
                 given: Checkpoints | None = None) -> Rendered:
        """The layout, settings and checkpoints the job trains with on `inst` (`given`: the
        checkpoints the trainer there was given already, kept)."""
        strategy, w = self.layout(job, inst)
        count = job.gpu_count or inst.gpu_count or 1
        return Rendered(strategy, w, given or self.checkpoints(count, spot, w, strategy), count)

    def layout(self, job: Job, inst: Instance) -> tuple[str, Workload]:
        """The layout and resolved settings the job trains with on `inst`: the planner's
        choice on its GPU (the same pure function as at plan time); on a GPU orch has no
        figures for, single and the settings orch used before it decided them."""
        return resolved_layout(self.loaded, inst.gpu or job.gpu or "",
                               job.gpu_count or inst.gpu_count or 1)

    def pipeline_job(self, job: Job, inst: Instance, vllm_port: int, poll_s: float,
                     rendered: Rendered, exact_count: bool = True) -> PipelineJob:
        """The host pipeline's view of this job on `inst`.

        `exact_count` False: the machine may have more GPUs than the job uses (a kept server).
        `rendered`: its layout and checkpoints (`rendered()`; on a spot machine they come more
        often: no default, so that no caller renders a spot machine as an on-demand one).
        """
        from playbooks.deliver import HubTarget
        from playbooks.gpu import GpuExpectation
        from playbooks.pipeline import PipelineJob
        spec = self.loaded.spec
        gpu = inst.gpu or job.gpu or ""
        count = job.gpu_count or inst.gpu_count or 1
        spec_gpu = catalog.gpus().get(gpu)
        config = train_config(spec, rendered.strategy, rendered.checkpoints.save_steps,
                              rendered.workload, job_id=job.id, keep=rendered.checkpoints.keep)
        sources = data_sources(spec, self.loaded.path.parent)
        token = os.environ.get("HF_TOKEN") or None
        out = spec.output
        hub = None if out.push_to_hub is None else HubTarget(
            out.push_to_hub, private=out.private, merged=out.merged)
        serving = serving_for(self.loaded, count, spec_gpu.memory_bytes if spec_gpu else None)
        evaluates = spec.eval.eval_set is not None or bool(spec.eval.tasks)
        return PipelineJob(
            job_id=job.id, repo=spec.base_model.repo, revision=spec.base_model.revision,
            model_bytes=self.loaded.architecture.params * 2,
            gpu=GpuExpectation(gpu, count, exact_count=exact_count,
                               min_cuda=images.min_cuda(spec.trainer.image),
                               image=spec.trainer.image, free_mib=training_mib(rendered, count),
                               serve_utilization=serving.gpu_memory_utilization
                               if evaluates else 0.0, serve_gpus=serving.tensor_parallel),
            config=config, sources=sources, dataset=first_local(sources),
            trainer_env=trackingspec.trainer_env(spec.tracking, os.environ),
            artifacts_dir=str(artifacts_dir(job.id)),
            eval_set=None if spec.eval.eval_set is None
            else str(self.loaded.path.parent / spec.eval.eval_set),
            eval_tasks=tuple(spec.eval.tasks), trainer_image=spec.trainer.image,
            vllm_port=vllm_port, serving=serving, hf_token=token, poll_s=poll_s,
            include_merged=out.merged_local(), push_to_hub=hub,
            hub_endpoint=os.environ.get("HF_ENDPOINT") or None)  # fmt: skip


def training_mib(rendered: Rendered, gpu_count: int) -> int:
    """MiB the job's training needs free on each GPU: the plan's peak with its headroom
    (`sizing.estimate`, as the placement was fitted); 0 when it cannot be sized."""
    try:
        need = sizing.estimate(rendered.workload, gpu_count,
                               sizing.strategy_named(rendered.strategy)).required_bytes
    except ValueError:
        return 0
    return -(-need // 2**20)


def serving_for(loaded: LoadedJob, gpu_count: int, gpu_memory_bytes: int | None) -> Serving:
    """How vLLM serves the job's eval on these GPUs: the plan's
    evalsizing choice; vLLM's defaults (merged, one GPU) when nothing fits or the GPU is
    unknown, so the server itself says why it cannot start."""
    from playbooks.vllm import Serving

    work = eval_work(loaded)
    if work is None or gpu_memory_bytes is None:
        return Serving()
    est = evalsizing.fit(work, gpu_count, gpu_memory_bytes)
    if est is None:
        return Serving()
    return Serving(est.served, est.tensor_parallel, est.utilization, work.concurrency)


def dataset_places(spec: JobSpec) -> list[tuple[str, DatasetSpec]]:
    """Each training dataset with the job file's field that holds it."""
    if spec.datasets is None:
        return [("dataset", spec.dataset)]
    return [(f"datasets[{i}]", d) for i, d in enumerate(spec.datasets)]


def data_sources(spec: JobSpec, base: Path) -> tuple[DataSource, ...]:
    """Each `train_config` dataset entry's origin, in its order: the training datasets, then
    each Hub dataset's validation split (local files relative to the job file's folder)."""
    def source(where: str, ds: DatasetSpec) -> DataSource:
        if ds.path.local is not None:
            return DataSource(local=str(base / ds.path.local))
        return DataSource(hub_repo=ds.path.hf, hub_revision=ds.path.revision,
                          where=f"{where}.path.hf")

    places = dataset_places(spec)
    return (*(source(w, d) for w, d in places),
            *(source(w, d) for w, d in places if d.validation_split is not None))


def first_local(sources: tuple[DataSource, ...]) -> str:
    """The first local dataset file ("" when every dataset is on the Hub)."""
    return next((s.local for s in sources if s.local is not None), "")


def _entry(ds: DatasetSpec, split: str | None) -> DatasetEntry:
    f = ds.fields
    return DatasetEntry(
        path="", format=ds.format, split=split, subset=ds.path.subset,
        text_field=None if f is None else f.text,
        messages_field=None if f is None else f.messages,
        role_key=None if f is None else f.role, content_key=None if f is None else f.content)


def dataset_entries(spec: JobSpec) -> tuple[tuple[DatasetEntry, ...], tuple[DatasetEntry, ...]]:
    """The axolotl `datasets` and `test_datasets` entries (paths filled on the host)."""
    train = tuple(_entry(d, d.path.split if d.path.hf is not None else None)
                  for d in spec.all_datasets)
    test = tuple(_entry(d, d.validation_split) for d in spec.all_datasets
                 if d.validation_split is not None)
    return train, test


def train_config(spec: JobSpec, strategy: str, save_steps: int,
                 settings: Workload, job_id: str | None = None,
                 keep: int = checkpointing.KEEP) -> TrainConfigInput:
    """The job's axolotl inputs (paths left empty: the host's layout fills them).

    One function for the engine and `orch render`, so what is rendered is what runs.
    `settings` is the planner's resolved workload: the memory savers it turned on.
    `job_id` names the tracker's run (default: the job's name, as `orch render` shows it).
    `keep`: the checkpoints the trainer keeps (`save_total_limit`).
    """
    t, lora = spec.training, spec.lora
    datasets, test_datasets = dataset_entries(spec)
    cross_entropy = _resolved(settings.cross_entropy)
    return TrainConfigInput(
        method=spec.method, base_model_dir="", dataset_path="",
        dataset_format=spec.dataset.format, output_dir="",
        sequence_len=t.sequence_len, micro_batch_size=t.micro_batch_size,
        gradient_accumulation_steps=t.gradient_accumulation_steps, epochs=t.epochs,
        learning_rate=t.learning_rate, optimizer=str(settings.optimizer),
        gradient_checkpointing=settings.gradient_checkpointing is True, packing=t.packing,
        cross_entropy=cross_entropy,
        activation_offloading=settings.activation_offloading is True,
        lora_r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
        lora_target=None if lora.target is None else tuple(lora.target),
        strategy=strategy, save_steps=save_steps, save_total_limit=keep,
        datasets=datasets, test_datasets=test_datasets, val_set_size=t.val_set_size,
        tracking=trackingspec.tracker_keys(spec.tracking, spec.name, job_id or spec.name),
        extra=dict(spec.trainer.extra))  # fmt: skip


def resolved_layout(loaded: LoadedJob, gpu: str, count: int) -> tuple[str, Workload]:
    """The layout and resolved settings `loaded` trains with on `count` x `gpu`: the planner's
    choice (the same pure function as at plan time); on a GPU orch has no figures for,
    single and the settings orch used before it decided them."""
    spec_gpu = catalog.gpus().get(gpu)
    requested = workload_from(loaded)
    if spec_gpu is not None:
        est = savers.fit(requested, count, spec_gpu.memory_bytes, None, spec_gpu)
        if est is None:
            # Only an offloading layout fits: the placement checked its host RAM against
            # the offer, which the instance row does not keep. Without this the job
            # would be rendered single-GPU and run out of memory.
            est = savers.fit(requested, count, spec_gpu.memory_bytes, PLACED_RAM, spec_gpu)
        if est is not None and est.workload is not None:
            return est.strategy.value, est.workload
    return "single", savers.fallback(requested)


def _resolved(cross_entropy: CrossEntropy | Literal["auto"]) -> CrossEntropy:
    """The planner's choice; "auto" here means a workload the planner did not resolve."""
    if cross_entropy == "auto":
        raise ValueError("train_config needs the planner's resolved workload "
                         "(savers.fit or savers.fallback), not the requested one")
    return cross_entropy


def checkpoint_dir(job_id: str) -> Path:
    """Local copies of a job's newest checkpoint (providers without a volume)."""
    return data_dir() / "checkpoints" / job_id


def artifacts_dir(job_id: str) -> Path:
    """Where a job's adapter (and merged model) are copied back to."""
    return data_dir() / "artifacts" / job_id


def job_file(job: Job) -> Path:
    """The job file recorded at submit time."""
    path = job.placement().job_file
    if not path:
        raise InputsError(f"job {job.id} was recorded without its job file (a dry run?); "
                          "submit the job file again")
    return Path(path)


def recorded_spec(job: Job) -> JobSpec:
    """The job's spec as recorded at submit, validated again."""
    data = document_object(job.spec_json)
    if job.spec().method == "full":
        # The recorded spec carries every default, lora's too; a full fine-tune's job file
        # may not set lora, so leave the defaults out when validating it again.
        data.pop("lora", None)
    return JobSpec.model_validate(data)


def load_inputs(job: Job) -> Inputs:
    """Resolve a recorded job again; InputsError when its files are gone or changed."""
    path = job_file(job)
    spec = recorded_spec(job)
    try:
        loaded = resolve(spec, path, hub_size=recorded_sizes(job.placement().hub_sizes))
    except SpecError as exc:
        raise InputsError(f"job {job.id}: {'; '.join(exc.problems)}") from exc
    resume = job.placement().resume_from
    if resume is not None and resume.step and resume.max_steps:
        loaded = loaded._replace(done=min(resume.step / resume.max_steps, 1.0))
    planned = job.placement().placement
    est = None if planned is None else planned.est_training_hours
    return Inputs(loaded, total_tokens(loaded), est or None,
                  measured_throughput(), resume)


def recorded_sizes(records: list[dict[str, Any]] | None) -> HubSizer:
    """A `HubSizer` answering with the sizes recorded at submit: a worker never asks the Hub
    to size a job again (None for a dataset without one: the job then needs `tokens:`)."""
    known: dict[HubDatasetRef, DatasetSize] = {}
    for r in records or []:
        try:
            ref = HubDatasetRef(str(r["repo"]), str(r["revision"]), r.get("subset"),
                                str(r["split"]), str(r["format"]))
            known[ref] = DatasetSize(int(r["tokens"]), r.get("rows"), str(r["source"]))
        except (KeyError, TypeError, ValueError):
            continue  # a record orch did not write: the job asks for tokens
    return known.get


def measured_throughput() -> dict[MeasuredKey, Measured]:
    """Throughput learned from finished jobs (empty until the history has some)."""
    from orchestrator.records.readonly import measured_throughput

    try:
        return dict(measured_throughput(default_db_url()))
    except Exception:  # an estimate aid only: never a reason not to run
        return {}
