"""Which warm machine a queued job may take, and what that saves (pure; docs/warm.md).

A machine kept warm after its job (`resources.keep_warm`) is planned like any other offer:
the offer it was rented from, at the price it is billed at, with no boot (it is running)
and the base model already on its disk when it is the job's. The scheduler then decides:
it is used only when it is the cheapest placement that fits with everything the job asks
(memory per GPU, GPU count, providers, GPUs, price, budget, deadline) *including* the setup
a fresh machine would bill (boot with its image pull, model download). What the scheduler
cannot see is checked here first: the same image (a rental runs the image it was created
from), enough disk, a provider the job may use.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Sequence
from dataclasses import replace
from datetime import datetime
from decimal import Decimal
from typing import Any, NamedTuple

from orchestrator.core.scheduler import WARM_PREFIX, Placement
from providers.base import Billing, Offer

PREFIX = WARM_PREFIX


class WarmMachine(NamedTuple):
    """A parked machine as the planner sees it (a `warm_instance` row)."""

    warm_id: int
    offer: Offer  # what it was rented as
    price_per_hour: Decimal  # what it is billed at
    image: str | None
    disk_gb: int
    model: tuple[str, str] | None  # (repo, revision) in its cache
    parked_by: str
    expires_at: datetime
    instance_id: str


def offer_json(offer: Offer) -> str:
    """An offer as JSON text (kept with the warm row)."""
    data = {k: (str(v) if isinstance(v, Decimal) else v.value if isinstance(v, Billing)
                else v) for k, v in vars(offer).items()}
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def offer_from_json(text: str) -> Offer:
    """The offer `offer_json` wrote."""
    data: dict[str, Any] = json.loads(text)
    data["billing"] = Billing(data["billing"])
    for key in ("price_per_hour", "monthly_price"):
        if data.get(key) is not None:
            data[key] = Decimal(data[key])
    return Offer(**data)


def is_warm(offer: Offer) -> bool:
    return offer.offer_id.startswith(PREFIX)


def warm_id(offer: Offer) -> int:
    """The warm row an offer from `offers` stands for (ValueError for a fresh offer)."""
    if not is_warm(offer):
        raise ValueError(f"{offer.offer_id!r} is not a warm machine")
    return int(offer.offer_id[len(PREFIX):])


def problem(m: WarmMachine, *, providers: Collection[str], image: str | None, disk_gb: int,
            now: datetime) -> str | None:
    """Why the job cannot take `m` at all (before any pricing), or None."""
    if m.expires_at <= now:
        return "its window closed"
    if m.offer.provider not in providers:
        return f"provider {m.offer.provider} is not one this job may use"
    if m.image != image:
        return f"it runs {m.image}, the job needs {image}"
    if m.disk_gb < disk_gb:
        return f"its disk is {m.disk_gb} GB, the job needs {disk_gb} GB"
    return None


def offers(machines: Iterable[WarmMachine], *, providers: Collection[str], image: str | None,
           disk_gb: int, model: tuple[str, str], now: datetime
           ) -> tuple[list[Offer], frozenset[str]]:
    """The warm machines this job may take, as offers (no boot), and the ids of those that
    hold its base model (the scheduler's `cached_on`: no download)."""
    found: list[Offer] = []
    cached: set[str] = set()
    for m in machines:
        if problem(m, providers=providers, image=image, disk_gb=disk_gb, now=now) is not None:
            continue
        offer = replace(m.offer, offer_id=f"{PREFIX}{m.warm_id}", boot_minutes=0.0,
                        price_per_hour=m.price_per_hour, registered=False)
        found.append(offer)
        if m.model == model:
            cached.add(offer.offer_id)
    return found, frozenset(cached)


class Saving(NamedTuple):
    """A warm machine the ranking chose, and the cheapest fresh placement it beat."""

    warm: Placement
    fresh: Placement | None

    @property
    def saves(self) -> Decimal | None:
        return None if self.fresh is None else self.fresh.est_cost - self.warm.est_cost


def saving(placements: Sequence[Placement]) -> Saving | None:
    """When the cheapest placement is a warm machine: it and the best fresh one."""
    if not placements or not is_warm(placements[0].offer):
        return None
    fresh = next((p for p in placements if not is_warm(p.offer)), None)
    return Saving(placements[0], fresh)
