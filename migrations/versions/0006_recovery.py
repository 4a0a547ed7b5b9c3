"""Recovery after faults: outage backoff, durable phase completion, idempotent metrics.

Revision ID: 0006
Revises: 0004
Create Date: 2026-12-03

- `job.not_before`: a queued job is not claimed before this time. A job whose providers
  were all unavailable (5xx, timeouts: an outage) is requeued with a backoff instead of
  failed, and idle workers sleep instead of claiming it again at once.
- `job.outage_since`: when the current run of outages began for the job (NULL once it is
  placed); the job fails only after `orchestrator.engine.recovery.OUTAGE_LIMIT_S` of outage.
- `job.phase_done`: the last pipeline phase whose result is durable (training, merging,
  evaluating, releasing = artifacts copied back). A takeover resumes after it.
- `uq_metric_job_name_step`: one row per (job, name, step); eval scores have no step, so the
  index uses coalesce(step, -1) (NULLs never collide in a unique index). Duplicates written
  by earlier takeovers are removed first, keeping the newest row of each key.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TIME = sa.String(length=27)


def upgrade() -> None:
    """Add the recovery columns and make metrics unique per (job, name, step)."""
    with op.batch_alter_table("job") as job:
        job.add_column(sa.Column("not_before", TIME, nullable=True))
        job.add_column(sa.Column("outage_since", TIME, nullable=True))
        job.add_column(sa.Column("phase_done", sa.String(), nullable=True))
    op.execute("DELETE FROM metric WHERE id NOT IN (SELECT max(id) FROM metric "
               "GROUP BY job_id, name, coalesce(step, -1))")
    op.create_index("uq_metric_job_name_step", "metric",
                    ["job_id", "name", sa.text("coalesce(step, -1)")], unique=True)


def downgrade() -> None:
    """Drop what upgrade added (the removed duplicate metric rows stay removed)."""
    op.drop_index("uq_metric_job_name_step", table_name="metric")
    # A plain DROP COLUMN (SQLite >= 3.35): a batch copy of `job` would trip the foreign
    # keys of its events and metrics.
    for name in ("phase_done", "outage_since", "not_before"):
        op.drop_column("job", name)
