"""`orch jobs` without SQLAlchemy: the newest jobs of a SQLite database, read-only.

Importing SQLModel/SQLAlchemy is most of `orch jobs`' start-up (~20x a bare `python -c pass`
on its own), so where the store would only read, this reads through the history's read-only
connection (`historyread`) instead. It answers None, and the caller opens the store, whenever
the store would do more than read: no database file yet (the store creates it), a schema
below the newest migration (the store upgrades it), or a job whose worker's lease lapsed (the
store requeues it first, as every command that opens it does, issue 23 §7).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from orchestrator.core.jobstatus import ACTIVE_STATUSES, in_order
from orchestrator.core.paths import default_db_url, private_sqlite
from orchestrator.records.historyread import (
    HistoryError,
    SqliteReader,
    parse_stored,
    sqlite_path,
)

# The store's listing, column for column (orchestrator/records/store/jobs.py list_jobs).
COLUMNS = ("id", "name", "status", "method", "base_model", "provider", "gpu", "gpu_count",
           "interruptible", "est_hours", "est_cost_micros", "cost_micros", "created_at",
           "lease_owner", "lease_expires_at")
_TIMES = ("created_at", "lease_expires_at")
_ACTIVE = tuple(in_order(ACTIVE_STATUSES))


@dataclass(frozen=True)
class JobRow:
    """The columns of a `job` row that `orch jobs` shows, as the store's Job has them."""

    id: str
    name: str
    status: str
    method: str
    base_model: str
    provider: str | None
    gpu: str | None
    gpu_count: int | None
    interruptible: bool | None
    est_hours: float | None
    est_cost_micros: int | None
    cost_micros: int | None
    created_at: datetime
    lease_owner: str | None
    lease_expires_at: datetime | None


def schema_head() -> str:
    """The newest migration's revision (migrations/versions/NNNN_*.py: NNNN)."""
    versions = Path(__file__).resolve().parents[2] / "migrations" / "versions"
    return max(p.name[:4] for p in versions.glob("[0-9][0-9][0-9][0-9]_*.py"))


def recent_jobs(limit: int, statuses: tuple[str, ...] | None,
                url: str | None = None) -> list[JobRow] | None:
    """The newest `limit` jobs (only those in `statuses`, if given), or None where the store
    must open the database (see the module's docstring)."""
    path = sqlite_path(url or default_db_url())
    if path is None or not path.is_file():
        return None
    private_sqlite(path)  # as the store does at each open
    try:
        reader = SqliteReader(path)
    except HistoryError:
        return None
    try:
        if reader.rows("SELECT version_num FROM alembic_version") != [(schema_head(),)]:
            return None
        now = datetime.now(UTC)
        holders = reader.rows(
            f"SELECT lease_expires_at FROM job WHERE status IN ({_marks(_ACTIVE)}) "
            "AND lease_expires_at IS NOT NULL", _params(_ACTIVE))
        if any((parse_stored(t) or now) < now for (t,) in holders):
            return None
        where, params = "", dict[str, str]()
        if statuses is not None:
            where = f"WHERE status IN ({_marks(statuses)})"
            params = _params(statuses)
        rows = reader.rows(f"SELECT {', '.join(COLUMNS)} FROM job {where} "
                           f"ORDER BY created_at DESC, id DESC LIMIT {int(limit)}", params)
    except HistoryError:
        return None  # a schema this reader does not know: the store says what is wrong
    finally:
        reader.close()
    return [_row(values) for values in rows]


def _marks(values: tuple[str, ...]) -> str:
    return ", ".join(f":s{i}" for i in range(len(values)))


def _params(values: tuple[str, ...]) -> dict[str, str]:
    return {f"s{i}": value for i, value in enumerate(values)}


def _row(values: tuple[object, ...]) -> JobRow:
    fields = dict(zip(COLUMNS, values, strict=True))
    for name in _TIMES:
        fields[name] = parse_stored(fields[name])  # type: ignore[arg-type]
    if fields["interruptible"] is not None:
        fields["interruptible"] = bool(fields["interruptible"])
    return JobRow(**fields)  # type: ignore[arg-type]
