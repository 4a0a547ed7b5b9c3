"""A metric or rung value that is not a number is stored as NULL.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-07

A trainer logs `nan` (or `inf`) when a run diverges, or when a held-out split has no
trained token (an eval loss of 0 / 0). SQLite's REAL cannot hold a NaN: it binds it as NULL,
which the NOT NULL columns refused, so the engine's insert failed in the middle of a
training poll. `metric.value` and `sweep_rung.value` become nullable: NULL is "the trainer
reported a value that is not a finite number" (docs/schema.md).

`v_best_run_per_sweep` ordered by the value, where NULL sorts first in SQLite: a run whose
objective was `nan` would have been a sweep's best. It is made again without them.

What was written before is brought in line: PostgreSQL's float8 held a NaN (or infinity)
where SQLite refused one, so such values become NULL there; and event data written with a
bare `NaN`/`Infinity` (any database: Python's json.dumps allowed them) is written again with
null, so every event is JSON that json_extract and `::json` read.
"""

from __future__ import annotations

import importlib.util
import json
import math
import warnings
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

VIEW = "v_best_run_per_sweep"
SCORED = "WHERE o.metric IS NOT NULL"


def _history() -> ModuleType:
    # 0003 holds the view's dialect-specific SQL; a migration never changes once released.
    path = Path(__file__).with_name("0003_history.py")
    spec = importlib.util.spec_from_file_location("orch_migration_0003", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _view(with_values_only: bool) -> str:
    body: str = _history()._sql(op.get_context().dialect.name)[VIEW]
    assert SCORED in body
    if with_values_only:
        body = body.replace(SCORED, f"{SCORED} AND m.value IS NOT NULL")
    return f"CREATE VIEW {VIEW} AS {body}"


def _alter(nullable: bool) -> None:
    # The view names `metric`: SQLite alters a column by copying the table and renaming the
    # copy, a rename that checks every view (and fails while the original is gone).
    op.execute(f"DROP VIEW IF EXISTS {VIEW}")
    for table in ("metric", "sweep_rung"):
        with warnings.catch_warnings():
            # "Skipped unsupported reflection of expression-based index": made again below.
            warnings.simplefilter("ignore", sa.exc.SAWarning)
            with op.batch_alter_table(table) as batch:
                batch.alter_column("value", existing_type=sa.Float(), nullable=nullable)
    if op.get_context().dialect.name == "sqlite":
        # The copy keeps the indexes SQLAlchemy reflects, which leaves out those on an
        # expression: 0006's unique (job, name, step) is made again.
        op.create_index("uq_metric_job_name_step", "metric",
                        ["job_id", "name", sa.text("coalesce(step, -1)")], unique=True)
    op.execute(_view(with_values_only=nullable))


def _finite(value: object) -> object:
    # records/store/notanumber.finite as of this revision (a migration does not change).
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict | list):
        items = value.items() if isinstance(value, dict) else enumerate(value)
        fixed = {k: _finite(v) for k, v in items}
        return fixed if isinstance(value, dict) else list(fixed.values())
    return value


def _rewrite_events() -> None:
    """Event data with a bare NaN/Infinity, written again with null, canonical as the store
    writes it (sorted keys, no spaces)."""
    bind = op.get_bind()
    rows = bind.execute(sa.text(
        "SELECT id, data_json FROM event WHERE data_json LIKE '%NaN%' "
        "OR data_json LIKE '%Infinity%'")).all()
    for row_id, text in rows:
        try:
            fixed = json.dumps(_finite(json.loads(text)), sort_keys=True,
                               separators=(",", ":"), allow_nan=False)
        except ValueError:
            continue  # not JSON at all: left as it is
        if fixed != text:
            bind.execute(sa.text("UPDATE event SET data_json = :d WHERE id = :i"),
                         {"d": fixed, "i": row_id})


def upgrade() -> None:
    """Drop the NOT NULL of both value columns; the best-run view skips NULL values; what
    was stored before that is not a finite number becomes NULL (null in event data)."""
    _alter(True)
    if op.get_context().dialect.name == "postgresql":
        for table, column in (("metric", "value"), ("sweep_rung", "value"),
                              ("sweep_rung", "cutoff")):
            op.execute(f"UPDATE {table} SET {column} = NULL WHERE {column} IN ("
                       "CAST('NaN' AS double precision), CAST('Infinity' AS double precision), "
                       "CAST('-Infinity' AS double precision))")
    _rewrite_events()


def downgrade() -> None:
    """Put NOT NULL back (rows with a NULL value are deleted first: they cannot stay)."""
    for table in ("metric", "sweep_rung"):
        op.execute(f"DELETE FROM {table} WHERE value IS NULL")
    _alter(False)
