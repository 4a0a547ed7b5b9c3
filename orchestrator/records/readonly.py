"""What `orch plan` reads of the database: registered servers, measured throughput, machines
kept warm. Through the one read path (`historyread.open_reader`): on SQLite the standard
library, read-only (no migration, no file created; importing SQLModel/SQLAlchemy alone costs
~0.5 s), other databases through the store's engine with the same SQL.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from orchestrator.core import preemption, restarts
from orchestrator.core.money import dollars_trimmed, from_micros
from orchestrator.core.preemption import Rate
from orchestrator.core.throughput import Measured, MeasuredKey
from orchestrator.core.warmfit import WarmMachine
from orchestrator.records.historyread import (
    HistoryError,
    MissingTable,
    open_reader,
    parse_stored,
)
from providers.dedicated.compute import RegisteredServer

if TYPE_CHECKING:
    from orchestrator.core.hostmemory import Observation

# Only recent jobs speak for a key: drivers, images and the trainer change over time.
MEASURED_WINDOW = 20

# The newest MEASURED_WINDOW observations of each key (observed_at is fixed-width UTC text,
# so it orders as time; id breaks ties between rows written in the same microsecond).
_MEASURED_SQL = f"""
SELECT gpu, gpu_count, method, size_class, tokens_per_s FROM (
    SELECT gpu, gpu_count, method, size_class, tokens_per_s,
           ROW_NUMBER() OVER (PARTITION BY gpu, gpu_count, method, size_class
                              ORDER BY observed_at DESC, id DESC) AS newest
    FROM throughput_observation
    WHERE tokens_per_s > 0
) AS recent WHERE newest <= {MEASURED_WINDOW}
"""
_SERVERS_SQL = ("SELECT name, gpu, gpu_count, monthly_price_micros, host, status, port, "
                "user, claimed_by_job, check_error FROM server ORDER BY name")
_WARM_SQL = ("SELECT id, provider, provider_instance_id, offer_json, price_per_hour_micros, "
             "image, disk_gb, model_repo, model_revision, parked_by_job, expires_at "
             "FROM warm_instance WHERE state = 'parked' ORDER BY id")


_HOSTS_SQL = ("SELECT provider, machine_id, at, source, failed, delivered, why "
              "FROM host_observation ORDER BY at, id")
_SPOT_SQL = ("SELECT provider, gpu, end_reason, created_at, terminated_at FROM instance "
             "WHERE interruptible AND provider_instance_id IS NOT NULL")

# One provider's GPU's newest rentals (:provider, :gpu) with the time of their job's first
# training step on each (core.restarts), newest first. Asked per key, ORDER BY + LIMIT: a
# top-N of one key's rows, where a window over every key sorted the whole table (150k rows
# on SQLite: 0.36 s for all keys that way, 0.11-0.13 s for the two keys a decision asks).
# A machine taken warm (offer id `warm:...`, created when taken: no boot) is not a restart.
RESTART_SQL = f"""
SELECT provider, gpu, created_at, (
    SELECT MIN(e.at) FROM event e
    WHERE e.job_id = i.job_id AND e.kind = 'train.progress' AND e.at >= i.created_at
      AND (i.terminated_at IS NULL OR e.at <= i.terminated_at)) AS first_step
FROM instance i
WHERE provider = :provider AND gpu = :gpu AND provider_instance_id IS NOT NULL
  AND (offer_id IS NULL OR offer_id NOT LIKE 'warm:%')
