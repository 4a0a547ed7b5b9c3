"""The whole on-host pipeline for one job: prepare → train → merge → artifacts → evaluate.

`PHASES` is the job's one ordered list of phases. The engine runs it (`run_phases`) with
hooks that persist the job's state between phases (so a restarted orch resumes at the right
phase: `PipelineRun.done`), watch for stop signals, mirror checkpoints and record metrics;
`run_pipeline` runs the same list with `SimpleHooks` for tests and benchmarks. Every phase
is idempotent: running it again on a host where it already happened skips its steps, and
training is reattached by job id.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path

from playbooks import (
    artifacts,
    container_toolkit,
    datasources,
    deliver,
    evaluate,
    gpu,
    hostcheck,
    images,
    merge,
    train,
)
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
from playbooks.datasources import DataSource
from playbooks.hostreport import HostReport, Verdict
from playbooks.model_cache import ModelCache
from playbooks.vllm import DEFAULT_SERVING, Serving

# Pinned like the trainer image: the serving stack must not drift between runs
# (playbooks/data/images.yaml, `vllm`: the first release that reads transformers 5 output).
DEFAULT_VLLM_IMAGE = images.vllm_image()


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
    serving: Serving = DEFAULT_SERVING  # how vLLM serves the eval (the plan's evalsizing choice)
    include_merged: bool = False  # the merged model is copied back too (output.local)
    push_to_hub: deliver.HubTarget | None = None  # the result uploaded from the host
    hub_endpoint: str | None = None  # HF_ENDPOINT where orch runs (None: huggingface.co)
    # A kept (monthly or registered) server's name: its disk outlives the job, so where the
    # job's outputs stay on it is recorded with the deliveries (None: a rental, destroyed).
    kept_on: str | None = None
    hf_token: str | None = field(default=None, repr=False)
    # What the trainer reads from its environment for `tracking:` (WANDB_API_KEY,
    # MLFLOW_TRACKING_TOKEN, ..., core/trackingspec.trainer_env): secrets, so they go where
    # HF_TOKEN goes, the job's 0600 secrets.env, never argv, logs or the database.
    trainer_env: Mapping[str, str] = field(default_factory=dict, repr=False)
    # Each config.datasets/test_datasets entry's origin (`datasources`): Hub datasets are
    # downloaded on the host after the base model.
    sources: tuple[DataSource, ...] = ()
    toolkit_version: str = container_toolkit.DEFAULT_VERSION
    poll_s: float = 5.0
    # The pre-flight check of a fresh rental, before anything is downloaded or pulled (None:
    # none, e.g. a machine taken warm or a takeover). A rental that fails it is rejected
    # (`hostcheck.HostRejected`); a kept server's result is only reported (`kept_on`).
    host_check: hostcheck.HostCheckSpec | None = None


@dataclass
class PipelineResult:
    """What a pipeline run produced."""

    metrics: dict[str, float]
    artifacts: artifacts.FetchResult | None
    train_status: train.TrainStatus
    resumed: train.ResumeInfo | None = None
    reports: list[StepReport] = field(default_factory=list)
    host_report: HostReport | None = None


def model_cache(job: PipelineJob, runner: train.Runner, paths: HostPaths) -> ModelCache:
    """The base model's cache playbook as this kind of host runs `hf download`.

    Neither kind has `hf` on the host OS's PATH: a container rental has it in the rented
    image's venv (`NativeEnv.wrap` restores that environment), a Docker host in the trainer
    image, run as a throwaway container.
    """
    return cache_for(ModelCache(job.repo, job.revision, job.model_bytes, hf_token=job.hf_token),
                     job.trainer_image, runner, train.NativeEnv.mapped(paths))


def cache_for(cache: ModelCache, trainer_image: str, runner: train.Runner,
              native: train.NativeEnv) -> ModelCache:
    """`cache` set up to run `hf` where this kind of host has it (see `model_cache`)."""
    if runner == "docker":
        cache.image = images.for_host(trainer_image, "docker")
    else:
        cache.wrap = native.wrap
    return cache


def prepare(host: Host, job: PipelineJob, emit: Emit,
            check: Callable[[], None] | None = None) -> tuple[ModelCache, train.Runner]:
    """GPU check, then Container Toolkit (when the host has Docker) and the base model on NVMe.

    On a Docker host the download runs in a container, so it comes after the toolkit: the
    toolkit's Docker restart stops every running container (and it would stop the
    download). Disk discovery and the free-space check need no Docker and run beside the
    toolkit install, each thread with SFTP channels of its own (playbooks/ssh/sftp.py).
    `check` runs before every step and may raise to stop here (`run_playbook`).
    """
    run_playbook("gpu", gpu.steps(job.gpu), host, emit, check)
    runner = train.detect_runner(host)
    cache = model_cache(job, runner, host.paths)
    if runner != "docker":
        run_playbook("model_cache", cache.steps(), host, emit, check)
        return cache, runner
    steps = cache.steps()
    # A Host of its own for the second thread: each playbook sets its step deadline on it.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="model-cache") as pool:
        checks = pool.submit(run_playbook, "model_cache", steps[:-1], replace(host), emit,
                             check)
        try:
            run_playbook("container_toolkit", container_toolkit.steps(job.toolkit_version),
                         host, emit, check)
        finally:
            # Wait for the checks either way, so no step outlives this call; a toolkit
            # failure is raised in preference to theirs.
            checks_error = checks.exception()
        if checks_error is not None:
            raise checks_error
    run_playbook("model_cache", steps[-1:], host, emit, check)
    return cache, runner


def train_job(job: PipelineJob, layout: Layout, model_dir: str,
              runner: train.Runner, paths: HostPaths | None = None) -> train.TrainJob:
    """The training playbook's view of the job (`paths`: the host's, for native runs).

    `HF_TOKEN` goes to training (and merge) only when they must fetch the model from the
    Hub themselves: with the model in the host's cache they never ask the Hub, so the token
    is on the host's disk only while the model downloads (issue 23 §10), on every kind of
    host (a kept server's disk, a volume and Docker's container config outlive a run).
    """
    local = model_dir.startswith("/")
    env = {"HF_TOKEN": job.hf_token} if job.hf_token and not local else {}
    env.update(job.trainer_env)
    # The same tag, from the repository this kind of host runs (images.yaml, `repositories`).
    image = images.for_host(job.trainer_image, "docker" if runner == "docker" else "container")
    return train.TrainJob(job_id=job.job_id, layout=layout, dataset=job.dataset,
                          config=job.config, base_model=model_dir, image=image,
                          env=env, runner=runner, sources=job.sources,
                          native=train.NativeEnv.mapped(paths or HostPaths()))


class PhaseName(StrEnum):
    """The pipeline's phases. A phase that announces itself (`Hooks.status`) is named as the
    job status it puts the job in (`orchestrator.core.jobstatus.JobStatus`, same words);
    `artifacts` is durable but no status of its own (the job is still merging)."""

    PREPARING = "preparing"
    TRAINING = "training"
    MERGING = "merging"
    ARTIFACTS = "artifacts"
    EVALUATING = "evaluating"


P = PhaseName
# The phases whose completion is durable (the engine's job.phase_done), in order: a takeover
# on the same instance skips those done; once the last is done a takeover finishes the job.
DURABLE: tuple[PhaseName, ...] = (P.TRAINING, P.MERGING, P.ARTIFACTS, P.EVALUATING)


@dataclass
class PipelineRun:
    """One run of `PHASES` on a host: its inputs and what each phase leaves for the next."""

    host: Host
    job: PipelineJob
    done: tuple[str, ...] = ()  # durable phases already done on this host (a takeover)
    resume: bool = False  # a later attempt: resume training from the newest checkpoint
    train_seconds: float = 0.0  # of a training already done (`done`), else measured
    cache: ModelCache | None = None
    host_report: HostReport | None = None
    runner: train.Runner = "docker"
    tj: train.TrainJob | None = None
    status: train.TrainStatus | None = None
    resumed: train.ResumeInfo | None = None
    fetched: artifacts.FetchResult | None = None
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def train_job(self) -> train.TrainJob:
        """The training's view of the job (set by the prepare phase)."""
        assert self.tj is not None, "the prepare phase runs first"
        return self.tj

    @property
    def layout(self) -> Layout:
        """The job's directories on the host (set by the prepare phase)."""
        assert self.cache is not None and self.cache.layout is not None
        return self.cache.layout


