"""The whole on-host pipeline for one job: prepare → train → merge → artifacts → evaluate.

Each phase is a function the engine can call on its own (persisting the job's state between
them, so a restarted orch resumes at the right phase); `run_pipeline` chains them for tests,
benchmarks and the simulated provider. Every phase is idempotent: running it again on a
host where it already happened skips its steps, and training is reattached by job id.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from playbooks import artifacts, container_toolkit, evaluate, gpu, images, merge, train
from playbooks.axolotl import TrainConfigInput
from playbooks.base import (
    Emit,
    Fault,
    Host,
    HostPaths,
    Layout,
    PlaybookFailed,
    StepReport,
    run_playbook,
)
from playbooks.model_cache import ModelCache

# Pinned like the trainer image: the serving stack must not drift between runs.
DEFAULT_VLLM_IMAGE = "vllm/vllm-openai:v0.11.0"


@dataclass(frozen=True)
class PipelineJob:
    """Everything the host-side pipeline needs, as plain values (built by the engine)."""

    job_id: str
    repo: str
    model_bytes: int  # bf16 safetensors size, for the free-space check
    gpu: gpu.GpuExpectation
    config: TrainConfigInput  # its three path fields are filled in from the layout
    dataset: str  # local file
    artifacts_dir: str  # local directory the adapter (and merged model) are copied to
    revision: str = "main"
    eval_set: str | None = None  # local prompt/expected JSONL
    eval_tasks: tuple[str, ...] = ()
    trainer_image: str = train.DEFAULT_IMAGE
    vllm_image: str = DEFAULT_VLLM_IMAGE
    vllm_port: int = 8000
    include_merged: bool = False
    hf_token: str | None = field(default=None, repr=False)
    toolkit_version: str = container_toolkit.DEFAULT_VERSION
    poll_s: float = 5.0


@dataclass
class PipelineResult:
    """What a pipeline run produced."""

    metrics: dict[str, float]
    artifacts: artifacts.FetchResult | None
    train_status: train.TrainStatus
    resumed: train.ResumeInfo | None = None
    reports: list[StepReport] = field(default_factory=list)


def prepare(host: Host, job: PipelineJob, emit: Emit) -> tuple[ModelCache, train.Runner]:
    """GPU check, then Container Toolkit (when the host has Docker) and the base model on NVMe.

    The toolkit install (apt, a Docker restart) and the model download (the Hub to NVMe,
    often tens of GB) do not touch each other, and both only wait on the network: they run
    side by side over the one SSH connection, so the machine is not billed for them in turn.
    """
    run_playbook("gpu", gpu.steps(job.gpu), host, emit)
    runner = train.detect_runner(host)
    cache = ModelCache(job.repo, job.revision, job.model_bytes, hf_token=job.hf_token)
    if runner != "docker":
        run_playbook("model_cache", cache.steps(), host, emit)
        return cache, runner
    # A Host of its own for the second thread: each playbook sets its step deadline on it.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="model-cache") as pool:
        download = pool.submit(run_playbook, "model_cache", cache.steps(), replace(host), emit)
        try:
            run_playbook("container_toolkit", container_toolkit.steps(job.toolkit_version),
                         host, emit)
        finally:
            # Wait for the download either way, so no step outlives this call; a toolkit
            # failure is raised in preference to the download's.
            download_error = download.exception()
        if download_error is not None:
            raise download_error
    return cache, runner


def train_job(job: PipelineJob, layout: Layout, model_dir: str,
              runner: train.Runner, paths: HostPaths | None = None) -> train.TrainJob:
    """The training playbook's view of the job (`paths`: the host's, for native runs)."""
    env = {"HF_TOKEN": job.hf_token} if job.hf_token else {}
    # The same tag, from the repository this kind of host runs (images.yaml, `repositories`).
    image = images.for_host(job.trainer_image, "docker" if runner == "docker" else "container")
    return train.TrainJob(job_id=job.job_id, layout=layout, dataset=job.dataset,
                          config=job.config, base_model=model_dir, image=image,
                          env=env, runner=runner,
                          native=train.NativeEnv.mapped(paths or HostPaths()))


def run_training(host: Host, tj: train.TrainJob, emit: Emit,
                 on_progress: Callable[[train.Progress], None] | None = None,
                 poll_s: float = 5.0, deadline: float | None = None) -> train.TrainStatus:
    """Start (or reattach to) the training and wait for it; a failure raises PlaybookFailed."""
    run_playbook("train", train.steps(tj), host, emit)
    status = train.wait(host, tj, on_progress, poll_s=poll_s, deadline=deadline)
    if status.state is train.TrainState.FAILED:
        tail = train.log_tail(host, tj, 30)
        raise PlaybookFailed("train", "wait", f"training exited with {status.exit_code}; "
                             "resume continues from the last valid checkpoint", Fault.HOST,
                             tail)
    return status


def run_pipeline(host: Host, job: PipelineJob, emit: Emit,
                 on_progress: Callable[[train.Progress], None] | None = None) -> PipelineResult:
    """Run every phase in order on `host` (each skips what is already done)."""
    reports: list[StepReport] = []

    def record(report: StepReport) -> None:
        reports.append(report)
        emit(report)

    cache, runner = prepare(host, job, record)
    assert cache.layout is not None  # set by the model_cache playbook's first step
    tj = train_job(job, cache.layout, cache.model_dir, runner, host.paths)
    resumed = None
    if train.status(host, tj).state is train.TrainState.FAILED:
        resumed = train.prepare_resume(host, tj)
    status = run_training(host, tj, record, on_progress, poll_s=job.poll_s)
    run_playbook("merge", merge.steps(tj, poll_s=min(job.poll_s, 2.0)), host, record)

    # The trained model comes back before evaluation: an evaluation failure raises after
    # the artifacts are safe in `job.artifacts_dir`.
    fetched = artifacts.fetch(host, tj.output_dir, job.artifacts_dir,
                              include_merged=job.include_merged)
    metrics: dict[str, float] = {}
    if job.eval_set is not None or job.eval_tasks:
        rows = _read_rows(job.eval_set) if job.eval_set else None
        result = evaluate.evaluate(
            host, job.job_id, merge.merged_dir(tj), cache.layout, job.vllm_image,
            job.vllm_port, job.config.sequence_len, rows, tasks=job.eval_tasks,
            emit=record, runner=runner, native_wrap=tj.native.wrap)
        metrics = result.metrics
    return PipelineResult(metrics, fetched, status, resumed, reports)


def _read_rows(path: str) -> list[dict[str, object]]:
    rows = []
    for line in Path(path).read_text(encoding="utf-8-sig").splitlines():
        if line.strip():
            rows.append(json.loads(line))
    return rows
