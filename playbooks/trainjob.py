"""A training job on its host: its image, config, argv and environment, and the detached
run's status and progress. train.py builds on it (resume, the steps).
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Literal

from playbooks import images
from playbooks.axolotl import TrainConfigInput, deepspeed_config, dump
from playbooks.base import (
    CONTAINER_ROOT,
    Host,
    Layout,
    StepFailed,
    container_name,
    last_line,
    safe_name,
)
from playbooks.datasources import DataSource, filled

# A published, pinned tag (playbooks/data/images.yaml); the engine passes the job's own.
DEFAULT_IMAGE = images.default_image("docker")
WRAPPER = "orch-job.sh"  # in playbooks/remote/, uploaded into the job's directory

Runner = Literal["docker", "process"]

# A Docker image reference: registry/name:tag@digest. Anything else (a leading `-` above all)
# could be read by `docker run` as an option.
_IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,254}")
# `--gpus` values: all, a count, or device=0,1 (quoted the way docker expects).
_GPUS = re.compile(r"all|[0-9]+|\"?device=[0-9,]+\"?")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CHECKPOINT = re.compile(r"checkpoint-([0-9]+)")
_INSPECT = "{{.State.Status}} {{.State.ExitCode}}"

# What a resumable checkpoint holds besides trainer_state.json (HF Trainer, DeepSpeed, FSDP).
OPTIMIZER_STATE = ("optimizer.pt", "optimizer.bin", "optimizer.safetensors", "optimizer_0")
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
FULL_WEIGHTS = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json",
                "pytorch_model.bin.index.json", "pytorch_model_fsdp_0")


# --- the job -----------------------------------------------------------------------------------

# Restores the trainer image's environment for a native command, then execs it. $1: the env
# file the cloud image's entrypoint writes; $2: the image's venv bin; $3: the cu13
# LD_LIBRARY_PATH script. Values are positional parameters, expanded only in double quotes.
_NATIVE = ('[ -r "$1" ] && . "$1"; PATH="$2:$PATH"; export PATH; '
           '[ -r "$3" ] && . "$3"; shift 3; exec "$@"')


@dataclass(frozen=True)
class NativeEnv:
    """The trainer image's environment, for commands run natively in a rented container.

    SSH sessions on a container rental do not see the image's ENV (its PATH with the axolotl
    venv, the cu13 LD_LIBRARY_PATH): ~/.bashrc returns early for `ssh host cmd`
    (real-hosts.md §1, §5). So native commands never rely on the login environment: they
    source the env file the cloud image's entrypoint writes (when present), put the venv on
    PATH explicitly and source cuda13_env.sh (when present). The paths are server paths
    mapped through the host's HostPaths (the simulated host keeps them under its root).
    """

    env_file: str = images.layout().cloud_env_file
    venv_bin: str = f"{images.layout().venv}/bin"
    cuda_env: str = images.layout().cuda_env
    # uv by its path: /root/.local/bin is on the image's PATH only through its ENV, which an
    # SSH session does not get, and the restored env file is not always there (Vast).
    uv: str = images.layout().uv

    @classmethod
    def mapped(cls, paths: Callable[[str], str]) -> NativeEnv:
        """The image's paths as they are on a host whose server paths map through `paths`."""
        plain = cls()
        return cls(paths(plain.env_file), paths(plain.venv_bin), paths(plain.cuda_env),
                   paths(plain.uv))

    def wrap(self, command: Sequence[str]) -> list[str]:
        """`command` preceded by the environment restoring shell (argv, nothing evaluated)."""
        return ["sh", "-c", _NATIVE, "orch-native", self.env_file, self.venv_bin,
                self.cuda_env, *command]


