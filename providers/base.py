"""The provider contract: offers, instances, billing, and the typed errors adapters raise."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from enum import StrEnum
from typing import Protocol, runtime_checkable


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
    compute_capability: str = ""  # CUDA compute capability, "8.9"
    source: str = ""  # where the figures come from (gpus.yaml `source`)

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
    # The physical machine this offer rents, when the provider says before renting (Vast.ai's
    # `machine_id`); None when it picks one at create (RunPod: `Instance.machine_id`).
    machine_id: str | None = None

    @property
    def pull_bytes_per_s(self) -> float:
        """The model-download rate in bytes/s (`pull_gbps` is in Gbit/s)."""
        return self.pull_gbps * 1e9 / 8


class ProviderError(Exception):
    """Base of the errors adapters raise; each subclass tells the engine what to do next."""


class CapacityError(ProviderError):
    """No capacity for this offer: try the next one."""


class PriceChanged(ProviderError):
    """The offer's price moved between the search and the create (Vast.ai's HTTP 400
    `invalid_price`: the bid is now below the minimum): search again and re-plan."""


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


class BadAnswer(TransientError):
    """The provider answered with something its API does not document: not JSON, over the
    size cap (`providers.http.MAX_ANSWER_BYTES`), nested too deep, or a field out of range
    (`providers/<name>/answers.py` names which). Nothing in it is used. The same server
    would most likely answer the same at once, so it is not retried within the call; as a
    TransientError the engine treats the provider as unavailable for now (an outage, with
    its backoff), never as a verdict on the job."""


class NotFound(ProviderError):
    """The instance does not exist (on terminate: already gone, which is success)."""


class InstanceState(StrEnum):
    """A provider's instance states, mapped to what the engine acts on."""

    PROVISIONING = "provisioning"  # created, not yet running (image pull, boot)
    RUNNING = "running"
    INTERRUPTED = "interrupted"  # preempted, outbid, stopped by the provider: re-place the job
    TERMINATED = "terminated"  # gone or being destroyed
    FAILED = "failed"  # the provider reports an error state
    UNKNOWN = "unknown"


# Every instance orch creates carries this tag (in its name or label) with the job id, so
# `list()` finds instances the database never recorded (a crash between create and write).
TAG_PREFIX = "orch-"


def tag_for(job_id: str) -> str:
    """The name/label an instance of `job_id` is created with."""
    return f"{TAG_PREFIX}{job_id}"


def job_of(label: str | None) -> str | None:
    """The job id in an instance's name/label, or None when it is not ours."""
    if label and label.startswith(TAG_PREFIX) and len(label) > len(TAG_PREFIX):
        return label[len(TAG_PREFIX):]
    return None


@dataclass(frozen=True)
class Requirements:
    """What a job needs from an offer, as the scheduler sized it."""

    gpu_count: int
    min_gpu_memory_bytes: int
    gpus: frozenset[str] | None = None  # canonical GPU names; None = any
    interruptible: bool | None = None  # True = spot only, False = on-demand only, None = both
    max_price_per_hour: Decimal | None = None
    min_reliability: float | None = None
    disk_gb: int = 100
    # The trainer image's CUDA version ("13.0"): the host driver must support at least it
    # (a cu130 image on a CUDA 12 driver fails at the first kernel). None = any.
    min_cuda: str | None = None


def cuda_at_least(have: object, want: str) -> bool:
    """Whether CUDA version `have` ("12.8", 13.0, None) is at least `want` ("13.0")."""
    if have is None:
        return False
    try:
        got = tuple(int(p) for p in str(have).split("."))
        need = tuple(int(p) for p in want.split("."))
    except ValueError:
        return False
    return got + (0,) * (len(need) - len(got)) >= need


@dataclass(frozen=True)
class Instance:
    """One machine at a provider, as `get`/`list` report it."""

    provider: str
    instance_id: str
    state: InstanceState
    label: str | None  # the name/label orch created it with (see `tag_for`)
    gpu: str | None = None
    gpu_count: int = 0
    interruptible: bool = False
    price_per_hour: Decimal | None = None  # what the provider charges (not the catalog's)
    ssh_host: str | None = None
    ssh_port: int | None = None
    ssh_user: str = "root"
    raw_status: str = ""  # the provider's own words, for events
    message: str = ""
    # The provider's id of the physical machine (Vast.ai `machine_id`, RunPod `machineId`):
    # what orch remembers a machine's checks and speed by; None when it is not reported.
    machine_id: str | None = None

    @property
    def job_id(self) -> str | None:
        """The job this instance was created for, or None when it is not ours."""
        return job_of(self.label)

    @property
    def reachable(self) -> bool:
        """Running with an SSH endpoint."""
        return self.state is InstanceState.RUNNING and bool(self.ssh_host and self.ssh_port)


