"""Price history: what each search of a live market saw (`price_observation`).

One row per (provider, GPU, count, spot or not) per search: the cheapest whole-machine price
of that kind just seen. A row equal to the newest one of its key is not written again
(deduplicated: a market that did not move adds nothing), so the table grows with price
changes, not with searches. `orch prices GPU` reads it back.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from decimal import ROUND_HALF_EVEN

from sqlmodel import col, select

from orchestrator.records.store.database import StoreBase
from orchestrator.records.store.tables import PriceObservation, to_micros, utcnow
from providers.base import Offer

_Key = tuple[str, str, int, bool]  # provider, gpu, gpu_count, interruptible


def cheapest(offers: Iterable[Offer]) -> dict[_Key, int]:
    """The cheapest hourly price (micro-dollars) per key among metered `offers`."""
    best: dict[_Key, int] = {}
    for o in offers:
        if o.price_per_hour is None or o.registered:
            continue
        key = (o.provider, o.gpu, o.gpu_count, o.interruptible)
        micros = to_micros(o.price_per_hour, rounding=ROUND_HALF_EVEN)
        if key not in best or micros < best[key]:
            best[key] = micros
    return best


def record(store: StoreBase, offers: Iterable[Offer], at: datetime | None = None) -> int:
    """Write what a search saw (see the module doc); returns the rows written."""
    seen = cheapest(offers)
    if not seen:
        return 0
    at = at or utcnow()
    written = 0
    with store.transaction() as session:
        for (provider, gpu, count, spot), micros in sorted(seen.items()):
            last = session.exec(
                select(PriceObservation.price_per_hour_micros)
                .where(PriceObservation.provider == provider, PriceObservation.gpu == gpu,
                       PriceObservation.gpu_count == count,
                       PriceObservation.interruptible == spot)
                .order_by(col(PriceObservation.observed_at).desc(),
                          col(PriceObservation.id).desc())
                .limit(1)).first()
            if last == micros:
                continue
            session.add(PriceObservation(provider=provider, gpu=gpu, gpu_count=count,
                                         interruptible=spot, price_per_hour_micros=micros,
                                         observed_at=at))
            written += 1
    return written


@dataclass(frozen=True)
class PriceSummary:
    """One key's history since a date: newest, least, median and most, in micro-dollars."""

    provider: str
    gpu: str
    gpu_count: int
    interruptible: bool
    observations: int
    latest: int
    latest_at: datetime
    least: int
    median: int
    most: int


def history(store: StoreBase, gpus: Iterable[str], since: datetime | None = None
            ) -> list[PriceSummary]:
    """Per key, the prices observed for `gpus` since `since` (None: all), cheapest first."""
    query = select(PriceObservation).where(col(PriceObservation.gpu).in_(list(gpus)))
    if since is not None:
        query = query.where(col(PriceObservation.observed_at) >= since)
    query = query.order_by(col(PriceObservation.observed_at), col(PriceObservation.id))
    with store.session() as session:
        rows = list(session.exec(query))
    by_key: dict[_Key, list[PriceObservation]] = {}
    for r in rows:
        by_key.setdefault((r.provider, r.gpu, r.gpu_count, r.interruptible), []).append(r)
    out = []
    for (provider, gpu, count, spot), seen in by_key.items():
        prices = [r.price_per_hour_micros for r in seen]
        out.append(PriceSummary(provider, gpu, count, spot, len(seen), prices[-1],
                                seen[-1].observed_at, min(prices),
                                round(statistics.median(prices)), max(prices)))
    return sorted(out, key=lambda s: (s.median, s.provider, s.gpu_count, s.interruptible))
