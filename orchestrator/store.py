"""SQLModel tables, the engine, and the Store: one short transaction per write.

The database is the product's memory (DESIGN.md "Storage"): SQLite by default, WAL mode,
one writer at a time with a busy timeout, and Alembic migrations applied at open. Users
query it by hand, so docs/schema.md documents every table and column defined here.

Conventions (Invariant 7): money is integer micro-dollars (`*_micros`, BIGINT), times are
UTC ISO-8601 text `YYYY-MM-DDTHH:MM:SS.ffffffZ` (fixed width, so text order is time order),
JSON blobs are TEXT holding JSON. Nothing here is SQLite-only SQL, so `ORCH_DB_URL` can
point at PostgreSQL.

Alembic is imported only when the schema is missing or behind: every CLI command that
touches the database pays for `open_store`, and a plain `SELECT` on `alembic_version` is
far cheaper than loading the migration machinery.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path
from typing import Any

from sqlalchemy import (
    BigInteger,
    Dialect,
    Float,
    Index,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    create_engine,
    delete,
    event,
    or_,
    text,
    update,
)
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, IntegrityError
from sqlmodel import Field, Session, SQLModel, col, select

# Re-exported: callers of the store find the default URL here too.
from orchestrator.paths import default_db_url as default_db_url
from providers.dedicated import RegisteredServer

# The newest migration in migrations/versions. Kept here so the fast path of open_store
# knows the head without importing alembic; tests/test_store.py asserts it matches
# alembic's real head, so a new migration without bumping this fails the suite.
SCHEMA_HEAD = "0006"

JOB_STATUSES: tuple[str, ...] = (
    "queued",
    "planned",
    "provisioning",
    "connecting",
    "preparing",
    "training",
    "merging",
    "evaluating",
    "releasing",
    "succeeded",
    "failed",
    "cancelled",
    "interrupted",
)
# States in which a worker is driving the job (and may hold a paid instance).
ACTIVE_STATUSES: tuple[str, ...] = (
    "provisioning", "connecting", "preparing", "training", "merging", "evaluating", "releasing",
)
# States after which nothing more happens to the job.
FINAL_STATUSES: tuple[str, ...] = ("succeeded", "failed", "cancelled")
SERVER_STATUSES: tuple[str, ...] = ("idle", "busy", "disabled")
BILLINGS: tuple[str, ...] = ("per_second", "per_minute", "monthly")

# Long enough for a second writer to wait out the first one's short transaction.
BUSY_TIMEOUT_MS = 10_000
_MICROS = Decimal(1_000_000)
_TIME_FORMAT_LEN = len("2025-01-01T00:00:00.000000Z")
# Execution option that makes the SQLite BEGIN take the write lock up front.
_IMMEDIATE = "orch_begin_immediate"


# --- errors ------------------------------------------------------------------------------


class StoreError(Exception):
    """Base of the store's errors; the message says what happened and what to do."""


class AlreadyExists(StoreError):
    """A row with this unique name exists already."""


class NotFoundError(StoreError):
    """No row with this id or name."""


class ServerBusyError(StoreError):
    """The server is running a job and cannot be removed now."""


class InvalidValueError(StoreError, ValueError):
    """An argument is outside what the schema allows."""


class DatabaseURLError(InvalidValueError):
    """ORCH_DB_URL is not a database URL orch can use (malformed, or an unknown dialect)."""


class LeaseLost(StoreError):
    """The job is no longer driven by this worker (its lease expired and another took it)."""


# --- helpers -----------------------------------------------------------------------------


def utcnow() -> datetime:
    """Return the current time as an aware UTC datetime."""
    return datetime.now(UTC)


def new_job_id() -> str:
    """Return a fresh job id: `j-` and 12 lowercase hex digits from `secrets`."""
    return "j-" + secrets.token_hex(6)


def new_sweep_id() -> str:
    """Return a fresh sweep id: `s-` and 12 lowercase hex digits from `secrets`."""
    return "s-" + secrets.token_hex(6)


def to_micros(amount: Decimal | int, *, rounding: str | None = None) -> int:
    """Convert dollars to integer micro-dollars, exactly unless `rounding` is given.

    Floats are refused (TypeError): a float has already lost the cents. Without
    `rounding`, an amount finer than a micro-dollar is an error rather than silently
    rounded; pass e.g. `decimal.ROUND_HALF_EVEN` for computed estimates.
    """
    if isinstance(amount, bool) or not isinstance(amount, (Decimal, int)):
        raise TypeError(f"money must be a Decimal or int, not {type(amount).__name__}")
    value = Decimal(amount) * _MICROS
    if not value.is_finite():
        raise InvalidValueError(f"money must be a finite amount (got {amount})")
    integral = value.to_integral_value(rounding=rounding or ROUND_HALF_EVEN)
    if rounding is None and integral != value:
        raise InvalidValueError(
            f"{amount} dollars is finer than one micro-dollar; round it to 6 decimal places first"
        )
    return int(integral)


