"""Training on the GPU host: upload, render, start detached, poll, reattach, resume.

Facts: ../shared/reference/pipeline-facts.md ("Training (axolotl in Docker)").

Training runs detached from the SSH session, as a Docker container named after the job
(`container_name("train", job_id)`), or, on hosts without Docker, under the `orch-job.sh`
wrapper (playbooks/remote/) that `setsid nohup`s it and records pid and exit code in the
job's directory. Either way the run is found again by the job id alone, so `status()` and
`wait()` reattach from a new SSH connection or a restarted orch process (Invariant 4), and
the start step, re-run, finds it instead of starting a second one (Invariant 2).

Before a failed or interrupted run is started again, `prepare_resume()` validates the newest
checkpoint and moves a partial one aside (never deleting it), so axolotl's
`auto_resume_from_checkpoints` continues from the last valid one (Invariant 5).

Every user value (job id, file names, image) reaches the host only inside argv lists, which
`playbooks.ssh` quotes word by word; secrets travel in a 0600 env file and are passed to
the container by name (`-e NAME`), never by value (Invariant 6).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import stat
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum
from importlib import resources
from pathlib import Path, PurePosixPath
from typing import Any, Literal

import paramiko

from playbooks import images, ssh
from playbooks.axolotl import TrainConfigInput, deepspeed_config, dump
from playbooks.base import (
    CONTAINER_ROOT,
    Fault,
    Host,
    Layout,
    Step,
    StepFailed,
    container_name,
    last_line,
    safe_name,
)

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

    @classmethod
    def mapped(cls, paths: Callable[[str], str]) -> NativeEnv:
        """The image's paths as they are on a host whose server paths map through `paths`."""
        plain = cls()
        return cls(paths(plain.env_file), paths(plain.venv_bin), paths(plain.cuda_env))

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
    return replace(job.config, base_model_dir=base, dataset_path=job.inside(job.data_file),
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


# The HF/tqdm training bar: `' 25%|##     | 2/8 [00:01<00:03, 2.0it/s]'`. Bars with a label
# before the percentage (`Tokenizing Prompts: 100%|...| 1000/1000`) are dataset preparation,
# not training steps, and are ignored.
_BAR = re.compile(r"^\s*\d{1,3}%\|[^|]*\|\s*(\d+)/(\d+)\b")
# `{'loss': 1.234, 'grad_norm': ...}`; `'eval_loss'` and `'train_loss'` do not match.
_LOSS = re.compile(r"'loss':\s*'?([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|inf))")


def parse_progress(text: str) -> Progress:
    """The last training step/total and the last loss found in a log tail."""
    step = total = None
    loss = None
    for line in re.split(r"[\r\n]+", text):  # tqdm redraws with \r
        bar = _BAR.match(line)
        if bar:
            step, total = int(bar.group(1)), int(bar.group(2))
        found = _LOSS.search(line)
        if found:
            loss = float(found.group(1))
    return Progress(step, total, loss)


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
    reported: int | None = None
    loss: float | None = None
    while True:
        current, text = handle.poll(host, tail_lines)
        if on_tail is not None:
            on_tail(text)
        progress = parse_progress(text)
        # The loss is logged less often than the bar moves: keep the last one seen.
        loss = progress.loss if progress.loss is not None else loss
        if progress.step is not None and progress.step != reported:
            reported = progress.step
            if on_progress is not None:
                on_progress(replace(progress, loss=loss))
        if current.state is not TrainState.RUNNING:
            return current
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            return current
        time.sleep(poll_s if deadline is None else max(0.0, min(poll_s, deadline - now)))


# --- resume ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ResumeInfo:
    """What `prepare_resume` found and did."""

    previous: TrainStatus  # how the earlier run ended
    step: int  # the global step training resumes from (0: from the start)
    checkpoint: str | None  # host path of that checkpoint
    last_step: int | None  # the last step the earlier run reached (its log, else checkpoints)
    lost_steps: int | None  # steps to redo: last_step - step
    moved_aside: tuple[str, ...] = ()  # host paths the partial checkpoints were moved to
    problems: tuple[str, ...] = ()  # why each of them was not resumable


def prepare_resume(host: Host, job: TrainJob) -> ResumeInfo:
    """Make a failed or interrupted training restartable from its newest valid checkpoint.

    Checkpoints newer than the newest valid one are moved aside (never deleted), the ended
    run is removed (`docker rm` / the wrapper's files), and the next start resumes
    (auto_resume_from_checkpoints picks the highest remaining `checkpoint-N`). Safe to
    repeat. A training that still runs is refused: reattach with `wait` instead.
    """
    handle = job.handle("train")
    previous, text = handle.poll(host, 200)
    if previous.state is TrainState.RUNNING:
        raise StepFailed(f"training of job {job.job_id!r} is still running on the host: "
                         "reattach with wait() instead of restarting it")
    logged = parse_progress(text).step
    entries = list_dir(host, job.output_dir) or {}
    numbered = sorted(((int(m.group(1)), name) for name, attrs in entries.items()
                       if (m := _CHECKPOINT.fullmatch(name)) and stat.S_ISDIR(attrs.st_mode or 0)),
                      reverse=True)
    if previous.state is TrainState.SUCCEEDED:
        done = numbered[0][0] if numbered else (logged or 0)
        return ResumeInfo(previous, done, None, logged or done, 0)
    chosen: tuple[int, str] | None = None
    moved: list[str] = []
    problems: list[str] = []
    for number, name in numbered:
        path = f"{job.output_dir}/{name}"
        problem = _checkpoint_problem(host, path, number, job.adapter)
        if problem is None:
            chosen = (number, path)
            break
        moved.append(_move_aside(host, job, path, name))
        problems.append(f"{name}: {problem}")
    if previous.state is not TrainState.MISSING:
        handle.remove(host)
    step = chosen[0] if chosen else 0
    last = logged if logged is not None else (numbered[0][0] if numbered else None)
    lost = max(0, last - step) if last is not None else None
    return ResumeInfo(previous, step, chosen[1] if chosen else None, last, lost,
                      tuple(moved), tuple(problems))


def list_dir(host: Host, path: str) -> dict[str, paramiko.SFTPAttributes] | None:
    """A host directory's entries by name with their attributes, or None when it is missing.

    Over SFTP: no `ls` output to parse, whatever the file names contain.
    """
    try:
        entries = host.list_dir(path)
    except OSError as exc:
        raise ssh.ConnectionLost(f"listing {path} on {host.conn.host} failed: {exc}") from exc
    return None if entries is None else {a.filename: a for a in entries}


def _checkpoint_problem(host: Host, path: str, number: int, adapter: bool) -> str | None:
    """Why checkpoint `path` cannot be resumed from, or None when it is complete.

    Saves are not atomic (a preempted save leaves a directory that looks like a checkpoint),
    and HF writes trainer_state.json after the weights and optimizer state: so it must be
    there and parse, and so must the rest.
    """
    entries = list_dir(host, path) or {}

    def present(name: str) -> bool:
        attrs = entries.get(name)
        if attrs is None:
            return False
        return stat.S_ISDIR(attrs.st_mode or 0) or (attrs.st_size or 0) > 0

    if not present("trainer_state.json"):
        return "trainer_state.json missing"
    raw = host.read(f"{path}/trainer_state.json")
    try:
        state = json.loads(raw or b"")
        global_step = int(state["global_step"])
    except (ValueError, TypeError, KeyError):
        return "trainer_state.json does not parse"
    if global_step != number:
        return f"trainer_state.json says step {global_step}"
    deepspeed = present(f"global_step{number}")  # ZeRO: optimizer and model shards in there
    if not (deepspeed or any(present(name) for name in OPTIMIZER_STATE)):
        return "optimizer state missing"
    weights = ADAPTER_WEIGHTS if adapter else FULL_WEIGHTS
    if not (any(present(name) for name in weights) or (deepspeed and not adapter)):
        return ("adapter weights missing" if adapter else "model weights missing")
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if not adapter and present(index):
            missing = _missing_shards(host, f"{path}/{index}", entries)
            if missing:
                return f"weight shard {missing[0]} missing"
    return None


def _missing_shards(host: Host, index_path: str,
                    entries: Mapping[str, paramiko.SFTPAttributes]) -> list[str]:
    """Shards named by a safetensors/bin index that are absent or empty in `entries`."""
    try:
        weight_map = json.loads(host.read(index_path) or b"")["weight_map"]
        shards = sorted(set(weight_map.values()))
    except (ValueError, TypeError, KeyError, AttributeError):
        return [PurePosixPath(index_path).name]
    return [s for s in shards if s not in entries or not (entries[s].st_size or 0)]


def _move_aside(host: Host, job: TrainJob, path: str, name: str) -> str:
    """Rename a partial checkpoint into the job's partial-checkpoints/ directory.

    Not beside the others as `checkpoint-N.partial-...`: the HF Trainer's checkpoint rotation
    (save_total_limit) globs `checkpoint-*` and would count, and later delete, it.
    """
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    target = f"{job.aside_dir}/{name}.partial-{stamp}"
    taken = list_dir(host, job.aside_dir) or {}
    suffix = 1
    while PurePosixPath(target).name in taken:
        suffix += 1
        target = f"{job.aside_dir}/{name}.partial-{stamp}-{suffix}"
    host.must(["mkdir", "-p", "--", job.aside_dir], "creating the partial-checkpoints directory")
    host.must(["mv", "-T", "--", path, target], f"moving the partial {name} aside")
    return target


# --- the steps ---------------------------------------------------------------------------------


_hash_cache: dict[tuple[str, int, int], str] = {}


def local_sha256(path: str) -> str:
    """sha256 of a local file (cached by path, size and mtime: checks run twice per step)."""
    info = os.stat(path)
    key = (os.path.abspath(path), info.st_size, info.st_mtime_ns)
    if key not in _hash_cache:
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
        _hash_cache[key] = digest.hexdigest()
    return _hash_cache[key]


def remote_sha256(host: Host, path: str) -> str | None:
    """sha256 of a host file (`sha256sum`), or None when it does not exist."""
    result = host.run(["sha256sum", "--", path])
    if not result.ok:
        return None
    return result.stdout.split()[0] if result.stdout.split() else None


def _secrets_text(env: Mapping[str, str]) -> str:
    # The format ssh.write_secret_env writes: compared to skip an unchanged file.
    return "".join(f"{name}={shlex.quote(value)}\n" for name, value in env.items())


def _secrets_current(host: Host, job: TrainJob) -> bool:
    path = job.secrets_file
    assert path is not None
    try:
        attrs = host.stat(path)
    except OSError as exc:
        raise ssh.ConnectionLost(f"stat {path} failed: {exc}") from exc
    if attrs is None:
        return False
    mode = attrs.st_mode or 0
    return not mode & 0o077 and host.read(path) == _secrets_text(job.env).encode()


def wrapper_text() -> str:
    """The orch-job.sh wrapper shipped in playbooks/remote/."""
    return resources.files("playbooks").joinpath("remote", WRAPPER).read_text()


def wrapper_step(job: TrainJob) -> Step:
    """Upload orch-job.sh into the job's directory (process runner)."""
    text = wrapper_text()
    return Step(
        "job-wrapper",
        check=lambda h: h.read(job.wrapper) == text.encode(),
        apply=lambda h: h.put_text(text, job.wrapper, mode=0o755),
        timeout_s=120,
    )


def docker_options(job: TrainJob) -> list[str]:
    """`docker run` options shared by training and merging (GPUs, volume, secrets by name)."""
    options = ["--gpus", job.gpus, "--ipc=host", "--shm-size", "10g", "--ulimit", "memlock=-1",
               "-v", f"{job.layout.base}:{CONTAINER_ROOT}",
               "--label", f"orch.job={safe_name(job.job_id)}"]
    for name in job.env:
        options += ["-e", name]  # the value comes from the sourced env file, not argv
    return options


def steps(job: TrainJob) -> list[Step]:
    """Upload data, secrets and config, get the image or wrapper, start training detached."""
    config_text = render_config(job)

    launched: list[bool] = []  # set once this step started the run

    def start(h: Host) -> None:
        handle = job.handle("train")
        if handle.status(h).state is TrainState.FAILED:
            # An earlier run failed or was cut: validate checkpoints and free the name first
            # (the engine usually did this already, to record the ResumeInfo).
            prepare_resume(h, job)
        handle.start(h, train_argv(job), "starting axolotl train", job.secrets_file)
        launched.append(True)
        current = handle.status(h)
        if current.state is TrainState.FAILED:
            tail = handle.tail(h, 40)
            raise StepFailed(f"training exited with code {current.exit_code} right after "
                             f"starting: {last_line(tail)}", stderr=tail)

    def started(h: Host) -> bool:
        state = status(h, job).state
        # A run this step just started that already failed was started all the same: the
        # failure is the training's, reported by wait() with its log, not a start fault.
        return state in (TrainState.RUNNING, TrainState.SUCCEEDED) or (
            bool(launched) and state is TrainState.FAILED)

    result = [
        Step("upload-dataset",
             check=lambda h: remote_sha256(h, job.data_file) == local_sha256(job.dataset),
             apply=lambda h: h.put(job.dataset, job.data_file), timeout_s=3600),
    ]
    if job.env:
        result.append(Step(
            "secrets-env", check=lambda h: _secrets_current(h, job),
            apply=lambda h: ssh.write_secret_env(h.conn, str(job.secrets_file), job.env),
            timeout_s=120))
    ds_text, ds_file = deepspeed_text(job), job.deepspeed_file
    if ds_text is not None and ds_file is not None:
        result.append(Step(
            "upload-deepspeed", check=lambda h: h.read(ds_file) == ds_text.encode(),
            apply=lambda h: h.put_text(ds_text, ds_file), timeout_s=120))
    result.append(Step(
        "upload-config", check=lambda h: h.read(job.config_file) == config_text.encode(),
        apply=lambda h: h.put_text(config_text, job.config_file), timeout_s=120))
    if job.runner == "docker":
        # Pulled on its own (a ~10 GB image): `docker run -d` would pull inside the start
        # step's shorter timeout, and a failed pull is a different fault from a failed start.
        def pull(h: Host) -> None:
            h.must(["docker", "pull", job.image], f"docker pull {job.image}",
                   fault=Fault.TRANSIENT, timeout=3600)

        result.append(Step(
            "pull-image", check=lambda h: h.run(["docker", "image", "inspect", job.image]).ok,
            apply=pull, timeout_s=3600))
    else:
        result.append(wrapper_step(job))
    result.append(Step("start-training", check=started, apply=start, timeout_s=600))
    return result


def describe(info: ResumeInfo) -> dict[str, Any]:
    """JSON-ready event data for a ResumeInfo."""
    return {"previous": info.previous.state.value, "exit_code": info.previous.exit_code,
            "resumed_from_step": info.step, "checkpoint": info.checkpoint,
            "last_step": info.last_step, "lost_steps": info.lost_steps,
            "moved_aside": list(info.moved_aside), "problems": list(info.problems)}