class Hooks:
    """What a driver of `PHASES` does between and around the phases' steps.

    The defaults suit a run with no job record (tests, benchmarks): nothing is persisted,
    nothing stops the run, and failures raise the playbooks' own errors. The engine's
    `orchestrator.engine.hostsession.JobHooks` overrides them to keep the job's record.
    """

    # Each wait for the training returns after this many seconds (None: when it ends), so
    # stop signals are noticed and checkpoints mirrored between polls.
    wait_s: float | None = None

    def check_stop(self) -> None:
        """Raise if the run must stop now (cancelled, instance lost, stalled)."""

    def status(self, status: PhaseName, message: str, *, train_seconds: float | None = None,
               phase_done: PhaseName | None = None) -> None:
        """The job entered `status` (a phase); with it, durable progress: the seconds the
        training took and the phase now done."""

    def event(self, kind: str, message: str, data: dict[str, object] | None = None) -> None:
        """Something worth telling the user happened."""

    def emit(self, report: StepReport) -> None:
        """A playbook step finished."""

    def phase_done(self, phase: PhaseName, *, artifacts_dir: str | None = None) -> None:
        """A durable phase completed (persist it; `artifacts`: with where they went)."""

    def host_checked(self, run: PipelineRun, report: HostReport) -> None:
        """The host check measured the host (before `HostRejected` when it failed)."""

    def prepare_failed(self, exc: PlaybookFailed) -> None:
        """The prepare phase failed (the error is raised after this)."""

    def prepared(self, run: PipelineRun) -> None:
        """The host is ready (the layout is known)."""

    def restore(self, run: PipelineRun) -> None:
        """Before resuming on a new host: put back a checkpoint kept off the host."""

    def resumed(self, run: PipelineRun, info: train.ResumeInfo) -> None:
        """Training will resume from `info` (`run.resumed` holds it too)."""

    def mirror(self, run: PipelineRun) -> None:
        """Between training polls: copy a new checkpoint off the host if one is due."""

    def train_progress(self, progress: train.Progress) -> None:
        """The training's step or loss changed."""

    def train_log(self, text: str) -> None:
        """The training log's tail, to keep."""

    def training_failed(self, run: PipelineRun) -> None:
        """The training exited with an error: raise what the driver reports."""
        status = run.status
        assert status is not None
        tail = train.log_tail(run.host, run.train_job, 30)
        raise PlaybookFailed("train", "wait", f"training exited with {status.exit_code}; "
                             "resume continues from the last valid checkpoint", Fault.HOST,
                             tail)

    def trained(self, run: PipelineRun) -> None:
        """The trained model is back (record what the run measured)."""

    def eval_rows(self, run: PipelineRun) -> list[dict[str, object]] | None:
        """The evaluation set's rows (None: none)."""
        return _read_rows(run.job.eval_set) if run.job.eval_set else None

    def eval_port(self, run: PipelineRun) -> int:
        """The port to ask for the eval server on the host's 127.0.0.1 (the evaluation takes
        the next free one if something listens there: `playbooks.evalport`)."""
        return run.job.vllm_port

    def evaluated(self, run: PipelineRun) -> None:
        """The evaluation succeeded: `run.metrics` holds its scores."""

    def evaluation_failed(self, run: PipelineRun, exc: Exception) -> None:
        """The evaluation raised `exc` (after the artifacts were copied back): raise what
        the driver reports; returning re-raises `exc` as it is."""

    def stop_after_eval(self) -> bool:
        """Whether the evaluation server must be stopped (evaluate's default: yes)."""
        return True


