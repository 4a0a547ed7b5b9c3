"""Server checks: what `orch servers add/check` found, and why a server is not chosen.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03

- `check_error`: set when a server failed its GPU check (by `orch servers check`, or by a
  job's GPU playbook); the dedicated provider offers no server with one until a later check
  passes (issue 12 §4). NULL means fine.
- `checked_at` and `facts_json`: when it was last checked and what was found (GPUs, driver,
  CUDA, Docker and toolkit, free NVMe), for `orch servers list`.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add the three nullable columns (existing servers: never checked, no error)."""
    # checked_at: "YYYY-MM-DDTHH:MM:SS.ffffffZ", store.py's UTCDateTime (as in 0001).
    with op.batch_alter_table("server") as batch:
        batch.add_column(sa.Column("check_error", sa.Text(), nullable=True))
        batch.add_column(sa.Column("checked_at", sa.String(length=27), nullable=True))
        batch.add_column(sa.Column("facts_json", sa.Text(), nullable=True))


def downgrade() -> None:
    """Drop them."""
    with op.batch_alter_table("server") as batch:
        batch.drop_column("facts_json")
        batch.drop_column("checked_at")
        batch.drop_column("check_error")
