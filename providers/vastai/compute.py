"""Vast.ai adapter: the per-second bid (interruptible) and on-demand GPU market.

Speaks the REST API at `https://console.vast.ai/api/v0` exactly as described in
`shared/reference/provider-apis.md` ("Vast.ai"), including its quirks:

* `GET /instances/{id}/` answers `{"instances": {one object}}` (plural key, single object);
* a create can answer `success: false` *with* a `new_contract` (an instance created stopped):
  that contract is destroyed at once and the offer is treated as out of capacity;
* 429 "API requests too frequent" usually comes as plain text without `Retry-After`.

Request bodies carry the fields the official client (`vastai` 1.9.1, vast-ai/vast-cli) sends
for the same operations, checked against it in tests/test_vastai_cli.py:

* search: `type` is `on-demand` or `bid` (a search field only), with the CLI's default
  filters (`verified`, `external: false`, `rentable`) and `allocated_storage` (the disk the
  price is quoted for);
* create: `client_id: "me"`, `price: null` on demand and `price: <bid>` interruptible,
  `runtype: "ssh_direc ssh_proxy"` (what `vastai create instance --ssh --direct` sends:
  direct SSH on a public port, Vast's proxy as the fallback);
* list: the paginated `GET /api/v1/instances/` (`select_filters`, `order_by`, `limit`,
  `after_token` → `next_token`), which the CLI's `show instances` uses.

The image's environment is not visible to SSH sessions on Vast (the SSH runtypes replace the
image's ENTRYPOINT; sessions start from sshd's defaults): the onstart script persists it
with `env >> /etc/environment`, which logins read (pam_env), as Vast's own images do.

Every answer is checked against its model in `answers.py` before anything here reads it
(finite, non-negative, bounded numbers; names without control characters): an answer of
the wrong shape is a BadAnswer, an offer row that breaks it is left out and counted in
`rejected` (`providers.base.ReportsRejected`).

The requests and the typed error for each answer are `api_client.VastApi`'s; every call
goes through its retry policy (`providers.http.with_retries`, TransientError only). The API
key is sent only in the `Authorization: Bearer` header; it is never logged, put in a URL,
or included in an exception message (any text echoed back by the server is redacted).

SSH keys: the job's public key is injected through the instance's `onstart` script (appended
to `/root/.ssh/authorized_keys`), not through `POST /ssh/`, which would add it to the whole
account and to every later instance.

State mapping (`actual_status` / `intended_status` / `cur_state` / `next_state`):

* all of `cur_state`, `intended_status`, `next_state` == "stopped" on a bid instance: outbid
  → INTERRUPTED (Vast pauses it and keeps the data; orch re-places the job);
* `actual_status` "stopped"/"frozen" otherwise → INTERRUPTED too (orch never stops or freezes
  instances itself, so a paused instance cannot run the job);
* `null`, "loading", "created", "rebooting" → PROVISIONING; "running" → RUNNING;
* "exited" (the container died) and "offline" (the host dropped off the market, the disk
  with it) → FAILED: the provider reports an error and the instance will not finish the job;
  the engine terminates it and tries another placement;
* "unknown" or anything else → UNKNOWN.
"""

from __future__ import annotations

import shlex
from decimal import ROUND_HALF_UP, Decimal
from functools import partial
from typing import Any

import httpx

from providers import catalog
from providers.answers import check, merge, rows
from providers.apiclient import ApiProvider
from providers.base import (
    Billing,
    CapacityError,
    ContainerRental,
    Instance,
    InstanceState,
    NotFound,
    Offer,
    ProviderError,
    Requirements,
    cuda_at_least,
    job_of,
    tag_for,
)
from providers.catalog import disks
from providers.http import DEADLINE_S, MAX_ATTEMPTS
from providers.vastai import answers
from providers.vastai.api_client import DEFAULT_BASE_URL, VastApi

