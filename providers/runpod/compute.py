"""RunPod adapter: REST v2 (`https://api.runpod.io/v2`), on-demand pods billed per second.

Shapes follow ../shared/reference/provider-apis.md ("RunPod REST v2"):

* offers    `GET /catalog/gpus?include=AVAILABILITY&product=POD&cloud=C&count=N`, once per
            cloud: availability is scoped to that cloud and GPU count (`maxCount` is only
            the largest machine's GPU count, a ceiling, not stock)
* create    `POST /pods` (201, a Pod in `PROVISIONING`)
* get/list  `GET /pods/{id}` / `GET /pods` -> `{pods: [...]}`
* terminate `DELETE /pods/{id}` (204; 404 = already gone = success)

RunPod withdrew spot pods in 2026, so every offer is on-demand (`interruptible=False`).

Prices: an offer is the GPUs' list price × count plus the pod's container disk and volume
disk while running, at RunPod's published storage prices (providers/catalog/disks.yaml, with
its source; the market snapshot prices its RunPod rows with the same rule); a pod's hourly
price is its `cost` (the GPUs) plus the same storage, so a parked warm pod's idle cost counts
its disks too. The v2 catalog has no host RAM or vCPU figure for a GPU
type (openapi `GpuType`), so RunPod offers leave `ram_bytes` and `vcpu` unknown.

Every answer is checked against its model in `answers.py` before anything here reads it:
an answer of the wrong shape is a BadAnswer, a GPU row that breaks it is left out and
counted in `rejected` (`providers.base.ReportsRejected`).

SSH key delivery: the public key goes into the pod's `env` as `PUBLIC_KEY` and the pod is
created with `startSsh: true` (which injects the account's keys only when the request sets no
`PUBLIC_KEY`) and `22/tcp` exposed. Only images that honour the convention start sshd from it
(`axolotlai/axolotl-cloud*`, `runpod/base`, `runpod/pytorch`): the pod of any other image
runs but never answers on port 22, so pods are created with the trainer's cloud image. SSH
goes to `ssh.direct` (a public port for 22/tcp); `ssh.proxy` carries an interactive shell
only (no SFTP, no `ssh host cmd` output), useless to orch. We deliberately do NOT use
`PUT /account/ssh-keys`: it *replaces* the account's whole key set, so calling it would
silently remove the keys the user (or another orch job) relies on.

The requests and the typed error for each answer (RFC 9457 problem documents, mapped by
status) are `api_client.RunPodApi`'s. Every call goes through its retry policy
(`providers.http.with_retries`), which retries only `TransientError` (429 honouring
`Retry-After`, 5xx, network errors).

The API key travels only in the `Authorization` header: it is never put in URLs, bodies,
messages or `repr`, and any echo of it in a provider message is scrubbed.
"""

from __future__ import annotations

import builtins
import re
from decimal import Decimal
from functools import partial
from typing import Any

import httpx

from providers import catalog
from providers.answers import merge, rows
from providers.apiclient import ApiProvider
from providers.base import (
    Billing,
    ContainerRental,
    Instance,
    InstanceState,
    NotFound,
    Offer,
    ProviderError,
    Requirements,
    TransientError,
    job_of,
    tag_for,
)
from providers.catalog import disks
from providers.http import DEADLINE_S, MAX_ATTEMPTS
from providers.runpod import answers
from providers.runpod.api_client import DEFAULT_BASE_URL, RateLimited, RunPodApi

# The trainer's cloud image (axolotl v0.18.0, uv build): its entrypoint starts sshd from
# PUBLIC_KEY (real-hosts.md §1). Callers normally pass the job's image; this is the fallback.
DEFAULT_IMAGE = "axolotlai/axolotl-cloud:0.18.0-py3.12-cu130-2.12.0"
# Where the job's volume is mounted. RunPod's default `/workspace` would hide the image's
# /workspace/axolotl and /workspace/axolotl-venv; axolotl recommends /workspace/data.
VOLUME_PATH = "/workspace/data"
# The pod's disks and their prices are shared with the market snapshot (catalog/disks.yaml):
# the container disk (ephemeral: wiped on restart) holds only what the image writes outside
# the volume (pip/uv caches, /tmp); the job's data goes to the volume.
MIN_VOLUME_GB = disks.runpod().min_volume_gb  # PersistentMount.size minimum (openapi.json)
CONTAINER_DISK_GB = disks.runpod().container_disk_gb
CLOUDS = ("SECURE", "COMMUNITY")
_GIB = 1024**3

