"""The deadline contract's standing choice on the job (issue 41).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-06

- `job.deadline_choice`: what the deadline policy (orchestrator/engine/deadlines.py) last
  moved the job to: `on_demand` once it moved the job off spot. Written in the same
  transaction as the `deadline.move` event, before the spot machine is released, so a
  takeover after a crash keeps the job on on-demand and releases a spot machine it finds.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add the column."""
    with op.batch_alter_table("job") as job:
        job.add_column(sa.Column("deadline_choice", sa.String(), nullable=True))


def downgrade() -> None:
    """Drop it (a plain DROP COLUMN, as 0006 does)."""
    op.drop_column("job", "deadline_choice")
