"""Cheap read-only look-ups for commands that must start fast (`orch plan`).

Importing SQLModel/SQLAlchemy costs ~0.5 s; `orch plan` only needs the registered servers
and the measured throughput, so for SQLite it reads them with the standard library. Other
databases go through the store.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import unquote

from orchestrator.core.money import dollars_trimmed, from_micros
from orchestrator.core.throughput import Measured, MeasuredKey
from orchestrator.core.warmfit import WarmMachine
from providers.dedicated.compute import RegisteredServer

_T = TypeVar("_T")

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


class Unavailable(Exception):
    """The (non-SQLite) database cannot be opened; the message says why and what to do."""


def _open(url: str) -> Any:
    """The store at a non-SQLite `url`; Unavailable when it cannot be opened."""
    # Imported here, not at the top: the store pulls in SQLAlchemy (~0.5 s), which the SQLite
    # path of this module exists to avoid.
    from orchestrator.records.store import StoreError, open_store

    try:
        return open_store(url)
    except StoreError as exc:
        raise Unavailable(str(exc)) from exc


def sqlite_path(url: str) -> Path | None:
    """The file of a `sqlite:///...` URL, or None for other databases / in-memory."""
    prefix = "sqlite:///"
    if not url.startswith(prefix):
        return None
    rest = unquote(url[len(prefix):]).split("?", 1)[0]
    if not rest or rest == ":memory:":
        return None
    return Path(rest if rest.startswith("/") else rest)


def registered_servers(url: str) -> list[RegisteredServer]:
    """Every registered server, without creating or migrating the database."""
    path = sqlite_path(url)
    if path is None:
        if url.startswith("sqlite"):
            return []
        return _through_store(url, "registered servers", lambda store: store.registered())
    if not path.exists():
        return []
    import sqlite3  # only with a database: `orch plan` on a fresh machine skips it

    try:
        rows = _sqlite_rows(path, "SELECT name, gpu, gpu_count, monthly_price_micros, host, "
                            "status, port, user, claimed_by_job FROM server ORDER BY name")
    except sqlite3.OperationalError:
        return []  # database not migrated yet: no servers registered
    return [
        RegisteredServer(name, gpu, int(count), dollars_trimmed(micros), host, status,
                         int(port), user, claimed)
        for name, gpu, count, micros, host, status, port, user, claimed in rows
    ]


def measured_throughput(url: str) -> dict[MeasuredKey, Measured]:
    """Median tokens/s per (GPU, count, method, size class) over its newest observations."""
    path = sqlite_path(url)
    if path is None:
        if url.startswith("sqlite"):
            return {}
        from sqlalchemy import text

        def read(store: Any) -> dict[MeasuredKey, Measured]:
            with store.engine.connect() as conn:
                return _medians(tuple(r) for r in conn.execute(text(_MEASURED_SQL)))

        return _through_store(url, "measured throughput", read)
    if not path.exists():
        return {}
    import sqlite3  # only with a database: `orch plan` on a fresh machine skips it

    try:
        rows = _sqlite_rows(path, _MEASURED_SQL)
    except sqlite3.OperationalError:
        return {}  # database older than the table (or not migrated): no history yet
    return _medians(rows)


_WARM_SQL = ("SELECT id, provider, provider_instance_id, offer_json, price_per_hour_micros, "
             "image, disk_gb, model_repo, model_revision, parked_by_job, expires_at "
             "FROM warm_instance WHERE state = 'parked' ORDER BY id")


def parked_warm(url: str) -> list[WarmMachine]:
    """Machines kept warm now whose window is open (`orch plan` prices them beside fresh
    offers; the engine decides with the database's own clock when it takes one)."""
    from datetime import UTC, datetime

    from orchestrator.core.warmfit import offer_from_json

    path = sqlite_path(url)
    if path is None:
        if url.startswith("sqlite"):
            return []
        from orchestrator.records.store.warm import as_machine

        return _through_store(url, "warm instances",
                              lambda store: [as_machine(r) for r in store.parked()[0]])
    if not path.exists():
        return []
    import sqlite3

    try:
        rows = _sqlite_rows(path, _WARM_SQL)
    except sqlite3.OperationalError:
        return []  # database older than the table: nothing kept warm
    now = datetime.now(UTC)
    found = []
    for wid, _provider, iid, offer, price, image, disk, repo, rev, by, expires in rows:
        until = datetime.fromisoformat(expires.replace("Z", "+00:00"))
        if until <= now:
            continue
        found.append(WarmMachine(int(wid), offer_from_json(offer), from_micros(int(price)),
                                 image, int(disk), (repo, rev or "main") if repo else None,
                                 by, until, iid))
    return found


def _through_store(url: str, what: str, read: Callable[[Any], _T]) -> _T:
    """`read(store)` on a non-SQLite database, through the store; Unavailable if it fails."""
    # Start-up laziness: SQLAlchemy is imported only on the path that uses it.
    from sqlalchemy.exc import SQLAlchemyError

    store = _open(url)
    try:
        return read(store)
    except SQLAlchemyError as exc:
        raise Unavailable(f"cannot read {what}: {exc}") from exc
    finally:
        store.close()


def _sqlite_rows(path: Path, sql: str) -> list[Any]:
    """Rows of `sql` on a read-only connection; OperationalError (no such table) propagates,
    Unavailable when the file cannot be opened or is not a database at all."""
    # Start-up laziness: sqlite3 is imported only on the path that uses it.
    import sqlite3
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    except sqlite3.Error as exc:
        raise Unavailable(f"cannot open the database {path}: {exc}") from exc
    try:
        return con.execute(sql).fetchall()
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            raise
        raise Unavailable(f"cannot read the database {path}: {exc}") from exc
    except sqlite3.DatabaseError as exc:  # "file is not a database"
        raise Unavailable(f"cannot read the database {path}: {exc}; move it aside or set "
                          "ORCH_DB_URL to another database") from exc
    finally:
        con.close()


def _medians(rows: Iterable[tuple[Any, ...]]) -> dict[MeasuredKey, Measured]:
    # Start-up laziness: statistics is imported only on the path that uses it.
    import statistics

    by_key: dict[MeasuredKey, list[float]] = {}
    for gpu, count, method, size, rate in rows:
        by_key.setdefault((str(gpu), int(count), str(method), str(size)), []).append(
            float(rate))
    return {k: Measured(statistics.median(v), len(v)) for k, v in sorted(by_key.items())}
