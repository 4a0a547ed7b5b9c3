"""The dated market snapshot (snapshot.yaml): Vast.ai and RunPod machines as their published
catalogs list them, planned when no API key gives live offers, each with its source and date.

How it sits beside the seed catalogs (cloud.yaml, dedicated.yaml) is in docs/providers.md
("The market without keys"): all are ranked together, each offer labelled by where its
price comes from (`label`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from providers import catalog
from providers.base import Billing, Offer

_FILE = Path(__file__).parent / "snapshot.yaml"
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_GB = 1000**3
ID_PREFIX = "snap-"  # offer ids of snapshot rows (live ids are the providers' own)
SEED = frozenset({"cloud", "dedicated-host"})  # the seed catalogs' providers


@dataclass(frozen=True)
class Listed:
    """Where one snapshot offer's facts come from."""

    source: str  # "skypilot-catalog@01b8cdda2878 catalogs/v8/vast/vms.csv"
    date: str  # YYYY-MM-DD
    listed: str  # the source's instance type


@dataclass(frozen=True)
class Snapshot:
    """The snapshot's offers, where each comes from, and each provider's date."""

    offers: tuple[Offer, ...]
    listed: Mapping[tuple[str, str], Listed]  # (provider, offer_id) -> source
    dates: Mapping[str, str]  # provider -> YYYY-MM-DD

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
    doc = yaml.load(path.read_text(encoding="utf-8"), Loader=_LOADER)  # noqa: S506 - safe
    offers: list[Offer] = []
    listed: dict[tuple[str, str], Listed] = {}
    dates: dict[str, str] = {}
    for provider, raw in (doc.get("providers") or {}).items():
        dates[provider] = str(raw["date"])
        for offer, where in _offers(provider, raw, rows(doc, provider)):
            offers.append(offer)
            listed[(offer.provider, offer.offer_id)] = where
    return Snapshot(tuple(offers), listed, dates)


def keyless_offers() -> list[Offer]:
    """What orch ranks without live offers: the seed catalogs (`cloud`, `dedicated-host`)
    and the snapshot of what Vast.ai and RunPod list, side by side, each offer labelled by
    its source (`label`; docs/providers.md "The market without keys")."""
    return [*catalog.load().offers, *load().offers]


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
