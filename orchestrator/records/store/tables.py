"""The orch database's tables (SQLModel), its column types, errors and small helpers.

The database is the product's memory (DESIGN.md "Storage"); users query it by hand, so
docs/schema.md documents every table and column defined here. Conventions (Invariant 7):
money is integer micro-dollars (`*_micros`, BIGINT), times are UTC ISO-8601 text
`YYYY-MM-DDTHH:MM:SS.ffffffZ` (fixed width, so text order is time order), JSON blobs are TEXT
holding JSON. Nothing here is SQLite-only SQL, so `ORCH_DB_URL` can point at PostgreSQL.
Long by nature (one class per table); the store's logic is in the store* modules.
"""

from __future__ import annotations

import json
import secrets
from datetime import UTC, datetime
from decimal import Decimal
from enum import StrEnum
from typing import Any, TypedDict, TypeVar

from sqlalchemy import (
    BigInteger,
    Dialect,
    Float,
    Index,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    text,
)
from sqlmodel import Field, SQLModel
from sqlmodel.sql.sqltypes import AutoString

from orchestrator.core import money
from orchestrator.core.deadline import Choice
from orchestrator.core.jobstatus import JobStatus, parse_status
from orchestrator.core.states import EndReason, RowState, ServerStatus, WarmState
from orchestrator.records.columns import (
    EventData,
    PlacementRecord,
    SpecRecord,
    SweepSpecRecord,
    event_data,
    placement_record,
    spec_record,
    sweep_spec_record,
)

SERVER_STATUSES: tuple[ServerStatus, ...] = tuple(ServerStatus)
BILLINGS: tuple[str, ...] = ("per_second", "per_minute", "monthly")
_TIME_FORMAT_LEN = len("2025-01-01T00:00:00.000000Z")


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


class IllegalTransition(InvalidValueError):
    """A status change the job's lifecycle does not allow (orchestrator.core.jobstatus)."""


class LeaseLost(StoreError):
    """The job is no longer driven by this worker (its lease expired and another took it)."""


class CancelRequested(StoreError):
    """`orch cancel` asked the job to stop before this write: the job does not succeed, nor
    park its machine (the write that would have done so is refused, atomically)."""


class DatabaseBusy(StoreError):
    """Another process held the SQLite write lock past orch's whole wait (`lock_wait_s`)."""


class DatabaseFull(StoreError):
    """The disk (or file system) under the database is full: no write can be recorded."""


class DatabaseReadOnly(StoreError):
    """The database refuses this role's (or this user's) writes: a read-only role, or a
    SQLite file this user may only read."""



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
    """`money.to_micros` with its value errors as the store's InvalidValueError."""
    try:
        return money.to_micros(amount, rounding=rounding)
    except money.MoneyError as exc:
        raise InvalidValueError(str(exc)) from None


def dumps(value: object) -> str:
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
                "use an aware UTC time such as orchestrator.records.store.utcnow()"
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


_Enum = TypeVar("_Enum", bound=StrEnum)


