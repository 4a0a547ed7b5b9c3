"""Host memory: what orch learnt of each physical machine (issue 40).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-06

`host_observation`: one row per host check of a rental (or a registered server) and per
finished run's measured speed against its plan, keyed by the provider's machine id
(Vast.ai `machine_id`, RunPod `machineId`, sim's `sim-<model>-NN`, a registered server's
name). Placement reads a machine's rows through `orchestrator.core.hostmemory.advise`;
`orch hosts` lists them. docs/schema.md documents the columns.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# orch's UTC time text, "YYYY-MM-DDTHH:MM:SS.ffffffZ" (tables.UTCDateTime), as in 0001.
TIME = sa.String(length=27)


def upgrade() -> None:
    """Create the table and its index."""
    op.create_table(
        "host_observation",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("provider", sa.String(), nullable=False),
        sa.Column("machine_id", sa.String(), nullable=False),
        sa.Column("at", TIME, nullable=False),
        sa.Column("source", sa.String(), nullable=False),
        sa.Column("failed", sa.Boolean(), nullable=False),
        sa.Column("delivered", sa.Float(), nullable=True),
        sa.Column("why", sa.Text(), nullable=False),
        sa.Column("job_id", sa.String(), sa.ForeignKey("job.id"), nullable=True),
        sa.Column("report_json", sa.Text(), nullable=True),
    )
    op.create_index("ix_host_observation_machine", "host_observation",
                    ["provider", "machine_id", "at"])


def downgrade() -> None:
    """Drop the table."""
    op.drop_index("ix_host_observation_machine", table_name="host_observation")
    op.drop_table("host_observation")
