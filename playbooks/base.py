"""Idempotent steps run over SSH, the runner that reports each one, and the on-host layout.

A playbook is a list of `Step`s. Each step first asks `check(host)` whether the host is
already as it should be; only if not does it `apply(host)`, and then checks again, so a
step that "succeeds" without taking effect is caught. The runner reports every step to the
caller's `emit` (the engine turns these into the job's events): `skipped` (already done),
`changed`, `ok` (a pure verification passed) or `failed` (with the command's stderr tail),
and a failure stops the playbook with a `PlaybookFailed` that says who is at fault.

Playbooks never import the orchestrator core, the store or the providers: they get a
`Host` (a connection plus where things live on it) and plain values.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import PurePosixPath
from typing import Any

import paramiko
from fabric import Connection

from playbooks import ssh

STDERR_TAIL = 2000  # characters of a failed command's stderr kept in the event


class Fault(StrEnum):
    """Who has to act on a failure."""

    HOST = "host"  # the machine is broken or misconfigured (driver, disk, Docker)
    PROVIDER = "provider"  # the machine is not what the offer promised
    USER = "user"  # the job asks for something impossible (gated model without token, ...)
    TRANSIENT = "transient"  # network or service hiccup: retrying may work


class StepFailed(Exception):
    """A step could not reach its desired state; the message says what the user can do."""

    def __init__(self, message: str, *, fault: Fault = Fault.HOST, stderr: str = "") -> None:
        super().__init__(message)
        self.fault = fault
        self.stderr_tail = stderr[-STDERR_TAIL:]


class PlaybookFailed(Exception):
    """A playbook stopped at `step`; `fault` and the message say what to do."""

    def __init__(self, playbook: str, step: str, message: str, fault: Fault,
                 stderr_tail: str = "") -> None:
        super().__init__(f"{playbook}/{step}: {message}")
        self.playbook = playbook
        self.step = step
        self.reason = message
        self.fault = fault
        self.stderr_tail = stderr_tail


@dataclass(frozen=True)
class HostPaths:
    """Maps a server's absolute paths to where they are on this host.

    A real server uses them as they are (`root=""`); the simulated host keeps its server
    filesystem under a directory, and `root` is that directory.
    """

    root: str = ""

    def __call__(self, path: str) -> str:
        """The host path for the server path `path` (absolute)."""
        if not path.startswith("/"):
            raise ValueError(f"server paths are absolute (got {path!r})")
        return f"{self.root.rstrip('/')}{path}" if self.root else path


@dataclass
class Host:
    """One GPU host as the playbooks see it: a pinned SSH connection and its paths."""

    conn: Connection
    paths: HostPaths = field(default_factory=HostPaths)
    command_timeout: float = 600.0
    # A login that is not root: privileged commands go through `sudo -n` (never prompts;
    # set by the toolkit playbook's `privileges` check, or by whoever knows the login).
    sudo: bool = False
    # Set by the runner while a step runs, so commands use the step's timeout.
    _deadline: float | None = field(default=None, repr=False)

    def run(self, argv: Sequence[str], timeout: float | None = None,
            env_file: str | None = None) -> ssh.Result:
        """Run argv (every word quoted); non-zero exits are returned."""
        return ssh.run(self.conn, argv, timeout=self._timeout(timeout), env_file=env_file)

    def must(self, argv: Sequence[str], what: str, *, fault: Fault = Fault.HOST,
             timeout: float | None = None, env_file: str | None = None) -> ssh.Result:
        """Run argv; a non-zero exit raises StepFailed("`what` failed ...")."""
        result = self.run(argv, timeout=timeout, env_file=env_file)
        if not result.ok:
            raise StepFailed(f"{what} failed (exit {result.exit_code}): "
                             f"{last_line(result.stderr or result.stdout)}",
                             fault=fault, stderr=result.stderr)
        return result

    def read(self, path: str) -> bytes | None:
        """Contents of a host file, or None when it does not exist."""
        return ssh.read_file(self.conn, path, timeout=self._io_timeout())

    def put(self, local: str, remote: str, mode: int | None = None) -> None:
        """Upload a file (atomically: temporary name, then rename)."""
        ssh.put_file(self.conn, local, remote, mode=mode, timeout=self._io_timeout())

    def put_text(self, text: str, remote: str, mode: int | None = None) -> None:
        """Write `text` (UTF-8) to a host file, atomically like `put`."""
        fd, local = tempfile.mkstemp(prefix="orch-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
            self.put(local, remote, mode=mode)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(local)

    def privileged(self, argv: Sequence[str]) -> list[str]:
        """`argv` as root: itself for a root login, else through `sudo -n`."""
        return ["sudo", "-n", *argv] if self.sudo else list(argv)

    def put_text_privileged(self, text: str, remote: str, mode: int = 0o644) -> None:
        """`put_text` to a root-owned place (under /etc): SFTP writes as the login user, so
        a non-root login uploads to its home and `sudo -n install`s the file there."""
        if not self.sudo:
            self.put_text(text, remote, mode=mode)
            return
        staged = self.paths(f"/tmp/.orch-{os.getpid()}-{PurePosixPath(remote).name}")
        self.put_text(text, staged, mode=0o600)
        try:
            self.must(self.privileged(["install", "-D", "-m", f"{mode:o}", staged, remote]),
                      f"installing {remote}")
        finally:
            self.run(["rm", "-f", staged])

    def stat(self, path: str) -> paramiko.SFTPAttributes | None:
        """A host path's SFTP attributes, or None when it does not exist."""
        return ssh.stat(self.conn, path, timeout=self._io_timeout())

    def list_dir(self, path: str) -> list[paramiko.SFTPAttributes] | None:
        """A host directory's entries (SFTP attributes), or None when it is missing."""
        return ssh.list_dir(self.conn, path, timeout=self._io_timeout())

    def remove(self, *paths: str) -> list[str]:
        """Delete host files (missing ones are fine); the paths that existed."""
        return ssh.remove_files(self.conn, list(paths), timeout=self._io_timeout())

    def _io_timeout(self) -> float:
        # Every SFTP reply waits at most this long (each thread has its own channel).
        return min(ssh.io_timeout(self.conn), self._timeout(None))

    def _timeout(self, timeout: float | None) -> float:
        limit = timeout if timeout is not None else self.command_timeout
        if self._deadline is not None:
            limit = min(limit, max(1.0, self._deadline - time.monotonic()))
        return limit