@dataclass(frozen=True)
class TrainJob:
    """What training one job on one host needs, as plain values.

    `config`'s three path fields (`base_model_dir`, `dataset_path`, `output_dir`) are
    ignored: they are derived from the layout, as the container or the process sees them.
    `base_model` is a host path under `layout.base` (the model cache) or a Hub repo id.
    `env` holds secrets (HF_TOKEN, ...): they go to a 0600 file on the host, never argv.
    """

    job_id: str
    layout: Layout
    dataset: str  # local path of the training data
    config: TrainConfigInput
    base_model: str
    image: str = DEFAULT_IMAGE
    gpus: str = "all"
    env: Mapping[str, str] = field(default_factory=dict, repr=False)
    runner: Runner = "docker"
    native: NativeEnv = field(default_factory=NativeEnv)
    # Each `config.datasets` then `.test_datasets` entry's origin (`datasources`; empty: the
    # one `dataset` file, rendered from dataset_path/dataset_format).
    sources: tuple[DataSource, ...] = ()

    def __post_init__(self) -> None:
        if not _IMAGE.fullmatch(self.image):
            raise ValueError(f"image {self.image!r} is not a Docker image reference "
                             f"(e.g. {DEFAULT_IMAGE})")
        if not _GPUS.fullmatch(self.gpus):
            raise ValueError(f"gpus {self.gpus!r}: use all, a count, or device=0,1")
        for name in self.env:
            if not _ENV_NAME.fullmatch(name):
                raise ValueError(f"invalid environment variable name {name!r}")
        if self.runner not in ("docker", "process"):
            raise ValueError(f"runner must be docker or process (got {self.runner!r})")
        if self.base_model.startswith("/") and self.runner == "docker":
            self.inside(self.base_model)  # raises when the container could not see it

    # Paths on the host (all under the layout, built from safe_name()d components).
    @property
    def data_file(self) -> str:
        """Where the dataset is uploaded."""
        return self.layout.data_file(self.job_id, Path(self.dataset).name)

    @property
    def config_file(self) -> str:
        """The rendered axolotl config."""
        return self.layout.config_file(self.job_id)

    @property
    def output_dir(self) -> str:
        """Checkpoints and the final adapter (or model)."""
        return self.layout.output_dir(self.job_id)

    @property
    def deepspeed_file(self) -> str | None:
        """The uploaded DeepSpeed config, or None when the strategy does not shard."""
        if deepspeed_config(self.config.strategy) is None:
            return None
        return f"{self.layout.job_dir(self.job_id)}/deepspeed.json"

    @property
    def secrets_file(self) -> str | None:
        """The 0600 env file with `env`, or None when the job has no secrets."""
        return self.layout.secrets_file(self.job_id) if self.env else None

    @property
    def wrapper(self) -> str:
        """The uploaded orch-job.sh (process runner)."""
        return f"{self.layout.job_dir(self.job_id)}/{WRAPPER}"

    @property
    def aside_dir(self) -> str:
        """Where partial checkpoints are moved (outside output_dir: see _move_aside)."""
        return f"{self.layout.job_dir(self.job_id)}/partial-checkpoints"

    @property
    def adapter(self) -> bool:
        """Whether training produces an adapter (LoRA/QLoRA) rather than full weights."""
        return self.config.method in ("lora", "qlora")

    def inside(self, host_path: str) -> str:
        """`host_path` as the trainer sees it: the container path, or itself without Docker."""
        if self.runner == "process":
            return host_path
        try:
            return self.layout.container(host_path)
        except ValueError:
            raise ValueError(f"{host_path} is not under {self.layout.base}, the directory "
                             f"mounted at {CONTAINER_ROOT}: keep the model in the layout's "
                             "model cache") from None

    def run_argv(self, kind: str, command: Sequence[str]) -> list[str]:
        """The exact command line that starts `command` detached as this job's `kind` run.

        With Docker: `docker run -d` of the trainer image. Without (a container rental, where
        the rented image is the runtime): the orch-job.sh wrapper, running `command` with the
        image's environment restored (see NativeEnv).
        """
        handle = self.handle(kind)
        if self.runner == "process":
            return ["sh", self.wrapper, "start", handle.run_dir, *self.native.wrap(command)]
        return ["docker", "run", "-d", "--name", handle.name, *docker_options(self), self.image,
                *command]

    def handle(self, kind: str) -> Detached:
        """The detached run of `kind` (train, merge) of this job."""
        return Detached(self.runner, container_name(kind, self.job_id),
                        f"{self.layout.job_dir(self.job_id)}/run/{kind}", self.wrapper)


def config_input(job: TrainJob) -> TrainConfigInput:
    """`job.config` with its path fields as the trainer sees them."""
    base = job.inside(job.base_model) if job.base_model.startswith("/") else job.base_model
    ds = job.deepspeed_file
    config = filled(job.config, job.sources, job.layout, job.job_id, job.inside)
    return replace(config, base_model_dir=base,
                   dataset_path=job.inside(job.data_file) if job.dataset else "",
                   output_dir=job.inside(job.output_dir),
                   deepspeed_path="" if ds is None else job.inside(ds))


