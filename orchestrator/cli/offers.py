"""`orch offers`: the market a job would be placed on, without a job file.

Live offers from every cloud with an API key (asked at once, within `market.DEADLINE_S`),
the price catalogs otherwise, as `dstack offer` and `sky show-gpus` do. Offers of GPUs orch
does not plan are counted and named with the reason, so the GPU catalog can grow.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from orchestrator.cli.common import EXIT_INVALID, fail
from providers import catalog
from providers.base import Offer, Requirements

GIB = 1024**3


@dataclass(frozen=True)
class Filters:
    """The command's options as plain values."""

    gpus: frozenset[str] | None = None  # canonical names
    min_memory_gib: float = 0.0
    provider: str | None = None
    spot: bool | None = None  # True: spot only; False: on-demand only; None: both
    count: int = 1


def filters(gpu: str | None, min_memory: float, provider: str | None, spot: bool | None,
            count: int) -> Filters:
    """Checked filters; a bad value exits EXIT_INVALID naming the option and the fix."""
    gpus = None
    if gpu is not None:
        found = catalog.resolve_gpu(gpu)
        if not found:
            reason = catalog.left_out("vastai").get(gpu) or catalog.left_out("runpod").get(gpu)
            why = f" ({reason})" if reason else ""
            fail(f"--gpu {gpu!r}: not a GPU orch plans{why}; known: "
                 f"{', '.join(catalog.gpus())}", EXIT_INVALID)
        gpus = frozenset(found)
    names = catalog.provider_names()
    if provider is not None and provider not in names:
        fail(f"--provider {provider!r}: unknown; one of {', '.join(names)}", EXIT_INVALID)
    if min_memory < 0:
        fail("--min-memory: a number of GiB per GPU, 0 or more", EXIT_INVALID)
    if count not in (1, 2, 4, 8):
        fail("--count: 1, 2, 4 or 8 GPUs", EXIT_INVALID)
    return Filters(gpus, min_memory, provider, spot, count)


def keep(o: Offer, f: Filters) -> bool:
    """Whether offer `o` passes the filters (applied to live and catalog offers alike)."""
    return ((f.gpus is None or o.gpu in f.gpus)
            and o.gpu_memory_bytes >= f.min_memory_gib * GIB
            and (f.provider is None or o.provider == f.provider)
            and (f.spot is None or o.interruptible == f.spot)
            and o.gpu_count == f.count)


def _row(o: Offer) -> dict[str, Any]:
    return {"provider": o.provider, "offer_id": o.offer_id, "gpu": o.gpu,
            "gpu_count": o.gpu_count, "gpu_memory_gib": round(o.gpu_memory_bytes / GIB, 1),
            "interruptible": o.interruptible, "billing": o.billing.value,
            "price_per_hour": None if o.price_per_hour is None else str(o.price_per_hour),
            "monthly_price": None if o.monthly_price is None else str(o.monthly_price),
            "region": o.region}


def _price_key(o: Offer) -> tuple[Decimal, str, str]:
    price = o.price_per_hour if o.price_per_hour is not None else Decimal("Infinity")
    return price, o.provider, o.offer_id


def run(f: Filters, json_out: bool = False) -> None:
    """Print the offers passing `f`, cheapest first, and where they came from."""
    from orchestrator.engine.market import Market, clouds, search

    named = None if f.provider is None else [f.provider]
    providers, _ = clouds(named)
    market = Market()
    if providers:
        req = Requirements(gpu_count=f.count, min_gpu_memory_bytes=int(f.min_memory_gib * GIB),
                           gpus=f.gpus, interruptible=f.spot)
        market = search(providers, [req])
    live = bool(market.answered)
    if live:
        record_prices(market.offers)
    pool = list(market.offers) if live else list(catalog.load().offers)
    shown = sorted((o for o in pool if keep(o, f)), key=_price_key)
    source = (f"live offers from {', '.join(market.answered)}" if live else
              "the price catalogs (estimates, nothing to rent: " + (
                  "no cloud answered" if providers else
                  "no API key; set VAST_API_KEY or RUNPOD_API_KEY for live offers") + ")")
    notes = list(market.notes)  # skipped GPUs; why a cloud gave no offers
    if json_out:
        print(json.dumps({"source": "live" if live else "catalog", "from": list(market.answered),
                          "offers": [_row(o) for o in shown], "notes": notes,
                          "skipped": {p: dict(s) for p, s in market.skipped.items()}},
                         indent=2))
        return
    _render(shown, source, notes)


