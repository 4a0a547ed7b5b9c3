"""Values that are not finite numbers, as the database holds them.

A trainer logs `nan` (a diverged run, or an eval loss of 0 / 0) and `inf`. SQLite's REAL
holds no NaN (it binds one as NULL), and JSON has none: Python writes a bare `NaN`, which
SQLite's json_extract (before 3.42) and most other readers refuse as malformed, failing a
user's query over every event. So a metric's or rung's value is NULL, and an event's data
holds null, where the number was not finite; an event's message keeps its text.
"""

from __future__ import annotations

import math

from orchestrator.records.store.tables import dumps


def finite(value: object) -> object:
    """`value` with every float in it that is not finite made None."""
    if isinstance(value, float):
        return real_or_null(value)
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def real_or_null(value: float) -> float | None:
    """A metric's or rung's value as stored: None (NULL) when not a finite number."""
    return value if math.isfinite(value) else None


def nan_if_null(value: float | None) -> float:
    """A stored value as a float: NaN for NULL (what the search and the charts expect)."""
    return math.nan if value is None else value


def event_json(data: object) -> str:
    """An event's data as stored: canonical JSON (`tables.dumps`), not-finite floats null."""
    return dumps(finite(data))
