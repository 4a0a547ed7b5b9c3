"""What the pre-flight host check measured and concluded, and the thresholds it judged by.

Pydantic models so that the engine can keep a report as JSON (an event, a host-memory row)
and read it back typed (`HostReport.model_validate_json`). The thresholds are data
(playbooks/data/hostchecks.yaml, each with its source), read once and checked here.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from functools import cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from providers.datacache import read_yaml

DATA = Path(__file__).parent / "data" / "hostchecks.yaml"


class Verdict(StrEnum):
    """What one check concluded about the host."""

    PASS = "pass"
    FAIL = "fail"  # the host is not fit for the job: release it
    UNKNOWN = "unknown"  # not measured or not the host's doing (the Hub refused, no image yet)


class Check(StrEnum):
    """The checks, in the order they run (cheapest first)."""

    INVENTORY = "inventory"
    DRIVER = "driver"
    DISK = "disk"
    HUB = "hub"
    MATMUL = "matmul"


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Result(_Model):
    """One check's conclusion: its verdict, why (empty when it passed), how long it took."""

    verdict: Verdict
    reason: str = ""
    seconds: float = 0.0


class InventoryResult(Result):
    """The GPUs nvidia-smi lists (names as printed, memory in MiB)."""

    gpus: list[str] = Field(default_factory=list)
    memory_mib: list[int] = Field(default_factory=list)
    # In use, by whatever held it then (None: nvidia-smi said [N/A]); empty in a report
    # written before orch read it.
    used_mib: list[int | None] = Field(default_factory=list)
    busy: bool = False  # failed because other processes held the memory the job needs


class DriverResult(Result):
    """The driver, the highest CUDA it supports, and what the trainer image needs."""

    driver_version: str = ""
    cuda_version: str = ""
    image_cuda: str | None = None
    min_driver: str | None = None


class MatmulResult(Result):
    """bf16 matmul TFLOPS of each GPU against the catalog's rated dense figure."""

    tflops: list[float] = Field(default_factory=list)
    rated_tflops: float = 0.0
    healthy_tflops: float = 0.0  # what a healthy card reaches (rated x healthy fraction)
    min_tflops: float = 0.0  # the pass mark
    torch: str = ""

    @property
    def delivered_fraction(self) -> float | None:
        """The slowest GPU's speed as a fraction of a healthy card's (None: not measured)."""
        if not self.tflops or self.healthy_tflops <= 0:
            return None
        return min(self.tflops) / self.healthy_tflops


class DiskResult(Result):
    """Free space against the job's need, and flushed write / direct read speeds."""

    path: str = ""  # the server path the job's disk was measured on
    free_bytes: int = 0
    need_bytes: int = 0
    write_bytes_per_s: float | None = None
    read_bytes_per_s: float | None = None
    min_bytes_per_s: float = 0.0


class HubResult(Result):
    """A ranged GET of one of the base model's files from the Hub."""

    url: str = ""  # no token in it
    http_status: int = 0
    bytes: int = 0
    transfer_seconds: float = 0.0
    bytes_per_s: float | None = None
    min_bytes_per_s: float = 0.0


class HostReport(_Model):
    """Every check's result (None: it did not run: an earlier one failed) and when."""

    checked_at: datetime
    seconds: float
    inventory: InventoryResult | None = None
    driver: DriverResult | None = None
    disk: DiskResult | None = None
    hub: HubResult | None = None
    matmul: MatmulResult | None = None

    def results(self) -> dict[Check, Result]:
        """The checks that ran, in their order."""
        found = {check: getattr(self, check.value) for check in Check}
        return {check: result for check, result in found.items() if result is not None}

    @property
    def passed(self) -> bool:
        """Whether no check failed (an unknown verdict does not fail the host)."""
        return all(r.verdict is not Verdict.FAIL for r in self.results().values())

    @property
    def failures(self) -> dict[Check, str]:
        """Failed check -> why."""
        return {c: r.reason for c, r in self.results().items() if r.verdict is Verdict.FAIL}

    @property
    def delivered_fraction(self) -> float | None:
        """The GPUs' measured speed as a fraction of healthy ones' (None: not measured)."""
        return None if self.matmul is None else self.matmul.delivered_fraction


# --- thresholds (playbooks/data/hostchecks.yaml) ---------------------------------------------


class DriverThresholds(_Model):
    """The lowest driver of each CUDA toolkit (NVIDIA's release notes)."""

    min_driver: dict[str, str]


class MatmulThresholds(_Model):
    """The matmul probe's size and time, and its pass mark as a fraction of the rated figure."""

    size: int = Field(gt=0)
    seconds: float = Field(gt=0)
    timeout_s: float = Field(gt=0)
    healthy_fraction_of_rated: float = Field(gt=0, le=1)
    min_fraction_of_rated: float = Field(gt=0, le=1)


class DiskThresholds(_Model):
    """The dd test's size and bound, and the speed floor as a fraction of the planned pull."""

    test_mib: int = Field(gt=0)
    slack: float = Field(ge=1)
    timeout_s: float = Field(gt=0)
    min_fraction_of_pull: float = Field(gt=0)

    def bound_s(self, floor_bytes_per_s: float) -> float:
        """How long each dd may run: `slack` x what the floor allows, at most timeout_s."""
        return min(self.timeout_s, self.test_mib * 2**20 / floor_bytes_per_s * self.slack)

    def floor(self, pull_bytes_per_s: float) -> float:
        """The slowest disk a host passes with (bytes/s) when the plan downloads at
        `pull_bytes_per_s`; a checkpoint's write time is estimated at it
        (core/checkpointing)."""
        return pull_bytes_per_s * self.min_fraction_of_pull


class HubThresholds(_Model):
    """The ranged GET's size and bound, and Vast.ai's VRAM-scaled download floor."""

    range_mib: int = Field(gt=0)
    setup_s: float = Field(ge=0)
    slack: float = Field(ge=1)
    timeout_s: float = Field(gt=0)
    min_mbit_s: float = Field(gt=0)
    max_mbit_s: float = Field(gt=0)
    mbit_s_per_vram_gib: float = Field(gt=0)

    def min_bytes_per_s(self, total_vram_mib: int) -> float:
        """The floor for a machine with `total_vram_mib` of GPU memory, in bytes/s."""
        mbit = min(self.max_mbit_s, max(self.min_mbit_s,
                                        self.mbit_s_per_vram_gib * total_vram_mib / 1024))
        return mbit * 1e6 / 8

    def bound_s(self, floor_bytes_per_s: float) -> float:
        """How long the ranged GET may run: setup + `slack` x what the floor allows, at most
        timeout_s."""
        return min(self.timeout_s,
                   self.setup_s + self.range_mib * 2**20 / floor_bytes_per_s * self.slack)


class Thresholds(_Model):
    """playbooks/data/hostchecks.yaml."""

    version: int
    driver: DriverThresholds
    matmul: MatmulThresholds
    disk: DiskThresholds
    hub: HubThresholds


@cache
def thresholds() -> Thresholds:
    """The thresholds file, validated (read once)."""
    return Thresholds.model_validate(read_yaml(DATA))