class EnumText(TypeDecorator[_Enum]):
    """A `StrEnum` column stored as its text: the column stays VARCHAR and every row reads as
    before; a value read back is the enum's member, and a word outside the enum is refused
    on write (ValueError) rather than stored."""

    impl = AutoString
    cache_ok = True

    def __init__(self, enum: type[_Enum]) -> None:
        super().__init__()
        self.enum = enum

    def process_bind_param(self, value: _Enum | str | None, dialect: Dialect) -> str | None:
        """The member's text (a plain string is checked against the enum)."""
        return None if value is None else self.enum(value).value

    def process_result_value(self, value: str | None, dialect: Dialect) -> _Enum | None:
        """The member the stored text names."""
        return None if value is None else self.enum(value)


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

    def spec(self) -> SweepSpecRecord:
        """The sweep file's fields orch reads back (`records.columns`)."""
        return sweep_spec_record(self.spec_json)


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
        # 0009: the head of the queue, whatever the history's size (a claim's ORDER BY).
        Index("ix_job_queued_head", "created_at", "id",
              sqlite_where=text("status = 'queued'"),
              postgresql_where=text("status = 'queued'")),
        # 0010: a sweep's trial numbers are unique: two overlapping `orch sweep` ticks that
        # propose the same trial insert it once (docs/sweeps-search.md).
        Index("uq_job_sweep_trial", "sweep_id", "trial_number", unique=True),
    )

    id: str = Field(default_factory=new_job_id, primary_key=True)
    name: str
    status: JobStatus = Field(sa_type=EnumText(JobStatus))
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
    # 0006: recovery (orchestrator/engine/recovery.py). Not claimed before `not_before` (outage
    # backoff); `outage_since` starts the outage limit; `phase_done` is the last pipeline
    # phase whose result is durable, so a takeover resumes after it.
    not_before: datetime | None = _time(nullable=True, default_now=False)
    outage_since: datetime | None = _time(nullable=True, default_now=False)
    phase_done: str | None = None
    # 0010: a search sweep's trial number (the run index in its name); NULL outside sweeps.
    trial_number: int | None = None
    # 0012: the deadline contract's standing choice (engine/deadlines.py): `on_demand` once
    # the policy moved the job off spot (a takeover keeps it there); NULL: not decided.
    deadline_choice: Choice | None = Field(default=None, sa_type=EnumText(Choice))

    def placement(self) -> PlacementRecord:
        """The plan recorded at submit (`records.columns`)."""
        return placement_record(self.placement_json)

    def spec(self) -> SpecRecord:
        """The resolved spec's fields orch reads back without validating it whole."""
        return spec_record(self.spec_json)


class JobUpdate(TypedDict, total=False):
    """The `job` columns a status change may carry (`Store.set_status`), each typed: the
    costs so far, the failure, the lease, the attempt's counters, the placement being
    rented, and what training measured. The status itself never goes here."""

    failure_reason: str | None
    cost_micros: int
    storage_micros: int
    amortised_micros: int
    lease_owner: str | None
    lease_expires_at: datetime | None
    not_before: datetime | None
    outage_since: datetime | None
    attempt: int
    interruptions: int
    lost_steps: int
    provider: str | None
    gpu: str | None
    gpu_count: int | None
    billing: str | None
    interruptible: bool | None
    est_hours: float | None
    deadline_choice: Choice | None
    est_cost_micros: int | None
    tokens: int | None
    train_seconds: float | None
    phase_done: str | None
    artifacts_dir: str | None


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

    def data(self) -> EventData:
        """The event's data (`records.columns`)."""
        return event_data(self.data_json)


