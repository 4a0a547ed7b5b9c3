"""A provider's GPU's newest rentals found in an index, whatever the history's size.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-06

The deadline policy asks, before each rental of a deadline job (engine `Contract._search`),
and `orch plan` asks for each deadline job, how long the newest rentals of a (provider, GPU)
took to reach their first training step (`records.readonly.RESTART_SQL`: `WHERE provider = ?
AND gpu = ? ORDER BY created_at DESC, id DESC LIMIT 60`). Without an index the database read
and sorted every instance row for it (150k rows on SQLite: 0.12-0.15 s for the two keys a
decision asks); `ix_instance_provider_gpu_created_at` holds each key's rentals in that order,
so the read is its 60 newest entries (0.1-0.4 ms).
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Create the index."""
    op.create_index("ix_instance_provider_gpu_created_at", "instance",
                    ["provider", "gpu", "created_at", "id"])


def downgrade() -> None:
    """Drop it."""
    op.drop_index("ix_instance_provider_gpu_created_at", table_name="instance")