# The trainer image (axolotl v0.18.0, uv build; real-hosts.md §1). Callers normally pass the
# job's image to `create`; this is only the fallback.
DEFAULT_IMAGE = "axolotlai/axolotl-cloud:0.18.0-py3.12-cu130-2.12.0"
# `vastai create instance --ssh --direct` (vast-cli api/instances.py resolve_runtype).
RUNTYPE = "ssh_direc ssh_proxy"
# Search `type` values (vast-cli `search offers --type`; "interruptible" is sent as "bid").
ON_DEMAND, BID = "on-demand", "bid"
MIN_DISK_GB = 8  # Vast rejects smaller disks
_MIB = 1024**2
_GB = 1000**3
_PRICE_QUANTUM = Decimal("0.000001")

# Canonical GPU name → (Vast `gpu_name` values, minimum per-GPU `gpu_ram` in MB for the model
# to count as this one), from gpus.yaml's `spellings: vastai` and `vastai_min_gpu_ram_mb`
# (the source notes are there). Vast GPUs not listed are left out of `offers()`.
GPU_MAP: dict[str, tuple[tuple[str, ...], int]] = {
    canonical: (names, catalog.min_gpu_ram_mb("vastai").get(canonical, 0))
    for canonical, names in catalog.spellings("vastai").items()}


def canonical_gpu(vast_name: str | None, gpu_ram_mb: float | int | None) -> str | None:
    """Our canonical GPU name for a Vast `gpu_name` with `gpu_ram` MB, or None if unknown."""
    if not vast_name:
        return None
    # One name can cover several models told apart by memory (A100 40GB / 80GB): the model
    # with the highest memory floor the offer reaches.
    hits = [(min_ram, canonical) for canonical, (names, min_ram) in GPU_MAP.items()
            if vast_name in names and (gpu_ram_mb or 0) >= min_ram]
    return max(hits)[1] if hits else None


def hourly_price(offer: answers.Offer, disk_gb: int, interruptible: bool) -> Decimal | None:
    """Machine price per hour: `dph_base` (or `min_bid` for spot) + disk × storage_cost/30/24
    (catalog/disks.py, the rule the market snapshot prices its Vast.ai rows with)."""
    base = offer.min_bid if interruptible else offer.dph_base
    if base is None:
        return None
    return disks.quantize(base + disks.vast().per_hour(disk_gb, offer.storage_cost or Decimal(0)))


def map_state(inst: answers.Instance) -> InstanceState:
    """Vast's status fields → InstanceState (see the module docstring)."""
    actual = inst.actual_status
    cur, intended, nxt = inst.cur_state, inst.intended_status, inst.next_state
    if inst.is_bid and cur == intended == nxt == "stopped":
        return InstanceState.INTERRUPTED
    if actual in ("stopped", "frozen"):
        return InstanceState.INTERRUPTED
    if actual in (None, "", "loading", "created", "rebooting"):
        return InstanceState.PROVISIONING
    if actual == "running":
        return InstanceState.RUNNING
    if actual in ("exited", "offline"):
        return InstanceState.FAILED
    return InstanceState.UNKNOWN


def _ssh_endpoint(inst: answers.Instance) -> tuple[str | None, int | None]:
    """Direct SSH (public_ipaddr + ports["22/tcp"][0].HostPort), else ssh_host/ssh_port."""
    mapped = (inst.ports or {}).get("22/tcp")
    if inst.public_ipaddr and mapped:
        return inst.public_ipaddr, mapped[0].host_port
    if inst.ssh_host and inst.ssh_port:
        return inst.ssh_host, inst.ssh_port
    return None, None


def _onstart(ssh_public_key: str) -> str:
    """The onstart script: persist the image's environment for SSH sessions (Vast's SSH
    runtypes do not pass it on; logins read /etc/environment), then authorise the job's
    key for root."""
    key = shlex.quote(ssh_public_key.strip())
    return ("env >> /etc/environment; "
            "mkdir -p /root/.ssh && chmod 700 /root/.ssh && "
            f"echo {key} >> /root/.ssh/authorized_keys && "
            "chmod 600 /root/.ssh/authorized_keys")