def _check_host(run: PipelineRun, hooks: Hooks) -> None:
    """The pre-flight check (`PipelineJob.host_check`): first, before any download or pull."""
    spec = run.job.host_check
    if spec is None or run.host_report is not None:
        return
    run.host_report = report = hostcheck.run(run.host, spec, hooks.emit, hooks.check_stop)
    hooks.host_checked(run, report)
    if not report.passed and run.job.kept_on is None:
        raise hostcheck.HostRejected(report)


def _check_gpu_after_setup(run: PipelineRun, hooks: Hooks) -> None:
    """On a Docker host the check's matmul waits for the job's set-up (the Container Toolkit,
    the trainer image: `hostcheck.measure_gpu`); measured here, before any training, and
    judged as the first check was."""
    spec, report = run.job.host_check, run.host_report
    if spec is None or report is None or run.runner != "docker" or report.matmul is None \
            or report.matmul.verdict is not Verdict.UNKNOWN:
        return
    run.host_report = report = hostcheck.measure_gpu(run.host, spec, report, hooks.emit,
                                                     hooks.check_stop)
    hooks.host_checked(run, report)
    if not report.passed and run.job.kept_on is None:
        raise hostcheck.HostRejected(report)


def _prepare(run: PipelineRun, hooks: Hooks) -> None:
    hooks.status(P.PREPARING, "GPU check, Container Toolkit, base model to NVMe")
    _check_host(run, hooks)
    try:
        run.cache, run.runner = prepare(run.host, run.job, hooks.emit, hooks.check_stop)
        datasources.fetch(run.host, run.job.sources, run.layout, hf_token=run.job.hf_token,
                          hub_endpoint=run.job.hub_endpoint,
                          trainer_image=run.job.trainer_image, docker=run.runner == "docker",
                          wrap=train.NativeEnv.mapped(run.host.paths).wrap, emit=hooks.emit,
                          check=hooks.check_stop)
    except PlaybookFailed as exc:
        hooks.prepare_failed(exc)
        raise
    _check_gpu_after_setup(run, hooks)
    hooks.check_stop()
    run.tj = train_job(run.job, run.layout, run.cache.model_dir, run.runner, run.host.paths)
    hooks.prepared(run)