def from_micros(micros: int) -> Decimal:
    """Convert integer micro-dollars to exact Decimal dollars (6 decimal places)."""
    if isinstance(micros, bool) or not isinstance(micros, int):
        raise TypeError(f"micro-dollars must be an int, not {type(micros).__name__}")
    return Decimal(micros).scaleb(-6)


def _dumps(value: Any) -> str:
    # Canonical form (sorted keys, no spaces) so equal data gives equal text in the DB.
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetime stored as fixed-width ISO-8601 text ending in `Z`.

    Text rather than a native timestamp type so SQLite and PostgreSQL hold the same
    readable value and `sqlite3` users can compare times as strings. Naive datetimes are
    rejected: there is no way to know which zone they meant.
    """

    impl = String
    cache_ok = True

    def __init__(self) -> None:
        super().__init__(length=_TIME_FORMAT_LEN)

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> str | None:
        """Render an aware datetime as `YYYY-MM-DDTHH:MM:SS.ffffffZ` in UTC."""
        if value is None:
            return None
        if not isinstance(value, datetime):
            raise TypeError(f"expected a datetime, got {type(value).__name__}")
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(
                f"naive datetime {value.isoformat()} refused: "
                "use an aware UTC time such as orchestrator.store.utcnow()"
            )
        utc = value.astimezone(UTC).replace(tzinfo=None)
        # isoformat always writes 4-digit years and, with this timespec, microseconds.
        return utc.isoformat(timespec="microseconds") + "Z"

    def process_result_value(self, value: str | None, dialect: Dialect) -> datetime | None:
        """Parse the stored text back into an aware UTC datetime."""
        if value is None:
            return None
        parsed = datetime.fromisoformat(value)
        if parsed.tzinfo is None:
            # Hand-written rows may omit the Z; the column is UTC by definition.
            return parsed.replace(tzinfo=UTC)
        return parsed.astimezone(UTC)


def _time(*, nullable: bool = False, default_now: bool = True) -> Any:
    if default_now:
        return Field(default_factory=utcnow, sa_type=UTCDateTime(), nullable=nullable)
    return Field(default=None, sa_type=UTCDateTime(), nullable=nullable)


# --- tables ------------------------------------------------------------------------------
# Keep migrations/versions/0001_initial.py in step: tests compare the two.


class Sweep(SQLModel, table=True):
    """A grid of jobs expanded from one sweep file."""

    __tablename__ = "sweep"
    __table_args__ = (UniqueConstraint("name", name="uq_sweep_name"),)

    id: str = Field(default_factory=new_sweep_id, primary_key=True)
    name: str
    spec_json: str = Field(sa_type=Text)
    budget_micros: int | None = Field(default=None, sa_type=BigInteger)
    created_at: datetime = _time()


class Job(SQLModel, table=True):
    """One fine-tuning run and where it stands in the lifecycle."""

    __tablename__ = "job"
    __table_args__ = (
        Index("ix_job_status", "status"),
        Index("ix_job_created_at", "created_at"),
        Index("ix_job_sweep_id", "sweep_id"),
        Index("ix_job_spec_hash", "spec_hash"),
        Index("uq_job_sweep_key", "sweep_key", unique=True),
        # 0003: `orch history` filters, newest first (migrations/versions/0003_history.py).
        Index("ix_job_provider_created_at", "provider", "created_at"),
        Index("ix_job_gpu_created_at", "gpu", "created_at"),
        Index("ix_job_method_created_at", "method", "created_at"),
        Index("ix_job_base_model_created_at", "base_model", "created_at"),
        Index("ix_job_finished_at", "finished_at"),
        # 0004: covering indexes for `orch cost` (migrations/versions/0004_cost_indexes.py).
        Index("ix_job_created_at_cost", "created_at", "cost_micros", "amortised_micros",
              "provider", "gpu", "method", "sweep_id"),
        Index("ix_job_id_created_at", "id", "created_at", "provider", "gpu", "method",
              "sweep_id"),
    )

    id: str = Field(default_factory=new_job_id, primary_key=True)
    name: str
    status: str
    method: str
    base_model: str
    spec_json: str = Field(sa_type=Text)
    spec_hash: str
    sweep_id: str | None = Field(default=None, foreign_key="sweep.id")
    provider: str | None = None
    gpu: str | None = None
    gpu_count: int | None = None
    billing: str | None = None
    interruptible: bool | None = None
    # Hours are not money, so a float is fine here.
    est_hours: float | None = Field(default=None, sa_type=Float)
    est_cost_micros: int | None = Field(default=None, sa_type=BigInteger)
    cost_micros: int = Field(
        default=0, sa_type=BigInteger, sa_column_kwargs={"server_default": text("0")}
    )
    placement_json: str | None = Field(default=None, sa_type=Text)
    failure_reason: str | None = Field(default=None, sa_type=Text)
    attempt: int = Field(default=0, sa_column_kwargs={"server_default": text("0")})
    lease_owner: str | None = None
    lease_expires_at: datetime | None = _time(nullable=True, default_now=False)
    created_at: datetime = _time()
    updated_at: datetime = _time()
    started_at: datetime | None = _time(nullable=True, default_now=False)
    finished_at: datetime | None = _time(nullable=True, default_now=False)
    # 0002: the engine's columns.
    # sha256 of (sweep name, resolved spec): a sweep submits each grid point at most once.
    sweep_key: str | None = None
    # Set by `orch cancel` from any process; the worker driving the job sees it and stops.
    cancel_requested_at: datetime | None = _time(nullable=True, default_now=False)
    artifacts_dir: str | None = Field(default=None, sa_type=Text)
    # Share of monthly rents the job used (already paid: not part of cost_micros).
    amortised_micros: int = Field(
        default=0, sa_type=BigInteger, sa_column_kwargs={"server_default": text("0")}
    )
    # Volume storage, included in cost_micros.
    storage_micros: int = Field(
        default=0, sa_type=BigInteger, sa_column_kwargs={"server_default": text("0")}
    )
    interruptions: int = Field(default=0, sa_column_kwargs={"server_default": text("0")})
    lost_steps: int = Field(default=0, sa_column_kwargs={"server_default": text("0")})
    tokens: int | None = Field(default=None, sa_type=BigInteger)  # trained, all epochs
    train_seconds: float | None = Field(default=None, sa_type=Float)
    # 0006: recovery (orchestrator/recovery.py). Not claimed before `not_before` (outage
    # backoff); `outage_since` starts the outage limit; `phase_done` is the last pipeline
    # phase whose result is durable, so a takeover resumes after it.
    not_before: datetime | None = _time(nullable=True, default_now=False)
    outage_since: datetime | None = _time(nullable=True, default_now=False)
    phase_done: str | None = None


class Event(SQLModel, table=True):
    """One line of a job's history: state changes, step results, notes."""

    __tablename__ = "event"
    # AUTOINCREMENT on SQLite: ids are never reused, so "events after id N" is a safe
    # way to tail a log. Other dialects ignore the flag.
    __table_args__ = (
        Index("ix_event_job_id_at", "job_id", "at"),
        {"sqlite_autoincrement": True},
    )

    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(foreign_key="job.id")
    at: datetime = _time()
    kind: str
    message: str = Field(default="", sa_type=Text)
    data_json: str | None = Field(default=None, sa_type=Text)