# RunPod GPU type ids / display names -> our canonical names (providers/catalog/gpus.yaml).
# RunPod GPU id (the name nvidia-smi prints on the pod) → canonical name, from gpus.yaml's
# `spellings: runpod` (the source notes are there). Other ids fall back to
# `catalog.resolve_gpu` on the name with the vendor prefix stripped; a GPU that still maps to
# zero or several models is left out.
GPU_NAMES: dict[str, str] = {spelling: canonical
                             for canonical, names in catalog.spellings("runpod").items()
                             for spelling in names}

# Pod `status` -> the engine's states.
# EXITED: orch never stops a pod (it only deletes them), so an EXITED pod stopped without us:
# host maintenance, a crashed container, the account running dry. It no longer runs the job
# although it still exists (and bills for its disk), so the engine must re-place the job and
# terminate this pod: that is exactly INTERRUPTED.
STATES: dict[str, InstanceState] = {
    "PROVISIONING": InstanceState.PROVISIONING,
    "STARTING": InstanceState.PROVISIONING,
    "RUNNING": InstanceState.RUNNING,
    "EXITED": InstanceState.INTERRUPTED,
    "ERROR": InstanceState.FAILED,
    "TERMINATED": InstanceState.TERMINATED,
}


def canonical_gpu(gpu_id: str | None, name: str | None = None) -> str | None:
    """Our canonical GPU name for a RunPod GPU id/display name, or None when unknown."""
    for raw in (gpu_id, name):
        if not raw:
            continue
        if raw in GPU_NAMES:
            return GPU_NAMES[raw]
        short = re.sub(r"^(NVIDIA\s+)?(GeForce\s+)?", "", raw.strip(), flags=re.I)
        hits = catalog.resolve_gpu(short)
        if len(hits) == 1:
            return hits[0]
    return None


def volume_gb(disk_gb: int) -> int:
    """The volume disk a pod for a job of `disk_gb` gets (RunPod's minimum is 10 GB)."""
    return disks.runpod().volume_gb(disk_gb)


def pod_price(pod: answers.Pod) -> Decimal | None:
    """The pod's hourly price: its `cost` (the GPUs; 0 once EXITED) plus its disks, at
    RunPod's storage prices for its state; None when the pod reports no valid cost."""
    if pod.cost is None:
        return None
    prices = disks.runpod()
    volume = (pod.mounts.persistent.size if pod.mounts and pod.mounts.persistent else 0) or 0
    status = (pod.status or "").upper()
    if status == "TERMINATED":
        storage = Decimal(0)
    elif status == "EXITED":
        storage = prices.stopped_per_hour(volume)
    else:
        storage = prices.running_per_hour(pod.disk or 0, volume)
    return disks.quantize(pod.cost + storage)