def _train(run: PipelineRun, hooks: Hooks) -> None:
    """Start (or resume, or reattach to) training and wait for it."""
    if P.TRAINING in run.done:  # a takeover on the same instance after training ended
        hooks.event("resume", f"{run.done[-1]} already done on this instance; resuming "
                    "after it")
        return
    host, tj = run.host, run.train_job
    hooks.status(P.TRAINING, "training (detached on the host)")
    status = train.status(host, tj)
    needs = run.job.gpu.free_mib or run.job.gpu.serve_utilization
    if status.state is train.TrainState.MISSING and needs and run.host_report is None \
            and run.job.kept_on is not None:
        # A registered server between its checks, nothing of the job on its GPUs yet: memory
        # another process took since fails here, before the training is paid, not after it.
        # Not a rental kept warm: a rental's fault should re-place the job, where this
        # step's failure fails it (the earlier job's processes are gone: orch-job.sh's stop
        # returns once none of its session is left).
        run_playbook("gpu", [gpu.free_step(run.job.gpu)], host, hooks.emit, hooks.check_stop)
    if status.state is not train.TrainState.RUNNING and (
            run.resume or status.state is train.TrainState.FAILED):
        hooks.restore(run)
        run.resumed = train.prepare_resume(host, tj)
        hooks.resumed(run, run.resumed)
    started = time.monotonic()
    run_playbook("train", train.steps(tj), host, hooks.emit, hooks.check_stop)
    while True:
        hooks.check_stop()
        hooks.mirror(run)
        status = train.wait(host, tj, hooks.train_progress, poll_s=run.job.poll_s,
                            deadline=None if hooks.wait_s is None
                            else time.monotonic() + hooks.wait_s,
                            on_tail=hooks.train_log)
        if status.state is not train.TrainState.RUNNING:
            break
    run.status = status
    run.train_seconds = time.monotonic() - started
    if status.state is train.TrainState.FAILED:
        hooks.check_stop()
        hooks.training_failed(run)
    hooks.check_stop()


def _merge(run: PipelineRun, hooks: Hooks) -> None:
    if P.MERGING in run.done:
        return
    tj = run.train_job
    # One durable write: training done, with what it measured, as merging starts.
    hooks.status(P.MERGING, "merging the adapter into the base model" if tj.adapter
                 else "nothing to merge (full fine-tune)", train_seconds=run.train_seconds,
                 phase_done=P.TRAINING)
    run_playbook("merge", merge.steps(tj, poll_s=min(run.job.poll_s, 2.0)), run.host,
                 hooks.emit, hooks.check_stop)
    hooks.phase_done(P.MERGING)


