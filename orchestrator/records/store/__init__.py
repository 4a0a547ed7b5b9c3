"""The Store: typed reads and one-transaction writes over the orch database.

The database is the product's memory (DESIGN.md "Storage"). The store is assembled from
parts, each a module of its own:
- `tables`: the tables, the UTC time column type, the errors, small helpers;
- `database`: engine, SQLite pragmas, schema upgrade at open, sessions and transactions;
- `servers`: registered monthly servers;
- `jobs`: jobs, claims (with the sweep gate), leases, status changes;
- `run`: events, instances, metrics, throughput;
- `warm`: instances kept warm between jobs (park, take, end);
- `hosts`: host memory, what orch learnt of each physical machine.
Imports point one way: this package → jobs/servers/run → database → tables →
money/jobstatus; the sweep rules (`records.sweep.rules`) are a leaf the claim path uses.
Nothing in the store imports the sweep, history or CLI modules. The names below are re-exported so
callers keep importing them from `orchestrator.records.store`.
"""

from __future__ import annotations

from sqlalchemy.engine import Engine

from orchestrator.core.jobstatus import ACTIVE_STATUSES, FINAL_STATUSES, JOB_STATUSES, JobStatus
from orchestrator.core.money import from_micros

# Re-exported: callers of the store find the default URL here too.
from orchestrator.core.paths import default_db_url
from orchestrator.records.store.database import (
    BUSY_TIMEOUT_MS,
    LOCK_WAIT_S,
    SCHEMA_HEAD,
    db_now,
    lock_wait_s,
    make_engine,
    migrations_dir,
)
from orchestrator.records.store.hosts import HostsMixin
from orchestrator.records.store.jobs import JobsMixin, claim_in, claim_next_gated
from orchestrator.records.store.notanumber import event_json, nan_if_null, real_or_null
from orchestrator.records.store.run import RecordsMixin
from orchestrator.records.store.servers import ServersMixin
from orchestrator.records.store.tables import (
    BILLINGS,
    SERVER_STATUSES,
    AlreadyExists,
    CancelRequested,
    DatabaseBusy,
    DatabaseFull,
    DatabaseReadOnly,
    DatabaseURLError,
    Event,
    HostObservation,
    IllegalTransition,
    Instance,
    InvalidValueError,
    Job,
    JobUpdate,
    LeaseLost,
    Metric,
    NotFoundError,
    PriceObservation,
    Server,
    ServerBusyError,
    StoreError,
    Sweep,
    SweepRung,
    ThroughputObservation,
    UTCDateTime,
    WarmInstance,
    new_job_id,
    new_sweep_id,
    to_micros,
    utcnow,
)
from orchestrator.records.store.warm import WarmMixin


class Store(ServersMixin, JobsMixin, RecordsMixin, WarmMixin, HostsMixin):
    """Typed reads and one-transaction writes over the orch database."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine)


def open_store(url: str | None = None) -> Store:
    """Open (creating if needed) the database at `url` and upgrade its schema to head."""
    return Store(make_engine(url))


__all__ = [
    "ACTIVE_STATUSES", "BILLINGS", "BUSY_TIMEOUT_MS", "FINAL_STATUSES", "JOB_STATUSES",
    "LOCK_WAIT_S", "SCHEMA_HEAD", "SERVER_STATUSES", "AlreadyExists", "CancelRequested",
    "DatabaseBusy", "DatabaseFull", "DatabaseReadOnly", "DatabaseURLError", "Event",
    "HostObservation",
    "IllegalTransition", "Instance", "InvalidValueError", "Job", "JobStatus", "JobUpdate",
    "LeaseLost",
    "Metric", "NotFoundError", "PriceObservation", "Server", "ServerBusyError", "Store",
    "StoreError", "Sweep", "SweepRung", "ThroughputObservation", "UTCDateTime", "WarmInstance",
    "claim_in",
    "claim_next_gated", "db_now", "default_db_url", "event_json", "from_micros", "lock_wait_s",
    "migrations_dir", "nan_if_null", "new_job_id", "new_sweep_id", "open_store", "real_or_null",
    "to_micros", "utcnow",
]
