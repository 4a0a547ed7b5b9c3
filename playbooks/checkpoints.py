"""Keep a copy of the newest valid checkpoint off the GPU host, and put it back on a new one.

A preempted spot instance takes its disk with it unless the provider has a volume that
outlives it. For such providers the engine mirrors the newest *valid* checkpoint (the same
validation `train.prepare_resume` applies) to a local directory while training runs, and
before training starts on the next instance it uploads that checkpoint into the job's output
directory, so `auto_resume_from_checkpoints` continues from it (Invariant 5).

Only checkpoints up to `max_bytes` are mirrored (LoRA/QLoRA adapters with their optimizer
state are megabytes; a full fine-tune's checkpoint can be hundreds of gigabytes and belongs
on a provider volume). Local copies are written to `checkpoint-N.part` and renamed when
complete, so a crash mid-copy never leaves a half checkpoint that looks whole.
"""

from __future__ import annotations

import re
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from playbooks import ssh
from playbooks.base import Host
from playbooks.train import TrainJob, _checkpoint_problem, list_dir
from playbooks.trainjob import _CHECKPOINT

DEFAULT_MAX_BYTES = 2 * 1024**3
_LOCAL = re.compile(r"checkpoint-([0-9]+)")


@dataclass(frozen=True)
class Mirrored:
    """A checkpoint copied (or found already copied)."""

    step: int
    path: Path
    bytes: int
    copied: bool


def newest_valid(host: Host, job: TrainJob) -> tuple[int, str] | None:
    """The highest-numbered complete checkpoint on the host: (step, host path)."""
    entries = list_dir(host, job.output_dir) or {}
    numbered = sorted(((int(m.group(1)), name) for name, attrs in entries.items()
                       if (m := _CHECKPOINT.fullmatch(name)) and stat.S_ISDIR(attrs.st_mode or 0)),
                      reverse=True)
    for number, name in numbered:
        path = f"{job.output_dir}/{name}"
        if _checkpoint_problem(host, path, number, job.adapter) is None:
            return number, path
    return None


def local_steps(local_root: Path) -> list[int]:
    """Steps of the complete local copies, newest first."""
    if not local_root.is_dir():
        return []
    return sorted((int(m.group(1)) for p in local_root.iterdir()
                   if p.is_dir() and (m := _LOCAL.fullmatch(p.name))), reverse=True)


def _files(host: Host, path: str) -> list[tuple[str, int]] | None:
    """Files under a checkpoint with their sizes; None when the checkpoint is gone."""
    result = host.run(["find", path, "-type", "f", "-printf", "%P\\t%s\\n"])
    if not result.ok:
        if host.stat(path) is None:
            return None
        raise ssh.CommandFailed(result)
    files = []
    for line in result.stdout.splitlines():
        rel, _, size = line.rpartition("\t")
        parts = PurePosixPath(rel).parts
        if not rel or ".." in parts or rel.startswith("/"):
            continue
        files.append((rel, int(size or 0)))
    return files


def mirror(host: Host, job: TrainJob, local_root: Path,
           max_bytes: int = DEFAULT_MAX_BYTES) -> Mirrored | None:
    """Copy the newest valid checkpoint to `local_root` unless it is there already."""
    found = newest_valid(host, job)
    if found is None:
        return None
    step, path = found
    target = local_root / f"checkpoint-{step}"
    if target.is_dir():
        return Mirrored(step, target, 0, copied=False)
    files = _files(host, path)
    if files is None:
        return None  # rotated away since it was listed: the next poll mirrors a newer one
    total = sum(size for _, size in files)
    if total > max_bytes:
        return None
    part = local_root / f"checkpoint-{step}.part"
    shutil.rmtree(part, ignore_errors=True)
    for rel, _ in files:
        local = part.joinpath(*PurePosixPath(rel).parts)
        local.parent.mkdir(parents=True, exist_ok=True)
        try:
            ssh.get_file(host.conn, f"{path}/{rel}", local)
        except ssh.SSHError as exc:
            # The trainer keeps `save_total_limit` checkpoints and deletes older ones while
            # it runs: on a busy host that can happen mid-copy. Not an error of the job.
            if not isinstance(exc.__cause__, FileNotFoundError):
                raise
            shutil.rmtree(part, ignore_errors=True)
            return None
    part.rename(target)
    for older in local_steps(local_root)[1:]:
        shutil.rmtree(local_root / f"checkpoint-{older}", ignore_errors=True)
    return Mirrored(step, target, total, copied=True)


def restore(host: Host, job: TrainJob, local_root: Path) -> int | None:
    """Upload the newest local copy into the job's output directory if the host lacks it."""
    steps = local_steps(local_root)
    if not steps:
        return None
    step = steps[0]
    on_host = newest_valid(host, job)
    if on_host is not None and on_host[0] >= step:
        return None  # the host's own disk is as new (same machine, or a volume)
    source = local_root / f"checkpoint-{step}"
    remote = f"{job.output_dir}/checkpoint-{step}"
    for local in sorted(p for p in source.rglob("*") if p.is_file()):
        rel = local.relative_to(source).as_posix()
        target = f"{remote}/{rel}"
        host.must(["mkdir", "-p", "--", str(PurePosixPath(target).parent)],
                  "creating the checkpoint directory")
        ssh.put_file(host.conn, local, target)
    return step
