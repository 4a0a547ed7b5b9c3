"""Vast.ai's answers as orch reads them: the one place that says which fields, of what type,
within which bounds (`providers.answers`). A changed or hostile answer fails here, naming
the field: a whole answer of the wrong shape is a `BadAnswer` (the provider is unavailable
for now), one bad offer row is left out and counted (`VastAI.rejected`).

Shapes: `shared/reference/provider-apis.md` ("Vast.ai") and vast-cli 1.9.1, which prints
the same fields (`vastai search offers --raw`, `show instances --raw`). Vast's "MB" of
`gpu_ram` and `cpu_ram` are MiB; `disk_space` is GB; `storage_cost` is $/GB/month.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AliasChoices, Field

from providers.answers import (
    Answer,
    GpuCount,
    Host,
    InstanceId,
    Lenient,
    Name,
    Port,
    Price,
    Text,
    Token,
)

# Bounds of the quantities orch reads (orders of magnitude past any machine sold).
Mib = Annotated[float, Field(ge=0, le=1e9, allow_inf_nan=False)]  # memory (up to ~1 PB)
Gb = Annotated[float, Field(ge=0, le=1e7, allow_inf_nan=False)]  # disk
Cores = Annotated[float, Field(ge=0, le=1e5, allow_inf_nan=False)]
Fraction = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
Cuda = Annotated[float, Field(ge=0, le=1000, allow_inf_nan=False)]


class Offer(Answer):
    """One row of `POST /bundles/` (`offers[]`): a machine for sale."""

    id: int = Field(ge=0)
    machine_id: int | None = Field(default=None, ge=0)
    gpu_name: Name | None = None
    gpu_ram: Mib | None = None  # per GPU
    num_gpus: GpuCount = 0
    dph_base: Price | None = None  # $/h on demand, without storage
    min_bid: Price | None = None  # the lowest bid ($/h) for an interruptible rental
    storage_cost: Price | None = None  # $/GB/month
    cpu_cores_effective: Cores | None = None
    cpu_ram: Mib | None = None  # host RAM
    disk_space: Gb | None = None
    geolocation: Name | None = None
    # An offer's reliability (vast-cli 1.9.1 shows and filters offers by `reliability`,
    # `cli/display.py:77`); older answers named it `reliability2`, read when it is absent.
    reliability: Fraction | None = Field(default=None,
                                         validation_alias=AliasChoices("reliability",
                                                                       "reliability2"))
    cuda_max_good: Cuda | None = None  # the highest CUDA the host's driver supports


class Search(Answer):
    """`POST /bundles/`: `{"offers": [...]}`; each row is checked on its own (`Offer`)."""

    offers: list[Any]


class PortMapping(Answer):
    """One entry of `ports["22/tcp"]`: `{"HostIp": "0.0.0.0", "HostPort": "41234"}`."""

    host_port: Port = Field(alias="HostPort")


class Instance(Answer):
    """One instance (`GET /instances/{id}/`, a row of the v1 listing).

    Only the id is strict: every other field reads as absent when it is not valid, so an
    odd field never hides a machine orch pays for (the reconciler must still see it).
    """

    id: InstanceId
    machine_id: Lenient[int] = None
    label: Lenient[Name] = None
    actual_status: Lenient[Name] = None
    intended_status: Lenient[Name] = None
    cur_state: Lenient[Name] = None
    next_state: Lenient[Name] = None
    status_msg: Lenient[Text] = None
    is_bid: Lenient[bool] = None
    gpu_name: Lenient[Name] = None
    gpu_ram: Lenient[Mib] = None
    num_gpus: Lenient[GpuCount] = None
    dph_total: Lenient[Price] = None
    public_ipaddr: Lenient[Host] = None
    ports: Lenient[dict[str, Lenient[list[PortMapping]]]] = None
    ssh_host: Lenient[Host] = None
    ssh_port: Lenient[Port] = None


class OneInstance(Answer):
    """`GET /instances/{id}/`: `{"instances": {one object}}` (null when it does not exist;
    a list is tolerated)."""

    instances: dict[str, Any] | list[Any] | None = None


class InstancesPage(Answer):
    """One page of `GET /api/v1/instances/`: `{instances, next_token}`."""

    instances: list[Any] | None = None
    next_token: Lenient[Token] = None


class Outcome(Answer):
    """A create's (`{success, new_contract}`) or a destroy's (`{success}`) answer, or an
    error body (`{success: false, error, msg}`)."""

    success: bool | None = None
    new_contract: int | None = Field(default=None, ge=0)
    error: Lenient[Name] = None
    msg: Lenient[Text] = None
    message: Lenient[Text] = None