class Instance(SQLModel, table=True):
    """A machine rented from a provider for a job (written before the create call)."""

    __tablename__ = "instance"
    __table_args__ = (
        Index("ix_instance_provider_instance", "provider", "provider_instance_id"),
        Index("ix_instance_job_id", "job_id"),
    )

    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(foreign_key="job.id")
    provider: str
    # NULL until the provider's create call returns an id.
    provider_instance_id: str | None = None
    gpu: str
    gpu_count: int
    billing: str
    interruptible: bool
    price_per_hour_micros: int = Field(sa_type=BigInteger)
    state: str
    host: str | None = None
    port: int | None = None
    ssh_user: str | None = None
    host_key: str | None = Field(default=None, sa_type=Text)
    created_at: datetime = _time()
    terminated_at: datetime | None = _time(nullable=True, default_now=False)
    # 0002
    offer_id: str | None = None
    attempt: int = Field(default=0, sa_column_kwargs={"server_default": text("0")})
    # What this instance cost (charged price × billed time), set when it is terminated.
    cost_micros: int = Field(
        default=0, sa_type=BigInteger, sa_column_kwargs={"server_default": text("0")}
    )
    amortised_micros: int = Field(
        default=0, sa_type=BigInteger, sa_column_kwargs={"server_default": text("0")}
    )
    end_reason: str | None = None  # released | interrupted | failed | cancelled | unreachable
    lost_steps: int | None = None  # training steps redone because this instance was lost