# The help pointer a CLI prints after its error (Docker: "See 'docker run --help'." in older
# releases, "Run 'docker run --help' for more information" in newer): never the error.
_HELP_TRAILER = re.compile(r"(See|Run|Try) '[^']+ --help'( for more information)?\.?")


def last_line(text: str) -> str:
    """The last non-empty line of a command's output (the usual error message), past a
    CLI's help pointer."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    while len(lines) > 1 and _HELP_TRAILER.fullmatch(lines[-1]):
        lines.pop()
    return lines[-1][:300] if lines else "(no output)"


Check = Callable[[Host], bool]
# What an apply may say about what it did (reported with the step; None: nothing to add).
Apply = Callable[[Host], str | None]


@dataclass(frozen=True)
class Step:
    """One idempotent unit: `check` says whether it is done, `apply` does it.

    A step without `apply` is a verification: when its check fails the playbook stops with
    `message`.
    """

    name: str
    check: Check
    apply: Apply | None = None
    timeout_s: float = 600.0
    message: str = "check failed"
    fault: Fault = Fault.HOST


class StepOutcome(StrEnum):
    """What a step did: its check passed (`ok`: a check-only step; `skipped`: nothing to
    apply), it applied its change, or it failed (the event kind is `step.<outcome>`)."""

    OK = "ok"
    SKIPPED = "skipped"
    CHANGED = "changed"
    FAILED = "failed"


@dataclass(frozen=True)
class StepReport:
    """What one step did, as reported to `emit`."""

    playbook: str
    step: str
    outcome: StepOutcome
    duration_s: float
    message: str = ""
    stderr_tail: str = ""
    fault: str | None = None
    # When the run moved on to this step, taken before its stop check (UTC): a step whose
    # check read the job before a cancel was committed may start just after it, and this
    # says so exactly, where the event's own time (its write) comes later under load.
    started_at: datetime | None = None

    @property
    def kind(self) -> str:
        """The event kind, e.g. `step.changed`."""
        return f"step.{self.outcome}"

    def data(self) -> dict[str, Any]:
        """JSON-ready event data."""
        out: dict[str, Any] = {"playbook": self.playbook, "step": self.step,
                               "duration_s": round(self.duration_s, 3)}
        if self.stderr_tail:
            out["stderr_tail"] = self.stderr_tail
        if self.fault:
            out["fault"] = self.fault
        if self.started_at is not None:
            out["started_at"] = self.started_at.isoformat().replace("+00:00", "Z")
        return out


Emit = Callable[[StepReport], None]


def run_playbook(name: str, steps: Sequence[Step], host: Host, emit: Emit,
                 check: Callable[[], None] | None = None) -> list[StepReport]:
    """Run `steps` in order; report each; stop at the first failure with PlaybookFailed.

    `check` runs before each step and may raise to stop the run there (the engine's
    cancel: no step starts once the job was asked to stop)."""
    reports: list[StepReport] = []
    for step in steps:
        at = datetime.now(UTC)
        if check is not None:
            check()
        started = time.monotonic()
        host._deadline = started + step.timeout_s
        try:
            outcome, message = _run_step(step, host)
        except (StepFailed, ssh.SSHError) as exc:
            fault = exc.fault if isinstance(exc, StepFailed) else _ssh_fault(exc)
            tail = exc.stderr_tail if isinstance(exc, StepFailed) else ""
            report = StepReport(name, step.name, StepOutcome.FAILED, time.monotonic() - started,
                                str(exc), tail, fault.value, at)
            reports.append(report)
            emit(report)
            raise PlaybookFailed(name, step.name, str(exc), fault, tail) from exc
        finally:
            host._deadline = None
        report = StepReport(name, step.name, outcome, time.monotonic() - started, message,
                            started_at=at)
        reports.append(report)
        emit(report)
    return reports


def _run_step(step: Step, host: Host) -> tuple[StepOutcome, str]:
    if step.check(host):
        return (StepOutcome.OK if step.apply is None else StepOutcome.SKIPPED), ""
    if step.apply is None:
        raise StepFailed(step.message, fault=step.fault)
    said = step.apply(host)
    if not step.check(host):
        raise StepFailed(f"{step.name}: applied, but the host still is not in the desired "
                         "state", fault=step.fault)
    return StepOutcome.CHANGED, said or ""


def _ssh_fault(exc: ssh.SSHError) -> Fault:
    if isinstance(exc, ssh.ConnectionLost | ssh.HostUnreachable | ssh.CommandTimeout):
        return Fault.TRANSIENT
    return Fault.HOST


# --- where orch keeps things on a host -------------------------------------------------------

# Inside containers the host's orch directory is mounted here: never over /workspace, where
# the axolotl images keep their source, venv and entrypoint (/workspace/axolotl*); axolotl's
# docs recommend /workspace/data (real-hosts.md §1).
CONTAINER_ROOT = "/workspace/data"
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def safe_name(value: str) -> str:
    """A path component derived from a user value: never `..`, `/` or shell syntax."""
    cleaned = _SAFE.sub("_", value).strip("._") or "_"
    return cleaned[:120]


@dataclass(frozen=True)
class Layout:
    """orch's directories under one host directory (on the NVMe mount or the volume).

    `base` is a host path (already mapped for the simulated host); `container()` gives the
    same path as the training/serving containers see it (`-v base:/workspace/data`).
    """

    base: str  # e.g. /mnt/nvme/orch

    def model_dir(self, repo: str, revision: str = "main") -> str:
        """Per-repo, per-revision model cache (reused by later jobs on the same server).

        `org/name` becomes `org--name`, as the Hugging Face cache spells it: `--` cannot
        occur in a repo id, so two repos never share a directory.
        """
        return f"{self.base}/models/{safe_name(repo.replace('/', '--'))}/{safe_name(revision)}"

    def job_dir(self, job_id: str) -> str:
        return f"{self.base}/jobs/{safe_name(job_id)}"

    def data_file(self, job_id: str, filename: str) -> str:
        return f"{self.job_dir(job_id)}/data/{safe_name(filename)}"

    def output_dir(self, job_id: str) -> str:
        return f"{self.job_dir(job_id)}/output"

    def config_file(self, job_id: str) -> str:
        return f"{self.job_dir(job_id)}/config.yml"

    def secrets_file(self, job_id: str) -> str:
        return f"{self.job_dir(job_id)}/secrets.env"

    def container(self, host_path: str) -> str:
        """`host_path` as seen inside a container that mounts `base` at CONTAINER_ROOT."""
        rel = PurePosixPath(host_path).relative_to(self.base)
        return str(PurePosixPath(CONTAINER_ROOT) / rel)


def container_name(prefix: str, job_id: str) -> str:
    """A Docker container name derived from the job id (reattach finds it by name)."""
    return f"orch-{prefix}-{safe_name(job_id)}"[:120]
