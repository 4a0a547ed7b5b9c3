"""Preemption history: interruptions per hour of running of each provider's spot GPUs.

One query over `instance` (issue 41, docs/deadline.md "Preemption rates"): the interruptible
rows that were rented (a provider instance id), tallied per provider and GPU by
`core.preemption.histories` (interruptions, hours from `created_at` to `terminated_at`, now
for live ones). `core.preemption.rate` turns a `History` into the rate the policy plans
with, the documented prior weighing until there is enough of it. The read-only commands
(`orch plan`, `orch offers`) read the same rows through `records.readonly`.
"""

from __future__ import annotations

from datetime import datetime

from sqlmodel import col, select

from orchestrator.core.preemption import History, Rate, rate
from orchestrator.core.preemption import histories as tally
from orchestrator.records.store.database import StoreBase
from orchestrator.records.store.tables import Instance, utcnow

Key = tuple[str, str]  # provider, GPU


def histories(store: StoreBase, now: datetime | None = None) -> dict[Key, History]:
    """What orch saw of every provider's spot machines, by (provider, GPU)."""
    query = select(Instance).where(col(Instance.interruptible).is_(True),
                                   col(Instance.provider_instance_id).is_not(None))
    with store.session() as session:
        rows = [(r.provider, r.gpu, r.end_reason, r.created_at, r.terminated_at)
                for r in session.exec(query)]
    return tally(rows, now or utcnow())


def rate_of(store: StoreBase, provider: str, gpu: str, now: datetime | None = None) -> Rate:
    """The preemption rate of `provider`'s spot `gpu`: the prior updated by orch's history."""
    return rate(histories(store, now).get((provider, gpu)))


def rates(store: StoreBase, now: datetime | None = None) -> dict[Key, Rate]:
    """Every (provider, GPU) orch has a history for, with its rate (others: the prior)."""
    return {key: rate(seen) for key, seen in histories(store, now).items()}