class Server(SQLModel, table=True):
    """A dedicated server the user rents monthly and registered with `orch servers add`."""

    __tablename__ = "server"
    __table_args__ = (UniqueConstraint("name", name="uq_server_name"),)

    id: int | None = Field(default=None, primary_key=True)
    name: str
    host: str
    port: int = Field(default=22, sa_column_kwargs={"server_default": text("22")})
    user: str = Field(default="root", sa_column_kwargs={"server_default": "root"})
    gpu: str
    gpu_count: int = Field(default=1, sa_column_kwargs={"server_default": text("1")})
    monthly_price_micros: int = Field(sa_type=BigInteger)
    status: str = Field(default="idle", sa_column_kwargs={"server_default": "idle"})
    claimed_by_job: str | None = Field(default=None, foreign_key="job.id")
    host_key: str | None = Field(default=None, sa_type=Text)
    created_at: datetime = _time()
    # Why the server failed its GPU check (not offered to jobs until a check passes).
    check_error: str | None = Field(default=None, sa_type=Text)
    checked_at: datetime | None = _time(nullable=True, default_now=False)
    facts_json: str | None = Field(default=None, sa_type=Text)  # the last check's findings


class Metric(SQLModel, table=True):
    """A number a job reported: training loss at a step, an eval score at the end."""

    __tablename__ = "metric"
    __table_args__ = (
        Index("ix_metric_job_id_name", "job_id", "name"),
        # 0006: one row per (job, name, step), eval scores (step NULL) included: a takeover
        # that re-reports a step or re-runs the evaluation replaces, never duplicates.
        Index("uq_metric_job_name_step", "job_id", "name", text("coalesce(step, -1)"),
              unique=True),
    )

    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(foreign_key="job.id")
    name: str
    value: float = Field(sa_type=Float)
    step: int | None = None
    at: datetime = _time()


class PriceObservation(SQLModel, table=True):
    """A price a provider quoted at a moment, kept to learn price history."""

    __tablename__ = "price_observation"
    __table_args__ = (
        Index("ix_price_observation_provider_gpu_observed_at", "provider", "gpu", "observed_at"),
    )

    id: int | None = Field(default=None, primary_key=True)
    provider: str
    gpu: str
    gpu_count: int
    interruptible: bool
    price_per_hour_micros: int = Field(sa_type=BigInteger)
    observed_at: datetime = _time()


class ThroughputObservation(SQLModel, table=True):
    """Tokens per second a finished job measured, to replace the formula next time."""

    __tablename__ = "throughput_observation"
    __table_args__ = (
        Index("ix_throughput_observation_key", "gpu", "gpu_count", "method", "size_class"),
    )

    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(foreign_key="job.id")
    gpu: str
    gpu_count: int
    method: str
    size_class: str  # e.g. "8B": parameters rounded, see orchestrator.throughput
    tokens_per_s: float = Field(sa_type=Float)
    observed_at: datetime = _time()


# --- opening -----------------------------------------------------------------------------


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
    return Path(__file__).resolve().parent.parent / "migrations"


def _upgrade(engine: Engine) -> None:
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


def open_store(url: str | None = None) -> Store:
    """Open (creating if needed) the database at `url` and upgrade its schema to head."""
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
                         "not installed; install it in orch's environment (for PostgreSQL: "
                         "pip install 'orch[postgres]')") from None
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
    return Store(engine)


# --- the store ---------------------------------------------------------------------------


