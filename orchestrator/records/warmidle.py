"""What machines kept warm cost while idle (docs/warm.md), for `orch cost` and `orch warm`.

Idle time is billed to no job, so the job rollups never show it; it is read here from the
`warm_instance` table (through `historyread`, like the rollups). A window that closed has its
cost recorded (`idle_micros`); a machine parked now is priced up to `now` by the same rule
(`money.idle_micros`: per second or per started minute, as the provider bills it).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from orchestrator.core.money import dollars, idle_micros
from orchestrator.records.historyread import HistoryError, Reader, parse_stored, to_text

_SQL = ("SELECT id, provider, provider_instance_id, gpu, gpu_count, price_per_hour_micros, "
        "billing, parked_by_job, parked_at, expires_at, state, taken_by_job, idle_micros "
        "FROM warm_instance WHERE parked_at >= :since AND parked_at < :until ORDER BY id")


@dataclass(frozen=True)
class WarmRow:
    """One warm window, with its idle cost so far."""

    id: int
    provider: str
    instance_id: str
    gpu: str
    gpu_count: int
    price_per_hour_micros: int
    parked_by: str
    parked_at: datetime
    expires_at: datetime
    state: str
    taken_by: str | None
    idle_micros: int

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "provider": self.provider, "instance_id": self.instance_id,
                "gpu": self.gpu, "gpu_count": self.gpu_count,
                "price_per_hour": str(dollars(self.price_per_hour_micros)),
                "parked_by": self.parked_by, "parked_at": to_text(self.parked_at),
                "expires_at": to_text(self.expires_at), "state": self.state,
                "taken_by": self.taken_by, "idle_cost": str(dollars(self.idle_micros))}


def windows(reader: Reader, since: datetime, until: datetime, now: datetime) -> list[WarmRow]:
    """Warm windows opened in [since, until); those still open priced up to `now`. An older
    database without the table (not yet upgraded by an orch that writes) has none."""
    try:
        raw = reader.rows(_SQL, {"since": to_text(since), "until": to_text(until)})
    except HistoryError:
        return []
    rows: list[WarmRow] = []
    for (wid, provider, iid, gpu, count, price, billing, by, parked, expires, state, taken,
         idle) in raw:
        parked_at, expires_at = parse_stored(parked), parse_stored(expires)
        assert parked_at is not None and expires_at is not None  # NOT NULL columns
        if state in ("parked", "ending"):
            idle = idle_micros(int(price), billing, parked_at, now)
        rows.append(WarmRow(int(wid), provider, iid, gpu, int(count), int(price), by,
                            parked_at, expires_at, state, taken, int(idle or 0)))
    return rows


def idle_total(rows: list[WarmRow]) -> tuple[Decimal, int, int]:
    """(idle dollars, windows, machines parked now) over `rows`."""
    cost = dollars(sum(r.idle_micros for r in rows))
    return cost, len(rows), sum(1 for r in rows if r.state in ("parked", "ending"))
