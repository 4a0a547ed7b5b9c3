"""Preemption history: interruptions per hour of running of each provider's spot GPUs.

One query over `instance` (issue 41, docs/deadline.md "Preemption rates"): for each provider
and GPU, the interruptible rows that were rented (a provider instance id), how many ended
`interrupted`, and their hours from `created_at` to `terminated_at` (now for live ones).
A machine the deadline policy left (`moved`) counts its hours, not as an interruption; a
create that never ran (capacity, price changed) counts neither. `core.preemption.rate` turns
a `History` into the rate the policy plans with, the documented prior weighing until there is
enough of it.
"""

from __future__ import annotations

from datetime import datetime

from sqlmodel import col, select

from orchestrator.core.preemption import History, Rate, rate
from orchestrator.core.states import EndReason
from orchestrator.records.store.database import StoreBase
from orchestrator.records.store.tables import Instance, utcnow

# End reasons of rows that never ran a machine: no hours, no interruption.
_NEVER_RAN = (EndReason.CAPACITY, EndReason.PRICE_CHANGED)

Key = tuple[str, str]  # provider, GPU


def histories(store: StoreBase, now: datetime | None = None) -> dict[Key, History]:
    """What orch saw of every provider's spot machines, by (provider, GPU)."""
    at = now or utcnow()
    query = select(Instance).where(col(Instance.interruptible).is_(True),
                                   col(Instance.provider_instance_id).is_not(None))
    counts: dict[Key, tuple[int, float]] = {}
    with store.session() as session:
        for row in session.exec(query):
            if row.end_reason in _NEVER_RAN:
                continue
            key = (row.provider, row.gpu)
            n, hours = counts.get(key, (0, 0.0))
            ran = max(0.0, ((row.terminated_at or at) - row.created_at).total_seconds() / 3600)
            counts[key] = (n + (row.end_reason == EndReason.INTERRUPTED), hours + ran)
    return {key: History(n, hours) for key, (n, hours) in counts.items()}


def rate_of(store: StoreBase, provider: str, gpu: str, now: datetime | None = None) -> Rate:
    """The preemption rate of `provider`'s spot `gpu`: the prior updated by orch's history."""
    return rate(histories(store, now).get((provider, gpu)))


def rates(store: StoreBase, now: datetime | None = None) -> dict[Key, Rate]:
    """Every (provider, GPU) orch has a history for, with its rate (others: the prior)."""
    return {key: rate(seen) for key, seen in histories(store, now).items()}
