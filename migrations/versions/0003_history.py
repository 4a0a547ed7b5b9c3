"""History: indexes for `orch history` filters at 100k jobs, and views for common questions.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02

Indexes (measured with bench/history_scale.py on 100,000 jobs): each filter column is
paired with created_at, so `orch history --provider X` (newest first, LIMIT 50) reads the
matching index range in order instead of walking every job in ix_job_created_at when X is
rare or absent (~150 ms → <1 ms). `finished_at` serves "what finished/failed lately".

Views are dialect-specific SQL (JSON access and date arithmetic differ): SQLite uses
json_extract()/julianday(), PostgreSQL `::json ->>` and EXTRACT(EPOCH ...). Both produce
the same columns; docs/schema.md documents them. Money stays integer micro-dollars.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEXES: dict[str, list[str]] = {
    "ix_job_provider_created_at": ["provider", "created_at"],
    "ix_job_gpu_created_at": ["gpu", "created_at"],
    "ix_job_method_created_at": ["method", "created_at"],
    "ix_job_base_model_created_at": ["base_model", "created_at"],
    "ix_job_finished_at": ["finished_at"],
}

VIEWS = ("v_cost_per_month_provider", "v_best_run_per_sweep", "v_gpu_hours_per_model",
         "v_interruptions_per_provider")


def _sql(dialect: str) -> dict[str, str]:
    if dialect == "sqlite":
        month = "substr(j.created_at, 1, 7)"
        seconds = ("(coalesce(julianday(i.terminated_at), julianday('now')) "
                   "- julianday(i.created_at)) * 86400.0")
        # json_valid first: one hand-edited malformed spec must not break the whole view.
        metric = ("CASE WHEN json_valid(s.spec_json) "
                  "THEN json_extract(s.spec_json, '$.objective.metric') END")
        goal = ("CASE WHEN json_valid(s.spec_json) "
                "THEN json_extract(s.spec_json, '$.objective.goal') END")
    else:
        month = "substr(j.created_at, 1, 7)"
        # No `:` in the SQL: op.execute() would read `:name` as a bind parameter.
        seconds = ("EXTRACT(EPOCH FROM (coalesce(CAST(i.terminated_at AS timestamptz), now())"
                   " - CAST(i.created_at AS timestamptz)))")
        metric = "CAST(s.spec_json AS json) -> 'objective' ->> 'metric'"
        goal = "CAST(s.spec_json AS json) -> 'objective' ->> 'goal'"
    return {
        # Bucketed on the job's created_at (UTC), as `orch cost --by month --by provider`.
        "v_cost_per_month_provider": f"""
            SELECT {month} AS month, j.provider AS provider, count(*) AS jobs,
                   sum(j.cost_micros) AS cost_micros,
                   sum(j.amortised_micros) AS amortised_micros,
                   sum(j.storage_micros) AS storage_micros
            FROM job j
            GROUP BY {month}, j.provider""",
        # The best succeeded job per sweep by the sweep's objective (goal max unless 'min');
        # a job's latest final (step NULL) value of the metric counts.
        "v_best_run_per_sweep": f"""
            WITH objective AS (
                SELECT s.id AS sweep_id, s.name AS sweep_name, {metric} AS metric,
                       coalesce({goal}, 'max') AS goal
                FROM sweep s
            ),
            scored AS (
                SELECT o.sweep_id, o.sweep_name, o.metric, o.goal, j.id AS job_id,
                       j.name AS job_name, m.value AS value, j.cost_micros, j.finished_at,
                       row_number() OVER (
                           PARTITION BY o.sweep_id
                           ORDER BY CASE WHEN o.goal = 'min' THEN m.value ELSE -m.value END,
                                    j.finished_at, j.id) AS rank
                FROM objective o
                JOIN job j ON j.sweep_id = o.sweep_id AND j.status = 'succeeded'
                JOIN metric m ON m.job_id = j.id AND m.name = o.metric AND m.step IS NULL
                WHERE o.metric IS NOT NULL
                  AND m.id = (SELECT max(m2.id) FROM metric m2 WHERE m2.job_id = j.id
                              AND m2.name = o.metric AND m2.step IS NULL)
            )
            SELECT sweep_id, sweep_name, metric, goal, job_id, job_name, value, cost_micros,
                   finished_at
            FROM scored WHERE rank = 1""",
        # Instance time × GPUs, open instances counted until now.
        "v_gpu_hours_per_model": f"""
            SELECT j.base_model AS base_model, count(DISTINCT j.id) AS jobs,
                   count(i.id) AS instances,
                   sum(({seconds}) * i.gpu_count) / 3600.0 AS gpu_hours,
                   sum(i.cost_micros) AS cost_micros
            FROM instance i JOIN job j ON j.id = i.job_id
            GROUP BY j.base_model""",
        # interrupted_instances counts where the preemption happened (the instance's
        # provider); job_interruptions/job_lost_steps are by the job's final provider.
        "v_interruptions_per_provider": """
            WITH jobs AS (
                SELECT provider, count(*) AS jobs, sum(interruptions) AS job_interruptions,
                       sum(lost_steps) AS job_lost_steps
                FROM job WHERE provider IS NOT NULL GROUP BY provider
            ),
            inst AS (
                SELECT provider, count(*) AS instances,
                       sum(CASE WHEN end_reason = 'interrupted' THEN 1 ELSE 0 END)
                           AS interrupted_instances,
                       sum(coalesce(lost_steps, 0)) AS instance_lost_steps
                FROM instance GROUP BY provider
            ),
            p AS (SELECT provider FROM jobs UNION SELECT provider FROM inst)
            SELECT p.provider, coalesce(jobs.jobs, 0) AS jobs,
                   coalesce(jobs.job_interruptions, 0) AS job_interruptions,
                   coalesce(jobs.job_lost_steps, 0) AS job_lost_steps,
                   coalesce(inst.instances, 0) AS instances,
                   coalesce(inst.interrupted_instances, 0) AS interrupted_instances,
                   coalesce(inst.instance_lost_steps, 0) AS instance_lost_steps
            FROM p LEFT JOIN jobs ON jobs.provider = p.provider
                   LEFT JOIN inst ON inst.provider = p.provider""",
    }


def upgrade() -> None:
    """Create the history indexes and views."""
    for name, columns in INDEXES.items():
        op.create_index(name, "job", columns)
    # get_context works online and offline (`alembic upgrade --sql`), get_bind only online.
    for name, body in _sql(op.get_context().dialect.name).items():
        op.execute(f"CREATE VIEW {name} AS {body}")


def downgrade() -> None:
    """Drop the views and indexes."""
    for name in reversed(VIEWS):
        op.execute(f"DROP VIEW IF EXISTS {name}")
    for name in reversed(INDEXES):
        op.drop_index(name, table_name="job")
