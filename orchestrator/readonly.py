"""Cheap read-only look-ups for commands that must start fast (`orch plan`).

Importing SQLModel/SQLAlchemy costs ~0.5 s; `orch plan` only needs the registered servers
and the measured throughput, so for SQLite it reads them with the standard library. Other
databases go through the store.
"""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from orchestrator.throughput import Measured, MeasuredKey
from providers.dedicated import RegisteredServer

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
        from orchestrator.store import open_store  # non-SQLite: use the store

        return open_store(url).registered()
    if not path.exists():
        return []
    import sqlite3  # only with a database: `orch plan` on a fresh machine skips it

    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    try:
        rows = con.execute(
            "SELECT name, gpu, gpu_count, monthly_price_micros, host, status, port, user, "
            "claimed_by_job FROM server ORDER BY name"
        ).fetchall()
    except sqlite3.OperationalError:
        return []  # database not migrated yet: no servers registered
    finally:
        con.close()
    return [
        RegisteredServer(name, gpu, int(count), Decimal(int(micros)) / 1_000_000, host, status,
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

        from orchestrator.store import open_store  # non-SQLite: use the store's engine

        store = open_store(url)
        try:
            with store.engine.connect() as conn:
                return _medians(tuple(r) for r in conn.execute(text(_MEASURED_SQL)))
        finally:
            store.close()
    if not path.exists():
        return {}
    import sqlite3

    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    try:
        rows = con.execute(_MEASURED_SQL).fetchall()
    except sqlite3.OperationalError:
        return {}  # database older than the table (or not migrated): no history yet
    finally:
        con.close()
    return _medians(rows)


def _medians(rows: Iterable[tuple[Any, ...]]) -> dict[MeasuredKey, Measured]:
    import statistics

    by_key: dict[MeasuredKey, list[float]] = {}
    for gpu, count, method, size, rate in rows:
        by_key.setdefault((str(gpu), int(count), str(method), str(size)), []).append(
            float(rate))
    return {k: Measured(statistics.median(v), len(v)) for k, v in sorted(by_key.items())}
