"""The dated market snapshot (snapshot.yaml): Vast.ai and RunPod machines as their published
catalogs list them, planned when no API key gives live offers, each with its source and date.

How it sits beside the seed catalogs (cloud.yaml, dedicated.yaml) is in docs/providers.md
("The market without keys"): all are ranked together, each offer labelled by where its
price comes from (`label`). A row holds the price its source lists; `offers(disk_gb)` adds
what the machine's disks cost for the job's disk, with the rule the live adapters price
their offers with (catalog/disks.py), so a keyless plan and a live one price a machine alike.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from decimal import Decimal
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

from providers import catalog
from providers.base import Billing, Offer
from providers.datacache import read_yaml

_FILE = Path(__file__).parent / "snapshot.yaml"
_GB = 1000**3
ID_PREFIX = "snap-"  # offer ids of snapshot rows (live ids are the providers' own)
SEED = frozenset({"cloud", "dedicated-host"})  # the seed catalogs' providers


class Listed(NamedTuple):
    """Where one snapshot offer's facts come from."""

    source: str  # "skypilot-catalog@01b8cdda2878 catalogs/v8/vast/vms.csv"
    date: str  # YYYY-MM-DD
    listed: str  # the source's instance type


class Snapshot(NamedTuple):
    """The snapshot's offers, where each comes from, and each provider's date."""

    listed_offers: tuple[Offer, ...]  # at the price the source lists (no disks added)
    listed: Mapping[tuple[str, str], Listed]  # (provider, offer_id) -> source
    dates: Mapping[str, str]  # provider -> YYYY-MM-DD
    included_gb: Mapping[str, int]  # provider -> disk GB its listed on-demand prices pay for

    def providers(self) -> frozenset[str]:
        """The providers the snapshot has rows for."""
        return frozenset(self.dates)


def _id(listed: str, count: int, spot: bool) -> str:
    name = re.sub(r"[^a-z0-9]+", "-", listed.lower()).strip("-")
    return f"{ID_PREFIX}{name}-x{count}-{'spot' if spot else 'on-demand'}"


def rows(doc: Mapping[str, Any], provider: str) -> list[dict[str, Any]]:
    """A provider's rows of a parsed snapshot.yaml, each as {column: value}."""
    columns = doc["columns"]
    return [dict(zip(columns, row, strict=True)) for row in doc["providers"][provider]["rows"]]


def _offers(provider: str, raw: Mapping[str, Any],
            listed_rows: list[dict[str, Any]]) -> list[tuple[Offer, Listed]]:
    spec = catalog.gpus()
    out = []
    for row in listed_rows:
        gpu, count = spec[row["gpu"]], int(row["count"])
        ram = row.get("ram_gb")
        vcpu = row.get("vcpu")
        where = Listed(str(row["source"]), str(row["date"]), str(row["listed"]))
        for spot, key in ((False, "on_demand"), (True, "spot")):
            if row.get(key) is None:
                continue
            out.append((Offer(
                provider=provider, offer_id=_id(where.listed, count, spot), gpu=gpu.name,
                gpu_count=count, gpu_memory_bytes=gpu.memory_bytes,
                billing=Billing(raw["billing"]), interruptible=spot,
                price_per_hour=Decimal(str(row[key])),
                vcpu=None if vcpu is None else int(Decimal(str(vcpu))),
                ram_bytes=None if ram is None else int(Decimal(str(ram)) * _GB),
                boot_minutes=float(raw["boot_minutes"]), pull_gbps=float(raw["pull_gbps"])),
                where))
    return out


@cache
def load(path: Path = _FILE) -> Snapshot:
    """Every snapshot row as offers (on demand, and spot where listed)."""
    doc = read_yaml(path)
    offers: list[Offer] = []
    listed: dict[tuple[str, str], Listed] = {}
    dates: dict[str, str] = {}
    included: dict[str, int] = {}
    for provider, raw in (doc.get("providers") or {}).items():
        dates[provider] = str(raw["date"])
        included[provider] = int(raw.get("storage_in_price_gb") or 0)
        for offer, where in _offers(provider, raw, rows(doc, provider)):
            offers.append(offer)
            listed[(offer.provider, offer.offer_id)] = where
    return Snapshot(tuple(offers), listed, dates, included)


@cache
def offers(disk_gb: int, path: Path | None = None) -> tuple[Offer, ...]:
    """The snapshot's offers priced for a machine with `disk_gb` of job disk: each listed
    price plus what that machine's disks cost, as the provider's live offers are priced."""
    from providers.catalog import disks  # its models are built only when a plan prices this

    snap = load() if path is None else load(path)  # one parse: load() is cached by argument
    extra = {(p, spot): disks.snapshot_extra(p, disk_gb, spot=spot, included_gb=gb)
             for p, gb in snap.included_gb.items() for spot in (False, True)}
    return tuple(replace(o, disk_bytes=disk_gb * _GB, price_per_hour=disks.quantize(
        (o.price_per_hour or Decimal(0)) + extra[(o.provider, o.interruptible)]))
        for o in snap.listed_offers)


def keyless_offers(disk_gb: int) -> list[Offer]:
    """What orch ranks without live offers for a job of `disk_gb`: the seed catalogs
    (`cloud`, `dedicated-host`) and the snapshot of what Vast.ai and RunPod list, side by
    side, each offer labelled by its source (`label`; docs/providers.md "The market without
    keys")."""
    return [*catalog.load().offers, *offers(disk_gb)]


def label(offer: Offer) -> str:
    """Where an offer's price comes from, in a few words for a table's `source` column."""
    if offer.registered:
        return "registered"
    where = load().listed.get((offer.provider, offer.offer_id))
    if where is not None:
        return f"snapshot {where.date}"
    if offer.provider in SEED:
        return "seed catalog"
    if offer.offer_id.startswith("warm:"):
        return "kept warm"
    return "simulated" if offer.provider == "sim" else "live"