class Store:
    """Typed reads and one-transaction writes over the orch database."""

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

    # servers

    def add_server(
        self,
        name: str,
        host: str,
        port: int,
        user: str,
        gpu: str,
        gpu_count: int,
        monthly_price: Decimal,
    ) -> Server:
        """Register a monthly dedicated server; AlreadyExists if the name is taken."""
        if not name.strip():
            raise InvalidValueError("server name must not be empty")
        if not host.strip():
            raise InvalidValueError(f"server {name!r}: host must not be empty")
        if not 1 <= port <= 65535:
            raise InvalidValueError(f"server {name!r}: port must be 1-65535 (got {port})")
        if gpu_count < 1:
            raise InvalidValueError(f"server {name!r}: gpu_count must be >= 1 (got {gpu_count})")
        micros = to_micros(monthly_price)
        if micros < 0:
            raise InvalidValueError(
                f"server {name!r}: monthly price must be >= 0 (got {monthly_price})"
            )
        server = Server(
            name=name,
            host=host,
            port=port,
            user=user,
            gpu=gpu,
            gpu_count=gpu_count,
            monthly_price_micros=micros,
        )
        try:
            with self.transaction() as session:
                session.add(server)
        except IntegrityError as exc:
            raise AlreadyExists(
                f"server {name!r} already exists; remove it first with `orch servers remove {name}`"
            ) from exc
        return server

    def list_servers(self) -> list[Server]:
        """All registered servers, by name."""
        with self.session() as session:
            return list(session.exec(select(Server).order_by(col(Server.name))))

    def idle_servers(self) -> list[Server]:
        """Servers free to take a job (idle and unclaimed), by name."""
        with self.session() as session:
            query = (
                select(Server)
                .where(Server.status == "idle", col(Server.claimed_by_job).is_(None))
                .order_by(col(Server.name))
            )
            return list(session.exec(query))

    def registered(self) -> list[RegisteredServer]:
        """Every server as plain values (the dedicated provider's registry view)."""
        return [RegisteredServer(s.name, s.gpu, s.gpu_count, from_micros(s.monthly_price_micros),
                                 s.host, s.status, s.port, s.user, s.claimed_by_job,
                                 s.check_error)
                for s in self.list_servers()]

    def record_server_check(self, name: str, *, error: str | None,
                            facts_json: str | None = None) -> None:
        """Store a check's outcome: `error` None clears a failed check (offered again)."""
        values: dict[str, Any] = {"check_error": error, "checked_at": utcnow()}
        if facts_json is not None:
            values["facts_json"] = facts_json
        with self.transaction() as session:
            result = session.execute(update(Server).where(col(Server.name) == name)
                                     .values(**values))
            if not getattr(result, "rowcount", 0):
                raise NotFoundError(f"server {name!r} not found; see `orch servers list`")

    def repin_server_host_key(self, name: str, host_key: str) -> None:
        """Replace a server's pinned host key (after the user confirmed the new one)."""
        with self.transaction() as session:
            result = session.execute(update(Server).where(col(Server.name) == name)
                                     .values(host_key=host_key))
            if not getattr(result, "rowcount", 0):
                raise NotFoundError(f"server {name!r} not found; see `orch servers list`")

    def claim_server(self, name: str, job_id: str) -> bool:
        """Atomically mark an idle server as running `job_id`; False if it was not free.

        One conditional UPDATE, so two jobs (or two workers) can never share a server.
        """
        with self.transaction() as session:
            result = session.execute(
                update(Server)
                .where(col(Server.name) == name, col(Server.status) == "idle",
                       col(Server.claimed_by_job).is_(None))
                .values(status="busy", claimed_by_job=job_id)
            )
            return bool(getattr(result, "rowcount", 0))

    def release_server(self, name: str, job_id: str | None = None) -> bool:
        """Mark a busy server idle again (only if `job_id` holds it, when given)."""
        with self.transaction() as session:
            query = update(Server).where(col(Server.name) == name,
                                         col(Server.status) == "busy")
            if job_id is not None:
                query = query.where(col(Server.claimed_by_job) == job_id)
            result = session.execute(query.values(status="idle", claimed_by_job=None))
            return bool(getattr(result, "rowcount", 0))

    def remove_server(self, name: str) -> None:
        """Forget a server; NotFoundError if unknown, ServerBusyError while it runs a job."""
        with self.transaction() as session:
            server = session.exec(select(Server).where(Server.name == name)).first()
            if server is None:
                raise NotFoundError(
                    f"server {name!r} not found; see registered servers with `orch servers list`"
                )
            if server.status == "busy" or server.claimed_by_job is not None:
                job = server.claimed_by_job or "a job"
                raise ServerBusyError(
                    f"server {name!r} is busy running {job}; wait for it to finish "
                    f"(or `orch cancel {server.claimed_by_job or 'JOB'}`) and try again"
                )
            session.delete(server)

    # jobs

    def create_job(
        self,
        *,
        name: str,
        status: str,
        method: str,
        base_model: str,
        spec_json: str,
        spec_hash: str,
        placement: dict[str, Any] | None,
        provider: str | None,
        gpu: str | None,
        gpu_count: int | None,
        billing: str | None,
        interruptible: bool | None,
        est_hours: float | None,
        est_cost: Decimal | None,
        event_kind: str,
        event_message: str,
        event_data: dict[str, Any] | None,
        sweep_id: str | None = None,
        sweep_key: str | None = None,
    ) -> Job:
        """Insert a job and its first event in one transaction (both or neither)."""
        _check_status(status)
        if billing is not None and billing not in BILLINGS:
            raise InvalidValueError(
                f"billing must be one of {', '.join(BILLINGS)} (got {billing!r})"
            )
        if len(spec_hash) != 64 or any(c not in "0123456789abcdef" for c in spec_hash):
            raise InvalidValueError("spec_hash must be a sha256 hex digest (64 lowercase hex)")
        try:
            json.loads(spec_json)
        except ValueError as exc:
            raise InvalidValueError(f"spec_json is not valid JSON: {exc}") from exc
        # An estimate: rounding to the nearest micro-dollar loses nothing that matters.
        est_micros = None if est_cost is None else to_micros(est_cost, rounding=ROUND_HALF_EVEN)
        now = utcnow()
        job = Job(
            name=name,
            status=status,
            method=method,
            base_model=base_model,
            spec_json=spec_json,
            spec_hash=spec_hash,
            sweep_id=sweep_id,
            sweep_key=sweep_key,
            provider=provider,
            gpu=gpu,
            gpu_count=gpu_count,
            billing=billing,
            interruptible=interruptible,
            est_hours=est_hours,
            est_cost_micros=est_micros,
            placement_json=None if placement is None else _dumps(placement),
            created_at=now,
            updated_at=now,
        )
        with self.transaction() as session:
            session.add(job)
            # The job row goes in first (the event's foreign key needs it); anything that
            # fails after this point rolls the job back with the event.
            session.flush()
            session.add(
                Event(
                    job_id=job.id,
                    at=now,
                    kind=event_kind,
                    message=event_message,
                    data_json=None if event_data is None else _dumps(event_data),
                )
            )
        return job

    def find_job(self, job_id: str) -> Job | None:
        """The job, or None when there is no such job."""
        with self.session() as session:
            return session.get(Job, job_id)

    def add_event(self, job_id: str, kind: str, message: str,
                  data: dict[str, Any] | None = None) -> None:
        """Append one event to a job's history."""
        payload = None if data is None else json.dumps(data, sort_keys=True,
                                                       separators=(",", ":"))
        with self.transaction() as session:
            session.add(Event(job_id=job_id, at=utcnow(), kind=kind, message=message,
                              data_json=payload))

    def expired_leases(self, now: datetime | None = None) -> list[Job]:
        """Jobs in a running state whose worker's lease ran out (the worker died)."""
        now = now or utcnow()
        with self.session() as session:
            query = select(Job).where(col(Job.status).in_(ACTIVE_STATUSES),
                                      col(Job.lease_expires_at).is_not(None),
                                      col(Job.lease_expires_at) < now)
            return list(session.exec(query))

    def requeue(self, job_id: str, reason: str) -> bool:
        """Put a job whose worker died back in the queue (to resume); False if it moved on."""
        with self.transaction() as session:
            job = session.get(Job, job_id)
            if job is None or job.status not in ACTIVE_STATUSES:
                return False
            job.status = "queued"
            job.attempt += 1
            job.lease_owner = None
            job.lease_expires_at = None
            job.updated_at = utcnow()
            session.add(Event(job_id=job_id, at=job.updated_at, kind="requeued", message=reason))
            return True

    def open_instances(self) -> list[Instance]:
        """Instance rows not yet marked terminated (they may still be billing)."""
        with self.session() as session:
            query = select(Instance).where(col(Instance.terminated_at).is_(None))
            return list(session.exec(query))

    def mark_terminated(self, provider: str, provider_instance_id: str) -> int:
        """Record that an instance is gone; returns how many rows changed."""
        with self.transaction() as session:
            result = session.execute(
                update(Instance)
                .where(col(Instance.provider) == provider,
                       col(Instance.provider_instance_id) == provider_instance_id,
                       col(Instance.terminated_at).is_(None))
                .values(terminated_at=utcnow(), state="terminated"))
            return int(getattr(result, "rowcount", 0) or 0)

    # the engine: leases, state changes, instances, metrics

    def claim_job(self, job_id: str, owner: str, lease_s: float) -> Job | None:
        """Take a queued job for `owner` (one conditional UPDATE); None if someone else has it."""
        with self.transaction() as session:
            return claim_in(session, job_id, owner, lease_s, utcnow())

    def claim_next(self, owner: str, lease_s: float) -> Job | None:
        """Claim the oldest queued job that may start now, or None.

        Sweep jobs wait while their sweep runs `max_parallel` jobs or the next one would
        exceed its budget (orchestrator.sweepstore); those are skipped, not blocking others.
        """
        from orchestrator.sweepstore import claim_next_gated  # sweepstore imports the store

        return claim_next_gated(self, owner, lease_s)

    def renew_lease(self, job_id: str, owner: str, lease_s: float) -> Job | None:
        """Extend `owner`'s lease; None when the job is no longer `owner`'s."""
        now = utcnow()
        with self.transaction() as session:
            result = session.execute(
                update(Job)
                .where(col(Job.id) == job_id, col(Job.lease_owner) == owner)
                .values(lease_expires_at=now + timedelta(seconds=lease_s)))
            if not getattr(result, "rowcount", 0):
                return None
            return session.get(Job, job_id)

    def set_status(self, job_id: str, owner: str, status: str, message: str = "",
                   data: dict[str, Any] | None = None, **fields: Any) -> Job:
        """Move `owner`'s job to `status` (plus `fields`) with a `state` event, atomically.

        LeaseLost when the job is no longer `owner`'s: a worker that lost its lease must
        not overwrite what the new owner does.
        """
        _check_status(status)
        now = utcnow()
        with self.transaction() as session:
            job = session.get(Job, job_id)
            if job is None or job.lease_owner != owner:
                raise LeaseLost(f"job {job_id} is no longer driven by {owner}")
            job.status = status
            job.updated_at = now
            for key, value in fields.items():
                setattr(job, key, value)
            if status in FINAL_STATUSES:
                job.finished_at = now
                job.lease_owner = None
                job.lease_expires_at = None
            session.add(Event(job_id=job_id, at=now, kind="state",
                              message=message or status,
                              data_json=_dumps({"status": status, **(data or {})})))
            return job

    def request_cancel(self, job_id: str) -> Job:
        """Ask for a job to stop: a queued job is cancelled at once, a running one flagged."""
        now = utcnow()
        with self.transaction() as session:
            job = session.get(Job, job_id)
            if job is None:
                raise NotFoundError(f"job {job_id!r} not found; list recent jobs with `orch jobs`")
            if job.status in FINAL_STATUSES:
                return job
            if job.cancel_requested_at is None:
                job.cancel_requested_at = now
            if job.status in ("queued", "planned", "interrupted"):
                job.status = "cancelled"
                job.finished_at = now
                job.lease_owner = None
                job.lease_expires_at = None
                session.add(Event(job_id=job_id, at=now, kind="state",
                                  message="cancelled before it started",
                                  data_json=_dumps({"status": "cancelled"})))
            else:
                session.add(Event(job_id=job_id, at=now, kind="cancel.requested",
                                  message="cancel requested; the worker tears down"))
            job.updated_at = now
            return job

    def cancel_orphan(self, job_id: str, reason: str) -> bool:
        """Cancel a job nobody drives (lease expired or none); False if a worker holds it."""
        now = utcnow()
        with self.transaction() as session:
            job = session.get(Job, job_id)
            if job is None or job.status in FINAL_STATUSES:
                return False
            if job.lease_expires_at is not None and job.lease_expires_at > now:
                return False
            job.status = "cancelled"
            job.finished_at = job.updated_at = now
            job.lease_owner = None
            job.lease_expires_at = None
            session.add(Event(job_id=job_id, at=now, kind="state", message=reason,
                              data_json=_dumps({"status": "cancelled"})))
            return True

    def add_instance(self, job_id: str, *, provider: str, offer_id: str, gpu: str,
                     gpu_count: int, billing: str, interruptible: bool,
                     price_per_hour: Decimal, attempt: int) -> Instance:
        """Record an instance about to be created (before the provider call: Invariant 1)."""
        row = Instance(job_id=job_id, provider=provider, offer_id=offer_id, gpu=gpu,
                       gpu_count=gpu_count, billing=billing, interruptible=interruptible,
                       price_per_hour_micros=to_micros(price_per_hour, rounding=ROUND_HALF_EVEN),
                       state="creating", attempt=attempt)
        with self.transaction() as session:
            session.add(row)
        return row

    def update_instance(self, row_id: int, **fields: Any) -> Instance:
        """Change an instance row's columns."""
        with self.transaction() as session:
            row = session.get(Instance, row_id)
            if row is None:
                raise NotFoundError(f"instance row {row_id} not found")
            for key, value in fields.items():
                setattr(row, key, value)
            return row

    def update_job_fields(self, job_id: str, **fields: Any) -> None:
        """Change a job's columns without a state change (artifacts dir, say)."""
        with self.transaction() as session:
            job = session.get(Job, job_id)
            if job is None:
                raise NotFoundError(f"job {job_id!r} not found")
            for key, value in fields.items():
                setattr(job, key, value)
            job.updated_at = utcnow()

    def instances_of(self, job_id: str) -> list[Instance]:
        """A job's instance rows, oldest first."""
        with self.session() as session:
            query = (select(Instance).where(Instance.job_id == job_id)
                     .order_by(col(Instance.id)))
            return list(session.exec(query))

    def add_metrics(self, job_id: str, values: dict[str, float], step: int | None = None) -> None:
        """Record numbers the job reported (eval scores with step None, loss with its step)."""
        now = utcnow()
        with self.transaction() as session:
            for name, value in values.items():
                # An upsert by hand (the unique index is on an expression, which ON CONFLICT
                # cannot name portably): the newest value of a (job, name, step) wins.
                same_step = (col(Metric.step).is_(None) if step is None
                             else col(Metric.step) == step)
                session.execute(delete(Metric).where(col(Metric.job_id) == job_id,
                                                     col(Metric.name) == name, same_step))
                session.add(Metric(job_id=job_id, name=name, value=float(value), step=step,
                                   at=now))

    def metrics(self, job_id: str) -> list[Metric]:
        """A job's metrics, in the order recorded."""
        with self.session() as session:
            query = select(Metric).where(Metric.job_id == job_id).order_by(col(Metric.id))
            return list(session.exec(query))

    def add_throughput(self, job_id: str, gpu: str, gpu_count: int, method: str,
                       size_class: str, tokens_per_s: float) -> None:
        """Record the tokens/s a finished job measured."""
        with self.transaction() as session:
            session.add(ThroughputObservation(job_id=job_id, gpu=gpu, gpu_count=gpu_count,
                                              method=method, size_class=size_class,
                                              tokens_per_s=tokens_per_s))

    def events_after(self, job_id: str, after_id: int = 0) -> list[Event]:
        """A job's events with id > `after_id`, oldest first (for `orch logs -f`)."""
        with self.session() as session:
            query = (select(Event).where(Event.job_id == job_id, col(Event.id) > after_id)
                     .order_by(col(Event.id)))
            return list(session.exec(query))

    def set_server_host_key(self, name: str, host_key: str) -> None:
        """Pin a registered server's SSH host key (first contact)."""
        with self.transaction() as session:
            session.execute(update(Server).where(col(Server.name) == name,
                                                 col(Server.host_key).is_(None))
                            .values(host_key=host_key))

    def get_job(self, job_id: str) -> Job:
        """The job with this id; NotFoundError if there is none."""
        with self.session() as session:
            job = session.get(Job, job_id)
        if job is None:
            raise NotFoundError(f"job {job_id!r} not found; list recent jobs with `orch jobs`")
        return job

    def list_jobs(self, limit: int = 50, status: str | None = None) -> list[Job]:
        """The newest `limit` jobs, optionally only those in `status`."""
        query = select(Job)
        if status is not None:
            _check_status(status)
            query = query.where(Job.status == status)
        query = query.order_by(col(Job.created_at).desc(), col(Job.id).desc()).limit(limit)
        with self.session() as session:
            return list(session.exec(query))

    def events(self, job_id: str) -> list[Event]:
        """A job's events, oldest first; NotFoundError if the job does not exist."""
        with self.session() as session:
            if session.get(Job, job_id) is None:
                raise NotFoundError(f"job {job_id!r} not found; list recent jobs with `orch jobs`")
            query = (
                select(Event).where(Event.job_id == job_id).order_by(col(Event.at), col(Event.id))
            )
            return list(session.exec(query))


