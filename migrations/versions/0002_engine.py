"""The job engine's columns: cancellation, artifacts, cost split, interruptions, sweep keys,
measured throughput.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02

Columns only added (nullable or with a server default), so an existing history keeps every
row. `job.sweep_key` is a unique index, not a constraint: SQLite cannot add constraints to
an existing table, and a unique index enforces the same thing on both dialects (NULLs, the
jobs outside any sweep, never collide).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TIME = sa.String(length=27)
ZERO = sa.text("0")


def upgrade() -> None:
    """Add the engine's columns and the throughput_observation table."""
    with op.batch_alter_table("job") as job:
        job.add_column(sa.Column("sweep_key", sa.String(), nullable=True))
        job.add_column(sa.Column("cancel_requested_at", TIME, nullable=True))
        job.add_column(sa.Column("artifacts_dir", sa.Text(), nullable=True))
        job.add_column(sa.Column("amortised_micros", sa.BigInteger(), server_default=ZERO,
                                 nullable=False))
        job.add_column(sa.Column("storage_micros", sa.BigInteger(), server_default=ZERO,
                                 nullable=False))
        job.add_column(sa.Column("interruptions", sa.Integer(), server_default=ZERO,
                                 nullable=False))
        job.add_column(sa.Column("lost_steps", sa.Integer(), server_default=ZERO,
                                 nullable=False))
        job.add_column(sa.Column("tokens", sa.BigInteger(), nullable=True))
        job.add_column(sa.Column("train_seconds", sa.Float(), nullable=True))
    op.create_index("uq_job_sweep_key", "job", ["sweep_key"], unique=True)

    with op.batch_alter_table("instance") as inst:
        inst.add_column(sa.Column("offer_id", sa.String(), nullable=True))
        inst.add_column(sa.Column("attempt", sa.Integer(), server_default=ZERO, nullable=False))
        inst.add_column(sa.Column("cost_micros", sa.BigInteger(), server_default=ZERO,
                                  nullable=False))
        inst.add_column(sa.Column("amortised_micros", sa.BigInteger(), server_default=ZERO,
                                  nullable=False))
        inst.add_column(sa.Column("end_reason", sa.String(), nullable=True))
        inst.add_column(sa.Column("lost_steps", sa.Integer(), nullable=True))

    op.create_table(
        "throughput_observation",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.String(), nullable=False),
        sa.Column("gpu", sa.String(), nullable=False),
        sa.Column("gpu_count", sa.Integer(), nullable=False),
        sa.Column("method", sa.String(), nullable=False),
        sa.Column("size_class", sa.String(), nullable=False),
        sa.Column("tokens_per_s", sa.Float(), nullable=False),
        sa.Column("observed_at", TIME, nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["job.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_throughput_observation_key", "throughput_observation",
                    ["gpu", "gpu_count", "method", "size_class"])


def downgrade() -> None:
    """Drop what upgrade added."""
    op.drop_index("ix_throughput_observation_key", table_name="throughput_observation")
    op.drop_table("throughput_observation")
    with op.batch_alter_table("instance") as inst:
        for name in ("lost_steps", "end_reason", "amortised_micros", "cost_micros", "attempt",
                     "offer_id"):
            inst.drop_column(name)
    op.drop_index("uq_job_sweep_key", table_name="job")
    with op.batch_alter_table("job") as job:
        for name in ("train_seconds", "tokens", "lost_steps", "interruptions",
                     "storage_micros", "amortised_micros", "artifacts_dir",
                     "cancel_requested_at", "sweep_key"):
            job.drop_column(name)
