"""A registered monthly server's host check: when it is due, and what its report means (pure).

A rental that fails the pre-flight check is released and the job placed elsewhere; a server
the user registered is never given up on silently (its rent is paid, and the user chose it).
Its check runs when a job first uses it and again when due (`due`: never checked, its last
check found something, or that check is older than the policy's `server.recheck_after_hours`,
data/hostmemory.yaml). `judge` splits what a report found into what blocks the job (a wrong
or missing GPU, a driver older than the image needs, too little free disk, a broken disk, no
route to the Hub, a GPU torch cannot use: the job would fail later, after its downloads) and
what only slows it (a GPU under the matmul mark, a slow disk, a slow Hub download: the job
finishes, later than planned, on a machine already paid for). A blocking finding fails the
job with a message that names the server, the check and the fix; a slow one is a warning and
the job runs. `orch servers list` shows the last check's outcome (`ServerVerdict.outcome`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from orchestrator.core.hostmemory import Observation, Policy, Source, policy
from playbooks.hostreport import (
    Check,
    DiskResult,
    DriverResult,
    HostReport,
    HubResult,
    InventoryResult,
    MatmulResult,
    Result,
    Verdict,
)


class Severity(StrEnum):
    """What a finding does to a job on the server."""

    BLOCKS = "blocks"  # the job fails at once, naming the server, the check and the fix
    SLOW = "slow"  # a warning: the job runs, slower than planned


@dataclass(frozen=True)
class Finding:
    """One failed check of a server: its severity, what was seen and what fixes it."""

    check: Check
    severity: Severity
    reason: str
    fix: str

    def to_dict(self) -> dict[str, str]:
        """JSON-ready."""
        return {"check": self.check.value, "severity": self.severity.value,
                "reason": self.reason, "fix": self.fix}


@dataclass(frozen=True)
class ServerVerdict:
    """What a host check of registered server `server` found."""

    server: str
    findings: tuple[Finding, ...] = ()

    @property
    def blocking(self) -> list[Finding]:
        """The findings that fail a job on the server."""
        return [f for f in self.findings if f.severity is Severity.BLOCKS]

    @property
    def slow(self) -> list[Finding]:
        """The findings that only slow a job down."""
        return [f for f in self.findings if f.severity is Severity.SLOW]

    @property
    def outcome(self) -> str:
        """`failed` (a job there fails), `slow` (it runs slower) or `passed`."""
        return "failed" if self.blocking else ("slow" if self.slow else "passed")

    def failure_message(self, in_job: bool = True) -> str:
        """Why a job on the server fails (`in_job`: this job; else any job: `orch servers
        check`), and what to do (one finding per line)."""
        head = (f"registered server {self.server} failed its host check: " + (
            "the job was not run there, nor moved to another machine (a registered server "
            "is never replaced silently)" if in_job else "jobs there fail until it is fixed"))
        lines = [head] + [f"  {f.check.value}: {f.reason}\n    fix: {f.fix}"
                          for f in self.blocking]
        lines.append(f"Then run `orch servers check {self.server}`" + (
            " and submit the job again (or name other providers in resources.providers)."
            if in_job else " again."))
        return "\n".join(lines)

    def warning(self) -> str:
        """What slows a job on the server (it runs anyway)."""
        said = "; ".join(f"{f.check.value}: {f.reason} ({f.fix})" for f in self.slow)
        return (f"registered server {self.server} is slower than the plan assumes; the job "
                f"runs there anyway (its rent is paid): {said}")


def _gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB"


def _classify(check: Check, result: Result, server: str, image: str) -> Finding:
    """The severity and the fix of failed check `check` (see the module docstring)."""
    slow = Severity.SLOW
    blocks = Severity.BLOCKS
    reason = result.reason
    if isinstance(result, DriverResult):
        floor = f" >= {result.min_driver}" if result.min_driver else ""
        cuda = f" (CUDA {result.image_cuda})" if result.image_cuda else ""
        return Finding(check, blocks, reason, f"install an NVIDIA driver{floor}{cuda} on "
                       f"{server} (NVIDIA's CUDA Toolkit release notes, Table 3), then reboot")
    if isinstance(result, DiskResult):
        where = result.path or "orch's directory"
        if result.free_bytes and result.free_bytes < result.need_bytes:
            short = _gb(result.need_bytes - result.free_bytes)
            return Finding(check, blocks, reason, f"free {short} on {where} of {server} (the "
                           "model cache and the job's outputs live there)")
        if result.write_bytes_per_s is None and "took over" not in reason:
            return Finding(check, blocks, reason, f"make {where} on {server} writable (a full"
                           " or read-only filesystem fails every download)")
        return Finding(check, slow, reason, f"an NVMe disk for {where} shortens the model "
                       "download and checkpoint saves")
    if isinstance(result, HubResult):
        if result.http_status == 0:
            return Finding(check, blocks, reason, f"let {server} reach https://huggingface.co"
                           " (DNS and outbound HTTPS on port 443; behind a proxy, set "
                           "HTTPS_PROXY for the login orch uses)")
        if result.bytes_per_s is not None and "under" in reason:
            return Finding(check, slow, reason, "the model download takes longer; its "
                           "network link or route to the Hub is the limit")
        return Finding(check, blocks, reason, f"check {server}'s network: a download from "
                       "https://huggingface.co broke off")
    if isinstance(result, MatmulResult) and result.tflops:
        return Finding(check, slow, reason, "check the GPUs' clocks, power limit and "
                       "temperature (`nvidia-smi -q -d PERFORMANCE,POWER,TEMPERATURE`)")
    if isinstance(result, MatmulResult):
        return Finding(check, blocks, reason, f"make `docker run --rm --gpus all {image} "
                       f"nvidia-smi` work on {server} (the job trains in that image)")
    if isinstance(result, InventoryResult) and result.busy:
        return Finding(check, blocks, reason, f"stop what holds the GPUs' memory on {server} "
                       "(`nvidia-smi --query-compute-apps=pid,process_name,used_memory "
                       "--format=csv` lists it), then submit again: the server is checked "
                       "again before the next job")
    # inventory: nvidia-smi does not list the registered GPUs
    return Finding(check, blocks, reason, f"make nvidia-smi on {server} list the GPUs it was "
                   f"registered with, or register what it has (`orch servers remove "
                   f"{server}`, then `orch servers add {server} --gpu ... --gpus N ...`)")


def judge(server: str, report: HostReport, image: str = "the trainer image") -> ServerVerdict:
    """What `report` (a host check of registered server `server`) means for a job there."""
    found = tuple(_classify(check, result, server, image)
                  for check, result in report.results().items()
                  if result.verdict is Verdict.FAIL)
    return ServerVerdict(server, found)


def due(checks: list[Observation], now: datetime, rules: Policy | None = None) -> str | None:
    """Why registered server's host check is due at `now` (None: it is not), from its
    remembered observations (only `Source.CHECK` ones count)."""
    rules = rules or policy()
    done = [o for o in checks if o.source is Source.CHECK]
    if not done:
        return "it was never checked by orch"
    last = max(done, key=lambda o: o.at)
    when = last.at.strftime("%Y-%m-%d %H:%M UTC")
    if last.failed:
        return f"its last check ({when}) found: {last.why}"
    every = timedelta(hours=rules.server.recheck_after_hours)
    if now - last.at >= every:
        return (f"its last check ({when}) is older than {_span(every)} (checked again after "
                "that)")
    return None


def _span(span: timedelta) -> str:
    hours = span.total_seconds() / 3600
    return f"{hours / 24:g} days" if hours >= 48 and hours % 24 == 0 else f"{hours:g} hours"
