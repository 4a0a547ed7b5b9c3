"""Initial schema: job, event, instance, server, sweep, metric, price_observation.

Revision ID: 0001
Revises:
Create Date: 2025-01-01

Written by hand so it is deterministic; tests/test_store.py compares the migrated schema
with the SQLModel tables in orchestrator/records/store.py and expects no difference. Plain
Alembic ops only, nothing SQLite-specific, so the same revision builds PostgreSQL.
Times are 27-character UTC text (`YYYY-MM-DDTHH:MM:SS.ffffffZ`); money is BIGINT
micro-dollars.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Width of "YYYY-MM-DDTHH:MM:SS.ffffffZ", the UTCDateTime column type in store.py.
TIME = sa.String(length=27)


def upgrade() -> None:
    """Create every table and index of the first schema."""
    op.create_table(
        "sweep",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("spec_json", sa.Text(), nullable=False),
        sa.Column("budget_micros", sa.BigInteger(), nullable=True),
        sa.Column("created_at", TIME, nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name", name="uq_sweep_name"),
    )

    op.create_table(
        "job",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("method", sa.String(), nullable=False),
        sa.Column("base_model", sa.String(), nullable=False),
        sa.Column("spec_json", sa.Text(), nullable=False),
        sa.Column("spec_hash", sa.String(), nullable=False),
        sa.Column("sweep_id", sa.String(), nullable=True),
        sa.Column("provider", sa.String(), nullable=True),
        sa.Column("gpu", sa.String(), nullable=True),
        sa.Column("gpu_count", sa.Integer(), nullable=True),
        sa.Column("billing", sa.String(), nullable=True),
        sa.Column("interruptible", sa.Boolean(), nullable=True),
        sa.Column("est_hours", sa.Float(), nullable=True),
        sa.Column("est_cost_micros", sa.BigInteger(), nullable=True),
        sa.Column("cost_micros", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("placement_json", sa.Text(), nullable=True),
        sa.Column("failure_reason", sa.Text(), nullable=True),
        sa.Column("attempt", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("lease_owner", sa.String(), nullable=True),
        sa.Column("lease_expires_at", TIME, nullable=True),
        sa.Column("created_at", TIME, nullable=False),
        sa.Column("updated_at", TIME, nullable=False),
        sa.Column("started_at", TIME, nullable=True),
        sa.Column("finished_at", TIME, nullable=True),
        sa.ForeignKeyConstraint(["sweep_id"], ["sweep.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_job_status", "job", ["status"])
    op.create_index("ix_job_created_at", "job", ["created_at"])
    op.create_index("ix_job_sweep_id", "job", ["sweep_id"])
    op.create_index("ix_job_spec_hash", "job", ["spec_hash"])

    op.create_table(
        "event",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.String(), nullable=False),
        sa.Column("at", TIME, nullable=False),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("data_json", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["job.id"]),
        sa.PrimaryKeyConstraint("id"),
        # Ignored by other dialects; on SQLite ids are never reused.
        sqlite_autoincrement=True,
    )
    op.create_index("ix_event_job_id_at", "event", ["job_id", "at"])

    op.create_table(
        "instance",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.String(), nullable=False),
        sa.Column("provider", sa.String(), nullable=False),
        sa.Column("provider_instance_id", sa.String(), nullable=True),
        sa.Column("gpu", sa.String(), nullable=False),
        sa.Column("gpu_count", sa.Integer(), nullable=False),
        sa.Column("billing", sa.String(), nullable=False),
        sa.Column("interruptible", sa.Boolean(), nullable=False),
        sa.Column("price_per_hour_micros", sa.BigInteger(), nullable=False),
        sa.Column("state", sa.String(), nullable=False),
        sa.Column("host", sa.String(), nullable=True),
        sa.Column("port", sa.Integer(), nullable=True),
        sa.Column("ssh_user", sa.String(), nullable=True),
        sa.Column("host_key", sa.Text(), nullable=True),
        sa.Column("created_at", TIME, nullable=False),
        sa.Column("terminated_at", TIME, nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["job.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(
        "ix_instance_provider_instance", "instance", ["provider", "provider_instance_id"]
    )
    op.create_index("ix_instance_job_id", "instance", ["job_id"])

    op.create_table(
        "server",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("host", sa.String(), nullable=False),
        sa.Column("port", sa.Integer(), server_default=sa.text("22"), nullable=False),
        sa.Column("user", sa.String(), server_default="root", nullable=False),
        sa.Column("gpu", sa.String(), nullable=False),
        sa.Column("gpu_count", sa.Integer(), server_default=sa.text("1"), nullable=False),
        sa.Column("monthly_price_micros", sa.BigInteger(), nullable=False),
        sa.Column("status", sa.String(), server_default="idle", nullable=False),
        sa.Column("claimed_by_job", sa.String(), nullable=True),
        sa.Column("host_key", sa.Text(), nullable=True),
        sa.Column("created_at", TIME, nullable=False),
        sa.ForeignKeyConstraint(["claimed_by_job"], ["job.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name", name="uq_server_name"),
    )

    op.create_table(
        "metric",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.String(), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=True),
        sa.Column("at", TIME, nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["job.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_metric_job_id_name", "metric", ["job_id", "name"])

    op.create_table(
        "price_observation",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("provider", sa.String(), nullable=False),
        sa.Column("gpu", sa.String(), nullable=False),
        sa.Column("gpu_count", sa.Integer(), nullable=False),
        sa.Column("interruptible", sa.Boolean(), nullable=False),
        sa.Column("price_per_hour_micros", sa.BigInteger(), nullable=False),
        sa.Column("observed_at", TIME, nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(
        "ix_price_observation_provider_gpu_observed_at",
        "price_observation",
        ["provider", "gpu", "observed_at"],
    )


def downgrade() -> None:
    """Drop everything, children before parents."""
    op.drop_table("price_observation")
    op.drop_table("metric")
    op.drop_table("server")
    op.drop_table("instance")
    op.drop_table("event")
    op.drop_table("job")
    op.drop_table("sweep")
