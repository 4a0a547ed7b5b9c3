"""The provider contract: offers, instances, billing, and the typed errors adapters raise."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from enum import StrEnum


class Billing(StrEnum):
    """How a provider charges: per second, per started minute, or a monthly rent."""

    PER_SECOND = "per_second"
    PER_MINUTE = "per_minute"
    MONTHLY = "monthly"


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model's capabilities (from providers/catalog/gpus.yaml)."""

    name: str
    memory_bytes: int
    bf16_tflops: float
    bandwidth_tbps: float
    mfu: float
    interconnect: str = "pcie"
    # Multi-GPU efficiency by strategy kind ("ddp", "fsdp", "offload") for this interconnect.
    scaling: tuple[tuple[str, float], ...] = ()
    aliases: tuple[str, ...] = ()

    def efficiency(self, kind: str) -> float:
        """Fraction of linear speed-up for `kind` (1.0 when not listed)."""
        return dict(self.scaling).get(kind, 1.0)


@dataclass(frozen=True)
class Offer:
    """Something a job can run on: a cloud machine for sale or a server the user rents.

    `price_per_hour` is the whole machine's price (all its GPUs). For monthly billing it is
    None and `monthly_price` holds the rent; `registered` marks a server the user already
    pays for, whose marginal cost for one more job is zero.
    """

    provider: str
    offer_id: str
    gpu: str
    gpu_count: int
    gpu_memory_bytes: int
    billing: Billing
    interruptible: bool
    price_per_hour: Decimal | None
    monthly_price: Decimal | None = None
    registered: bool = False
    vcpu: int | None = None
    ram_bytes: int | None = None
    disk_bytes: int | None = None
    region: str | None = None
    reliability: float | None = None
    # Minutes from "create" to the first useful second, and the model-download rate.
    boot_minutes: float = 0.0
    pull_gbps: float = 2.0


class ProviderError(Exception):
    """Base of the errors adapters raise; each subclass tells the engine what to do next."""


class CapacityError(ProviderError):
    """No capacity for this offer: try the next one."""


class AuthError(ProviderError):
    """Credentials missing or refused: stop and tell the user which key to set."""


class QuotaError(ProviderError):
    """Account limit reached: stop."""


class BalanceError(ProviderError):
    """Not enough credit: stop."""


class TransientError(ProviderError):
    """Rate limit or server error: retry with backoff."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class NotFound(ProviderError):
    """The instance does not exist (on terminate: already gone, which is success)."""
