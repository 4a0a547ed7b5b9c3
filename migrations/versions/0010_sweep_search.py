"""A search sweep's trials and their rung decisions (issue 38).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-06

`job.trial_number` is a search sweep's trial number, unique per sweep, so that two
overlapping `orch sweep` ticks that propose the same trial insert it once. `sweep_rung` holds
each trial's check at a rung of its early stopping, keyed by (job, resource): a rung is
decided once, and a worker that replays the check (a takeover after kill -9) finds the
stored decision instead of deciding again.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# orch's UTC time text, "YYYY-MM-DDTHH:MM:SS.ffffffZ" (tables.UTCDateTime), as in 0001.
TIME = sa.String(length=27)


def upgrade() -> None:
    """Add the trial number and the rung table."""
    # A plain ADD COLUMN (nullable): SQLite's batch copy of `job` would trip the foreign keys
    # that point at it.
    op.add_column("job", sa.Column("trial_number", sa.Integer(), nullable=True))
    op.create_index("uq_job_sweep_trial", "job", ["sweep_id", "trial_number"], unique=True)
    op.create_table(
        "sweep_rung",
        sa.Column("job_id", sa.String(), sa.ForeignKey("job.id"), nullable=False),
        sa.Column("resource", sa.Integer(), nullable=False, autoincrement=False),
        sa.Column("rung", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("metric", sa.String(), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        sa.Column("decision", sa.String(), nullable=False),
        sa.Column("cutoff", sa.Float(), nullable=True),
        sa.Column("decided_at", TIME, nullable=False),
        sa.PrimaryKeyConstraint("job_id", "resource"),
    )


def downgrade() -> None:
    """Drop them."""
    op.drop_table("sweep_rung")
    op.drop_index("uq_job_sweep_trial", table_name="job")
    op.drop_column("job", "trial_number")  # SQLite >= 3.35 drops a column in place
