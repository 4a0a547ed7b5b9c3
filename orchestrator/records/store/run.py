"""The store's record of what happened: events, instances (and their cost), metrics.

An instance row is written before the provider's create call (Invariant 1), so a crash
between the two leaves a row that reconciliation finds, never an unrecorded paid machine.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from decimal import ROUND_HALF_EVEN, Decimal

from sqlalchemy import delete, update
from sqlmodel import Session, col, select

from orchestrator.core import money
from orchestrator.core.states import EndReason, RowState
from orchestrator.records.store.database import StoreBase
from orchestrator.records.store.notanumber import event_json, real_or_null
from orchestrator.records.store.tables import (
    Event,
    Instance,
    Job,
    Metric,
    NotFoundError,
    ThroughputObservation,
    to_micros,
    utcnow,
)


def _instance(session: Session, row_id: int) -> Instance:
    row = session.get(Instance, row_id)
    if row is None:
        raise NotFoundError(f"instance row {row_id} not found")
    return row


class RecordsMixin(StoreBase):
    """Events, instances, metrics and throughput (part of `store.Store`)."""

    def add_event(self, job_id: str, kind: str, message: str,
                  data: Mapping[str, object] | None = None) -> None:
        """Append one event to a job's history."""
        # A not-finite float (a `nan` loss) is written as null: the message keeps its text.
        payload = None if data is None else event_json(data)
        with self.transaction() as session:
            session.add(Event(job_id=job_id, at=utcnow(), kind=kind, message=message,
                              data_json=payload))

    def events_after(self, job_id: str, after_id: int = 0,
                     kinds: tuple[str, ...] | None = None) -> list[Event]:
        """A job's events with id > `after_id` (of `kinds` only, when given), oldest first:
        `orch logs -f` follows every kind; the engine reads one or two of a long job's
        thousands of progress events (filtered here, not by the caller)."""
        with self.session() as session:
            query = select(Event).where(Event.job_id == job_id, col(Event.id) > after_id)
            if kinds is not None:
                query = query.where(col(Event.kind).in_(kinds))
            return list(session.exec(query.order_by(col(Event.id))))

    def events(self, job_id: str) -> list[Event]:
        """A job's events, oldest first; NotFoundError if the job does not exist."""
        with self.session() as session:
            if session.get(Job, job_id) is None:
                raise NotFoundError(f"job {job_id!r} not found; list recent jobs with `orch jobs`")
            query = (
                select(Event).where(Event.job_id == job_id).order_by(col(Event.at), col(Event.id))
            )
            return list(session.exec(query))


    def add_instance(self, job_id: str, *, provider: str, offer_id: str, gpu: str,
                     gpu_count: int, billing: str, interruptible: bool,
                     price_per_hour: Decimal, attempt: int) -> Instance:
        """Record an instance about to be created (before the provider call: Invariant 1)."""
        row = Instance(job_id=job_id, provider=provider, offer_id=offer_id, gpu=gpu,
                       gpu_count=gpu_count, billing=billing, interruptible=interruptible,
                       price_per_hour_micros=to_micros(price_per_hour, rounding=ROUND_HALF_EVEN),
                       state=RowState.CREATING, attempt=attempt)
        with self.transaction() as session:
            session.add(row)
        return row

    def set_instance_id(self, row_id: int, provider_instance_id: str) -> Instance:
        """The provider's id of the row's machine (found by its tag after a crash)."""
        with self.transaction() as session:
            row = _instance(session, row_id)
            row.provider_instance_id = provider_instance_id
            return row

    def record_created(self, row_id: int, provider_instance_id: str, state: RowState,
                       price_per_hour_micros: int) -> Instance:
        """The provider created the row's machine: its id, state and the price it charges."""
        with self.transaction() as session:
            row = _instance(session, row_id)
            row.provider_instance_id = provider_instance_id
            row.state = state
            row.price_per_hour_micros = price_per_hour_micros
            return row

    def record_address(self, row_id: int, *, host: str, port: int, ssh_user: str,
                       host_key: str, state: RowState) -> Instance:
        """Where the row's machine answers SSH, its pinned host key, and its state."""
        with self.transaction() as session:
            row = _instance(session, row_id)
            row.host, row.port, row.ssh_user, row.host_key = host, port, ssh_user, host_key
            row.state = state
            return row

    def close_instance(self, row_id: int, reason: EndReason, at: datetime) -> Instance:
        """The row's machine is gone (terminated, released, lost) at `at`: closed with
        `reason` and what it cost (charged and amortised, to `at`), in one write."""
        with self.transaction() as session:
            row = _instance(session, row_id)
            row.terminated_at, row.state, row.end_reason = at, RowState.TERMINATED, reason
            charged, amortised = money.instance_cost(row, at)
            row.cost_micros, row.amortised_micros = to_micros(charged), to_micros(amortised)
            return row

    def instances_of(self, job_id: str) -> list[Instance]:
        """A job's instance rows, oldest first."""
        with self.session() as session:
            query = (select(Instance).where(Instance.job_id == job_id)
                     .order_by(col(Instance.id)))
            return list(session.exec(query))

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
                .values(terminated_at=utcnow(), state=RowState.TERMINATED))
            return int(getattr(result, "rowcount", 0) or 0)

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
                # Not finite (a `nan` loss): NULL, see Metric.value.
                session.add(Metric(job_id=job_id, name=name, step=step, at=now,
                                   value=real_or_null(float(value))))

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
