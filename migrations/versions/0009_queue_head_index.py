"""The head of the queue found in its own small index, whatever the history's size.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-04

A worker's claim asks for the oldest claimable queued job (`ORDER BY created_at, id`, issue
23 §11). With `ix_job_created_at` the database may walk every finished job older than the
oldest queued one (PostgreSQL did so with stale statistics: 700 finished rows filtered per
claim in bench/fleet.py); `ix_job_queued_head` is a partial index over the queued rows only
(SQLite and PostgreSQL both have them), so the head is its first entry.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

QUEUED = sa.text("status = 'queued'")


def upgrade() -> None:
    """Create the partial index."""
    op.create_index("ix_job_queued_head", "job", ["created_at", "id"],
                    sqlite_where=QUEUED, postgresql_where=QUEUED)


def downgrade() -> None:
    """Drop it."""
    op.drop_index("ix_job_queued_head", table_name="job")
