"""`orchestrator.core.servercheck`: what a registered server's host check means for a job
there (blocks or only slows), and when the next check is due (issue 40 §1)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from orchestrator.core.hostmemory import Observation, Source
from orchestrator.core.servercheck import Severity, due, judge
from playbooks.hostreport import (
    DiskResult,
    DriverResult,
    HostReport,
    HubResult,
    InventoryResult,
    MatmulResult,
    Verdict,
)

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
FAIL, PASS = Verdict.FAIL, Verdict.PASS


def report(**results: object) -> HostReport:
    return HostReport.model_validate({"checked_at": NOW, "seconds": 3.0, **results})


@pytest.mark.parametrize(("results", "check", "severity", "fix"), [
    ({"inventory": InventoryResult(verdict=FAIL, reason="1x NVIDIA A100, expected H100 SXM")},
     "inventory", Severity.BLOCKS, "orch servers remove box1"),
    ({"inventory": InventoryResult(verdict=FAIL, reason="GPU memory is already in use by "
                                   "processes outside this job (GPU 0: 21504 of 81559 MiB in "
                                   "use)", used_mib=[21504], busy=True)},
     "inventory", Severity.BLOCKS, "stop what holds the GPUs' memory on box1 (`nvidia-smi "
     "--query-compute-apps"),
    ({"driver": DriverResult(verdict=FAIL, reason="CUDA 12.8", min_driver="580.65.06",
                             image_cuda="13.0")},
     "driver", Severity.BLOCKS, "install an NVIDIA driver >= 580.65.06 (CUDA 13.0) on box1"),
    ({"disk": DiskResult(verdict=FAIL, reason="9.0 GB free, the job needs 20.0 GB",
                         path="/mnt/nvme/orch", free_bytes=9_000_000_000,
                         need_bytes=20_000_000_000, write_bytes_per_s=2e9)},
     "disk", Severity.BLOCKS, "free 11.0 GB on /mnt/nvme/orch of box1"),
    ({"disk": DiskResult(verdict=FAIL, reason="the write test failed: Read-only file system",
                         path="/mnt/nvme/orch", free_bytes=10**12, need_bytes=10**9)},
     "disk", Severity.BLOCKS, "writable"),
    ({"disk": DiskResult(verdict=FAIL, reason="writes at 40 MB/s, under 125 MB/s",
                         free_bytes=10**12, need_bytes=10**9, write_bytes_per_s=40e6)},
     "disk", Severity.SLOW, "NVMe"),
    ({"hub": HubResult(verdict=FAIL, reason="no route to the Hub", http_status=0)},
     "hub", Severity.BLOCKS, "let box1 reach https://huggingface.co"),
    ({"hub": HubResult(verdict=FAIL, reason="downloads from the Hub at 24 Mbit/s, under 100 "
                       "Mbit/s", http_status=206, bytes_per_s=3e6)},
     "hub", Severity.SLOW, "network link"),
    ({"matmul": MatmulResult(verdict=FAIL, reason="a GPU reaches 300 TFLOPS, under 544",
                             tflops=[300.0], healthy_tflops=791.0)},
     "matmul", Severity.SLOW, "nvidia-smi -q -d PERFORMANCE"),
    ({"matmul": MatmulResult(verdict=FAIL, reason="torch could not run a matmul on the GPUs")},
     "matmul", Severity.BLOCKS, "docker run --rm --gpus all img nvidia-smi"),
])
def test_each_failed_check_blocks_or_slows_with_its_fix(
        results: dict[str, object], check: str, severity: Severity, fix: str) -> None:
    verdict = judge("box1", report(**results), "img")
    (finding,) = verdict.findings
    assert (finding.check.value, finding.severity) == (check, severity)
    assert fix in finding.fix
    if severity is Severity.BLOCKS:
        assert verdict.outcome == "failed" and not verdict.slow
        message = verdict.failure_message()
        assert "box1" in message and f"{check}: " in message and fix in message
    else:
        assert verdict.outcome == "slow" and "box1" in verdict.warning()


def test_a_passing_report_has_no_findings() -> None:
    verdict = judge("box1", report(inventory=InventoryResult(verdict=PASS),
                                   matmul=MatmulResult(verdict=Verdict.UNKNOWN)))
    assert verdict.outcome == "passed" and verdict.findings == ()


def check(hours_ago: float, failed: bool = False, source: Source = Source.CHECK) -> Observation:
    return Observation(at=NOW - timedelta(hours=hours_ago), source=source, failed=failed,
                       why="driver: too old" if failed else "passed")


def test_a_check_is_due_when_never_run_failed_or_a_week_old() -> None:
    assert "never checked" in (due([], NOW) or "")
    assert "never checked" in (due([check(1, source=Source.RUN)], NOW) or "")
    assert due([check(1)], NOW) is None
    assert due([check(167)], NOW) is None
    assert "older than 7 days" in (due([check(168)], NOW) or "")
    assert "found: driver: too old" in (due([check(5), check(1, failed=True)], NOW) or "")
    assert due([check(5, failed=True), check(1)], NOW) is None  # fixed since