class VastAI(ApiProvider[VastApi], ContainerRental):
    """The Vast.ai provider (implements `providers.base.Provider`).

    `offers()` searches `type: on-demand` and/or `type: bid` depending on
    `Requirements.interruptible`; a spot offer is rented with `price` = its `min_bid` ×
    (1 + `bid_markup`), which makes the instance interruptible.
    """

    name = "vastai"
    billing = Billing.PER_SECOND

    def __init__(self, api_key: str, base_url: str = DEFAULT_BASE_URL,
                 client: httpx.Client | None = None, *, timeout_s: float = 30.0,
                 attempts: int = MAX_ATTEMPTS, initial_s: float = 0.5, max_wait_s: float = 20.0,
                 deadline_s: float = DEADLINE_S, default_image: str = DEFAULT_IMAGE,
                 bid_markup: Decimal = Decimal(0), min_reliability: float | None = None,
                 verified_only: bool = True, limit: int = 64, boot_minutes: float = 5.0,
                 pull_gbps: float = 2.0) -> None:
        self._api = VastApi(api_key, base_url, client, timeout_s=timeout_s, attempts=attempts,
                           initial_s=initial_s, max_wait_s=max_wait_s, deadline_s=deadline_s)
        self.default_image = default_image
        self.bid_markup = bid_markup
        self.min_reliability = min_reliability
        self.verified_only = verified_only
        self.limit = limit
        self.boot_minutes = boot_minutes
        self.pull_gbps = pull_gbps
        # From the last search, by offer id: min_bid (the bid at create time) and machine_id
        # (to recognise our own instance after a lost create response).
        self._bids: dict[str, Decimal] = {}
        self._machines: dict[str, str] = {}
        # Offers the last `offers()` left out for a GPU orch does not plan (ReportsSkipped),
        # and rows it left out as invalid, by field and problem (ReportsRejected).
        self.skipped: dict[str, int] = {}
        self.rejected: dict[str, int] = {}

    # -- offers -------------------------------------------------------------------------

    def _query(self, req: Requirements, kind: str) -> dict[str, Any]:
        """The POST /bundles/ body of operator filters for `req` and `kind` (on-demand|bid)."""
        q: dict[str, Any] = {
            "num_gpus": {"eq": req.gpu_count},
            "gpu_ram": {"gte": req.min_gpu_memory_bytes // _MIB},  # Vast's "MB" are MiB
            "external": {"eq": False},
            "rentable": {"eq": True},
            "rented": {"eq": False},
            "order": [["dph_total", "asc"]],
            "limit": self.limit,
            "type": kind,
            "allocated_storage": req.disk_gb,
        }
        if self.verified_only:
            q["verified"] = {"eq": True}
        if req.gpus is not None:
            names = sorted({n for g in req.gpus if g in GPU_MAP for n in GPU_MAP[g][0]})
            q["gpu_name"] = {"in": names}
        reliability = req.min_reliability if req.min_reliability is not None \
            else self.min_reliability
        if reliability is not None:
            # The search field is `reliability` (vast-cli 1.9.1 `api/query.py:153`, where
            # `reliability2` is commented out of the offer fields, and `data/query.py:234`
            # remaps it to `reliability`); rows are read by `answers.Offer.reliability`.
            q["reliability"] = {"gte": reliability}
        if req.max_price_per_hour is not None and kind == ON_DEMAND:
            q["dph_total"] = {"lte": float(req.max_price_per_hour)}
        if req.min_cuda is not None:
            # The highest CUDA the host's driver supports (vast-cli's search field).
            q["cuda_max_good"] = {"gte": float(req.min_cuda)}
        return q

    def offers(self, req: Requirements) -> list[Offer]:
        """Live offers for `req`: on-demand, bid (interruptible) or both, cheapest first.

        Rows that break `answers.Offer` are left out and counted in `rejected`; an answer
        that is not `{"offers": [...]}` raises BadAnswer.
        """
        kinds = {True: [BID], False: [ON_DEMAND], None: [ON_DEMAND, BID]}[req.interruptible]
        found: list[Offer] = []
        self.skipped, self.rejected = {}, {}
        for kind in kinds:
            answer = self._api.retrying(partial(self._api.search, self._query(req, kind)))
            valid, bad = rows(answers.Offer, answer.offers)
            merge(self.rejected, bad)
            for row in valid:
                if canonical_gpu(row.gpu_name, row.gpu_ram) is None:
                    name = row.gpu_name or "(no gpu_name)"
                    self.skipped[name] = self.skipped.get(name, 0) + 1
                    continue
                offer = self._offer(row, req, interruptible=(kind == BID))
                if offer is not None:
                    found.append(offer)
        found.sort(key=lambda o: (o.price_per_hour or Decimal(0), o.offer_id))
        return found

    def _offer(self, row: answers.Offer, req: Requirements,
               interruptible: bool) -> Offer | None:
        gpu = canonical_gpu(row.gpu_name, row.gpu_ram)
        if gpu is None or (req.gpus is not None and gpu not in req.gpus):
            return None
        mem = int((row.gpu_ram or 0) * _MIB)
        if row.num_gpus != req.gpu_count or mem < req.min_gpu_memory_bytes:
            return None
        price = hourly_price(row, req.disk_gb, interruptible)
        if price is None:
            return None
        if req.max_price_per_hour is not None and price > req.max_price_per_hour:
            return None
        if req.min_cuda is not None and (row.cuda_max_good is None or not cuda_at_least(
                row.cuda_max_good, req.min_cuda)):
            return None
        if req.min_reliability is not None and (row.reliability is None
                                                or row.reliability < req.min_reliability):
            return None
        offer_id = str(row.id)
        if row.machine_id is not None:
            self._machines[offer_id] = str(row.machine_id)
        if interruptible and row.min_bid is not None:
            self._bids[offer_id] = row.min_bid
        return Offer(
            provider=self.name, offer_id=offer_id, gpu=gpu, gpu_count=row.num_gpus,
            gpu_memory_bytes=mem, billing=self.billing, interruptible=interruptible,
            price_per_hour=price,
            vcpu=int(row.cpu_cores_effective) if row.cpu_cores_effective is not None else None,
            ram_bytes=int(row.cpu_ram * _MIB) if row.cpu_ram is not None else None,
            disk_bytes=int(row.disk_space * _GB) if row.disk_space is not None else None,
            region=row.geolocation, reliability=row.reliability,
            boot_minutes=self.boot_minutes, pull_gbps=self.pull_gbps,
            machine_id=self._machines.get(offer_id),
        )

    # -- lifecycle ----------------------------------------------------------------------

    def _bid_for(self, offer: Offer) -> Decimal:
        """The bid for a spot offer: its last seen min_bid × (1 + markup).

        Falls back to the offer's whole hourly price (min_bid plus disk) when this adapter
        never searched the offer: a slightly higher bid, never a lower one.
        """
        base = self._bids.get(offer.offer_id) or offer.price_per_hour
        if base is None:
            raise ProviderError(f"Vast.ai offer {offer.offer_id} has no price to bid")
        return (base * (1 + self.bid_markup)).quantize(_PRICE_QUANTUM, rounding=ROUND_HALF_UP)

    def create(self, offer: Offer, ssh_public_key: str, job_id: str, image: str | None = None,
               disk_gb: int = 100) -> Instance:
        """Rent `offer` (PUT /asks/{id}/) labelled `tag_for(job_id)`; CapacityError if gone.

        A retry after an ambiguous failure (5xx, dropped connection) first looks for a live
        instance already labelled for the job (on the offer's machine when known), so a lost
        response never rents twice.
        """
        label = tag_for(job_id)
        body: dict[str, Any] = {
            "client_id": "me",
            "image": image or self.default_image,
            "env": {},
            # null = on demand; a bid makes the instance interruptible (vast-cli --bid_price)
            "price": float(self._bid_for(offer)) if offer.interruptible else None,
            "disk": max(MIN_DISK_GB, int(disk_gb)),
            "label": label,
            "onstart": _onstart(ssh_public_key),
            "runtype": RUNTYPE,
            "cancel_unavail": True,
        }
        tries = 0

        def attempt() -> Instance | answers.Outcome:
            nonlocal tries
            tries += 1
            if tries > 1:
                existing = self._adoptable(job_id, offer.offer_id)
                if existing is not None:
                    return existing
            return self._api.rent(offer.offer_id, body)

        try:
            doc = self._api.retrying(attempt)
        except NotFound as exc:
            raise CapacityError(f"Vast.ai offer {offer.offer_id} is gone "
                                f"({getattr(exc, 'code', '') or 'no_such_ask'})") from None
        if isinstance(doc, Instance):
            return doc
        contract = doc.new_contract
        if not doc.success or not contract:
            if contract:  # created stopped: destroy it, or it bills storage forever
                self.terminate(str(contract))
            reason = self._api.redact(doc.msg or doc.error or "not started")
            raise CapacityError(f"Vast.ai offer {offer.offer_id} could not be rented: {reason}")
        return Instance(
            provider=self.name, instance_id=str(contract), state=InstanceState.PROVISIONING,
            label=label, gpu=offer.gpu, gpu_count=offer.gpu_count,
            interruptible=offer.interruptible, price_per_hour=offer.price_per_hour,
            raw_status="created", machine_id=offer.machine_id,
        )

    def _adoptable(self, job_id: str, offer_id: str) -> Instance | None:
        """A live instance labelled for `job_id` (on `offer_id`'s machine when known)."""
        machine = self._machines.get(offer_id)
        for row in self._rows({"label": {"in": [tag_for(job_id)]}}):
            if job_of(row.label) != job_id:
                continue
            if machine is not None and str(row.machine_id) != machine:
                continue
            inst = self._instance(row)
            if inst.state is not InstanceState.TERMINATED:
                return inst
        return None

    def _instance(self, inst: answers.Instance) -> Instance:
        host, port = _ssh_endpoint(inst)
        gpu = canonical_gpu(inst.gpu_name, inst.gpu_ram) or inst.gpu_name
        raw = "/".join(str(v) for v in
                       (inst.actual_status, inst.intended_status, inst.cur_state, inst.next_state))
        return Instance(
            provider=self.name, instance_id=inst.id, state=map_state(inst),
            label=inst.label, gpu=gpu, gpu_count=inst.num_gpus or 0,
            interruptible=bool(inst.is_bid), price_per_hour=inst.dph_total,
            ssh_host=host, ssh_port=port, ssh_user="root", raw_status=raw,
            message=self._api.redact(inst.status_msg or ""),
            machine_id=None if inst.machine_id is None else str(inst.machine_id),
        )

    def get(self, instance_id: str) -> Instance:
        """GET /instances/{id}/ (`{"instances": {one object}}`); NotFound when gone."""
        doc = self._api.retrying(lambda: self._api.instance(instance_id)).instances
        if isinstance(doc, list):  # tolerate the list shape
            valid, _bad = rows(answers.Instance, doc)
            found = next((i for i in valid if i.id == str(instance_id)), None)
        else:
            found = check(answers.Instance, doc, f"Vast.ai instance {instance_id}") \
                if doc else None
        if found is None:
            raise NotFound(f"Vast.ai instance {instance_id} does not exist")
        return self._instance(found)

    def _rows(self, select: dict[str, Any]) -> list[answers.Instance]:
        """Every instance row matching `select`, page by page (GET /api/v1/instances/).

        A row without a valid id is left out: nothing could be done with it by id."""
        found: list[answers.Instance] = []
        seen: set[str] = set()
        after: str | None = None
        while True:
            page = self._api.retrying(partial(self._api.instances_page, select, after))
            valid, _bad = rows(answers.Instance, page.instances or [])
            found.extend(valid)
            token = page.next_token
            if not token or not page.instances or token in seen:  # a repeated token loops
                return found
            seen.add(token)
            after = token

    def list(self, job_id: str | None = None) -> list[Instance]:
        """The instances labelled as orch's (for `job_id`, or all), from every page of the
        paginated listing."""
        # the filter `vastai show instances --label L` sends
        select = {"label": {"in": [tag_for(job_id)]}} if job_id is not None else {}
        out = []
        for row in self._rows(select):
            owner = job_of(row.label)
            if owner is not None and (job_id is None or owner == job_id):
                out.append(self._instance(row))
        return out

    def terminate(self, instance_id: str) -> None:
        """DELETE /instances/{id}/; an instance that is already gone counts as success."""
        try:
            doc = self._api.retrying(lambda: self._api.destroy(instance_id))
        except NotFound:
            return
        if doc.success is False:
            if doc.error == "no_such_instance":
                return
            raise ProviderError(f"Vast.ai could not destroy instance {instance_id}: "
                                f"{self._api.redact(doc.msg or doc.error or 'no reason given')}")