class Instance(SQLModel, table=True):
    """A machine rented from a provider for a job (written before the create call)."""

    __tablename__ = "instance"
    __table_args__ = (
        Index("ix_instance_provider_instance", "provider", "provider_instance_id"),
        Index("ix_instance_job_id", "job_id"),
        # RESTART_SQL's newest rentals of one (provider, GPU): migration 0013.
        Index("ix_instance_provider_gpu_created_at", "provider", "gpu", "created_at", "id"),
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
    state: RowState = Field(sa_type=EnumText(RowState))
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
    end_reason: EndReason | None = Field(default=None, sa_type=EnumText(EndReason))
    lost_steps: int | None = None  # training steps redone because this instance was lost


WARM_STATES: tuple[WarmState, ...] = tuple(WarmState)


class WarmInstance(SQLModel, table=True):
    """A per-second instance kept idle after its job, for the next job that fits it
    (`resources.keep_warm`; docs/warm.md).

    Exactly one row owns a live machine at any time: the job's instance row until it is
    parked, this row while `parked` (or `ending`: being terminated), then the instance row
    of the job that took it. Parking closes the parker's row and inserts this one in one
    transaction; taking is one conditional UPDATE plus the taker's instance row, in one.
    """

    __tablename__ = "warm_instance"
    __table_args__ = (
        Index("ix_warm_instance_state", "state"),
        Index("ix_warm_instance_provider_instance", "provider", "provider_instance_id"),
    )

    id: int | None = Field(default=None, primary_key=True)
    provider: str
    provider_instance_id: str
    # The offer it was rented from (JSON): what the planner prices the machine as.
    offer_json: str = Field(sa_type=Text)
    gpu: str
    gpu_count: int
    billing: str  # per_second | per_minute (a monthly server is never parked: it is kept)
    interruptible: bool
    price_per_hour_micros: int = Field(sa_type=BigInteger)
    image: str | None = None  # what the machine runs (a rental's image is fixed at create)
    disk_gb: int
    model_repo: str | None = None  # the base model in its cache (repo, revision)
    model_revision: str | None = None
    host: str | None = None
    port: int | None = None
    ssh_user: str | None = None
    host_key: str | None = Field(default=None, sa_type=Text)
    parked_by_job: str = Field(foreign_key="job.id")
    parked_at: datetime = _time()
    expires_at: datetime = _time()
    state: WarmState = Field(default=WarmState.PARKED, sa_type=EnumText(WarmState),
                             sa_column_kwargs={"server_default": "parked"})
    taken_by_job: str | None = Field(default=None, foreign_key="job.id")
    taken_at: datetime | None = _time(nullable=True, default_now=False)
    ended_at: datetime | None = _time(nullable=True, default_now=False)
    end_reason: EndReason | None = Field(default=None, sa_type=EnumText(EndReason))
    # What the idle time cost (price x billed seconds from parked to taken or ended): billed
    # to no job; `orch cost` shows it.
    idle_micros: int = Field(default=0, sa_type=BigInteger,
                             sa_column_kwargs={"server_default": text("0")})


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
    status: ServerStatus = Field(default=ServerStatus.IDLE, sa_type=EnumText(ServerStatus),
                                 sa_column_kwargs={"server_default": "idle"})
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
    # NULL (0014): not a finite number (a diverged run's `nan`; store/notanumber.py).
    value: float | None = Field(default=None, sa_type=Float)
    step: int | None = None
    at: datetime = _time()


class SweepRung(SQLModel, table=True):
    """A sweep trial's check at one rung of its early stopping, decided once (0010).

    The primary key is the decision's identity: a second insert of the same (job, resource)
    (another worker, a replay after kill -9) fails, and the stored decision stands."""

    __tablename__ = "sweep_rung"

    job_id: str = Field(foreign_key="job.id", primary_key=True)
    resource: int = Field(primary_key=True, sa_column_kwargs={"autoincrement": False})
    rung: int  # optuna's rung index in the trial's bracket
    step: int  # the training step whose report decided it
    metric: str
    value: float | None = Field(default=None, sa_type=Float)  # NULL: not a number (0014)
    decision: str  # `continue` or `prune` (core.states.RungDecision)
    cutoff: float | None = Field(default=None, sa_type=Float)  # a prune's: the value needed
    decided_at: datetime = _time()


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
    size_class: str  # e.g. "8B": parameters rounded, see orchestrator.core.throughput
    tokens_per_s: float = Field(sa_type=Float)
    observed_at: datetime = _time()


class HostObservation(SQLModel, table=True):
    """What orch learnt of one physical machine: a host check's result or a finished run's
    measured speed against its plan (`orchestrator.core.hostmemory.Observation`)."""

    __tablename__ = "host_observation"
    __table_args__ = (
        Index("ix_host_observation_machine", "provider", "machine_id", "at"),
    )

    id: int | None = Field(default=None, primary_key=True)
    provider: str
    machine_id: str  # the provider's physical machine id (a registered server's name)
    at: datetime = _time()
    source: str  # hostmemory.Source: check | run
    failed: bool = False
    delivered: float | None = Field(default=None, sa_type=Float)  # of a healthy machine
    why: str = Field(default="", sa_type=Text)
    job_id: str | None = Field(default=None, foreign_key="job.id")
    report_json: str | None = Field(default=None, sa_type=Text)  # the HostReport (checks)


def check_status(status: str) -> JobStatus:
    """`status` as a JobStatus; InvalidValueError unless it is one."""
    try:
        return parse_status(status)
    except ValueError as exc:
        raise InvalidValueError(str(exc)) from None