def render_config(job: TrainJob) -> str:
    """The axolotl config YAML for `job`, with the paths the trainer sees."""
    return dump(config_input(job))


def deepspeed_text(job: TrainJob) -> str | None:
    """The DeepSpeed JSON uploaded for a sharded job, or None."""
    config = deepspeed_config(job.config.strategy)
    return None if config is None else json.dumps(config, indent=2, sort_keys=True) + "\n"


def train_argv(job: TrainJob) -> list[str]:
    """The command line that starts the training on the host (what `orch render` shows)."""
    return job.run_argv("train", ["axolotl", "train", job.inside(job.config_file)])


def detect_runner(host: Host) -> Runner:
    """`docker` when the host has a Docker CLI, else `process` (the setsid wrapper)."""
    return "docker" if host.run(["docker", "--version"], timeout=30).ok else "process"


# --- status and progress -----------------------------------------------------------------------


class TrainState(StrEnum):
    """Where a detached run is."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # exited non-zero, or vanished (exit_code None: killed, host rebooted)
    MISSING = "missing"  # never started, or removed


@dataclass(frozen=True)
class TrainStatus:
    """A detached run's state and, once it ended, its exit code."""

    state: TrainState
    exit_code: int | None = None

    @property
    def finished(self) -> bool:
        """Whether it ran and ended (succeeded or failed)."""
        return self.state in (TrainState.SUCCEEDED, TrainState.FAILED)


@dataclass(frozen=True)
class Progress:
    """What the trainer's log says: the current step of `total`, and the latest loss."""

    step: int | None = None
    total: int | None = None
    loss: float | None = None
    # Every (step, loss) the tail holds: polls are further apart than steps, and the latest
    # loss alone lost the others (`orch show` summarised steps 3-6 of a 6-step run).
    losses: tuple[tuple[int, float], ...] = ()
    # Every (step, eval loss) the tail holds: the held-out split's loss (axolotl's
    # val_set_size), every eval_steps; what a sweep's early stopping may rank runs by.
    eval_losses: tuple[tuple[int, float], ...] = ()


# The HF/tqdm training bar: `' 25%|##     | 2/8 [00:01<00:03, 2.0it/s]'`. Bars with a label
# before the percentage (`Tokenizing Prompts: 100%|...| 1000/1000`) are dataset preparation,
# not training steps, and are ignored.
_BAR = re.compile(r"^\s*\d{1,3}%\|[^|]*\|\s*(\d+)/(\d+)\b")
# `{'loss': 1.234, 'grad_norm': ...}`; `'eval_loss'` and `'train_loss'` do not match.
# transformers 5 writes floats as `f"{v:.4g}"` strings (`{'loss': '1.234', ...}`): the
# quote is optional.
_NUMBER = r"'?([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|inf))"
_LOSS = re.compile(r"'loss':\s*" + _NUMBER)
# Trainer.evaluate's metrics carry the `eval_` prefix: `{'eval_loss': 1.31, 'eval_runtime': ...}`.
_EVAL_LOSS = re.compile(r"'eval_loss':\s*" + _NUMBER)
_GRAD_NORM = re.compile(r"'grad_norm':\s*" + _NUMBER)


def _logged_loss(line: str, text: str) -> float:
    """The training loss a log line says, NaN where the trainer's NaN filter hid one.

    transformers' Trainer (`logging_nan_inf_filter`, on by default) adds, for a step whose
    loss is NaN or inf, the average of the window's earlier steps instead: a window whose
    every step was NaN (weights gone NaN: a diverged run) sums to 0 and logs `'loss': 0.0`,
    beside a `'grad_norm': nan` (logged when gradients are clipped: `max_grad_norm`, 1.0 by
    default). Taken as written it would be a diverged run's best value. An `inf` norm is
    not it: fp16's loss scaling overflows now and then, skips that step, and the loss is a
    number (a converged fp16 loss under 5e-5 rounds to 0.0 too).
    """
    value = float(text)
    norm = _GRAD_NORM.search(line)
    if value == 0.0 and norm is not None and math.isnan(float(norm.group(1))):
        return float("nan")  # a new NaN at every poll, as a logged `nan` parses
    return value


