"""`orch offers`: the market a job would be placed on, without a job file.

Live offers from every cloud with an API key (asked at once, within `market.DEADLINE_S`),
the price catalogs otherwise (the dated snapshot of Vast.ai and RunPod list prices and the
seed catalogs), as `dstack offer` and `sky show-gpus` do; each row says where its price
comes from. Offers of GPUs orch does not plan are counted and named with the reason, so the
GPU catalog can grow. A search that shows nothing says why: no key, nothing of that GPU,
and how many offers each filter left out.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from orchestrator.cli.common import EXIT_INVALID, fail, open_db
from orchestrator.cli.tables import table
from orchestrator.cli.term import human_time, prose
from orchestrator.core import preemption
from orchestrator.core.money import from_micros, usd
from orchestrator.core.preemption import Rate
from orchestrator.core.utc import iso_z
from providers import catalog
from providers.base import Offer, Requirements
from providers.catalog import snapshot

GIB = 1024**3


@dataclass(frozen=True)
class Filters:
    """The command's options as plain values."""

    gpus: frozenset[str] | None = None  # canonical names
    min_memory_gib: float = 0.0
    provider: str | None = None
    spot: bool | None = None  # True: spot only; False: on-demand only; None: both
    count: int = 1
    gpu: str | None = None  # as the user spelled it


def did_you_mean(name: str) -> list[str]:
    """GPU models whose name or alias is close to `name` ("L41" -> L40, L4, L40S)."""
    import difflib

    def norm(s: str) -> str:
        return "".join(ch for ch in s.lower() if ch.isalnum())

    spelled: dict[str, str] = {}
    for g in catalog.gpus().values():
        for s in (g.name, *g.aliases):
            spelled.setdefault(norm(s), g.name)
    close = difflib.get_close_matches(norm(name), spelled, n=6, cutoff=0.6)
    return list(dict.fromkeys(spelled[c] for c in close))[:3]


def filters(gpu: str | None, min_memory: float, provider: str | None, spot: bool | None,
            count: int) -> Filters:
    """Checked filters; a bad value exits EXIT_INVALID naming the option and the fix."""
    gpus = None
    if gpu is not None:
        found = catalog.resolve_gpu(gpu)
        if not found:
            reason = catalog.left_out("vastai").get(gpu) or catalog.left_out("runpod").get(gpu)
            why = f" ({reason})" if reason else ""
            close = did_you_mean(gpu)
            hint = f"; did you mean {' or '.join(close)}?" if close and not reason else ""
            fail(f"--gpu {gpu!r}: not a GPU orch plans{why}{hint} Known: "
                 f"{', '.join(catalog.gpus())}", EXIT_INVALID)
        gpus = frozenset(found)
    names = catalog.provider_names()
    if provider is not None and provider not in names:
        fail(f"--provider {provider!r}: unknown; one of {', '.join(names)}", EXIT_INVALID)
    if not 0 <= min_memory <= 10_000:  # also refuses nan
        fail(f"--min-memory {min_memory}: a number of GiB per GPU, 0 to 10000", EXIT_INVALID)
    if count not in (1, 2, 4, 8):
        fail("--count: 1, 2, 4 or 8 GPUs", EXIT_INVALID)
    return Filters(gpus, min_memory, provider, spot, count, gpu)


def steps(f: Filters) -> list[tuple[str, Callable[[Offer], bool]]]:
    """Each filter as (the option as typed, the test an offer must pass), in the order the
    funnel applies them: where offers come from first, what the machine is last."""
    out: list[tuple[str, Callable[[Offer], bool]]] = []
    if f.provider is not None:
        out.append((f"--provider {f.provider}", lambda o: o.provider == f.provider))
    if f.gpus is not None:
        out.append((f"--gpu {f.gpu}", lambda o: o.gpu in (f.gpus or ())))
    out.append((f"--count {f.count}", lambda o: o.gpu_count == f.count))
    if f.spot is not None:
        out.append(("--spot" if f.spot else "--on-demand", lambda o: o.interruptible == f.spot))
    if f.min_memory_gib:
        out.append((f"--min-memory {f.min_memory_gib:g}",
                    lambda o: o.gpu_memory_bytes >= f.min_memory_gib * GIB))
    return out


def funnel(pool: list[Offer], f: Filters) -> tuple[list[Offer], list[tuple[str, int]]]:
    """The offers passing every filter, and how many each filter left out in turn."""
    removed = []
    for name, test in steps(f):
        kept = [o for o in pool if test(o)]
        removed.append((name, len(pool) - len(kept)))
        pool = kept
    return pool, removed


