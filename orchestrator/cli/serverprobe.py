"""Prove a monthly server before its first job: reach it, pin its host key, look at its GPUs.

`orch servers add` and `orch servers check` call `probe`: it connects with orch's own key
(the one jobs use), with the host key pinned (read at first contact and shown to the user,
or the one recorded earlier), and reports what a job will need: the GPUs nvidia-smi lists
against what the user registered, the driver and the CUDA version it supports, Docker and
the NVIDIA Container Toolkit, and the free space where the model cache will live. Nothing on
the server is changed.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from playbooks import secrets, ssh
from playbooks.base import Host, HostPaths, StepFailed
from playbooks.gpu import GpuExpectation, check_gpus, mismatch
from playbooks.hostreport import HostReport
from playbooks.model_cache import find_nvme


class ProbeError(Exception):
    """The server could not be checked; `kind` is unreachable | auth | hostkey | error."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass
class ServerFacts:
    """What a check found (JSON-ready through `to_dict`)."""

    host_key: str
    fingerprint: str
    gpus: list[dict[str, Any]] = field(default_factory=list)
    driver: str | None = None
    cuda: str | None = None
    docker: str | None = None
    toolkit: str | None = None
    privileges: str | None = None  # root | sudo (passwordless) | none
    cache_mount: str | None = None
    cache_nvme: bool = False
    cache_free_bytes: int | None = None
    gpu_error: str | None = None  # set: the server must not take jobs until fixed
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_CUDA = re.compile(r"CUDA Version\s*:\s*([0-9]+(?:\.[0-9]+)*)")


def probe(host: str, port: int, user: str, key_path: Path, *, gpu: str, gpu_count: int,
          pinned: str | None = None, timeout: float = 15.0) -> ServerFacts:
    """Check the server; raises ProbeError when it cannot be reached or logged into.

    `pinned` None: read the host key now (first contact) and pin that one for the check.
    """
    try:
        key = ssh.parse_host_key(pinned) if pinned else ssh.trust_on_first_use(
            host, port, timeout=timeout, deadline=timeout, retry_refused=False)
    except ssh.HostUnreachable as exc:
        if isinstance(exc.__cause__, ConnectionRefusedError):
            raise ProbeError("unreachable", f"cannot reach {host}:{port} over SSH: the "
                             "connection was refused; check that sshd runs on the server and "
                             f"listens on port {port} (give the right one with --port) and "
                             "that no firewall rejects it") from exc
        raise ProbeError("unreachable", f"cannot reach {host}:{port} over SSH: {exc}") from exc
    except ssh.SSHError as exc:
        raise ProbeError("unreachable", str(exc)) from exc
    host_key = ssh.format_host_key(key)
    facts = ServerFacts(host_key=host_key, fingerprint=ssh.fingerprint(key))
    with _session(host, port, user, key_path, host_key, timeout) as target:
        try:
            expected = GpuExpectation(gpu, gpu_count, exact_count=False)
        except ValueError as exc:  # a catalog GPU the nvidia-smi name table lacks
            facts.gpu_error = str(exc)
        else:
            _gpus(target, facts, expected)
        _software(target, facts)
        _disk(target, facts)
    return facts


def host_check(host: str, port: int, user: str, key_path: Path, host_key: str, *, gpu: str,
               gpu_count: int, repo: str, hf_token: str | None,
               timeout: float = 15.0) -> HostReport:
    """The engine's pre-flight host check (playbooks/hostcheck.py) on a registered server, as
    a job's would run it there (its trainer image's environment, orch's directory on the model
    cache disk), with `repo` as the model the Hub is asked for. The job's disk need is not
    known here: free space is judged by each job's own check. Raises ProbeError as `probe`."""
    from playbooks import hostcheck, images, train
    from providers import catalog
    from providers.dedicated.compute import PULL_GBPS

    image = train.DEFAULT_IMAGE
    spec = hostcheck.HostCheckSpec(
        job_id="servers-check", gpu=GpuExpectation(gpu, gpu_count, exact_count=False,
                                                   min_cuda=images.min_cuda(image), image=image),
        rated_tflops=catalog.gpus()[gpu].bf16_tflops, disk_need_bytes=0, repo=repo,
        trainer_image=image, pull_bytes_per_s=PULL_GBPS * 1e9 / 8, hf_token=hf_token,
        complete=True)
    with _session(host, port, user, key_path, host_key, timeout) as target:
        target.command_timeout = 600
        return hostcheck.run(target, spec, lambda _report: None)