def parse_progress(text: str) -> Progress:
    """The last training step/total, the last loss, and each loss and eval loss with its step.

    A loss belongs to the step of the next bar line: transformers' ProgressCallback writes
    the logs dict with `tqdm.write` after the bar reached that step, which redraws the bar
    (same step) below it; the simulated trainer prints the dict just before that bar. A
    loss with no bar after it yet waits for the next poll.
    """
    step = total = None
    loss = None
    pending: list[float] = []
    pending_eval: list[float] = []
    losses: dict[int, float] = {}
    evals: dict[int, float] = {}
    for line in re.split(r"[\r\n]+", text):  # tqdm redraws with \r
        bar = _BAR.match(line)
        if bar:
            step, total = int(bar.group(1)), int(bar.group(2))
            if pending:
                losses[step] = pending[-1]
                pending.clear()
            if pending_eval:
                evals[step] = pending_eval[-1]
                pending_eval.clear()
        found = _LOSS.search(line)
        if found:
            loss = _logged_loss(line, found.group(1))
            pending.append(loss)
        found = _EVAL_LOSS.search(line)
        if found:
            pending_eval.append(float(found.group(1)))
    return Progress(step, total, loss, tuple(sorted(losses.items())),
                    tuple(sorted(evals.items())))


@dataclass(frozen=True)
class Detached:
    """One detached command of a job: a named container, or a run directory of the wrapper."""

    runner: Runner
    name: str  # the container name
    run_dir: str  # pid / log / exit_code of the wrapper
    wrapper: str

    def status(self, host: Host) -> TrainStatus:
        """Its state, from `docker inspect` or the wrapper's files."""
        return self.poll(host, 0)[0]

    def tail(self, host: Host, lines: int) -> str:
        """The last `lines` lines of its output (stdout and stderr, in order)."""
        return self.poll(host, lines)[1]

    def poll(self, host: Host, lines: int) -> tuple[TrainStatus, str]:
        """State and log tail in one SSH round trip."""
        if self.runner == "process":
            # No wrapper uploaded yet means nothing was ever started with it.
            script = '[ -f "$1" ] || { echo missing; exit 0; }; exec sh "$@"'
            result = host.run(["sh", "-c", script, "sh", self.wrapper, "poll", self.run_dir,
                               str(lines)])
            if not result.ok:
                raise StepFailed(f"cannot read the job's state in {self.run_dir}: "
                                 f"{last_line(result.stderr)}", stderr=result.stderr)
            head, _, text = result.stdout.partition("\n")
            return _wrapper_status(head), (text if lines else "")
        # `docker logs` writes the container's stderr to stderr: 2>&1 keeps the order.
        script = ('docker inspect -f "$1" "$2" || exit; [ "$3" -gt 0 ] || exit 0; '
                  'exec docker logs --tail "$3" "$2" 2>&1')
        result = host.run(["sh", "-c", script, "sh", _INSPECT, self.name, str(lines)])
        if not result.ok:
            if "no such" in result.stderr.lower():
                return TrainStatus(TrainState.MISSING), ""
            raise StepFailed(f"docker inspect {self.name} failed (exit {result.exit_code}): "
                             f"{last_line(result.stderr or result.stdout)}",
                             stderr=result.stderr)
        head, _, text = result.stdout.partition("\n")
        return _docker_status(head), text

    def start(self, host: Host, argv: Sequence[str], what: str,
              env_file: str | None = None) -> None:
        """Run `argv`, a command line from `TrainJob.run_argv` that starts this run detached."""
        host.must(list(argv), what if self.runner == "process"
                  else f"starting container {self.name} ({what})", env_file=env_file)

    def stop(self, host: Host) -> None:
        """End the run now and forget it (`docker rm -f`, or the wrapper's `stop`: TERM to
        each process of its session, KILL after 10 s, back once none is left); absent is
        fine. Its data (checkpoints) stays."""
        if self.runner == "process":
            script = '[ -f "$1" ] || exit 0; exec sh "$@"'
            host.must(["sh", "-c", script, "sh", self.wrapper, "stop", self.run_dir],
                      "stopping the run")
            return
        result = host.run(["docker", "rm", "-f", self.name])
        if not result.ok and "no such" not in result.stderr.lower():
            raise StepFailed(f"docker rm -f {self.name} failed: {last_line(result.stderr)}",
                             stderr=result.stderr)

    def remove(self, host: Host) -> None:
        """Forget a run that ended (`docker rm`, or clear the wrapper's files); keeps data."""
        if self.runner == "process":
            host.must(["sh", self.wrapper, "clear", self.run_dir], "clearing the finished run")
            return
        result = host.run(["docker", "rm", self.name])
        if not result.ok and "no such" not in result.stderr.lower():
            raise StepFailed(f"docker rm {self.name} failed: {last_line(result.stderr)}",
                             stderr=result.stderr)


