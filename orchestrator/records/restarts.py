"""Measured restarts (`core.restarts`) read through the store, for the engine's deadline
policy; the SQL is the read-only path's (`records.readonly.RESTART_SQL`), so `orch plan`
and the engine see the same figures."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import text

from orchestrator.core import restarts
from orchestrator.records.readonly import RESTART_SQL, restart_params, restarts_of
from orchestrator.records.store.database import StoreBase


def measured(store: StoreBase, keys: Iterable[restarts.Key]
             ) -> dict[restarts.Key, restarts.Measured]:
    """The median seconds from a rental to its job's first step of each (provider, GPU) of
    `keys` that has any."""
    with store.session() as session:
        rows = [tuple(row) for params in restart_params(keys)
                for row in session.execute(text(RESTART_SQL), params)]
    return restarts_of(rows)
