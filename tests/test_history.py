"""History queries, cost rollups, views, read-only SQL and the history CLI on real SQLite files."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import typer
from conftest import BACKENDS, database_url
from typer.testing import CliRunner

from orchestrator.cli.history import register
from orchestrator.core.jobstatus import FINAL_STATUSES, in_order
from orchestrator.core.settings import SettingsError
from orchestrator.records import history as h
from orchestrator.records.store import (
    JOB_STATUSES,
    Instance,
    Job,
    Metric,
    Store,
    Sweep,
    open_store,
)

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
HASH = "b" * 64


# Tests about the SQLite file itself; every other test runs on SQLite and on PostgreSQL.
SQLITE_ONLY = {"test_migration_creates_the_views_and_downgrades_cleanly",
               "test_sql_errors_are_clear",
               "test_long_read_does_not_block_a_writer_process_or_see_half_writes",
               "test_history_commands_do_not_import_sqlalchemy",
               "test_sql_runs_only_allow_listed_functions"}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "db" in metafunc.fixturenames and metafunc.function.__name__ not in SQLITE_ONLY:
        metafunc.parametrize("db", BACKENDS, indirect=True)


@pytest.fixture
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Store, str]]:
    """(store, URL) of an empty database (SQLite unless parametrized)."""
    url = database_url(getattr(request, "param", "sqlite"), tmp_path, request)
    store = open_store(url)
    yield store, url
    store.close()


def _job(jid: str, created: datetime, **over: Any) -> Job:
    fields: dict[str, Any] = dict(
        id=jid, name=jid, status="succeeded", method="lora", base_model="Qwen/Qwen2.5-7B",
        spec_json="{}", spec_hash=HASH, provider="vastai", gpu="H100 SXM", gpu_count=1,
        billing="per_second", interruptible=False, cost_micros=0, created_at=created,
        updated_at=created, started_at=created + timedelta(minutes=5),
        finished_at=created + timedelta(hours=2))
    fields.update(over)
    return Job(**fields)


def _inst(jid: str, start: datetime, end: datetime | None, **over: Any) -> Instance:
    fields: dict[str, Any] = dict(
        job_id=jid, provider="vastai", provider_instance_id=f"i-{jid}", gpu="H100 SXM",
        gpu_count=1, billing="per_second", interruptible=False,
        price_per_hour_micros=2_000_000, state="terminated" if end else "running",
        created_at=start, terminated_at=end)
    fields.update(over)
    return Instance(**fields)


def _add(store: Store, *rows: Any) -> None:
    with store.transaction() as session:
        for row in rows:
            session.add(row)
            session.flush()


def _reader(url: str) -> Any:
    reader = h.open_reader(url)
    assert reader is not None
    return reader


# --- times -------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("2026-11-01", datetime(2026, 11, 1, tzinfo=UTC)),
    ("2026-11-01T12:30", datetime(2026, 11, 1, 12, 30, tzinfo=UTC)),
    ("2026-11-01 12:30:05Z", datetime(2026, 11, 1, 12, 30, 5, tzinfo=UTC)),
    ("2026-11-01T14:30+02:00", datetime(2026, 11, 1, 12, 30, tzinfo=UTC)),
    ("30d", NOW - timedelta(days=30)),
    ("12h", NOW - timedelta(hours=12)),
    ("2w", NOW - timedelta(weeks=2)),
    ("90m", NOW - timedelta(minutes=90)),
])
def test_parse_when_accepts_iso_utc_and_spans(text: str, expected: datetime) -> None:
    assert h.parse_when(text, "--since", NOW) == expected


def test_parse_when_error_names_the_flag_and_the_fix() -> None:
    with pytest.raises(h.HistoryError, match=r"--since 3x: use an ISO date like 2026-11-01.*30d"):
        h.parse_when("3x", "--since", NOW)


def test_job_statuses_copy_matches_the_store() -> None:
    # The copy this guarded is gone (history imports core.jobstatus); what can still drift
    # is the documentation users query by: docs/schema.md's job-states table lists every
    # status, in lifecycle order, and marks exactly the final ones "(final)".
    doc = (Path(__file__).resolve().parent.parent / "docs" / "schema.md").read_text()
    table = doc.split("#### Job states", 1)[1].split("\n\n", 2)[1]
    rows = [line.split("|")[1:3] for line in table.splitlines()[2:]]
    assert h.JOB_STATUSES == JOB_STATUSES == tuple(c.strip(" `") for c, _ in rows)
    assert tuple(c.strip(" `") for c, m in rows if "(final)" in m) == in_order(FINAL_STATUSES)


# --- history -----------------------------------------------------------------------------


@pytest.fixture
def jobs(db: tuple[Store, str]) -> str:
    store, path = db
    sweep = Sweep(id="s-000000000001", name="lr-grid", spec_json="{}", created_at=NOW)
    _add(store, sweep,
         _job("j-a", NOW - timedelta(days=40), cost_micros=5_000_000, method="qlora"),
         _job("j-b", NOW - timedelta(days=10), cost_micros=1_000_000, status="failed",
              provider="runpod", gpu="H100 PCIe", sweep_id=sweep.id),
         _job("j-c", NOW - timedelta(days=2), cost_micros=9_000_000, gpu="A100 80GB",
              base_model="meta-llama/Llama-3.1-8B", sweep_id=sweep.id,
              finished_at=NOW - timedelta(days=2) + timedelta(hours=10)),
         _job("j-d", NOW - timedelta(hours=1), status="queued", started_at=None,
              finished_at=None, provider=None, gpu=None, gpu_count=None))
    return path


def _ids(path: str, flt: h.Filters | None = None, **kw: Any) -> list[str]:
    r = _reader(path)
    try:
        return [row.id for row in h.history(r, flt or h.Filters(), now=NOW, **kw)]
    finally:
        r.close()


def test_history_newest_first_by_default(jobs: str) -> None:
    assert _ids(jobs) == ["j-d", "j-c", "j-b", "j-a"]
    assert _ids(jobs, descending=False) == ["j-a", "j-b", "j-c", "j-d"]
    assert _ids(jobs, limit=2) == ["j-d", "j-c"]


def test_history_filters(jobs: str) -> None:
    assert _ids(jobs, h.Filters(statuses=("failed", "queued"))) == ["j-d", "j-b"]
    assert _ids(jobs, h.Filters(methods=("qlora",))) == ["j-a"]
    assert _ids(jobs, h.Filters(providers=("runpod",))) == ["j-b"]
    # The repo id, or only its name after the org.
    assert _ids(jobs, h.Filters(models=("meta-llama/Llama-3.1-8B",))) == ["j-c"]
    assert _ids(jobs, h.Filters(models=("Llama-3.1-8B",))) == ["j-c"]
    assert _ids(jobs, h.Filters(models=("3.1-8B",))) == []
    # H100 means both H100 variants in the catalog.
    assert _ids(jobs, h.Filters(gpus=("H100",))) == ["j-b", "j-a"]
    assert _ids(jobs, h.Filters(gpus=("h100 pcie",))) == ["j-b"]
    assert _ids(jobs, h.Filters(sweep="lr-grid")) == ["j-c", "j-b"]
    assert _ids(jobs, h.Filters(sweep="s-000000000001")) == ["j-c", "j-b"]
    assert _ids(jobs, h.Filters(since=NOW - timedelta(days=30))) == ["j-d", "j-c", "j-b"]
    assert _ids(jobs, h.Filters(since=NOW - timedelta(days=30),
                                until=NOW - timedelta(days=5))) == ["j-b"]


def test_history_filter_errors(jobs: str) -> None:
    with pytest.raises(h.HistoryError, match="--sweep nope: no sweep"):
        _ids(jobs, h.Filters(sweep="nope"))
    with pytest.raises(h.HistoryError, match="--status done: use one of queued"):
        _ids(jobs, h.Filters(statuses=("done",)))
    with pytest.raises(h.HistoryError, match="is not before --until"):
        _ids(jobs, h.Filters(since=NOW, until=NOW - timedelta(days=1)))
    with pytest.raises(h.HistoryError, match="--sort size: use one of created"):
        _ids(jobs, sort="size")


def test_history_sorting(jobs: str) -> None:
    assert _ids(jobs, sort="cost") == ["j-c", "j-a", "j-b", "j-d"]
    assert _ids(jobs, sort="cost", descending=False) == ["j-d", "j-b", "j-a", "j-c"]
    # A job that never started has no duration: last in both directions.
    assert _ids(jobs, sort="duration") == ["j-c", "j-b", "j-a", "j-d"]
    assert _ids(jobs, sort="duration", descending=False)[-1] == "j-d"
    assert _ids(jobs, sort="status", descending=False) == ["j-b", "j-d", "j-a", "j-c"]


def test_history_row_values(jobs: str) -> None:
    r = _reader(jobs)
    rows = {row.id: row for row in h.history(r, h.Filters(), now=NOW)}
    r.close()
    c = rows["j-c"]
    assert c.duration_s == 10 * 3600 - 300
    assert c.to_dict()["cost"] == "9.000000"
    assert c.to_dict()["created_at"] == "2026-11-30T12:00:00.000000Z"
    assert rows["j-d"].duration_s is None and rows["j-d"].provider is None


def test_missing_database_is_an_empty_history(tmp_path: Path) -> None:
    assert h.open_reader(f"sqlite:///{tmp_path / 'none.db'}") is None
    assert h.history(None, h.Filters()) == []
    assert not (tmp_path / "none.db").exists()


# --- cost rollups ------------------------------------------------------------------------


@pytest.fixture
def costs(db: tuple[Store, str]) -> str:
    store, path = db
    t1 = datetime(2026, 10, 15, tzinfo=UTC)
    t2 = datetime(2026, 11, 20, tzinfo=UTC)
    _add(store,
         # October: one on-demand H100 SXM job (2 GPUs, 3 h) on runpod.
         _job("j-1", t1, provider="runpod", cost_micros=12_000_000),
         _inst("j-1", t1, t1 + timedelta(hours=3), provider="runpod", gpu_count=2,
               cost_micros=12_000_000),
         # November: a spot A100 job interrupted once (1 h + 2 h) on vastai...
         _job("j-2", t2, gpu="A100 80GB", interruptible=True, cost_micros=600_000),
         _inst("j-2", t2, t2 + timedelta(hours=1), gpu="A100 80GB", interruptible=True,
               price_per_hour_micros=200_000, cost_micros=200_000, end_reason="interrupted"),
         _inst("j-2", t2 + timedelta(hours=1), t2 + timedelta(hours=3), gpu="A100 80GB",
               interruptible=True, price_per_hour_micros=200_000, cost_micros=400_000),
         # ... a spot RTX 3090 job still running (no on-demand price in the catalog) ...
         _job("j-3", t2, gpu="RTX 3090", interruptible=True, status="training"),
         _inst("j-3", NOW - timedelta(hours=4), None, gpu="RTX 3090", interruptible=True,
               price_per_hour_micros=74_000),
         # ... and a job on a monthly server: no cost, an amortised share.
         _job("j-4", t2, provider="dedicated", billing="monthly", amortised_micros=3_000_000),
         _inst("j-4", t2, t2 + timedelta(hours=1), provider="dedicated", billing="monthly",
               price_per_hour_micros=0, amortised_micros=3_000_000))
    return path


PRICES = {"A100 80GB": Decimal("0.468"), "H100 SXM": Decimal("2.5")}


def _cost(path: str, **kw: Any) -> list[h.CostRow]:
    r = _reader(path)
    try:
        return h.cost_rollup(r, now=NOW, prices=PRICES, **kw)
    finally:
        r.close()


def test_cost_by_month(costs: str) -> None:
    oct_, nov = _cost(costs, when="month", dim=None)
    assert (oct_.bucket, oct_.jobs, oct_.gpu_seconds, oct_.cost_micros) == (
        "2026-10", 1, 6 * 3600, 12_000_000)
    assert oct_.savings_micros is None  # no spot hours
    assert (nov.bucket, nov.jobs, nov.cost_micros, nov.amortised_micros) == (
        "2026-11", 3, 600_000, 3_000_000)
    # A100 3 h + RTX 3090 4 h so far (open: until now) + dedicated 1 h.
    assert nov.gpu_seconds == (3 + 4 + 1) * 3600
    # Spot A100: 3 GPU-h at $0.468 on-demand = $1.404, charged $0.60. The RTX 3090 has no
    # on-demand price: no figure for it, and it is named.
    assert nov.savings_micros == 1_404_000 - 600_000
    assert nov.unpriced_gpus == {"RTX 3090"}
    t = h.total([oct_, nov])
    assert (t.jobs, t.cost_micros, t.savings_micros) == (4, 12_600_000, 804_000)
    assert nov.to_dict()["spot_savings"] == "0.804000"


def test_cost_by_month_and_provider_and_iso_weeks(costs: str) -> None:
    rows = _cost(costs, when="month", dim="provider")
    assert [(r.bucket, r.key, r.jobs) for r in rows] == [
        ("2026-10", "runpod", 1), ("2026-11", "vastai", 2), ("2026-11", "dedicated", 1)]
    by_gpu = {r.key: r for r in _cost(costs, when=None, dim="gpu")}
    assert by_gpu["H100 SXM"].jobs == 2 and by_gpu["RTX 3090"].savings_micros is None
    weeks = _cost(costs, when="week", dim=None)
    assert [r.bucket for r in weeks] == ["2026-W42", "2026-W47"]
    assert [r.bucket for r in _cost(costs, when="day", dim=None,
                                    since=datetime(2026, 11, 1, tzinfo=UTC))] == ["2026-11-20"]


def test_iso_week_buckets_across_new_year() -> None:
    assert h._bucket("2026-12-31", "week") == "2026-W53"
    assert h._bucket("2027-01-03", "week") == "2026-W53"
    assert h._bucket("2027-01-04", "week") == "2027-W01"


def test_split_by() -> None:
    assert h.split_by(["month", "provider"]) == ("month", "provider")
    assert h.split_by(["GPU"]) == (None, "gpu")
    with pytest.raises(h.HistoryError, match="--by month --by week: give at most one"):
        h.split_by(["month", "week"])
    with pytest.raises(h.HistoryError, match="--by year: use day, week, month"):
        h.split_by(["year"])


def test_on_demand_prices_come_from_the_catalog() -> None:
    prices = h.on_demand_prices()
    assert prices["A100 80GB"] == Decimal("0.468")
    assert "RTX 3090" not in prices  # spot only in the catalog


# --- views -------------------------------------------------------------------------------


def _raw(url: str, sql: str) -> list[tuple[Any, ...]]:
    """Plain SQL as a user at the shell would run it (sqlite3, or psql's driver)."""
    path = url.removeprefix("sqlite:///")
    if path != url:
        con = sqlite3.connect(path)
        try:
            return con.execute(sql).fetchall()
        finally:
            con.close()
    from sqlalchemy import create_engine

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return [tuple(row) for row in conn.exec_driver_sql(sql)]
    finally:
        engine.dispose()


def test_cost_view_agrees_with_cost_rollup(costs: str) -> None:
    view = _raw(costs, "SELECT month, provider, jobs, cost_micros, amortised_micros "
                       "FROM v_cost_per_month_provider ORDER BY month, provider")
    rows = _cost(costs, when="month", dim="provider")
    assert view == sorted((r.bucket, r.key, r.jobs, r.cost_micros, r.amortised_micros)
                          for r in rows)


def test_gpu_hours_and_interruption_views(costs: str) -> None:
    [(model, jobs, instances, gpu_hours)] = _raw(
        costs, "SELECT base_model, jobs, instances, gpu_hours FROM v_gpu_hours_per_model")
    assert (model, jobs, instances) == ("Qwen/Qwen2.5-7B", 4, 5)
    # 6 + 3 + 1 closed GPU-hours, and the open RTX 3090 counted until the real now.
    assert gpu_hours > 10
    rows = _raw(costs, "SELECT provider, jobs, instances, interrupted_instances "
                       "FROM v_interruptions_per_provider ORDER BY provider")
    assert rows == [("dedicated", 1, 1, 0), ("runpod", 1, 1, 0), ("vastai", 2, 3, 1)]


def test_best_run_per_sweep_view(db: tuple[Store, str]) -> None:
    store, path = db
    hi = Sweep(id="s-00000000000a", name="hi", created_at=NOW,
               spec_json=json.dumps({"objective": {"metric": "eval.exact_match",
                                                   "goal": "max"}}))
    lo = Sweep(id="s-00000000000b", name="lo", created_at=NOW,
               spec_json=json.dumps({"objective": {"metric": "eval.loss", "goal": "min"}}))
    none = Sweep(id="s-00000000000c", name="no-objective", spec_json="{}", created_at=NOW)
    rows: list[Any] = [hi, lo, none]
    for n, (sweep, status) in enumerate([(hi, "succeeded"), (hi, "succeeded"), (hi, "failed"),
                                         (lo, "succeeded"), (lo, "succeeded"),
                                         (lo, "succeeded")]):
        rows.append(_job(f"j-{n}", NOW, sweep_id=sweep.id, status=status))
    # j-1 was evaluated twice (0.9, then 0.6): one row per (job, name, step) since 0006, and
    # Store.add_metrics keeps the latest.
    metric = [("j-0", "eval.exact_match", 0.7, None),
              ("j-1", "eval.exact_match", 0.6, None),
              ("j-0", "eval.exact_match", 0.99, 100),  # a step metric is not final
              ("j-2", "eval.exact_match", 1.0, None),  # failed jobs never win
              ("j-3", "eval.loss", 0.5, None), ("j-4", "eval.loss", 0.3, None),
              # a diverged run's `nan` is NULL (0014), which SQLite sorts before any number
              ("j-5", "eval.loss", None, None)]
    rows += [Metric(job_id=j, name=name, value=v, step=step, at=NOW)
             for j, name, v, step in metric]
    _add(store, *rows)
    assert _raw(path, "SELECT sweep_name, metric, goal, job_id, value "
                      "FROM v_best_run_per_sweep ORDER BY sweep_name") == [
        ("hi", "eval.exact_match", "max", "j-0", 0.7), ("lo", "eval.loss", "min", "j-4", 0.3)]


def test_migration_creates_the_views_and_downgrades_cleanly(db: tuple[Store, str]) -> None:
    from alembic import command
    from alembic.config import Config

    store, path = db
    views = {r[0] for r in _raw(path, "SELECT name FROM sqlite_master WHERE type='view'")}
    assert views == {"v_cost_per_month_provider", "v_best_run_per_sweep",
                     "v_gpu_hours_per_model", "v_interruptions_per_provider"}
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(__file__).parent.parent / "migrations"))
    with store.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0002")
    assert _raw(path, "SELECT name FROM sqlite_master WHERE type='view' OR name LIKE "
                      "'ix_job_%_created_at'") == []
    with store.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")
    assert len(_raw(path, "SELECT name FROM sqlite_master WHERE type='view'")) == 4