def _docker_status(line: str) -> TrainStatus:
    parts = line.split()
    if len(parts) != 2 or not parts[1].lstrip("-").isdigit():
        raise StepFailed(f"unexpected docker inspect output {line!r}")
    state, code = parts[0], int(parts[1])
    if state in ("created", "running", "restarting", "paused"):
        return TrainStatus(TrainState.RUNNING)
    if state == "exited" and code == 0:
        return TrainStatus(TrainState.SUCCEEDED, 0)
    return TrainStatus(TrainState.FAILED, code)  # exited non-zero, dead, removing


def _wrapper_status(line: str) -> TrainStatus:
    parts = line.split()
    if parts == ["running"]:
        return TrainStatus(TrainState.RUNNING)
    if parts == ["missing"]:
        return TrainStatus(TrainState.MISSING)
    if parts == ["lost"]:
        return TrainStatus(TrainState.FAILED, None)
    if len(parts) == 2 and parts[0] == "exited" and parts[1].isdigit():
        code = int(parts[1])
        return TrainStatus(TrainState.SUCCEEDED if code == 0 else TrainState.FAILED, code)
    raise StepFailed(f"unexpected {WRAPPER} status {line!r}")


def status(host: Host, job: TrainJob) -> TrainStatus:
    """The training's state, found by the job id alone (so it works after a reconnect)."""
    return job.handle("train").status(host)


def log_tail(host: Host, job: TrainJob, lines: int = 50) -> str:
    """The last `lines` lines of the training's output."""
    return job.handle("train").tail(host, lines)


def wait(host: Host, job: TrainJob, on_progress: Callable[[Progress], None] | None = None,
         poll_s: float = 5.0, deadline: float | None = None,
         tail_lines: int = 50, on_tail: Callable[[str], None] | None = None) -> TrainStatus:
    """Poll the training until it ends; call `on_progress` each time the step changes.

    `deadline` is a `time.monotonic()` value: when it passes, the current (running) status
    is returned and training goes on. A dropped connection raises `ssh.SSHError`: connect
    again and call `wait` again, it reattaches by the job id. `on_tail` gets each log tail
    read, so the caller can keep the trainer's output without another round trip.
    """
    handle = job.handle("train")
    # A `nan` loss is not equal to itself: the same steps are reported again at each poll,
    # and the caller compares NaN-aware (engine/hostsession.py `_same`).
    reported: tuple[int, tuple[tuple[int, float], ...]] | None = None
    loss: float | None = None
    while True:
        current, text = handle.poll(host, tail_lines)
        if on_tail is not None:
            on_tail(text)
        progress = parse_progress(text)
        # The loss is logged less often than the bar moves: keep the last one seen.
        loss = progress.loss if progress.loss is not None else loss
        if progress.step is not None and (progress.step, progress.losses) != reported:
            reported = progress.step, progress.losses
            if on_progress is not None:
                on_progress(replace(progress, loss=loss))
        if current.state is not TrainState.RUNNING:
            return current
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            return current
        time.sleep(poll_s if deadline is None else max(0.0, min(poll_s, deadline - now)))


def docker_options(job: TrainJob) -> list[str]:
    """`docker run` options shared by training and merging (GPUs, volume, secrets by name)."""
    options = ["--gpus", job.gpus, "--ipc=host", "--shm-size", "10g", "--ulimit", "memlock=-1",
               "-v", f"{job.layout.base}:{CONTAINER_ROOT}",
               "--label", f"orch.job={safe_name(job.job_id)}"]
    for name in job.env:
        options += ["-e", name]  # the value comes from the sourced env file, not argv
    return options