def _artifacts(run: PipelineRun, hooks: Hooks) -> None:
    hooks.check_stop()
    if P.ARTIFACTS in run.done:
        return
    # The trained model comes back before evaluation starts: nothing that fails after
    # training (an eval set, lm-eval on the host) may lose what the GPU hours paid for.
    job = run.job
    run.fetched = fetched = artifacts.fetch(run.host, run.train_job.output_dir,
                                            job.artifacts_dir,
                                            include_merged=job.include_merged)
    hooks.event("artifacts", f"{len(fetched.copied)} files copied to {job.artifacts_dir}",
                {"copied": len(fetched.copied), "skipped": len(fetched.skipped)})
    places = [{"what": "adapter" if run.train_job.adapter else "model", "where": "local",
               "location": job.artifacts_dir}]
    if job.include_merged:
        places.append({"what": "merged", "where": "local",
                       "location": f"{job.artifacts_dir}/{artifacts.MERGED}"})
    if job.push_to_hub is not None:
        target = job.push_to_hub
        what = "merged model" if target.merged else "adapter"
        hooks.event("deliver", f"uploading the {what} to {target.repo} on Hugging Face from "
                    "the host")
        upload = deliver.Upload(run.train_job, target, job.hf_token, job.hub_endpoint)
        run_playbook("deliver", upload.steps(), run.host, hooks.emit,
                     hooks.check_stop)
        places.append({"what": "merged" if target.merged else "adapter", "where": "hub",
                       "location": upload.url or ""})
    if job.kept_on is not None:
        # Checkpoints, the adapter and, once merged, the merged model stay on the server.
        places.append({"what": "outputs", "where": "host",
                       "location": f"{job.kept_on}:{run.train_job.output_dir}"})
    hooks.event("delivered", "; ".join(f"{p['what']}: {p['location']}" for p in places),
                {"places": places})
    hooks.phase_done(P.ARTIFACTS, artifacts_dir=job.artifacts_dir)
    hooks.trained(run)



def _evaluate(run: PipelineRun, hooks: Hooks) -> None:
    job, tj = run.job, run.train_job
    if job.eval_set is not None or job.eval_tasks:
        hooks.check_stop()
        hooks.status(P.EVALUATING, "serving the model with vLLM and scoring the evaluation")
        model, adapter = merge.served_dirs(tj, job.serving.served == "adapter")
        context = images.eval_context(job.config.sequence_len, bool(job.eval_tasks))
        try:
            result = evaluate.evaluate(
                run.host, job.job_id, model, run.layout, job.vllm_image,
                hooks.eval_port(run), context, hooks.eval_rows(run),
                tasks=job.eval_tasks, lora=adapter, emit=hooks.emit,
                stop_after=hooks.stop_after_eval(), runner=tj.runner,
                native_wrap=tj.native.wrap, native_wrapper=tj.wrapper, native_uv=tj.native.uv,
                vllm_version=images.vllm_version(), serving=job.serving,
                trainer_image=tj.image)
        except Exception as exc:
            hooks.evaluation_failed(run, exc)
            raise
        run.metrics = result.metrics
        hooks.evaluated(run)
    # Durable: a crash from here on finishes the job without renting again.
    hooks.phase_done(DURABLE[-1])


Phase = Callable[[PipelineRun, Hooks], None]
# The job's phases, in production order (prepare always runs: it reattaches to the host).
PHASES: Sequence[tuple[PhaseName, Phase]] = (
    (P.PREPARING, _prepare),
    (P.TRAINING, _train),
    (P.MERGING, _merge),
    (P.ARTIFACTS, _artifacts),
    (P.EVALUATING, _evaluate),
)


def run_phases(run: PipelineRun, hooks: Hooks) -> PipelineRun:
    """Run `PHASES` in order (each skips what `run.done` says is done)."""
    for _name, phase in PHASES:
        phase(run, hooks)
    return run


class SimpleHooks(Hooks):
    """`Hooks` for tests and benchmarks: step reports and training progress go to the
    callbacks; everything else is the defaults."""

    def __init__(self, emit: Emit,
                 on_progress: Callable[[train.Progress], None] | None = None) -> None:
        self._emit = emit
        self._on_progress = on_progress

    def emit(self, report: StepReport) -> None:
        self._emit(report)

    def train_progress(self, progress: train.Progress) -> None:
        if self._on_progress is not None:
            self._on_progress(progress)


def run_pipeline(host: Host, job: PipelineJob, emit: Emit,
                 on_progress: Callable[[train.Progress], None] | None = None) -> PipelineResult:
    """Run `PHASES` on `host` with `SimpleHooks` (each phase skips what is already done)."""
    reports: list[StepReport] = []

    def record(report: StepReport) -> None:
        reports.append(report)
        emit(report)

    run = run_phases(PipelineRun(host, job), SimpleHooks(record, on_progress))
    assert run.status is not None
    return PipelineResult(run.metrics, run.fetched, run.status, run.resumed, reports,
                          run.host_report)


def _read_rows(path: str) -> list[dict[str, object]]:
    rows = []
    for line in Path(path).read_text(encoding="utf-8-sig").splitlines():
        if line.strip():
            rows.append(json.loads(line))
    return rows