# --- read-only SQL -----------------------------------------------------------------------


def test_sql_reads(jobs: str) -> None:
    url = jobs
    res = h.run_sql(url, "SELECT status, count(*) AS n FROM job GROUP BY status ORDER BY 1;")
    assert res.columns == ("status", "n")
    assert res.rows == [("failed", 1), ("queued", 1), ("succeeded", 2)]
    assert h.run_sql(url, "SELECT ';' AS semi -- trailing; comment").rows == [(";",)]
    assert h.run_sql(url, "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c "
                          "WHERE x < 3) SELECT sum(x) FROM c").rows == [(6,)]
    assert h.run_sql(url, "SELECT count(*) FROM v_best_run_per_sweep").rows == [(0,)]


@pytest.mark.parametrize("sql", [
    "DELETE FROM job",
    "UPDATE job SET cost_micros = 0",
    "INSERT INTO sweep (id, name, spec_json, created_at) VALUES ('s', 's', '{}', 'x')",
    "DROP TABLE job",
    "CREATE TABLE t (x)",
    "CREATE TEMP TABLE t AS SELECT 1",
    "PRAGMA query_only=OFF",
    "ATTACH DATABASE ':memory:' AS m",
    "WITH x AS (SELECT 1) DELETE FROM job",
    "BEGIN IMMEDIATE",
    "VACUUM",
])
def test_sql_refuses_writes(jobs: str, sql: str) -> None:
    before = _raw(jobs, "SELECT id, cost_micros FROM job ORDER BY id")
    with pytest.raises(h.ReadOnlyError, match="read-only|one statement"):
        h.run_sql(jobs, sql)
    assert _raw(jobs, "SELECT id, cost_micros FROM job ORDER BY id") == before