class Provider(Protocol):
    """What every provider adapter offers the engine (DESIGN.md, "Contracts")."""

    name: str
    billing: Billing

    def offers(self, req: Requirements) -> list[Offer]:
        """Offers that can run a job with `req`, with live prices."""
        ...

    def create(self, offer: Offer, ssh_public_key: str, job_id: str, image: str | None = None,
               disk_gb: int = 100) -> Instance:
        """Rent `offer` for `job_id` (tagged with `tag_for(job_id)`); CapacityError if gone."""
        ...

    def get(self, instance_id: str) -> Instance:
        """The instance's current state; NotFound when it no longer exists."""
        ...

    def list(self, job_id: str | None = None) -> list[Instance]:
        """Instances tagged as orch's (for `job_id`, or all of them)."""
        ...

    def terminate(self, instance_id: str) -> None:
        """Destroy the instance; one that is already gone counts as success."""
        ...


@runtime_checkable
class ReportsSkipped(Protocol):
    """An adapter that says which offers its last `offers()` call left out because their GPU
    is not one orch plans on (`providers/catalog/gpus.yaml`): the provider's GPU name → how
    many offers. The caller reports them, so a GPU the catalog lacks is never dropped
    silently."""

    skipped: dict[str, int]


@runtime_checkable
class ReportsRejected(Protocol):
    """An adapter that says how many rows of its last `offers()` answer it left out because
    they broke the documented shape (a price that is NaN, infinite, negative or absurd, a
    string where a number belongs): `"<field>: <problem>"` → how many rows. The caller
    reports them; a provider whose every row was rejected is treated as unavailable."""

    rejected: dict[str, int]


@runtime_checkable
class HostPathMapping(Protocol):
    """Optional capability: the provider's machines keep the server's filesystem elsewhere.

    Only simulated machines have it (`sim`, the emulators' hosts): their "server" is a
    directory on this machine, and absolute paths of the real server live under
    `host_root(instance)`. Real providers do not implement it: their paths are used as they
    are. The engine asks for it instead of probing every host for a simulator's variable.
    """

    def host_root(self, instance: Instance) -> str:
        """Where `/` of the instance's machine is on that machine ("" = paths as they are)."""
        ...


def host_root(provider: object, instance: Instance) -> str:
    """The instance's path root when `provider` maps host paths, else "" (a real server)."""
    if isinstance(provider, HostPathMapping):
        return provider.host_root(instance)
    return ""


# --- capabilities ----------------------------------------------------------------------------
# What a provider can do beyond the contract above is declared by implementing one of these
# small protocols, never guessed from its name or probed attribute by attribute: the engine
# asks `isinstance(provider, Capability)` and each adapter says what it is by the methods it
# has. Protocols (rather than flags on `Provider`) keep every capability's members together
# with its meaning, let mypy check an adapter against what it claims, and let a wrapper that
# forwards attributes (the emulators' `WithHostPaths`) carry its provider's capabilities.
# A capability with no members is a marker class instead (below).


@runtime_checkable
class KeepsMachine(Protocol):
    """The machine is the user's (a monthly server): kept, never destroyed.

    At a job's end it is released, not terminated; orch's secret files are removed from it
    first; its SSH host key is pinned in the server registry (outliving the job); a failed
    GPU check marks the server unhealthy rather than the machine lost; the GPU is freed after
    an evaluation. The provider owns the format of its ids.
    """

    def server_name(self, offer_or_instance_id: str) -> str:
        """The registered server an offer id or instance id stands for."""
        ...


# Markers: a capability that is only a fact about the provider, with nothing to call, is a
# nominal base class the adapter inherits (`class SimCloud(OptInOnly, Simulated)`), not a
# dummy method that returns True: an empty Protocol would match every object. A wrapper
# that forwards attributes does not carry a marker; it inherits the marker to declare it.


class OptInOnly:
    """Marker: only jobs that name this provider in `resources.providers` are placed on it
    (a simulated cloud must never take a real job by being cheapest)."""

    __slots__ = ()


class Simulated:
    """Marker: the machines run stand-ins at whatever speed they are told: what runs there
    measures no hardware, so no throughput is recorded from it, and it costs nothing (a
    job on it is not asked about before renting, and runs with quick engine timings)."""

    __slots__ = ()


@runtime_checkable
class HubMirror(Protocol):
    """The provider's hosts download models from a Hub of its own (a mirror of
    huggingface.co), not from `HF_ENDPOINT` or huggingface.co: the check before renting asks
    that Hub, over the same HTTP API (`orchestrator/engine/hubaccess.py`)."""

    def hub_endpoint(self) -> str:
        """The Hub's base URL (`http://127.0.0.1:PORT`), as `HF_ENDPOINT` would name it."""
        ...


@runtime_checkable
class PriceList(Protocol):
    """The provider's offers are a fixed price list, known without asking it (no account,
    no network): `orch plan` ranks them for a job that names the provider."""

    @staticmethod
    def price_list() -> list[Offer]:
        """Everything the provider sells, cheapest first."""
        ...


class ContainerRental:
    """Marker: instances are containers started from the image `create` is given (no Docker
    on the host), as opposed to a full machine that runs the trainer image in Docker."""

    __slots__ = ()


def keeps_machine(provider: object) -> KeepsMachine | None:
    """`provider` as a KeepsMachine, or None."""
    return provider if isinstance(provider, KeepsMachine) else None
