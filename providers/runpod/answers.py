"""RunPod's REST v2 answers as orch reads them: the one place that says which fields, of
what type, within which bounds (`providers.answers`). Its storage prices are
providers/catalog/disks.yaml's (shared with the market snapshot).

A changed or hostile answer fails here, naming the field: a whole answer of the wrong shape
is a `BadAnswer` (the provider is unavailable for now), one bad GPU row is left out and
counted (`RunPod.rejected`). Shapes: api-reference-v2/openapi.json in runpod/docs (a900806):
`ListGpuTypesResponse`/`GpuType`, `Pod`, `ListPodsResponse`, `ErrorResponse`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from providers.answers import (
    Answer,
    GpuCount,
    Host,
    InstanceId,
    Lenient,
    Login,
    Name,
    Port,
    Price,
    Text,
)

VramGb = Annotated[int, Field(ge=0, le=100_000)]
DiskGb = Annotated[int, Field(ge=0, le=10_000_000)]
Availability = Literal["NONE", "LOW", "MEDIUM", "HIGH"]


class PerCloud(Answer):
    """`price`: $/h for ONE GPU, per cloud (the whole pod's is that × `gpu.count`)."""

    secure: Price | None = None
    community: Price | None = None


class MaxCount(Answer):
    """`maxCount`: a ceiling per cloud (the largest machine), not stock."""

    secure: GpuCount | None = None
    community: GpuCount | None = None


class GpuType(Answer):
    """One row of `GET /catalog/gpus` (`gpus[]`)."""

    id: Annotated[Name, Field(min_length=1)]
    name: Name | None = None
    memory: VramGb | None = None  # VRAM, GB
    secure: bool | None = None
    community: bool | None = None
    price: PerCloud = PerCloud()
    max_count: MaxCount = Field(default=MaxCount(), alias="maxCount")
    # Present with include=AVAILABILITY, scoped to the query's `cloud` and `count`.
    availability: Availability | None = None


class Catalog(Answer):
    """`GET /catalog/gpus`: `{"gpus": [...]}`; each row is checked on its own (`GpuType`)."""

    gpus: list[Any]


# A pod: only the id is strict; every other field reads as absent when it is not valid,
# so an odd field never hides a pod orch pays for (the reconciler must still see it).


class PodGpu(Answer):
    id: Lenient[Name] = None
    display_name: Lenient[Name] = Field(default=None, alias="displayName")
    count: Lenient[GpuCount] = None


class SshEndpoint(Answer):
    host: Host
    port: Port
    username: Lenient[Login] = None


class PodSsh(Answer):
    direct: Lenient[SshEndpoint] = None


class RuntimePort(Answer):
    """An entry of `runtime.ports`: `{private, public, type, ip}`."""

    private: Lenient[Port] = None
    public: Lenient[Port] = None
    type: Lenient[Name] = None
    ip: Lenient[Host] = None


class PodRuntime(Answer):
    ports: Lenient[list[Lenient[RuntimePort]]] = None


class PersistentMount(Answer):
    size: Lenient[DiskGb] = None


class Mounts(Answer):
    persistent: Lenient[PersistentMount] = None


class Pod(Answer):
    """`GET /pods/{id}`, a row of `GET /pods`, the answer of `POST /pods`."""

    id: InstanceId
    name: Lenient[Name] = None
    status: Lenient[Name] = None
    gpu: Lenient[PodGpu] = None
    cost: Lenient[Price] = None  # $/h, "0.0 when EXITED or TERMINATED"
    disk: Lenient[DiskGb] = None  # the container disk, GB
    mounts: Lenient[Mounts] = None
    ssh: Lenient[PodSsh] = None
    runtime: Lenient[PodRuntime] = None
    message: Lenient[Text] = None


class Pods(Answer):
    """`GET /pods`: `{"pods": [...]}`; each pod is checked on its own (`Pod`)."""

    pods: list[Any]


class FieldProblem(Answer):
    field: Lenient[Name] = None
    message: Lenient[Text] = None


class Problem(Answer):
    """An RFC 9457 problem document: `{title, status, detail, errors?}`."""

    title: Lenient[Text] = None
    detail: Lenient[Text] = None
    errors: Lenient[list[Lenient[FieldProblem]]] = None
