"""Opening the orch database: engine, SQLite pragmas, schema upgrade, transactions.

SQLite by default, WAL mode, one writer at a time with a busy timeout, and Alembic
migrations applied at open. A writer that finds the SQLite file locked waits (SQLite's busy
handler, then tenacity) up to `lock_wait_s()` in all before `DatabaseBusy`; a full disk is
`DatabaseFull`, a role or file that may not be written `DatabaseReadOnly`: each is one clear
line, never a driver traceback with its SQL (issue 23 §1, §7; issue 36 §6). Lease
times come from `db_now`: PostgreSQL's own clock, so workers on machines whose clocks
disagree still agree on when a lease lapsed (§6). The SQLite file, its -wal/-shm and the
folder made for it are private to the user (0600/0700, §9).

Alembic is imported only when the schema is missing or behind: every CLI command that
touches the database pays for opening it, and a plain `SELECT` on `alembic_version` is far
cheaper than loading the migration machinery.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, OperationalError
from sqlmodel import Session

from orchestrator.core.paths import default_db_url, private_sqlite
from orchestrator.core.settings import DB_LOCK_WAIT_S, settings
from orchestrator.records.store.tables import (
    DatabaseBusy,
    DatabaseFull,
    DatabaseReadOnly,
    DatabaseURLError,
    StoreError,
    utcnow,
)
from providers import retrying

# The newest migration in migrations/versions. Kept here so the fast path of open_store
# knows the head without importing alembic; tests/test_store.py asserts it matches
# alembic's real head, so a new migration without bumping this fails the suite.
SCHEMA_HEAD = "0014"
# Long enough for a second writer to wait out the first one's short transaction.
BUSY_TIMEOUT_MS = 10_000
# How long a writer waits for the SQLite write lock in all (SQLite's busy handler, retried by
# tenacity) before DatabaseBusy: long enough for any transaction orch makes and for a backup
# or a hand-held `BEGIN IMMEDIATE`; ORCH_DB_LOCK_WAIT_S overrides it.
LOCK_WAIT_S = DB_LOCK_WAIT_S
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
            # busy_timeout first: switching a fresh file to WAL needs a lock too. Never
            # longer than the whole wait, so a short ORCH_DB_LOCK_WAIT_S holds.
            busy_ms = min(BUSY_TIMEOUT_MS, int(lock_wait_s() * 1000))
            cur.execute(f"PRAGMA busy_timeout={busy_ms}")
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


def lock_wait_s() -> float:
    """LOCK_WAIT_S, or ORCH_DB_LOCK_WAIT_S when set (orch's settings)."""
    return settings().db_lock_wait_s


def _driver_error(exc: BaseException) -> BaseException:
    return getattr(exc, "orig", None) or exc


def is_locked(exc: BaseException) -> bool:
    """SQLite's "database is locked" (SQLITE_BUSY/LOCKED): waiting longer can help."""
    orig = _driver_error(exc)
    name = str(getattr(orig, "sqlite_errorname", ""))
    return (isinstance(exc, OperationalError) and (
        name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "database is locked" in str(orig)))


def is_full(exc: BaseException) -> bool:
    """The disk under the database is full: SQLITE_FULL, or PostgreSQL's disk_full (53100)."""
    orig = _driver_error(exc)
    return (getattr(orig, "sqlite_errorname", "") == "SQLITE_FULL"
            or getattr(orig, "sqlstate", "") == "53100"
            or "database or disk is full" in str(orig))


# PostgreSQL's insufficient_privilege (a role without INSERT/UPDATE) and
# read_only_sql_transaction (a standby, or default_transaction_read_only): Appendix A.
READ_ONLY_SQLSTATES = {"42501": "insufficient_privilege", "25006": "read_only_sql_transaction"}


def is_read_only(exc: BaseException) -> bool:
    """The database refused a write to this role or user: PostgreSQL's 42501/25006, or
    SQLite's SQLITE_READONLY ("attempt to write a readonly database")."""
    orig = _driver_error(exc)
    return (getattr(orig, "sqlstate", "") in READ_ONLY_SQLSTATES
            or str(getattr(orig, "sqlite_errorname", "")).startswith("SQLITE_READONLY")
            or "attempt to write a readonly database" in str(orig))


def read_only_error(engine: Engine, exc: BaseException) -> DatabaseReadOnly:
    """The one line a refused write is reported with: who may not write, and the fix."""
    orig = _driver_error(exc)
    reason = str(orig).strip().splitlines()[0]
    if engine.dialect.name == "sqlite":
        return DatabaseReadOnly(
            f"the database {_where(engine)} is read-only for this user ({reason}): this "
            "command records to it; run it as a user that may write the file and its folder "
            "(SQLite writes its -wal and -shm files there). Reading commands (`orch jobs`, "
            "`show`, `history`, `sql`) work as this user")
    code = str(getattr(orig, "sqlstate", "") or "?")
    return DatabaseReadOnly(
        f"the database {_where(engine)} does not let this role write ({reason}; PostgreSQL "
        f"{READ_ONLY_SQLSTATES.get(code, 'SQLSTATE')} {code}): this command records to it; "
        "use a role that may write "
        "(`GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO ROLE`, or "
        "the database's owner). Reading commands (`orch jobs`, `show`, `history`, `sql`) "
        "work with this role")


def _where(engine: Engine) -> str:
    return engine.url.render_as_string(hide_password=True)


def full_error(engine: Engine, exc: BaseException) -> DatabaseFull:
    """The one line a full disk under the database is reported with."""
    reason = str(_driver_error(exc)).strip().splitlines()[0]
    return DatabaseFull(
        f"the disk under the database {_where(engine)} is full ({reason}): nothing more "
        "can be recorded. Free space there; the next orch command that opens the database "
        "requeues the jobs this left unfinished (their instances were terminated)")


def db_now(session: Session) -> datetime:
    """The time leases are measured in: the database server's clock on PostgreSQL.

    Workers on several machines share one PostgreSQL but not one clock: a lease written by
    one machine's clock and judged by another's lapses early or late by their skew. On
    SQLite the file is local to one machine (SQLite does not support network file systems),
    so every process sharing it reads the same clock: this machine's.
    """
    if session.get_bind().dialect.name == "postgresql":
        value: datetime = session.execute(text("SELECT clock_timestamp()")).scalar_one()
        return value.astimezone(UTC)
    return utcnow()


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
    return Path(__file__).resolve().parents[3] / "migrations"


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
        # A SQLite URI filename (`file:...?mode=ro&uri=true`) is SQLite's to open as it says
        # (read-only creates nothing); as a path it would make a `file:` folder here.
        if is_sqlite and parsed.database and parsed.database != ":memory:" \
                and parsed.query.get("uri") != "true":
            private_sqlite(Path(parsed.database))
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
        raise StoreError(f"cannot create the database file or its folder {parsed.database}: "
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

    def now(self) -> datetime:
        """The database's time (`db_now`): what leases are written and judged in."""
        with self.session() as session:
            return db_now(session)

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        """One write transaction: commits on success, rolls everything back on error.

        The write lock is taken first (BEGIN IMMEDIATE on SQLite) and its wait retried up to
        `lock_wait_s()`; then DatabaseBusy. A full disk anywhere in it is DatabaseFull.
        """
        session = self._begin_write()
        with self._refusal_is_said():
            with session:
                try:
                    yield session
                    session.commit()
                except BaseException:
                    session.rollback()
                    raise

    @contextmanager
    def statement(self) -> Iterator[Session]:
        """A PostgreSQL session whose every statement is a transaction of its own.

        For one statement that does all its writes itself (the claim's CTE): autocommit
        saves the BEGIN and COMMIT round trips, and a single statement is atomic anyway. A
        full disk is DatabaseFull, as in `transaction`.
        """
        if self.engine.dialect.name != "postgresql":
            # SQLite's writers need BEGIN IMMEDIATE to wait for the lock: use transaction().
            raise StoreError("statement() is for PostgreSQL; use transaction() on SQLite")
        bind = self.engine.execution_options(isolation_level="AUTOCOMMIT")
        with self._refusal_is_said(), Session(bind, expire_on_commit=False) as session:
            yield session

    @contextmanager
    def _refusal_is_said(self) -> Iterator[None]:
        """A full disk, or a write this role may not make, as its one line."""
        try:
            yield
        except DBAPIError as exc:
            if is_full(exc):
                raise full_error(self.engine, exc) from exc
            if is_read_only(exc):
                raise read_only_error(self.engine, exc) from exc
            raise

    def _begin_write(self) -> Session:
        """A session holding the write lock, waiting out other writers (tenacity)."""
        wait_s = lock_wait_s()
        waiting = retrying.policy(is_locked, deadline_s=wait_s,
                                  wait=retrying.full_jitter(0.05, 1.0))
        try:
            for attempt in waiting:
                with attempt:
                    session = Session(self.engine, expire_on_commit=False)
                    try:
                        session.begin()
                        session.connection(execution_options={_IMMEDIATE: True})
                    except BaseException:
                        session.close()
                        raise
        except OperationalError as exc:
            if is_locked(exc):
                raise DatabaseBusy(
                    f"the database {_where(self.engine)} stayed locked by another process "
                    f"for {wait_s:.0f}s (ORCH_DB_LOCK_WAIT_S): a long transaction or a "
                    "backup holds its write lock; find it with `fuser` on the file and let "
                    "it finish") from exc
            if is_full(exc):
                raise full_error(self.engine, exc) from exc
            if is_read_only(exc):
                raise read_only_error(self.engine, exc) from exc
            raise
        return session
