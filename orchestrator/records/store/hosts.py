"""The store's host memory: every host check's result and every finished run's measured
speed, per physical machine (the `host_observation` table, issue 40).

Read back as `orchestrator.core.hostmemory.Observation`s, which `hostmemory.advise` turns
into a stance for the next placement.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from sqlmodel import col, select

from orchestrator.core.hostmemory import Observation, Source
from orchestrator.records.store.database import StoreBase
from orchestrator.records.store.tables import HostObservation, utcnow


def observation(row: HostObservation) -> Observation:
    """A stored row as host memory's typed observation."""
    return Observation(at=row.at, source=Source(row.source), failed=row.failed,
                       delivered=row.delivered, why=row.why)


class HostsMixin(StoreBase):
    """Host observations (part of `store.Store`)."""

    def record_host_observation(self, provider: str, machine_id: str, source: Source, *,
                                failed: bool, delivered: float | None, why: str,
                                job_id: str | None = None, report_json: str | None = None,
                                at: datetime | None = None) -> HostObservation:
        """Remember one thing learnt about machine `machine_id` of `provider`."""
        row = HostObservation(provider=provider, machine_id=machine_id, at=at or utcnow(),
                              source=source.value, failed=failed, delivered=delivered,
                              why=why, job_id=job_id, report_json=report_json)
        with self.transaction() as session:
            session.add(row)
            session.flush()
            session.refresh(row)
        return row

    def host_observations(self, provider: str | None = None,
                          machine_ids: Iterable[str] | None = None,
                          since: datetime | None = None) -> list[HostObservation]:
        """The rows of `provider`'s machines `machine_ids` (None: all) from `since`, oldest
        first."""
        query = select(HostObservation)
        if provider is not None:
            query = query.where(HostObservation.provider == provider)
        if machine_ids is not None:
            ids = sorted(set(machine_ids))
            if not ids:
                return []
            query = query.where(col(HostObservation.machine_id).in_(ids))
        if since is not None:
            query = query.where(col(HostObservation.at) >= since)
        with self.session() as session:
            return list(session.exec(query.order_by(col(HostObservation.at),
                                                    col(HostObservation.id))))