ORDER BY created_at DESC, id DESC LIMIT {3 * restarts.WINDOW}
"""


class Unavailable(HistoryError):
    """The database cannot be read; the message says why and what to do."""


def _rows(url: str, what: str, sql: str,
          each: Iterable[Mapping[str, Any]] = ({},)) -> list[tuple[Any, ...]]:
    """Rows of `sql` (run once for each of `each`'s parameters, on one connection): none
    when there is no database yet, or it predates the table (not migrated this far);
    Unavailable when it cannot be opened or read."""
    try:
        reader = open_reader(url)
    except HistoryError as exc:
        raise Unavailable(str(exc)) from exc
    if reader is None:
        return []
    try:
        return [row for params in each for row in reader.rows(sql, params)]
    except MissingTable:
        return []
    except HistoryError as exc:
        raise Unavailable(f"cannot read {what}: {exc}") from exc
    finally:
        reader.close()


def registered_servers(url: str) -> list[RegisteredServer]:
    """Every registered server, without creating or migrating the database."""
    return [RegisteredServer(name, gpu, int(count), dollars_trimmed(micros), host, status,
                             int(port), user, claimed, check_error)
            for name, gpu, count, micros, host, status, port, user, claimed, check_error
            in _rows(url, "registered servers", _SERVERS_SQL)]


def measured_throughput(url: str) -> dict[MeasuredKey, Measured]:
    """Median tokens/s per (GPU, count, method, size class) over its newest observations."""
    rows = _rows(url, "measured throughput", _MEASURED_SQL)
    return _medians(rows) if rows else {}


def parked_warm(url: str) -> list[WarmMachine]:
    """Machines kept warm now whose window is open (`orch plan` prices them beside fresh
    offers; the engine decides with the database's own clock when it takes one)."""
    from datetime import UTC, datetime

    from orchestrator.core.warmfit import offer_from_json

    now = datetime.now(UTC)
    found = []
    for wid, _provider, iid, offer, price, image, disk, repo, rev, by, expires in _rows(
            url, "warm instances", _WARM_SQL):
        until = parse_stored(expires)
        if until is None or until <= now:
            continue
        found.append(WarmMachine(int(wid), offer_from_json(offer), from_micros(int(price)),
                                 image, int(disk), (repo, rev or "main") if repo else None,
                                 by, until, iid))
    return found


def _medians(rows: Iterable[tuple[Any, ...]]) -> dict[MeasuredKey, Measured]:
    # Start-up laziness: statistics is imported only on the path that uses it.
    import statistics

    by_key: dict[MeasuredKey, list[float]] = {}
    for gpu, count, method, size, rate in rows:
        by_key.setdefault((str(gpu), int(count), str(method), str(size)), []).append(
            float(rate))
    return {k: Measured(statistics.median(v), len(v)) for k, v in sorted(by_key.items())}


def preemption_rates(url: str) -> dict[tuple[str, str], Rate]:
    """Each (provider, GPU)'s spot preemption rate from its instance rows (the prior's
    where orch has none: absent here), as `records.preemptions` computes it."""
    rows = [(p, g, r, parse_stored(c), parse_stored(t))
            for p, g, r, c, t in _rows(url, "instances", _SPOT_SQL)]
    seen = preemption.histories([(p, g, r, c, t) for p, g, r, c, t in rows if c is not None],
                     datetime.now(UTC))
    return {key: preemption.rate(h) for key, h in seen.items()}


def restart_times(url: str, keys: Iterable[restarts.Key]
                  ) -> dict[restarts.Key, restarts.Measured]:
    """The measured rental-to-first-step seconds (`core.restarts`) of each (provider, GPU) of
    `keys` that has any."""
    return restarts_of(_rows(url, "instances", RESTART_SQL, restart_params(keys)))


def restart_params(keys: Iterable[restarts.Key]) -> list[dict[str, str]]:
    """`RESTART_SQL`'s parameters for each of `keys`, once each: for this path and the
    engine's."""
    return [{"provider": p, "gpu": g} for p, g in sorted(set(keys))]


def restarts_of(rows: Iterable[tuple[Any, ...]]) -> dict[restarts.Key, restarts.Measured]:
    """`RESTART_SQL`'s rows (times as stored) measured: for this path and the engine's."""
    parsed = ((p, g, parse_stored(c), parse_stored(f)) for p, g, c, f in rows)
    return restarts.measured((p, g, c, f) for p, g, c, f in parsed if c is not None)


def host_observations(url: str, machines: Iterable[tuple[str, str]]
                      ) -> dict[tuple[str, str], list[Observation]]:
    """What host memory holds of `machines` ((provider, machine id) pairs), oldest first:
    what `orch plan` ranks live offers by, as the engine's placement does."""
    wanted = set(machines)
    if not wanted:
        return {}
    from orchestrator.core.hostmemory import Observation, Source

    seen: dict[tuple[str, str], list[Observation]] = {}
    for provider, machine, at, source, failed, delivered, why in _rows(
            url, "host memory", _HOSTS_SQL):
        when = parse_stored(at)
        if (provider, machine) not in wanted or when is None:
            continue
        seen.setdefault((provider, machine), []).append(Observation(
            at=when, source=Source(source), failed=bool(failed),
            delivered=None if delivered is None else float(delivered), why=why or ""))
    return seen