def keep(o: Offer, f: Filters) -> bool:
    """Whether offer `o` passes the filters (applied to live and catalog offers alike)."""
    return all(test(o) for _name, test in steps(f))


def _row(o: Offer) -> dict[str, Any]:
    return {"provider": o.provider, "offer_id": o.offer_id, "gpu": o.gpu,
            "gpu_count": o.gpu_count, "gpu_memory_gib": round(o.gpu_memory_bytes / GIB, 1),
            "interruptible": o.interruptible, "billing": o.billing.value,
            "price_per_hour": None if o.price_per_hour is None else str(o.price_per_hour),
            "monthly_price": None if o.monthly_price is None else str(o.monthly_price),
            "ram_gb": None if o.ram_bytes is None else round(o.ram_bytes / 1000**3, 1),
            "region": o.region, "source": snapshot.label(o)}


def _price_key(o: Offer) -> tuple[Decimal, str, str]:
    price = o.price_per_hour if o.price_per_hour is not None else Decimal("Infinity")
    return price, o.provider, o.offer_id


def keyless_source(key_notes: list[str]) -> str:
    """What the list shows without live offers, and why."""
    dates = ", ".join(f"{p} {d}" for p, d in sorted(snapshot.load().dates.items()))
    why = "no cloud answered" if not key_notes else (
        "no API key; set VAST_API_KEY or RUNPOD_API_KEY for live offers")
    return (f"the price catalogs (estimates, nothing to rent: {why}): the market snapshot of "
            f"listed prices ({dates}) and the seed catalogs")


def why_none(f: Filters, pool: list[Offer], removed: list[tuple[str, int]],
             answered: tuple[str, ...], unkeyed: list[str], failed: list[str]) -> list[str]:
    """Why a search shows nothing: where offers were looked for, then each filter's toll."""
    live = bool(answered)
    where = "the live offers" if live else "the catalogs"
    out = []
    if unkeyed:
        dates = snapshot.load().dates
        out.append(f"no API key for {' or '.join(unkeyed)}: " + (
            "not searched" if live else "searched the market snapshot of listed prices ("
            + ", ".join(f"{p} {dates[p]}" for p in unkeyed if p in dates)
            + ") and the seed catalogs instead"))
    out += failed  # a cloud with a key that gave nothing, and why
    if not pool:
        # A live search sends the filters along: an empty answer is the answer to them.
        asked = " ".join(name for name, _test in steps(f) if not name.startswith("--provider"))
        out.append(f"{' and '.join(answered)} listed no offer for {asked}" if live
                   else f"{where} hold no offer at all")
        return out
    if f.gpus is not None and not any(o.gpu in f.gpus for o in pool):
        out.append(f"nothing of {', '.join(sorted(f.gpus))} in {where}" + (
            "" if live else " (a provider may list it now: set an API key to search live)"))
    tolls = [f"{name} left out {n}" for name, n in removed if n]
    if tolls:
        out.append(f"of {len(pool)} offers in {where}: " + "; ".join(tolls))
    return out


def run(f: Filters, json_out: bool = False) -> None:
    """Print the offers passing `f`, cheapest first, and where they came from."""
    from orchestrator.engine.market import Market, search
    from orchestrator.engine.wiring import CLOUDS, clouds

    named = None if f.provider is None else [f.provider]
    providers, key_notes = clouds(named)
    market = Market()
    req = Requirements(gpu_count=f.count, min_gpu_memory_bytes=int(f.min_memory_gib * GIB),
                       gpus=f.gpus, interruptible=f.spot)
    if providers:
        market = search(providers, [req])
    live = bool(market.answered)
    if live:
        record_prices(market.offers)
    # Without live offers, the snapshot is priced for the same disk a live search asks for.
    pool = list(market.offers) if live else snapshot.keyless_offers(req.disk_gb)
    kept, removed = funnel(pool, f)
    shown = sorted(kept, key=_price_key)
    source = f"live offers from {', '.join(market.answered)}" if live else keyless_source(
        [] if providers else key_notes or ["no key"])
    # Skipped GPUs; why a cloud gave no offers; a cloud left out for want of a key.
    notes = [*market.notes, *(key_notes if live and f.provider is None else [])]
    unkeyed = [c for c in CLOUDS if c not in providers and (named is None or c in named)]
    reasons = [] if shown else why_none(f, pool, removed, market.answered, unkeyed,
                                        [n for n in market.notes if "skipped" not in n])
    from orchestrator.cli.deadlineview import rates

    learned = rates() if any(o.interruptible for o in shown) else {}
    if json_out:
        print(json.dumps({"source": "live" if live else "catalog", "from": list(market.answered),
                          "offers": [{**_row(o), **_preempts(o, learned)} for o in shown],
                          "notes": notes,
                          "filtered": [{"filter": n, "left_out": k} for n, k in removed],
                          "why_none": reasons,
                          "skipped": {p: dict(s) for p, s in market.skipped.items()}},
                         indent=2))
        return
    _render(shown, source, notes + [f"0 offers: {r}" for r in reasons], learned)


