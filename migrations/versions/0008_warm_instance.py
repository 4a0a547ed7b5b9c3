"""Warm instances: a per-second machine kept idle after its job for the next one (issue 22).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-04

`warm_instance`: one row per machine a finished job left warm (`resources.keep_warm`). While
its state is `parked` (or `ending`, being terminated) the row owns the machine; a job that
takes it gets an instance row of its own and the warm row becomes `taken`; a window that
ran out ends as `ended` (`expired`, `released` or `lost`). `idle_micros` is what the idle
time cost, billed to no job. docs/schema.md documents the columns; docs/warm.md the hand-over.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# orch's UTC time text, "YYYY-MM-DDTHH:MM:SS.ffffffZ" (tables.UTCDateTime), as in 0001.
TIME = sa.String(length=27)


def upgrade() -> None:
    """Create the table and its two indexes."""
    op.create_table(
        "warm_instance",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("provider", sa.String(), nullable=False),
        sa.Column("provider_instance_id", sa.String(), nullable=False),
        sa.Column("offer_json", sa.Text(), nullable=False),
        sa.Column("gpu", sa.String(), nullable=False),
        sa.Column("gpu_count", sa.Integer(), nullable=False),
        sa.Column("billing", sa.String(), nullable=False),
        sa.Column("interruptible", sa.Boolean(), nullable=False),
        sa.Column("price_per_hour_micros", sa.BigInteger(), nullable=False),
        sa.Column("image", sa.String(), nullable=True),
        sa.Column("disk_gb", sa.Integer(), nullable=False),
        sa.Column("model_repo", sa.String(), nullable=True),
        sa.Column("model_revision", sa.String(), nullable=True),
        sa.Column("host", sa.String(), nullable=True),
        sa.Column("port", sa.Integer(), nullable=True),
        sa.Column("ssh_user", sa.String(), nullable=True),
        sa.Column("host_key", sa.Text(), nullable=True),
        sa.Column("parked_by_job", sa.String(), sa.ForeignKey("job.id"), nullable=False),
        sa.Column("parked_at", TIME, nullable=False),
        sa.Column("expires_at", TIME, nullable=False),
        sa.Column("state", sa.String(), nullable=False, server_default="parked"),
        sa.Column("taken_by_job", sa.String(), sa.ForeignKey("job.id"), nullable=True),
        sa.Column("taken_at", TIME, nullable=True),
        sa.Column("ended_at", TIME, nullable=True),
        sa.Column("end_reason", sa.String(), nullable=True),
        sa.Column("idle_micros", sa.BigInteger(), nullable=False, server_default=sa.text("0")),
    )
    op.create_index("ix_warm_instance_state", "warm_instance", ["state"])
    op.create_index("ix_warm_instance_provider_instance", "warm_instance",
                    ["provider", "provider_instance_id"])


def downgrade() -> None:
    """Drop the table (a parked machine's row goes with it: end warm instances first)."""
    op.drop_index("ix_warm_instance_provider_instance", table_name="warm_instance")
    op.drop_index("ix_warm_instance_state", table_name="warm_instance")
    op.drop_table("warm_instance")