class RunPod(ApiProvider[RunPodApi], ContainerRental):
    """The RunPod provider (on-demand pods, per-second billing); see the module docstring."""

    name = "runpod"
    billing = Billing.PER_SECOND

    def __init__(self, api_key: str, base_url: str = DEFAULT_BASE_URL,
                 client: httpx.Client | None = None, *, timeout_s: float = 30.0,
                 attempts: int = MAX_ATTEMPTS, deadline_s: float = DEADLINE_S,
                 initial_backoff_s: float = 0.5, max_backoff_s: float = 20.0,
                 default_image: str = DEFAULT_IMAGE, boot_minutes: float = 5.0) -> None:
        """`client` may be shared; the key is sent per request, never set on the client."""
        self._api = RunPodApi(api_key, base_url, client, timeout_s=timeout_s,
                              attempts=attempts, deadline_s=deadline_s,
                              initial_s=initial_backoff_s, max_wait_s=max_backoff_s)
        self.default_image = default_image
        self.boot_minutes = boot_minutes
        self._min_cuda: dict[str, str] = {}  # offer id -> the CUDA its search asked for
        # GPU ids the last `offers()` left out as not planned (ReportsSkipped): id -> 1;
        # rows it left out as invalid, by field and problem (ReportsRejected).
        self.skipped: dict[str, int] = {}
        self.rejected: dict[str, int] = {}

    # -- Provider protocol --------------------------------------------------------------

    def offers(self, req: Requirements) -> builtins.list[Offer]:
        """Secure and community offers that can be created now for `req.gpu_count` GPUs.

        The catalog is asked once per cloud with that cloud and count, so `availability`
        says whether such a pod can be created there. Price = the cloud's per-GPU price ×
        count + the pod's disks while running (whole machine, per hour). GPUs whose name we
        cannot map to a canonical model are left out (the scheduler cannot size them).
        RunPod publishes no reliability figure; `req.min_reliability` is not applied here.
        """
        self.skipped, self.rejected = {}, {}
        if req.interruptible is True:
            return []  # spot withdrawn: RunPod has no interruptible pods
        found: list[Offer] = []
        for cloud in CLOUDS:
            params = {"include": "AVAILABILITY", "product": "POD", "cloud": cloud,
                      "count": str(req.gpu_count)}
            if req.min_cuda is not None:
                # Availability counts only machines whose driver supports the image's CUDA.
                params["minCudaVersion"] = req.min_cuda
            answer = self._api.retrying(partial(self._api.gpus, params))
            valid, bad = rows(answers.GpuType, answer.gpus)
            merge(self.rejected, bad)
            found += [o for row in valid if (o := self._offer(row, cloud, req)) is not None]
        return sorted(found, key=lambda o: (o.price_per_hour or Decimal(0), o.offer_id))

    def _offer(self, row: answers.GpuType, cloud: str, req: Requirements) -> Offer | None:
        """`row` as an offer in `cloud` for `req`, or None when it cannot serve it."""
        if row.availability in (None, "NONE"):
            return None
        gpu = canonical_gpu(row.id, row.name)
        if gpu is None:
            self.skipped[row.id] = 1
            return None
        if req.gpus is not None and gpu not in req.gpus:
            return None
        spec = catalog.gpus().get(gpu)
        memory = spec.memory_bytes if spec else (row.memory or 0) * _GIB
        if memory < req.min_gpu_memory_bytes:
            return None
        key = cloud.lower()
        per_gpu: Decimal | None = getattr(row.price, key)
        ceiling: int | None = getattr(row.max_count, key)
        if getattr(row, key) is False or per_gpu is None or (ceiling or 0) < req.gpu_count:
            return None
        price = disks.quantize(per_gpu * req.gpu_count + disks.runpod().pod_per_hour(req.disk_gb))
        if req.max_price_per_hour is not None and price > req.max_price_per_hour:
            return None
        offer_id = f"{cloud}|{row.id}"
        # The create asks for the same CUDA floor (gpu.minCudaVersion), so the pod lands
        # on such a machine or fails as "no capacity" (the next offer is tried).
        if req.min_cuda is not None:
            self._min_cuda[offer_id] = req.min_cuda
        else:
            self._min_cuda.pop(offer_id, None)
        return Offer(
            provider=self.name, offer_id=offer_id, gpu=gpu, gpu_count=req.gpu_count,
            gpu_memory_bytes=memory, billing=self.billing, interruptible=False,
            price_per_hour=price, disk_bytes=req.disk_gb * 1000**3, region=key,
            boot_minutes=self.boot_minutes,
        )

    def create(self, offer: Offer, ssh_public_key: str, job_id: str, image: str | None = None,
               disk_gb: int = 100) -> Instance:
        """Deploy a pod for `job_id` named `tag_for(job_id)`; the key goes in `PUBLIC_KEY`.

        A create whose response was lost (5xx or network error after the pod was made) is not
        blindly re-sent: before each retry we look for a pod with our name and return it.
        """
        cloud, sep, gpu_id = offer.offer_id.partition("|")
        if not sep or cloud not in CLOUDS:
            raise ProviderError(f"not a RunPod offer id: {offer.offer_id!r}")
        name = tag_for(job_id)
        gpu: dict[str, Any] = {"id": gpu_id, "count": offer.gpu_count}
        if offer.offer_id in self._min_cuda:
            gpu["minCudaVersion"] = self._min_cuda[offer.offer_id]
        body = {
            "name": name, "image": image or self.default_image,
            "gpu": gpu, "cloud": cloud,
            "disk": CONTAINER_DISK_GB, "ports": ["22/tcp"],
            "env": {"PUBLIC_KEY": ssh_public_key.strip()}, "startSsh": True,
            "mounts": {"persistent": {"size": volume_gb(disk_gb), "path": VOLUME_PATH}},
        }
        sent = [False]  # a POST went out whose outcome we did not see

        def attempt() -> Instance:
            if sent[0]:
                existing = [i for i in self._list_once() if i.label == name
                            and i.state not in (InstanceState.TERMINATED, InstanceState.FAILED)]
                if existing:
                    return existing[0]
            sent[0] = True
            try:
                pod = self._api.create_pod(name, body)
            except TransientError as exc:
                # A 429 was rejected before anything was made; 5xx/network may have made it.
                sent[0] = not isinstance(exc, RateLimited)
                raise
            except ProviderError:
                sent[0] = False
                raise
            return self._instance(pod)

        return self._api.retrying(attempt)

    def get(self, instance_id: str) -> Instance:
        """The pod's state; NotFound when RunPod no longer knows it."""
        return self._instance(self._api.retrying(partial(self._api.pod, instance_id)))

    def list(self, job_id: str | None = None) -> builtins.list[Instance]:
        """Pods whose name carries orch's tag (for `job_id`, or all of orch's)."""
        return self._api.retrying(lambda: [i for i in self._list_once()
                                           if job_id is None or i.job_id == job_id])

    def terminate(self, instance_id: str) -> None:
        """Delete the pod (204); 404 means already gone, which is success."""
        try:
            self._api.retrying(partial(self._api.delete_pod, instance_id))
        except NotFound:
            return

    # -- helpers ------------------------------------------------------------------------

    def _list_once(self) -> builtins.list[Instance]:
        """orch's pods; a pod without a valid id is left out (nothing can be done by id)."""
        valid, _bad = rows(answers.Pod, self._api.pods().pods)
        return [self._instance(p) for p in valid if job_of(p.name) is not None]

    def _instance(self, pod: answers.Pod) -> Instance:
        raw = pod.status or ""
        gpu = pod.gpu or answers.PodGpu()
        host, port, user = _direct_ssh(pod)
        return Instance(
            provider=self.name,
            instance_id=pod.id,
            state=STATES.get(raw.upper(), InstanceState.UNKNOWN),
            label=pod.name,
            gpu=canonical_gpu(gpu.id, gpu.display_name),
            gpu_count=gpu.count or 0,
            interruptible=False,
            price_per_hour=pod_price(pod),
            ssh_host=host,
            ssh_port=port,
            ssh_user=user,
            raw_status=raw,
            message=self._api.redact(pod.message or ""),
        )


def _direct_ssh(pod: answers.Pod) -> tuple[str | None, int | None, str]:
    """(host, port, user) of `ssh.direct`; else the public mapping of 22/tcp in
    `runtime.ports` (user root); (None, None, "root") while neither is there. Never
    `ssh.proxy`."""
    direct = pod.ssh.direct if pod.ssh else None
    if direct is not None:
        return direct.host, direct.port, direct.username or "root"
    for port in (pod.runtime.ports if pod.runtime else None) or []:
        if (port is not None and port.private == 22 and port.type == "tcp" and port.ip
                and port.public):
            return port.ip, port.public, "root"
    return None, None, "root"
