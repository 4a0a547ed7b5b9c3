"""Opening the orch database: engine, SQLite pragmas, schema upgrade, transactions.

SQLite by default, WAL mode, one writer at a time with a busy timeout, and Alembic
migrations applied at open. Alembic is imported only when the schema is missing or behind:
every CLI command that touches the database pays for opening it, and a plain `SELECT` on
`alembic_version` is far cheaper than loading the migration machinery.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError
from sqlmodel import Session

from orchestrator.core.paths import default_db_url
from orchestrator.records.storetables import DatabaseURLError, StoreError

# The newest migration in migrations/versions. Kept here so the fast path of open_store
# knows the head without importing alembic; tests/test_store.py asserts it matches
# alembic's real head, so a new migration without bumping this fails the suite.
SCHEMA_HEAD = "0006"
# Long enough for a second writer to wait out the first one's short transaction.
BUSY_TIMEOUT_MS = 10_000
# Execution option that makes the SQLite BEGIN take the write lock up front.
_IMMEDIATE = "orch_begin_immediate"


def _sqlite_setup(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Take over BEGIN from pysqlite (SQLAlchemy's documented recipe) so that DDL is
        # transactional and writers can ask for BEGIN IMMEDIATE below.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        try:
            # busy_timeout first: switching a fresh file to WAL needs a lock too.
            cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
        finally:
            cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # A deferred transaction that reads and then writes cannot wait for the lock in
        # WAL mode (SQLITE_BUSY at once); writers take the lock at BEGIN and so wait out
        # busy_timeout instead.
        if conn.get_execution_options().get(_IMMEDIATE):
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        else:
            conn.exec_driver_sql("BEGIN")


def _schema_version(engine: Engine) -> list[str]:
    try:
        with engine.connect() as conn:
            rows = conn.exec_driver_sql("SELECT version_num FROM alembic_version").all()
    except DBAPIError:
        # No alembic_version table yet: a fresh database.
        return []
    return [str(row[0]) for row in rows]


def migrations_dir() -> Path:
    """Return the directory of the Alembic environment (the `migrations` package)."""
    return Path(__file__).resolve().parents[2] / "migrations"


def _upgrade(engine: Engine) -> None:
    # Imported here: loading alembic is start-up cost paid only when the schema must change.
    from alembic import command
    from alembic.config import Config
    from alembic.util import CommandError

    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    # No sqlalchemy.url: env.py uses the connection handed over below, which also keeps a
    # password out of the config (and out of configparser's % interpolation).
    # One IMMEDIATE transaction: a second process opening a fresh database at the same
    # moment waits here, then finds the schema at head and does nothing.
    with engine.connect().execution_options(**{_IMMEDIATE: True}) as conn, conn.begin():
        cfg.attributes["connection"] = conn
        try:
            command.upgrade(cfg, "head")
        except CommandError as exc:
            raise StoreError(
                f"cannot upgrade the database schema at {engine.url!r}: {exc}. "
                "If another orch version created it, upgrade orch to the newest version."
            ) from exc



def make_engine(url: str | None = None) -> Engine:
    """The engine of the database at `url` (created if needed), its schema upgraded to head."""
    url = url or default_db_url()
    fix = (" (unset ORCH_DB_URL for the default SQLite file, or give e.g. "
           "sqlite:////srv/orch/orch.db or postgresql+psycopg://USER@HOST/DB)")
    try:
        parsed = make_url(url)
        is_sqlite = parsed.get_backend_name() == "sqlite"
        if is_sqlite and parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url)
    except ArgumentError as exc:  # malformed, or a dialect SQLAlchemy does not know
        # The URL itself is not echoed: it may hold a password.
        raise DatabaseURLError(f"ORCH_DB_URL is not a database URL orch can use "
                               f"({str(exc).splitlines()[0]}){fix}") from None
    except ImportError as exc:  # the dialect's driver (psycopg for PostgreSQL) is missing
        raise StoreError(f"ORCH_DB_URL needs the Python driver {exc.name or 'for it'}, which is "
                         "not installed; install it in orch's environment (for PostgreSQL, in "
                         "orch's checkout: .venv/bin/pip install -e '.[postgres]')") from None
    except OSError as exc:
        raise StoreError(f"cannot create the database folder for {parsed.database}: "
                         f"{exc.strerror or exc}{fix}") from None
    if is_sqlite:
        _sqlite_setup(engine)
    try:
        if _schema_version(engine) != [SCHEMA_HEAD]:
            _upgrade(engine)
    except DBAPIError as exc:
        engine.dispose()
        where = ("check that the path is a writable file" if is_sqlite else
                 "check that the server is running and reachable from here and that the "
                 "user, password and database in ORCH_DB_URL are right")
        reason = str(exc.orig).strip().splitlines()[0] if str(exc.orig).strip() else exc
        raise StoreError(
            f"cannot open the database {parsed.render_as_string(hide_password=True)}: "
            f"{reason}; {where} (or set ORCH_DB_URL to another database)"
        ) from exc
    except BaseException:
        engine.dispose()
        raise
    return engine



class StoreBase:
    """The engine and its two kinds of session; the store's parts build on these."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def close(self) -> None:
        """Close every pooled connection."""
        self.engine.dispose()

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A session for reads; objects stay usable after it closes."""
        with Session(self.engine, expire_on_commit=False) as session:
            yield session

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        """One write transaction: commits on success, rolls everything back on error."""
        with Session(self.engine, expire_on_commit=False) as session, session.begin():
            session.connection(execution_options={_IMMEDIATE: True})
            yield session
