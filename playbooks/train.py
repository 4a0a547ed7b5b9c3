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
import shlex
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from pathlib import PurePosixPath
from typing import Any, Protocol

import paramiko

from playbooks import ssh
from playbooks.base import (
    Fault,
    Host,
    Step,
    StepFailed,
    last_line,
)
from playbooks.datasources import local_files, upload_name
from playbooks.trainjob import (  # noqa: F401 - re-exported: callers use train.<name>
    _BAR,
    _CHECKPOINT,
    _ENV_NAME,
    _GPUS,
    _IMAGE,
    _INSPECT,
    _LOSS,
    _NATIVE,
    ADAPTER_WEIGHTS,
    DEFAULT_IMAGE,
    FULL_WEIGHTS,
    OPTIMIZER_STATE,
    WRAPPER,
    Detached,
    NativeEnv,
    Progress,
    Runner,
    TrainJob,
    TrainState,
    TrainStatus,
    _docker_status,
    _wrapper_status,
    config_input,
    deepspeed_text,
    detect_runner,
    docker_options,
    log_tail,
    parse_progress,
    render_config,
    status,
    train_argv,
    wait,
)

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


class _Entry(Protocol):
    """What the check reads of a directory entry: an SFTP listing's or `os.stat`'s."""

    @property
    def st_mode(self) -> int | None: ...

    @property
    def st_size(self) -> int | None: ...


def _checkpoint_problem(host: Host, path: str, number: int, adapter: bool) -> str | None:
    """Why checkpoint `path` on the host cannot be resumed from (`checkpoint_problem`)."""
    return checkpoint_problem(list_dir(host, path) or {},
                              lambda name: host.read(f"{path}/{name}"), number, adapter)


def checkpoint_problem(entries: Mapping[str, _Entry], read: Callable[[str], bytes | None],
                       number: int, adapter: bool) -> str | None:
    """Why a checkpoint cannot be resumed from, or None when it is complete, from its
    directory's `entries` and `read` (a file's bytes by name, None if absent): on a host,
    and where orch keeps a copy (`orch submit --resume-from` checks that one the same way).

    Saves are not atomic (a preempted save leaves a directory that looks like a checkpoint),
    and HF writes trainer_state.json after the weights and optimizer state: so it must be
    there and parse, and so must the rest.
    """
    def present(name: str) -> bool:
        attrs = entries.get(name)
        if attrs is None:
            return False
        return stat.S_ISDIR(attrs.st_mode or 0) or (attrs.st_size or 0) > 0

    if not present("trainer_state.json"):
        return "trainer_state.json missing"
    raw = read("trainer_state.json")
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
            missing = _missing_shards(read(index), index, entries)
            if missing:
                return f"weight shard {missing[0]} missing"
    return None


def _missing_shards(raw: bytes | None, index: str, entries: Mapping[str, _Entry]) -> list[str]:
    """Shards named by a safetensors/bin index (`raw`) that are absent or empty in `entries`."""
    try:
        weight_map = json.loads(raw or b"")["weight_map"]
        shards = sorted(set(weight_map.values()))
    except (ValueError, TypeError, KeyError, AttributeError):
        return [index]
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


def _upload(job: TrainJob, local: str) -> Step:
    """Upload one local dataset file to the job's data folder (skipped when it is there)."""
    remote = job.layout.data_file(job.job_id, upload_name(local))
    name = "upload-dataset" if local == job.dataset else f"upload-dataset:{upload_name(local)}"
    return Step(name, check=lambda h: remote_sha256(h, remote) == local_sha256(local),
                apply=lambda h: h.put(local, remote), timeout_s=3600)


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

    result = [_upload(job, local) for local in local_files(job.sources, job.dataset)]
    if job.env:
        result.append(Step(
            "secrets-env", check=lambda h: _secrets_current(h, job),
            apply=lambda h: ssh.write_secret_env(h.conn, str(job.secrets_file), job.env),
            timeout_s=120))

    def written(path: str, text: str) -> Callable[[Host], bool]:
        # A trainer that runs read its configs when it started: a takeover that renders the
        # job again (a moved preemption rate, a newer orch) must not rewrite them under it,
        # where they would then say something other than what the run does.
        return lambda h: (h.read(path) == text.encode()
                          or status(h, job).state is TrainState.RUNNING)

    ds_text, ds_file = deepspeed_text(job), job.deepspeed_file
    if ds_text is not None and ds_file is not None:
        result.append(Step(
            "upload-deepspeed", check=written(ds_file, ds_text),
            apply=lambda h: h.put_text(ds_text, ds_file), timeout_s=120))
    result.append(Step(
        "upload-config", check=written(job.config_file, config_text),
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


# What callers use as `train.<name>`: this module's own and those of `trainjob` it re-exports.
__all__ = [
    "ADAPTER_WEIGHTS", "DEFAULT_IMAGE", "FULL_WEIGHTS", "OPTIMIZER_STATE", "WRAPPER",
    "Detached", "NativeEnv", "Progress", "ResumeInfo", "Runner", "TrainJob", "TrainState",
    "TrainStatus", "config_input", "deepspeed_text", "describe", "detect_runner",
    "docker_options", "list_dir", "local_sha256", "log_tail", "parse_progress",
    "prepare_resume", "remote_sha256", "render_config", "status", "steps", "train_argv",
    "wait", "wrapper_step", "wrapper_text",
]