def _rate(o: Offer, learned: dict[tuple[str, str], Rate]) -> Rate | None:
    """A spot offer's preemption rate (orch's history with the prior); None: on-demand."""
    return learned.get((o.provider, o.gpu)) or preemption.rate() if o.interruptible else None


def _preempts(o: Offer, learned: dict[tuple[str, str], Rate]) -> dict[str, Any]:
    r = _rate(o, learned)
    return {"preemptions": None if r is None else r.describe(),
            "preemptions_per_hour": None if r is None else round(r.preemptions_per_hour, 4)}


def _render(shown: list[Offer], source: str, notes: list[str],
            learned: dict[tuple[str, str], Rate]) -> None:
    from orchestrator.cli.deadlineview import short

    rows = [[o.provider, o.gpu, o.gpu_count, f"{o.gpu_memory_bytes / GIB:.0f}",
             "yes" if o.interruptible else "no",
             f"${o.price_per_hour:,.3f}" if o.price_per_hour is not None else
             f"${o.monthly_price:,.0f}/mo" if o.monthly_price is not None else "-",
             "-" if o.ram_bytes is None else f"{o.ram_bytes / 1000**3:.0f}",
             snapshot.label(o), o.offer_id,
             "-" if (r := _rate(o, learned)) is None else short(r)] for o in shown]
    out = [prose(f"{len(shown)} offer{'s' if len(shown) != 1 else ''}, cheapest first: "
                 f"{source}")]
    if rows:
        out.append(table(["provider", "GPU", "n", "GiB", "spot", "$/h", "RAM GB", "source",
                          "offer", "preemptions"], rows, right=[2, 3, 5, 6], drop=[8, 6]))
    out += [prose(f"note: {n}", "  ") for n in notes]
    print("\n".join(out))


def record_prices(offers: tuple[Offer, ...]) -> None:
    """Add what a live search saw to the price history (`orch prices`)."""
    from orchestrator.records import prices

    prices.record(open_db(), offers)


def prices_run(gpu: str, since: str | None, json_out: bool) -> None:
    """`orch prices GPU`: the prices searches have seen for `gpu`, per provider and kind."""
    from datetime import UTC, datetime

    from orchestrator.records import prices
    from orchestrator.records.history import HistoryError, parse_when

    names = catalog.resolve_gpu(gpu)
    if not names:
        fail(f"{gpu!r}: not a GPU orch plans; known: {', '.join(catalog.gpus())}", EXIT_INVALID)
    try:
        start = None if since is None else parse_when(since, "--since", datetime.now(UTC))
    except HistoryError as exc:
        fail(str(exc), EXIT_INVALID)
    from orchestrator.cli.deadlineview import short
    from orchestrator.records.preemptions import rates

    store = open_db()
    rows = prices.history(store, names, start)
    learned = rates(store)

    def rate(r: prices.PriceSummary) -> Rate | None:
        return (learned.get((r.provider, r.gpu)) or preemption.rate()) if r.interruptible \
            else None

    if json_out:
        print(json.dumps([{"provider": r.provider, "gpu": r.gpu, "gpu_count": r.gpu_count,
                           "interruptible": r.interruptible, "observations": r.observations,
                           "latest": str(from_micros(r.latest)),
                           "latest_at": iso_z(r.latest_at),
                           "min": str(from_micros(r.least)),
                           "median": str(from_micros(r.median)),
                           "max": str(from_micros(r.most)),
                           "preemptions": (p := rate(r)) and p.describe(),
                           "preemptions_per_hour": p and round(p.preemptions_per_hour, 4)}
                          for r in rows], indent=2))
        return
    if not rows:
        print(f"no prices seen for {', '.join(names)}"
              + (f" since {since}" if since else "")
              + "; `orch offers` (with an API key) and every placement record them")
        return
    def cell(micros: int) -> str:
        return usd(from_micros(micros))

    print(table(["provider", "GPU", "n", "spot", "seen", "median $/h", "min", "max", "latest",
                 "at", "preemptions"],
                [[r.provider, r.gpu, r.gpu_count, "yes" if r.interruptible else "no",
                  r.observations, cell(r.median), cell(r.least), cell(r.most), cell(r.latest),
                  human_time(r.latest_at), "-" if (p := rate(r)) is None else short(p)]
                 for r in rows], right=[2, 4, 5, 6, 7, 8]))