def claim_in(session: Session, job_id: str, owner: str, lease_s: float,
             now: datetime) -> Job | None:
    """Within the caller's write transaction: queued → provisioning for `owner`, with its
    `state` event; None when the job is not claimable (taken, cancelled, or still leased)."""
    result = session.execute(
        update(Job)
        .where(col(Job.id) == job_id, col(Job.status) == "queued",
               col(Job.cancel_requested_at).is_(None),
               # A job briefly queued while its worker re-places it is still that
               # worker's: only an unowned (or lapsed) job can be claimed.
               or_(col(Job.lease_owner).is_(None), col(Job.lease_expires_at) < now),
               # Requeued with a backoff after a provider outage: not yet.
               or_(col(Job.not_before).is_(None), col(Job.not_before) <= now))
        .values(status="provisioning", lease_owner=owner,
                lease_expires_at=now + timedelta(seconds=lease_s), updated_at=now))
    if not getattr(result, "rowcount", 0):
        return None
    job = session.get(Job, job_id)
    assert job is not None
    session.refresh(job)  # the UPDATE bypassed the session's copy
    if job.started_at is None:
        job.started_at = now
    session.add(Event(job_id=job_id, at=now, kind="state",
                      message=f"provisioning (claimed by {owner})",
                      data_json=_dumps({"status": "provisioning", "owner": owner,
                                        "attempt": job.attempt})))
    return job


def _check_status(status: str) -> None:
    if status not in JOB_STATUSES:
        raise InvalidValueError(
            f"unknown job status {status!r}; use one of {', '.join(JOB_STATUSES)}"
        )