def test_sql_refuses_several_statements(jobs: str) -> None:
    with pytest.raises(h.ReadOnlyError, match="one statement at a time"):
        h.run_sql(jobs, "SELECT 1; DELETE FROM job")
    assert _raw(jobs, "SELECT count(*) FROM job") == [(4,)]


@pytest.mark.parametrize(("sql", "name"), [
    ("SELECT fts3_tokenizer('simple')", "fts3_tokenizer"),  # a native pointer (issue 23 §8)
    ("SELECT load_extension('/tmp/evil.so')", "load_extension"),
    ("SELECT length(randomblob(1000000000))", "randomblob"),
    ("SELECT count(*) FROM job WHERE id <> hex(zeroblob(1000000000))", "zeroblob"),
])
def test_sql_runs_only_allow_listed_functions(jobs: str, sql: str, name: str) -> None:
    with pytest.raises(h.QueryError, match=f"does not run the function {name}\\(\\)"):
        h.run_sql(jobs, sql)
    # SQLite's ordinary functions (and those of orch's views) still run.
    assert h.run_sql(jobs, "SELECT json_extract('{\"a\": 1}', '$.a'), round(2.25, 1), "
                           "strftime('%Y', '2026-01-02'), '{\"b\": 2}' ->> '$.b', "
                           "coalesce(NULL, upper('x')), "
                           "(SELECT count(*) FROM v_best_run_per_sweep)").rows == [
        (1, 2.3, "2026", 2, "X", 0)]