def scrub_secrets(host: str, port: int, user: str, key_path: Path, host_key: str,
                  timeout: float = 15.0) -> list[str]:
    """Remove orch's secret files from a server we keep (issue 10 §6); the paths removed.

    orch's directory is `<model cache mount>/orch`, found the way the model cache finds it.
    """
    with _session(host, port, user, key_path, host_key, timeout) as target:
        try:
            mount = find_nvme(target)
        except StepFailed:
            return []  # no cache disk: no job ever wrote there
        try:
            return secrets.scrub(target, f"{mount.mount_point.rstrip('/')}/orch")
        except StepFailed as exc:
            raise ProbeError("error", str(exc)) from exc


@contextlib.contextmanager
def _session(host: str, port: int, user: str, key_path: Path, host_key: str,
             timeout: float) -> Iterator[Host]:
    """A playbook Host on the server, host key pinned; SSH failures become ProbeError."""
    from orchestrator.core.settings import settings

    chosen = settings()
    factory = ssh.ConnectionFactory(key_path, connect_timeout=timeout, connect_deadline=timeout,
                                    command_timeout_s=chosen.ssh_command_timeout_s,
                                    io_timeout_s=chosen.ssh_io_timeout_s)
    try:
        try:
            conn = factory.connect(host, port, user, host_key)
        except ssh.HostKeyMismatch as exc:
            raise ProbeError("hostkey", str(exc)) from exc
        except ssh.AuthenticationFailed as exc:
            raise ProbeError("auth", f"{user}@{host}:{port} refused orch's key") from exc
        except ssh.HostUnreachable as exc:
            raise ProbeError("unreachable", f"cannot reach {host}:{port} over SSH: "
                                            f"{exc}") from exc
        except ssh.SSHError as exc:
            raise ProbeError("error", str(exc)) from exc
        # The simulated host keeps its filesystem under SIMHOST_ROOT (as the engine reads it);
        # on a real server it is unset and paths are used as they are.
        root = ssh.run(conn, ["sh", "-c", 'printf %s "${SIMHOST_ROOT-}"'], timeout=30)
        yield Host(conn, HostPaths(root.stdout.strip() if root.ok else ""), command_timeout=60)
    except ssh.SSHError as exc:
        raise ProbeError("error", f"{host}:{port}: {exc}") from exc
    finally:
        factory.close_all()


def _gpus(host: Host, facts: ServerFacts, expected: GpuExpectation) -> None:
    try:
        gpus = check_gpus(host)
    except StepFailed as exc:
        facts.gpu_error = str(exc)
        return
    facts.gpus = [{"name": g.name, "memory_mib": g.memory_mib, "model": g.model} for g in gpus]
    facts.driver = gpus[0].driver_version
    facts.gpu_error = mismatch(expected, gpus)
    version = host.run(["nvidia-smi", "--version"], timeout=30)
    found = _CUDA.search(version.stdout) if version.ok else None
    if found is None:  # older drivers have no --version: the summary header says it too
        summary = host.run(["nvidia-smi"], timeout=30)
        found = _CUDA.search(summary.stdout) if summary.ok else None
    facts.cuda = found.group(1) if found else None


def privileges(host: Host) -> str:
    """`root`, `sudo` (passwordless) or `none`: what orch's privileged steps can use."""
    uid = host.run(["id", "-u"], timeout=30)
    if uid.ok and uid.stdout.strip() == "0":
        return "root"
    return "sudo" if host.run(["sudo", "-n", "true"], timeout=30).ok else "none"


def _software(host: Host, facts: ServerFacts) -> None:
    facts.privileges = privileges(host)
    docker = host.run(["docker", "--version"], timeout=30)
    facts.docker = docker.stdout.strip() if docker.ok else None
    toolkit = host.run(["nvidia-ctk", "--version"], timeout=30)
    if toolkit.ok:
        facts.toolkit = (toolkit.stdout.strip().splitlines() or ["installed"])[0]
    if facts.docker is None:
        facts.notes.append("Docker is not installed: install Docker Engine "
                           "(https://docs.docker.com/engine/install/) before the first job")
    elif facts.toolkit is None:
        facts.notes.append("the NVIDIA Container Toolkit is not installed: the first job "
                           "installs it (apt, then a Docker restart)")
        if facts.privileges == "none":
            facts.notes.append("the login is not root and has no passwordless sudo: the "
                               "first job cannot install the toolkit; log in as root, give "
                               "the user `NOPASSWD` sudo, or install the toolkit yourself")


def _disk(host: Host, facts: ServerFacts) -> None:
    try:
        mount = find_nvme(host)
    except StepFailed as exc:
        facts.notes.append(str(exc))
        return
    facts.cache_mount = mount.mount_point.removeprefix(host.paths.root) or "/"
    facts.cache_nvme = mount.nvme
    facts.cache_free_bytes = mount.avail_bytes
    if not mount.nvme:
        facts.notes.append(f"no NVMe filesystem is mounted: the model cache goes to "
                           f"{facts.cache_mount}")
