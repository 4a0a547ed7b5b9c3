"""Static price catalogs and GPU specs (YAML beside this file) for planning without credentials."""

from __future__ import annotations

import re
from decimal import Decimal
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

from providers.base import Billing, GpuSpec, Offer
from providers.datacache import read_yaml

_DIR = Path(__file__).parent
_MIB = 1024**2
_GB = 1000**3


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", str(name).lower())


@cache
def _gpu_doc() -> dict[str, Any]:
    doc: dict[str, Any] = read_yaml(_DIR / "gpus.yaml")
    return doc


@cache
def gpus() -> dict[str, GpuSpec]:
    """Every GPU model we know, by canonical name."""
    doc = _gpu_doc()
    raw, scaling = doc["gpus"], doc["scaling"]
    return {
        name: GpuSpec(
            name=name,
            memory_bytes=int(f["memory_mib"]) * _MIB,
            bf16_tflops=float(f["bf16_tflops"]),
            bandwidth_tbps=float(f["bandwidth_tbps"]),
            mfu=float(f["mfu"]),
            interconnect=f["interconnect"],
            scaling=tuple((k, float(v)) for k, v in scaling[f["interconnect"]].items()),
            aliases=tuple(str(a) for a in f.get("aliases", [])),
            compute_capability=str(f["compute_capability"]),
            source=str(f["source"]),
        )
        for name, f in raw.items()
    }


@cache
def spellings(provider: str) -> dict[str, tuple[str, ...]]:
    """Canonical GPU name → `provider`'s own names for it (gpus.yaml `spellings`), in the
    file's order; models the provider has no name for are absent."""
    return {name: tuple(str(n) for n in f["spellings"][provider])
            for name, f in _gpu_doc()["gpus"].items()
            if provider in (f.get("spellings") or {})}


@cache
def min_gpu_ram_mb(provider: str) -> dict[str, int]:
    """Canonical GPU name → the least per-GPU memory (MB) `provider` must report for one of
    its names to count as that model (gpus.yaml `<provider>_min_gpu_ram_mb`)."""
    key = f"{provider}_min_gpu_ram_mb"
    return {name: int(f[key]) for name, f in _gpu_doc()["gpus"].items() if key in f}


@cache
def left_out(provider: str) -> dict[str, str]:
    """`provider`'s GPU names that orch does not plan on → why (gpus.yaml `left_out`)."""
    return {str(n): str(entry["reason"]) for entry in _gpu_doc().get("left_out", [])
            for n in entry.get(provider, [])}


def skip_reason(provider: str, name: str) -> str:
    """Why an offer of `provider`'s GPU `name` is not planned: a listed reason, or unknown."""
    return left_out(provider).get(name, "unknown to providers/catalog/gpus.yaml")


def skipped_note(provider: str, skipped: dict[str, int]) -> str:
    """One line naming the offers `provider` sold of GPUs orch does not plan, and why."""
    total = sum(skipped.values())
    parts = [f"{name} x{n} ({skip_reason(provider, name)})" for name, n in sorted(skipped.items())]
    return (f"{provider}: {total} offer{'s' if total != 1 else ''} skipped, GPU not planned: "
            + "; ".join(parts))


def resolve_gpu(name: str) -> list[str]:
    """Canonical GPU names a user's spelling refers to ("h100" → both H100 variants)."""
    key = _norm(name)
    hits = [g.name for g in gpus().values() if key in {_norm(g.name), *map(_norm, g.aliases)}]
    return hits


def canonical_name(name: str) -> str:
    """The catalog's name for a stored GPU name (unchanged when unknown or ambiguous)."""
    if name in gpus():
        return name
    hits = resolve_gpu(name)
    return hits[0] if len(hits) == 1 else name


class UnpricedTier(NamedTuple):
    """A catalog tier whose price the source does not publish (never planned as-is)."""

    provider: str
    name: str
    gpu: str
    gpu_count: int


class Catalog(NamedTuple):
    """Offers with published prices, plus the tiers left out for want of a price."""

    offers: tuple[Offer, ...]
    unpriced: tuple[UnpricedTier, ...]


def _price(value: Any) -> Decimal | None:
    return None if value is None else Decimal(str(value))


def _cloud(raw: dict[str, Any]) -> tuple[list[Offer], list[UnpricedTier]]:
    # A per-second tier without a price is one the source does not sell ("—"), not one
    # with an unpublished price: it yields no offer and no "unpriced" entry.
    spec = gpus()
    offers: list[Offer] = []
    provider = raw["provider"]
    for tier in raw["tiers"]:
        gpu = spec[tier["gpu"]]
        for count in raw["counts"]:
            for interruptible, key in ((False, "on_demand"), (True, "spot")):
                per_gpu = _price(tier[key])
                if per_gpu is None:
                    continue
                kind = "spot" if interruptible else "on-demand"
                offers.append(
                    Offer(
                        provider=provider,
                        offer_id=f"{_norm(gpu.name)}-x{count}-{kind}",
                        gpu=gpu.name,
                        gpu_count=count,
                        gpu_memory_bytes=gpu.memory_bytes,
                        billing=Billing(raw["billing"]),
                        interruptible=interruptible,
                        price_per_hour=per_gpu * count,
                        boot_minutes=float(raw["boot_minutes"]),
                        pull_gbps=float(raw["pull_gbps"]),
                    )
                )
    return offers, []


def _dedicated(raw: dict[str, Any]) -> tuple[list[Offer], list[UnpricedTier]]:
    spec = gpus()
    offers: list[Offer] = []
    unpriced: list[UnpricedTier] = []
    provider = raw["provider"]
    for tier in raw["tiers"]:
        gpu = spec[tier["gpu"]]
        monthly = _price(tier["monthly"])
        if monthly is None:
            unpriced.append(UnpricedTier(provider, tier["name"], gpu.name, int(tier["count"])))
            continue
        ram = tier.get("ram_gb")
        offers.append(
            Offer(
                provider=provider,
                offer_id=tier["name"],
                gpu=gpu.name,
                gpu_count=int(tier["count"]),
                gpu_memory_bytes=gpu.memory_bytes,
                billing=Billing.MONTHLY,
                interruptible=False,
                price_per_hour=None,
                monthly_price=monthly,
                vcpu=tier.get("vcpu"),
                ram_bytes=None if ram is None else int(ram * _GB),
                boot_minutes=float(raw["handover_minutes"]),
                pull_gbps=float(raw["pull_gbps"]),
            )
        )
    return offers, unpriced


@cache
def load() -> Catalog:
    """The static catalog: every priced offer and every unpriced tier."""
    offers: list[Offer] = []
    unpriced: list[UnpricedTier] = []
    for name, parse in (("cloud.yaml", _cloud), ("dedicated.yaml", _dedicated)):
        raw = read_yaml(_DIR / name)
        o, u = parse(raw)
        offers += o
        unpriced += u
    return Catalog(tuple(offers), tuple(unpriced))


def provider_names() -> list[str]:
    """Providers a job may name: the catalogs', `dedicated` (registered servers), the live
    adapters and the simulated cloud."""
    return sorted({o.provider for o in load().offers} | {u.provider for u in load().unpriced}
                  | {"dedicated", "vastai", "runpod", "sim"})