def _render(shown: list[Offer], source: str, notes: list[str]) -> None:
    from orchestrator.cli.tables import table
    from orchestrator.cli.term import prose

    rows = [[o.provider, o.gpu, o.gpu_count, f"{o.gpu_memory_bytes / GIB:.0f}",
             "yes" if o.interruptible else "no",
             f"${o.price_per_hour:,.3f}" if o.price_per_hour is not None else
             f"${o.monthly_price:,.0f}/mo" if o.monthly_price is not None else "-",
             o.offer_id] for o in shown]
    out = [f"{len(shown)} offer{'s' if len(shown) != 1 else ''}, cheapest first: {source}"]
    if rows:
        out.append(table(["provider", "GPU", "n", "GiB", "spot", "$/h", "offer"], rows,
                         right=[2, 3, 5], drop=[6]))
    out += [prose(f"note: {n}", "  ") for n in notes]
    print("\n".join(out))


def record_prices(offers: tuple[Offer, ...]) -> None:
    """Add what a live search saw to the price history (`orch prices`)."""
    from orchestrator.cli.common import open_db
    from orchestrator.records import prices

    prices.record(open_db(), offers)


def prices_run(gpu: str, since: str | None, json_out: bool) -> None:
    """`orch prices GPU`: the prices searches have seen for `gpu`, per provider and kind."""
    from datetime import UTC, datetime

    from orchestrator.cli.common import open_db
    from orchestrator.core.money import from_micros, usd
    from orchestrator.core.utc import iso_z
    from orchestrator.records import prices
    from orchestrator.records.history import HistoryError, parse_when

    names = catalog.resolve_gpu(gpu)
    if not names:
        fail(f"{gpu!r}: not a GPU orch plans; known: {', '.join(catalog.gpus())}", EXIT_INVALID)
    try:
        start = None if since is None else parse_when(since, "--since", datetime.now(UTC))
    except HistoryError as exc:
        fail(str(exc), EXIT_INVALID)
    rows = prices.history(open_db(), names, start)
    if json_out:
        print(json.dumps([{"provider": r.provider, "gpu": r.gpu, "gpu_count": r.gpu_count,
                           "interruptible": r.interruptible, "observations": r.observations,
                           "latest": str(from_micros(r.latest)),
                           "latest_at": iso_z(r.latest_at),
                           "min": str(from_micros(r.least)),
                           "median": str(from_micros(r.median)),
                           "max": str(from_micros(r.most))} for r in rows], indent=2))
        return
    if not rows:
        print(f"no prices seen for {', '.join(names)}"
              + (f" since {since}" if since else "")
              + "; `orch offers` (with an API key) and every placement record them")
        return
    from orchestrator.cli.tables import table
    from orchestrator.cli.term import human_time

    def cell(micros: int) -> str:
        return usd(from_micros(micros))

    print(table(["provider", "GPU", "n", "spot", "seen", "median $/h", "min", "max", "latest",
                 "at"],
                [[r.provider, r.gpu, r.gpu_count, "yes" if r.interruptible else "no",
                  r.observations, cell(r.median), cell(r.least), cell(r.most), cell(r.latest),
                  human_time(r.latest_at)] for r in rows], right=[2, 4, 5, 6, 7, 8]))
