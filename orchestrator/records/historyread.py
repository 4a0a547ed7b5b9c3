"""The one read path for queries outside the engine: read-only access to the orch database.

On SQLite a `mode=ro` sqlite3 connection (no SQLModel/SQLAlchemy import, ~0.5 s saved per
command, and no file or schema is ever created: no database yet is no rows); other databases
(`ORCH_DB_URL` = PostgreSQL) through the store's engine with the same SQL. Also the time
formats those commands parse and the errors they report. `history`, `adhocsql`,
`sweep.view`, `warmidle` and `readonly` (what `orch plan` reads) all read through this; the
store is the engine's, for reads inside its transactions and for every write.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import quote, unquote

from orchestrator.core.utc import iso_z

if TYPE_CHECKING:
    import sqlite3

_SPAN = re.compile(r"(\d+)\s*([mhdw])")
_SPAN_UNITS = {"m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


class HistoryError(Exception):
    """A bad argument or an unreadable database; the message names the flag and the fix."""


class ReadOnlyError(HistoryError):
    """`orch sql` was given something other than one read-only query."""


class QueryError(HistoryError):
    """`orch sql`'s query is wrong (syntax, unknown table or column): invalid input."""


class MissingTable(HistoryError):
    """The database has no such table: orch never migrated it this far (no rows of it yet)."""


# --- times -------------------------------------------------------------------------------


def to_text(when: datetime) -> str:
    """The stored form of an aware time: `YYYY-MM-DDTHH:MM:SS.ffffffZ` in UTC."""
    return iso_z(when)


def parse_when(value: str, flag: str, now: datetime) -> datetime:
    """An ISO date/time (UTC unless it says otherwise) or a span back from `now` (`30d`)."""
    text = value.strip()
    span = _SPAN.fullmatch(text.lower())
    if span:
        return now - timedelta(**{_SPAN_UNITS[span.group(2)]: int(span.group(1))})
    try:
        # fromisoformat takes dates, `T` or space separated times, offsets and (3.11) `Z`.
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise HistoryError(
            f"{flag} {value}: use an ISO date like 2026-11-01, a UTC time like "
            "2026-11-01T12:00, or a span like 30d, 12h, 2w, 90m"
        ) from None
    # A time without an offset is UTC: every time orch stores and prints is.
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def parse_stored(text: str | None) -> datetime | None:
    """Parse a stored time column (tolerating hand-written rows without the `Z`)."""
    if text is None:
        return None
    parsed = datetime.fromisoformat(text)
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


# --- database access ---------------------------------------------------------------------


def sqlite_path(url: str) -> Path | None:
    """The file of a `sqlite:///...` URL, or None for other databases / in-memory."""
    prefix = "sqlite:///"
    if not url.startswith(prefix):
        return None
    rest = unquote(url[len(prefix):]).split("?", 1)[0]
    if not rest or rest == ":memory:":
        return None
    return Path(rest if rest.startswith("/") else rest)


class Reader(Protocol):
    """Run one read query with `:name` parameters and return every row."""

    dialect: str

    def rows(self, sql: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        """All rows of `sql`."""
        ...

    def close(self) -> None:
        """Release the connection."""
        ...


def _ro_connect(path: Path) -> sqlite3.Connection:
    # Start-up laziness: sqlite3 only where there is a database file to read.
    import sqlite3

    # mode=ro: a typo'd path is an error, not a new empty database; timeout only matters
    # while a WAL checkpoint or recovery holds the file.
    con = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True, timeout=10)
    con.execute("PRAGMA query_only=ON")
    return con


class SqliteReader:
    """A read-only sqlite3 connection (stdlib only)."""

    dialect = "sqlite"

    def __init__(self, path: Path) -> None:
        import sqlite3

        self.path = path
        try:
            self.con = _ro_connect(path)
        except sqlite3.Error as exc:
            raise HistoryError(f"cannot read the database {path}: {exc}") from exc

    def rows(self, sql: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        """All rows of `sql`; a missing table means a database orch never migrated
        (MissingTable)."""
        import sqlite3

        try:
            return self.con.execute(sql, dict(params or {})).fetchall()
        except sqlite3.OperationalError as exc:
            kind = MissingTable if "no such table" in str(exc) else HistoryError
            raise kind(
                f"cannot read the history in {self.path}: {exc}; run any orch command that "
                "opens the database (e.g. `orch jobs`) to create or upgrade its schema"
            ) from exc
        except sqlite3.DatabaseError as exc:  # "file is not a database"
            raise HistoryError(f"cannot read the history in {self.path}: {exc}; move it "
                               "aside or set ORCH_DB_URL to another database") from exc

    def close(self) -> None:
        """Close the connection."""
        self.con.close()


class EngineReader:
    """Reads through the store's SQLAlchemy engine (PostgreSQL and other non-SQLite URLs)."""

    def __init__(self, url: str) -> None:
        # Imported here, not at the top: the store pulls in SQLAlchemy (~0.5 s), which the
        # SQLite readers never need.
        from orchestrator.records.store import StoreError, open_store

        try:
            self.store = open_store(url)
        except StoreError as exc:
            raise HistoryError(str(exc)) from exc
        self.dialect = self.store.engine.dialect.name

    def rows(self, sql: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        """All rows of `sql` in a read-only transaction."""
        # Start-up laziness: SQLAlchemy is imported only on the path that uses it.
        from sqlalchemy import text
        from sqlalchemy.exc import SQLAlchemyError

        try:
            with self.store.engine.connect() as conn:
                if self.dialect == "postgresql":
                    conn.exec_driver_sql("SET TRANSACTION READ ONLY")
                result = conn.execute(text(sql), dict(params or {}))
                out = [tuple(r) for r in result]
                conn.rollback()
                return out
        except SQLAlchemyError as exc:
            raise HistoryError(f"cannot read the history: {exc}") from exc

    def close(self) -> None:
        """Dispose of the engine."""
        self.store.close()


def open_reader(url: str) -> Reader | None:
    """A reader for `url`, or None when the SQLite file does not exist (no history yet)."""
    path = sqlite_path(url)
    if path is None:
        if url.startswith("sqlite"):
            return None  # in-memory: a fresh process has no history
        return EngineReader(url)
    if not path.exists():
        return None
    return SqliteReader(path)
