"""Cost rollups: covering indexes so `orch cost` reads job columns from indexes, not the table.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02

`orch cost` (orchestrator.records.history.cost_rollup) reads two things: the jobs per created day
(count, cost, amortised rent) and every instance with the created day of its job. Measured
with bench/history_scale.py on 100,000 jobs, both walked the job table (30 MiB there, far
more with real spec_json): the first as a full scan, the second as one table look-up per
instance through the primary key. Each index holds exactly the job columns those queries
use (the --by dimensions and the --since/--until bound included), so SQLite answers from the
index alone:

- `ix_job_created_at_cost`: the per-day job sums scan it instead of the table.
- `ix_job_id_created_at`: the instance → job join finds the job's day (and dimension) in it.

Indexes only: no row changes, and a downgrade drops them.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEXES: dict[str, list[str]] = {
    "ix_job_created_at_cost": ["created_at", "cost_micros", "amortised_micros", "provider",
                               "gpu", "method", "sweep_id"],
    "ix_job_id_created_at": ["id", "created_at", "provider", "gpu", "method", "sweep_id"],
}


def upgrade() -> None:
    """Create the cost rollup indexes."""
    for name, columns in INDEXES.items():
        op.create_index(name, "job", columns)


def downgrade() -> None:
    """Drop them."""
    for name in reversed(INDEXES):
        op.drop_index(name, table_name="job")