def test_sql_stops_a_query_that_runs_too_long(jobs: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCH_SQL_TIMEOUT_S", "1")
    with pytest.raises(h.QueryError, match="ran longer than 1s and was stopped"):
        h.run_sql(jobs, "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
                        "SELECT max(x) FROM c")


def test_sql_bounds_the_rows(jobs: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCH_SQL_MAX_ROWS", "3")
    with pytest.raises(h.QueryError, match="more than 3 rows: add a LIMIT"):
        h.run_sql(jobs, "SELECT id FROM job")
    assert len(h.run_sql(jobs, "SELECT id FROM job LIMIT 3").rows) == 3
    monkeypatch.setenv("ORCH_SQL_MAX_ROWS", "lots")
    with pytest.raises(SettingsError, match="ORCH_SQL_MAX_ROWS='lots': must be a whole number"):
        h.run_sql(jobs, "SELECT id FROM job")


def test_sql_errors_are_clear(tmp_path: Path, jobs: Path) -> None:
    with pytest.raises(h.HistoryError, match="no orch database at"):
        h.run_sql(f"sqlite:///{tmp_path / 'missing.db'}", "SELECT 1")
    assert not (tmp_path / "missing.db").exists()
    with pytest.raises(h.HistoryError, match="query failed: no such column: nope"):
        h.run_sql(jobs, "SELECT nope FROM job")
    with pytest.raises(h.ReadOnlyError, match="needs a query"):
        h.run_sql(jobs, " ; ")


WRITER = textwrap.dedent("""
    import sys, time
    from datetime import timedelta
    from pathlib import Path
    from orchestrator.records.store import Event, Job, open_store, utcnow
    store = open_store(sys.argv[1])
    stop = Path(sys.argv[2])
    print("ready", flush=True)
    sys.stdin.readline()
    n, worst = 0, 0.0
    while not stop.exists():
        t = time.monotonic()
        with store.transaction() as s:  # a job and its two events: all or nothing
            now = utcnow()
            s.add(Job(id=f"j-w{n:010d}", name="w", status="queued", method="lora",
                      base_model="m", spec_json="{}", spec_hash="c" * 64,
                      created_at=now, updated_at=now))
            s.flush()
            s.add(Event(job_id=f"j-w{n:010d}", kind="a", message=""))
            s.add(Event(job_id=f"j-w{n:010d}", kind="b", message=""))
        worst = max(worst, time.monotonic() - t)
        print(f"commit {time.time()!r}", flush=True)
        n += 1
        time.sleep(0.02)
    print(f"worst {worst!r}", flush=True)
""")


def test_long_read_does_not_block_a_writer_process_or_see_half_writes(
        db: tuple[Store, str], tmp_path: Path) -> None:
    _store, path = db
    stop = tmp_path / "stop"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, path, str(stop)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert writer.stdin is not None and writer.stdout is not None
    try:
        assert writer.stdout.readline().strip() == "ready"
        writer.stdin.write("go\n")
        writer.stdin.flush()
        # Some writes land before the read's snapshot: wait for the first commit, not a time.
        first = writer.stdout.readline().split()
        assert first[0] == "commit", first
        # Count jobs, then spin through a long recursive CTE, then count events: one
        # snapshot means events == 2 x jobs however many commits happen meanwhile.
        sql = ("SELECT (SELECT count(*) FROM job), (SELECT sum(x) FROM (WITH RECURSIVE "
               "c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 3000000) "
               "SELECT x FROM c)), (SELECT count(*) FROM event)")
        result: dict[str, Any] = {}

        def read() -> None:
            result["start"] = time.time()
            result["rows"] = h.run_sql(path, sql).rows
            result["end"] = time.time()

        reader = threading.Thread(target=read)
        reader.start()
        reader.join(120)
        stop.touch()
        out, _ = writer.communicate(timeout=60)
    finally:
        if writer.poll() is None:
            writer.kill()
    lines = [*first, *out.split()]
    commits = [float(lines[i + 1]) for i, w in enumerate(lines) if w == "commit"]
    worst = float(lines[lines.index("worst") + 1])
    [(njobs, _, nevents)] = result["rows"]
    assert njobs > 0 and nevents == 2 * njobs
    # The writer kept committing while the read ran, never waiting long for a lock.
    assert any(result["start"] < c < result["end"] for c in commits)
    assert worst < 5.0


# --- CLI ---------------------------------------------------------------------------------


@pytest.fixture
def cli(jobs: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("ORCH_DB_URL", jobs)
    app = typer.Typer()
    register(app)
    runner = CliRunner()
    return lambda *args: runner.invoke(app, list(args))


def test_cli_history_table_json_csv(cli: Any) -> None:
    res = cli("history", "--status", "succeeded", "--sort", "cost", "--asc")
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0].split()[:3] == ["id", "name", "status"]
    assert lines[1].split()[0] == "j-a" and "$5.00" in lines[1] and "H100 SXM x1" in lines[1]
    data = json.loads(cli("history", "--json", "--gpu", "A100").output)
    assert [d["job_id"] for d in data] == ["j-c"] and data[0]["cost"] == "9.000000"
    out = cli("history", "--csv", "--provider", "runpod").output.splitlines()
    assert out[0].startswith("job_id,name,status,method,model,provider,gpu,gpu_count,spot,cost")
    assert out[1].startswith("j-b,j-b,failed,lora,Qwen/Qwen2.5-7B,runpod,H100 PCIe,1,false,")


def test_cli_history_bad_flags(cli: Any) -> None:
    res = cli("history", "--since", "3x")
    assert res.exit_code == 2
    assert "--since 3x: use an ISO date like 2026-11-01" in res.output
    res = cli("history", "--sweep", "nope")
    assert res.exit_code == 2 and "--sweep nope" in res.output


def test_cli_cost(cli: Any) -> None:
    res = cli("cost", "--by", "month", "--by", "provider", "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["by"] == ["month", "provider"]
    assert data["total"]["jobs"] == 4 and data["total"]["cost"] == "15.000000"
    res = cli("cost", "--by", "month")
    assert res.exit_code == 0 and "total" in res.output and "amortised" in res.output
    assert cli("cost", "--by", "year").exit_code == 2


def test_cli_sql(cli: Any) -> None:
    res = cli("sql", "SELECT id, cost_micros FROM job ORDER BY id LIMIT 2")
    assert res.exit_code == 0
    # Not a terminal: tab-separated, header first (aligned columns are for a TTY).
    assert res.output.splitlines()[:3] == ["id\tcost_micros", "j-a\t5000000", "j-b\t1000000"]
    assert json.loads(cli("sql", "--json", "SELECT 1 AS one").output) == {
        "columns": ["one"], "rows": [[1]]}
    res = cli("sql", "DELETE FROM job")
    assert res.exit_code == 2 and "read-only" in res.output
    res = cli("sql", "SELECT fts3_tokenizer('simple')")  # SQLite: refused; PostgreSQL: none
    assert res.exit_code == 2 and "fts3_tokenizer" in res.output


def test_history_commands_do_not_import_sqlalchemy(jobs: str) -> None:
    code = textwrap.dedent(f"""
        import os, sys, typer
        os.environ["ORCH_DB_URL"] = {jobs!r}
        from orchestrator.cli.history import register
        app = typer.Typer(); register(app)
        for args in (["history"], ["cost", "--by", "month"], ["sql", "SELECT 1"]):
            try:
                app(args)
            except SystemExit as exc:
                assert not exc.code, (args, exc.code)
        print("sqlalchemy" in sys.modules, "sqlmodel" in sys.modules, file=sys.stderr)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stderr.strip().splitlines()[-1] == "False False"
