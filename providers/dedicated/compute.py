"""Monthly dedicated servers the user rents and registered with `orch servers add`.

There is no provider API: `create` claims an idle registered server (atomically, so two jobs
never share one), `terminate` releases it, and nothing is ever destroyed. The rent is already
paid, so a job's marginal cost here is zero; the amortised share is reported separately.
The registry (the store's `server` table) is passed in, so this module imports no database
code.
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal
from typing import NamedTuple, Protocol

from providers.base import (
    Billing,
    CapacityError,
    Instance,
    InstanceState,
    NotFound,
    Offer,
    Requirements,
    tag_for,
)

NAME = "dedicated"
# A registered server is already running: no boot, and one model pull the first time.
PULL_GBPS = 2.0
_PREFIX = "server:"


class RegisteredServer(NamedTuple):
    """A monthly server the user rents (a row of the `server` table), as plain values."""

    name: str
    gpu: str
    gpu_count: int
    monthly_price: Decimal
    host: str = ""
    status: str = "idle"
    port: int = 22
    user: str = "root"
    claimed_by_job: str | None = None
    check_error: str | None = None  # failed its GPU check: not offered until fixed


class ServerRegistry(Protocol):
    """What the provider needs from the store."""

    def registered(self) -> Sequence[RegisteredServer]:
        """Every registered server."""
        ...

    def claim_server(self, name: str, job_id: str) -> bool:
        """Atomically claim an idle server for `job_id`; False if it was not free."""
        ...

    def release_server(self, name: str, job_id: str | None = None) -> bool:
        """Make a claimed server idle again."""
        ...


def offer_id(name: str) -> str:
    """The offer id of a registered server."""
    return f"{_PREFIX}{name}"


def server_offers(servers: Sequence[RegisteredServer]) -> list[Offer]:
    """Idle registered servers as offers with zero marginal cost."""
    # Imported here: the store imports this module for `RegisteredServer`, and commands that
    # only read the database (`orch jobs`) need neither the catalog nor its YAML parser.
    from providers import catalog

    spec = catalog.gpus()
    out = []
    for s in servers:
        if s.status != "idle" or s.claimed_by_job or s.gpu not in spec or s.check_error:
            continue
        out.append(Offer(
            provider=NAME,
            offer_id=offer_id(s.name),
            gpu=s.gpu,
            gpu_count=s.gpu_count,
            gpu_memory_bytes=spec[s.gpu].memory_bytes,
            billing=Billing.MONTHLY,
            interruptible=False,
            price_per_hour=None,
            monthly_price=s.monthly_price,
            registered=True,
            region=s.host or None,
            boot_minutes=0.0,
            pull_gbps=PULL_GBPS,
        ))
    return out


class Dedicated:
    """The Provider contract over the user's registered monthly servers."""

    name = NAME
    billing = Billing.MONTHLY

    def __init__(self, registry: ServerRegistry) -> None:
        self.registry = registry

    def offers(self, req: Requirements) -> list[Offer]:
        """Idle servers with enough GPUs of enough memory."""
        return [o for o in server_offers(self.registry.registered())
                if o.gpu_count >= req.gpu_count
                and o.gpu_memory_bytes >= req.min_gpu_memory_bytes
                and (req.gpus is None or o.gpu in req.gpus)
                and req.interruptible is not True]

    def create(self, offer: Offer, ssh_public_key: str, job_id: str, image: str | None = None,
               disk_gb: int = 100) -> Instance:
        """Claim the server for `job_id`; CapacityError when another job holds it."""
        name = _server_name(offer.offer_id)
        if not self.registry.claim_server(name, job_id):
            raise CapacityError(f"server {name} is busy or no longer registered")
        return self.get(name)

    def get(self, instance_id: str) -> Instance:
        """The server as an instance: running while claimed, terminated once released."""
        for s in self.registry.registered():
            if s.name == instance_id:
                return _instance(s)
        raise NotFound(f"server {instance_id} is not registered")

    def list(self, job_id: str | None = None) -> list[Instance]:
        """Servers claimed by orch jobs (by `job_id`, or all)."""
        return [_instance(s) for s in self.registry.registered()
                if s.claimed_by_job and (job_id is None or s.claimed_by_job == job_id)]

    def terminate(self, instance_id: str) -> None:
        """Release the server (never destroyed); an idle or unknown one is fine."""
        self.registry.release_server(instance_id)

    def server_name(self, offer_or_instance_id: str) -> str:
        """The server an offer or instance id names (`providers.base.KeepsMachine`)."""
        return _server_name(offer_or_instance_id)


def _server_name(offer_or_instance_id: str) -> str:
    return offer_or_instance_id.removeprefix(_PREFIX)


def _instance(s: RegisteredServer) -> Instance:
    claimed = s.claimed_by_job is not None and s.status == "busy"
    return Instance(
        provider=NAME,
        instance_id=s.name,
        state=InstanceState.RUNNING if claimed else InstanceState.TERMINATED,
        label=tag_for(s.claimed_by_job) if s.claimed_by_job else None,
        gpu=s.gpu,
        gpu_count=s.gpu_count,
        interruptible=False,
        price_per_hour=Decimal(0),  # the rent is already paid
        ssh_host=s.host,
        ssh_port=s.port,
        ssh_user=s.user,
        raw_status=s.status,
    )
