"""The store's record of what happened: events, instances (and their cost), metrics.

An instance row is written before the provider's create call (Invariant 1), so a crash
between the two leaves a row that reconciliation finds, never an unrecorded paid machine.
"""

from __future__ import annotations

import json
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

from sqlalchemy import delete, update
from sqlmodel import col, select

from orchestrator.records.store.database import StoreBase
from orchestrator.records.store.tables import (
    Event,
    Instance,
    Job,
    Metric,
    NotFoundError,
    ThroughputObservation,
    set_columns,
    to_micros,
    utcnow,
)


class RecordsMixin(StoreBase):
    """Events, instances, metrics and throughput (part of `store.Store`)."""

    def add_event(self, job_id: str, kind: str, message: str,
                  data: dict[str, Any] | None = None) -> None:
        """Append one event to a job's history."""
        payload = None if data is None else json.dumps(data, sort_keys=True,
                                                       separators=(",", ":"))
        with self.transaction() as session:
            session.add(Event(job_id=job_id, at=utcnow(), kind=kind, message=message,
                              data_json=payload))

    def events_after(self, job_id: str, after_id: int = 0) -> list[Event]:
        """A job's events with id > `after_id`, oldest first (for `orch logs -f`)."""
        with self.session() as session:
            query = (select(Event).where(Event.job_id == job_id, col(Event.id) > after_id)
                     .order_by(col(Event.id)))
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
            return set_columns(session, Instance, row_id, fields,
                               f"instance row {row_id} not found")

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
                .values(terminated_at=utcnow(), state="terminated"))
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
