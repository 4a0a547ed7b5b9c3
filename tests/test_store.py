"""The SQLite store on real database files: schema, migrations, money, time, atomicity."""

from __future__ import annotations

import json
import multiprocessing
import re
import sqlite3
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta, timezone
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path
from typing import Any

import pytest
from conftest import BACKENDS, database_url
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import event as sa_event
from sqlalchemy.exc import IntegrityError, StatementError
from sqlmodel import SQLModel, select

from orchestrator.records import store as store_mod
from orchestrator.records.store import (
    SCHEMA_HEAD,
    AlreadyExists,
    Event,
    InvalidValueError,
    Job,
    NotFoundError,
    Server,
    ServerBusyError,
    Store,
    StoreError,
    UTCDateTime,
    default_db_url,
    from_micros,
    open_store,
    to_micros,
    utcnow,
)

TIME_RE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
SPEC = json.dumps({"base_model": "Qwen/Qwen2.5-7B", "method": "lora"}, sort_keys=True)
SPEC_HASH = "a" * 64


def _url(path: Path) -> str:
    return f"sqlite:///{path}"


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "orch.db"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # Tests that read the SQLite file directly (db_path) run on SQLite only; the rest run on
    # both backends.
    if "store" in metafunc.fixturenames and "db_path" not in metafunc.fixturenames:
        metafunc.parametrize("store", BACKENDS, indirect=True)


@pytest.fixture
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    backend = getattr(request, "param", "sqlite")
    s = open_store(database_url(backend, tmp_path, request))
    yield s
    s.close()


def _job_kwargs(**over: Any) -> dict[str, Any]:
    kwargs: dict[str, Any] = dict(
        name="qwen-lora",
        status="queued",
        method="lora",
        base_model="Qwen/Qwen2.5-7B",
        spec_json=SPEC,
        spec_hash=SPEC_HASH,
        placement={"chosen": {"provider": "vastai", "gpu": "H100"}, "alternatives": []},
        provider="vastai",
        gpu="H100",
        gpu_count=1,
        billing="per_second",
        interruptible=True,
        est_hours=2.5,
        est_cost=Decimal("4.125"),
        event_kind="planned",
        event_message="planned on vastai H100 x1",
        event_data={"rank": 1},
    )
    kwargs.update(over)
    return kwargs


def _raw(db_path: Path, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    # The sqlite3 module, as a user at the shell would see the file.
    conn = sqlite3.connect(db_path)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def _run_python(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    return done.stdout.strip()


# --- opening and migrations ---------------------------------------------------------------


def test_open_creates_parent_dirs_and_file_in_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "orch.db"
    s = open_store(_url(path))
    try:
        assert path.is_file()
        assert _raw(path, "PRAGMA journal_mode") == [("wal",)]
        with s.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 10_000
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert _raw(path, "SELECT version_num FROM alembic_version") == [(SCHEMA_HEAD,)]
    finally:
        s.close()


def test_schema_head_constant_matches_alembic_head() -> None:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    cfg = Config()
    cfg.set_main_option("script_location", str(store_mod.migrations_dir()))
    assert ScriptDirectory.from_config(cfg).get_heads() == [SCHEMA_HEAD]


def test_migrated_schema_matches_models(store: Store) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    with store.engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_server_default": True})
        assert compare_metadata(ctx, SQLModel.metadata) == []


def test_schema_comparison_notices_drift(store: Store, db_path: Path) -> None:
    # Guards the test above against passing vacuously.
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    _raw(db_path, "DROP INDEX ix_job_status")
    with store.engine.connect() as conn:
        diffs = compare_metadata(MigrationContext.configure(conn), SQLModel.metadata)
    assert [(d[0], d[1].name) for d in diffs] == [("add_index", "ix_job_status")]


def test_migration_creates_exactly_the_documented_tables_and_indexes(
    store: Store, db_path: Path
) -> None:
    tables = {r[0] for r in _raw(db_path, "SELECT name FROM sqlite_master WHERE type='table'")}
    assert tables - {"sqlite_sequence"} == {
        "alembic_version",
        "job",
        "event",
        "instance",
        "server",
        "sweep",
        "metric",
        "price_observation",
        "throughput_observation",
        "warm_instance",
        "sweep_rung",
        "host_observation",
    }
    indexes = {
        (r[0], r[1])
        for r in _raw(
            db_path,
            "SELECT tbl_name, name FROM sqlite_master WHERE type='index' AND sql IS NOT NULL",
        )
    }
    assert indexes == {
        ("job", "ix_job_status"),
        ("job", "ix_job_created_at"),
        ("job", "ix_job_sweep_id"),
        ("job", "ix_job_spec_hash"),
        ("job", "uq_job_sweep_key"),
        ("job", "ix_job_provider_created_at"),
        ("job", "ix_job_gpu_created_at"),
        ("job", "ix_job_method_created_at"),
        ("job", "ix_job_base_model_created_at"),
        ("job", "ix_job_finished_at"),
        ("job", "ix_job_created_at_cost"),
        ("job", "ix_job_id_created_at"),
        ("job", "ix_job_queued_head"),
        ("job", "uq_job_sweep_trial"),
        ("event", "ix_event_job_id_at"),
        ("instance", "ix_instance_provider_instance"),
        ("instance", "ix_instance_job_id"),
        ("instance", "ix_instance_provider_gpu_created_at"),
        ("metric", "ix_metric_job_id_name"),
        ("metric", "uq_metric_job_name_step"),
        ("price_observation", "ix_price_observation_provider_gpu_observed_at"),
        ("throughput_observation", "ix_throughput_observation_key"),
        ("warm_instance", "ix_warm_instance_state"),
        ("warm_instance", "ix_warm_instance_provider_instance"),
        ("host_observation", "ix_host_observation_machine"),
    }


def test_reopen_does_not_run_migrations_or_import_alembic(db_path: Path) -> None:
    code = (
        "import sys; from orchestrator.records.store import open_store; "
        f"open_store({_url(db_path)!r}); print('alembic' in sys.modules)"
    )
    assert _run_python(code) == "True"  # fresh file: migrated
    schema = _raw(db_path, "SELECT type, name, sql FROM sqlite_master ORDER BY name")
    version = _raw(db_path, "SELECT version_num FROM alembic_version")
    schema_cookie = _raw(db_path, "PRAGMA schema_version")

    assert _run_python(code) == "False"  # at head: plain SELECT only
    assert _raw(db_path, "SELECT version_num FROM alembic_version") == version == [(SCHEMA_HEAD,)]
    assert _raw(db_path, "SELECT type, name, sql FROM sqlite_master ORDER BY name") == schema
    assert _raw(db_path, "PRAGMA schema_version") == schema_cookie


def test_importing_the_store_stays_light() -> None:
    heavy = ["alembic", "fabric", "paramiko", "httpx", "rich", "typer"]
    code = (f"import sys, orchestrator.records.store; "
            f"print([m for m in {heavy!r} if m in sys.modules])")
    assert _run_python(code) == "[]"


def test_database_from_a_newer_orch_gives_a_clear_error(db_path: Path) -> None:
    open_store(_url(db_path)).close()
    conn = sqlite3.connect(db_path)
    conn.execute("UPDATE alembic_version SET version_num = '9999'")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="upgrade orch"):
        open_store(_url(db_path))


def test_unopenable_database_is_a_clear_error(tmp_path: Path) -> None:
    # A directory where the file should be: SQLite cannot open it.
    with pytest.raises(StoreError, match="cannot open the database .*writable file"):
        open_store(_url(tmp_path))


def _open_at(url: str, barrier: Any) -> None:
    barrier.wait()
    open_store(url).close()


def test_two_processes_opening_a_fresh_database_both_succeed(db_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_open_at, args=(_url(db_path), barrier)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    assert _raw(db_path, "SELECT version_num FROM alembic_version") == [(SCHEMA_HEAD,)]


# --- default URL --------------------------------------------------------------------------


def test_default_db_url_prefers_orch_db_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCH_DB_URL", "postgresql://orch@db/orch")
    monkeypatch.setenv("XDG_DATA_HOME", "/data")
    assert default_db_url() == "postgresql://orch@db/orch"


def test_default_db_url_honours_xdg_data_home(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("ORCH_DB_URL", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_db_url() == f"sqlite:///{tmp_path}/xdg/orch/orch.db"


def test_default_db_url_falls_back_to_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("ORCH_DB_URL", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    expected = f"sqlite:///{tmp_path}/.local/share/orch/orch.db"
    assert default_db_url() == expected
    # The XDG spec says a relative XDG_DATA_HOME is invalid and must be ignored.
    monkeypatch.setenv("XDG_DATA_HOME", "relative/dir")
    assert default_db_url() == expected


def test_open_store_without_url_uses_the_default(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("ORCH_DB_URL", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    open_store().close()
    assert (tmp_path / "orch" / "orch.db").is_file()


# --- servers ------------------------------------------------------------------------------


def _add(store: Store, name: str, price: str = "2190.00") -> Server:
    return store.add_server(name, "10.0.0.5", 22, "root", "H100", 8, Decimal(price))


def test_server_add_list_remove(store: Store) -> None:
    added = _add(store, "box-b")
    _add(store, "box-a", "0.074")
    # Detached objects: readable after their session closed.
    assert added.id is not None and added.status == "idle" and added.gpu_count == 8
    assert [s.name for s in store.list_servers()] == ["box-a", "box-b"]
    store.remove_server("box-a")
    assert [s.name for s in store.list_servers()] == ["box-b"]


def test_duplicate_server_says_how_to_fix(store: Store) -> None:
    _add(store, "x")
    with pytest.raises(AlreadyExists, match=r"server 'x' already exists; .*orch servers remove x"):
        _add(store, "x")
    assert len(store.list_servers()) == 1


def test_removing_unknown_server_is_a_clear_error(store: Store) -> None:
    with pytest.raises(NotFoundError, match=r"server 'nope' not found; .*orch servers list"):
        store.remove_server("nope")


def test_busy_server_cannot_be_removed_and_is_not_idle(store: Store) -> None:
    _add(store, "busy-box")
    _add(store, "off-box")
    _add(store, "free-box")
    with store.transaction() as session:
        for server in session.exec(select(Server)):
            server.status = {"busy-box": "busy", "off-box": "disabled"}.get(server.name, "idle")
    with pytest.raises(ServerBusyError, match="busy"):
        store.remove_server("busy-box")
    assert [s.name for s in store.idle_servers()] == ["free-box"]
    assert len(store.list_servers()) == 3


def test_server_arguments_are_checked(store: Store) -> None:
    with pytest.raises(InvalidValueError, match="port"):
        store.add_server("p", "h", 0, "root", "H100", 1, Decimal("1"))
    with pytest.raises(InvalidValueError, match="gpu_count"):
        store.add_server("p", "h", 22, "root", "H100", 0, Decimal("1"))
    with pytest.raises(InvalidValueError, match="monthly price"):
        store.add_server("p", "h", 22, "root", "H100", 1, Decimal("-1"))
    with pytest.raises(TypeError):
        store.add_server("p", "h", 22, "root", "H100", 1, 2190.0)  # type: ignore[arg-type]
    assert store.list_servers() == []


# --- money --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("amount", "micros"),
    [
        (Decimal("2190.00"), 2_190_000_000),
        (Decimal("0.074"), 74_000),
        (Decimal("0.000001"), 1),
        (Decimal("0"), 0),
        (Decimal("12345678901.234567"), 12_345_678_901_234_567),
        (3, 3_000_000),
    ],
)
def test_money_round_trips_exactly(amount: Decimal | int, micros: int) -> None:
    assert to_micros(amount) == micros
    assert from_micros(micros) == amount


@given(st.decimals(min_value=-(10**12), max_value=10**12, places=6, allow_nan=False))
def test_money_round_trip_property(amount: Decimal) -> None:
    assert from_micros(to_micros(amount)) == amount


def test_money_refuses_floats_and_silent_rounding() -> None:
    with pytest.raises(TypeError):
        to_micros(0.074)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        from_micros(74000.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        to_micros(True)
    with pytest.raises(InvalidValueError, match="finer than one micro-dollar"):
        to_micros(Decimal("0.0000001"))
    with pytest.raises(InvalidValueError):
        to_micros(Decimal("NaN"))
    assert to_micros(Decimal("0.0000015"), rounding=ROUND_HALF_EVEN) == 2


def test_money_is_stored_as_integer_micros(store: Store, db_path: Path) -> None:
    _add(store, "a", "2190.00")
    _add(store, "b", "0.074")
    rows = _raw(
        db_path,
        "SELECT name, monthly_price_micros, typeof(monthly_price_micros) FROM server ORDER BY name",
    )
    assert rows == [("a", 2_190_000_000, "integer"), ("b", 74_000, "integer")]
    prices = {s.name: from_micros(s.monthly_price_micros) for s in store.list_servers()}
    assert prices == {"a": Decimal("2190.00"), "b": Decimal("0.074")}


# --- time ---------------------------------------------------------------------------------


def test_naive_datetime_is_rejected(store: Store) -> None:
    naive = datetime(2025, 1, 1, 12, 0, 0)
    with pytest.raises(ValueError, match="naive datetime"):
        UTCDateTime().process_bind_param(naive, store.engine.dialect)
    with pytest.raises(StatementError, match="naive datetime"):
        with store.transaction() as session:
            session.add(
                Job(
                    name="n",
                    status="queued",
                    method="lora",
                    base_model="m",
                    spec_json="{}",
                    spec_hash=SPEC_HASH,
                    created_at=naive,
                )
            )
    assert store.list_jobs() == []


def test_times_are_fixed_width_utc_text(store: Store, db_path: Path) -> None:
    job = store.create_job(**_job_kwargs())
    plus_two = timezone(timedelta(hours=2))
    with store.transaction() as session:
        row = session.get(Job, job.id)
        assert row is not None
        row.started_at = datetime(2025, 3, 1, 14, 0, 0, tzinfo=plus_two)
    ((created, started),) = _raw(db_path, "SELECT created_at, started_at FROM job")
    assert TIME_RE.match(created)
    assert started == "2025-03-01T12:00:00.000000Z"
    back = store.get_job(job.id)
    assert back.started_at == datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)
    assert back.started_at is not None and back.started_at.utcoffset() == timedelta(0)
    assert back.created_at.tzinfo is not None


# --- jobs and events ----------------------------------------------------------------------


def test_create_job_writes_job_and_first_event(store: Store, db_path: Path) -> None:
    job = store.create_job(**_job_kwargs())
    assert re.fullmatch(r"j-[0-9a-f]{12}", job.id)
    got = store.get_job(job.id)
    assert got.status == "queued" and got.attempt == 0 and got.cost_micros == 0
    assert got.est_cost_micros == 4_125_000
    assert json.loads(got.placement_json or "") == _job_kwargs()["placement"]
    (ev,) = store.events(job.id)
    assert (ev.kind, ev.message, json.loads(ev.data_json or "")) == (
        "planned",
        "planned on vastai H100 x1",
        {"rank": 1},
    )
    assert ev.at == got.created_at
    assert _raw(db_path, "SELECT typeof(interruptible), interruptible FROM job") == [("integer", 1)]


def _count(db_path: Path, table: str) -> int:
    return int(_raw(db_path, f"SELECT count(*) FROM {table}")[0][0])


def test_create_job_is_atomic_when_the_event_cannot_be_serialised(
    store: Store, db_path: Path
) -> None:
    statements: list[str] = []

    @sa_event.listens_for(store.engine, "before_cursor_execute")
    def _record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    with pytest.raises(TypeError):
        store.create_job(**_job_kwargs(event_data={"when": object()}))
    # The job INSERT really reached SQLite before the event part failed ...
    assert any(s.startswith("INSERT INTO job ") for s in statements)
    # ... and was rolled back with it.
    assert _count(db_path, "job") == 0
    assert _count(db_path, "event") == 0


def test_create_job_is_atomic_when_the_event_insert_fails(store: Store, db_path: Path) -> None:
    with pytest.raises(IntegrityError):
        store.create_job(**_job_kwargs(event_kind=None))
    assert _count(db_path, "job") == 0
    assert _count(db_path, "event") == 0


def test_create_job_checks_its_arguments(store: Store) -> None:
    with pytest.raises(InvalidValueError, match="unknown job status 'runing'"):
        store.create_job(**_job_kwargs(status="runing"))
    with pytest.raises(InvalidValueError, match="spec_hash"):
        store.create_job(**_job_kwargs(spec_hash="abc"))
    with pytest.raises(InvalidValueError, match="spec_json"):
        store.create_job(**_job_kwargs(spec_json="{not json"))
    with pytest.raises(TypeError):
        store.create_job(**_job_kwargs(est_cost=4.125))
    assert store.list_jobs() == []


def test_list_jobs_newest_first_with_limit_and_status(store: Store) -> None:
    ids = [store.create_job(**_job_kwargs(name=f"j{i}")).id for i in range(5)]
    store.create_job(**_job_kwargs(name="done", status="succeeded"))
    listed = store.list_jobs()
    assert [j.name for j in listed] == ["done", "j4", "j3", "j2", "j1", "j0"]
    assert [j.id for j in store.list_jobs(limit=2, status="queued")] == ids[:-3:-1]
    assert [j.name for j in store.list_jobs(status="succeeded")] == ["done"]
    assert store.list_jobs(status="failed") == []


def test_unknown_job_is_a_clear_error(store: Store) -> None:
    with pytest.raises(NotFoundError, match=r"job 'j-000000000000' not found; .*orch jobs"):
        store.get_job("j-000000000000")
    with pytest.raises(NotFoundError):
        store.events("j-000000000000")


def test_foreign_keys_are_enforced(store: Store) -> None:
    with pytest.raises(IntegrityError, match="(?i)foreign key"):
        with store.transaction() as session:
            session.add(Event(job_id="j-missing", kind="state", message="x"))


# --- concurrency --------------------------------------------------------------------------


def test_writer_waits_for_a_held_lock_instead_of_failing(store: Store, db_path: Path) -> None:
    blocker = sqlite3.connect(db_path, isolation_level=None, check_same_thread=False)
    blocker.execute("BEGIN IMMEDIATE")
    release = threading.Timer(0.5, blocker.execute, args=("COMMIT",))
    release.start()
    try:
        started = time.monotonic()
        _add(store, "waited")
        waited = time.monotonic() - started
    finally:
        release.join()
        blocker.close()
    assert waited >= 0.4
    assert [s.name for s in store.list_servers()] == ["waited"]


def _add_many(url: str, prefix: str, barrier: Any) -> None:
    s = open_store(url)
    barrier.wait()
    for i in range(20):
        s.add_server(f"{prefix}-{i:02d}", "10.0.0.1", 22, "root", "A100", 1, Decimal("999.99"))
    s.close()


def test_two_processes_write_concurrently(store: Store) -> None:
    url = str(store.engine.url)
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_add_many, args=(url, p, barrier)) for p in ("a", "b")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    names = [s.name for s in store.list_servers()]
    assert len(names) == 40
    assert names == sorted([f"a-{i:02d}" for i in range(20)] + [f"b-{i:02d}" for i in range(20)])


def test_utcnow_is_aware_utc() -> None:
    now = utcnow()
    assert now.tzinfo is UTC


# --- metrics are idempotent (issue 10 §4) ---------------------------------------------------


def _write(db_path: Path, sql: str, *params: Any) -> None:
    conn = sqlite3.connect(db_path)
    try:
        with conn:  # commits
            conn.execute(sql, params)
    finally:
        conn.close()


def test_metrics_are_one_row_per_job_name_and_step(store: Store, db_path: Path) -> None:
    job = store.create_job(**_job_kwargs())
    # A takeover re-reports training steps and re-runs the evaluation.
    for _ in range(2):
        store.add_metrics(job.id, {"train.loss": 1.5}, step=3)
        store.add_metrics(job.id, {"eval.contains": 0.5, "eval.count": 3.0})
    store.add_metrics(job.id, {"eval.contains": 0.75})
    rows = _raw(db_path, "SELECT name, step, value FROM metric ORDER BY name")
    assert rows == [("eval.contains", None, 0.75), ("eval.count", None, 3.0),
                    ("train.loss", 3, 1.5)]
    # The database itself refuses a duplicate, whoever writes it.
    with pytest.raises(sqlite3.IntegrityError):
        _write(db_path, "INSERT INTO metric (job_id, name, value, step, at) VALUES "
                      "(?, 'eval.count', 1.0, NULL, '2026-01-01T00:00:00.000000Z')", job.id)


def _migrate(store: Store, revision: str) -> None:
    """Run alembic down (a revision) or up ("head") on the store's database."""
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(store_mod.migrations_dir()))
    with store.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        if revision == "head":
            command.upgrade(cfg, "head")
        else:
            command.downgrade(cfg, revision)


def test_upgrade_to_0006_drops_duplicate_metrics_keeping_the_newest(store: Store,
                                                                    db_path: Path) -> None:
    job = store.create_job(**_job_kwargs())
    _migrate(store, "0005")
    at = "2026-01-01T00:00:00.000000Z"
    for value, step in ((1.0, None), (2.0, None), (3.0, 7), (4.0, 7), (5.0, 8)):
        _write(db_path, "INSERT INTO metric (job_id, name, value, step, at) VALUES "
                      "(?, 'm', ?, ?, ?)", job.id, value, step, at)
    _migrate(store, "head")
    assert _raw(db_path, "SELECT step, value FROM metric ORDER BY id") == [
        (None, 2.0), (7, 4.0), (8, 5.0)]


def test_upgrade_to_0014_keeps_metrics_and_their_unique_index(store: Store,
                                                                db_path: Path) -> None:
    # 0014 copies `metric` to drop a NOT NULL (SQLite's way); the copy loses the expression
    # index of 0006 unless the migration makes it again.
    job = store.create_job(**_job_kwargs())
    _migrate(store, "0013")
    with pytest.raises(sqlite3.IntegrityError, match="NOT NULL constraint failed: metric.value"):
        _write(db_path, "INSERT INTO metric (job_id, name, value, step, at) VALUES "
                      "(?, 'train.loss', NULL, 4, '2026-01-01T00:00:00.000000Z')", job.id)
    store.add_metrics(job.id, {"train.loss": 1.25}, step=3)
    _migrate(store, "head")
    assert _raw(db_path, "SELECT name, step, value FROM metric") == [("train.loss", 3, 1.25)]
    store.add_metrics(job.id, {"train.loss": float("nan")}, step=4)
    with pytest.raises(sqlite3.IntegrityError, match="UNIQUE"):
        _write(db_path, "INSERT INTO metric (job_id, name, value, step, at) VALUES "
                      "(?, 'train.loss', 2.0, 3, '2026-01-01T00:00:00.000000Z')", job.id)
    assert _raw(db_path, "SELECT step, value FROM metric ORDER BY step") == [(3, 1.25),
                                                                               (4, None)]


def test_upgrade_to_0014_nulls_what_was_stored_not_a_number(store: Store) -> None:
    # Before 0014 PostgreSQL's float8 kept a NaN metric, and any backend kept an event's bare
    # `NaN`/`Infinity` (json.dumps allowed them): the upgrade writes them as NULL / null.
    from sqlalchemy import text

    job = store.create_job(**_job_kwargs())
    _migrate(store, "0013")
    postgres = store.engine.dialect.name == "postgresql"
    with store.engine.begin() as conn:
        conn.execute(text("INSERT INTO event (job_id, at, kind, message, data_json) VALUES "
                          "(:j, '2026-01-01T00:00:00.000000Z', 'train.progress', 'nan', "
                          ":d)"), {"j": job.id, "d": '{"loss":NaN,"x":[1.5,-Infinity],'
                                                   '"note":"NaN in text"}'})
        if postgres:
            conn.execute(text("INSERT INTO metric (job_id, name, value, step, at) VALUES "
                              "(:j, 'train.loss', CAST('NaN' AS double precision), 3, "
                              "'2026-01-01T00:00:00.000000Z')"), {"j": job.id})
    _migrate(store, "head")
    with store.engine.begin() as conn:
        rows = conn.execute(text("SELECT data_json FROM event WHERE kind = 'train.progress'"))
        assert [r[0] for r in rows] == ['{"loss":null,"note":"NaN in text","x":[1.5,null]}']
        if postgres:
            assert conn.execute(text("SELECT value FROM metric")).all() == [(None,)]
    # And back: 0014's downgrade deletes the NULL rows it cannot keep under NOT NULL.
    store.add_metrics(job.id, {"train.loss": float("nan"), "train.grad": 0.5}, step=4)
    _migrate(store, "0013")
    with store.engine.connect() as conn:
        kept = conn.execute(text("SELECT name, value FROM metric")).all()
    assert [tuple(r) for r in kept] == [("train.grad", 0.5)]
    _migrate(store, "head")


def test_a_value_that_is_not_a_number_is_null_in_metrics_and_events(store: Store,
                                                                      db_path: Path) -> None:
    # A diverged run logs `nan`. SQLite's REAL holds no NaN (the NOT NULL metric column
    # refused the insert, failing the poll that read it), and Python's json.dumps wrote a bare
    # `NaN`, which SQLite's json_extract refuses: a user's query over all events failed.
    job = store.create_job(**_job_kwargs())
    store.add_event(job.id, "train.progress", "step 9/30 loss nan",
                    {"step": 9, "loss": float("nan"), "rates": [1.0, float("inf")],
                     "nested": {"x": float("-inf")}})
    store.add_metrics(job.id, {"train.loss": float("nan"), "train.eval_loss": float("inf"),
                               "train.grad": 0.5}, step=9)
    assert _raw(db_path, "SELECT json_extract(data_json, '$.loss'), "
                         "json_extract(data_json, '$.rates[1]'), "
                         "json_extract(data_json, '$.nested.x'), json_valid(data_json) "
                         "FROM event WHERE kind = 'train.progress'") == [(None, None, None, 1)]
    assert _raw(db_path, "SELECT count(*) FROM event WHERE json_valid(data_json) = 0") == [(0,)]
    assert _raw(db_path, "SELECT name, value FROM metric ORDER BY name") == [
        ("train.eval_loss", None), ("train.grad", 0.5), ("train.loss", None)]


def test_not_a_number_metrics_read_back_as_nan_on_every_backend(store: Store) -> None:
    import math

    job = store.create_job(**_job_kwargs())
    store.add_metrics(job.id, {"train.loss": float("nan")}, step=2)
    store.add_metrics(job.id, {"train.loss": 1.5}, step=1)
    from orchestrator.records.store import nan_if_null

    got = {m.step: (m.value, nan_if_null(m.value)) for m in store.metrics(job.id)}
    assert got[1] == (1.5, 1.5)
    assert got[2][0] is None and math.isnan(got[2][1])
    from orchestrator.records.sweep.trials import curve

    points = curve(store, job.id, "train.loss")
    assert points[0] == (1, 1.5) and points[1][0] == 2 and math.isnan(points[1][1])


def test_metric_upsert_on_every_backend(store: Store) -> None:
    job = store.create_job(**_job_kwargs())
    for value in (1.0, 2.0):
        store.add_metrics(job.id, {"train.loss": value}, step=5)
        store.add_metrics(job.id, {"eval.score": value})
    got = sorted((m.name, m.step, m.value) for m in store.metrics(job.id))
    assert got == [("eval.score", None, 2.0), ("train.loss", 5, 2.0)]


# --- local files are the user's alone (issue 23 §9) ----------------------------------------


@pytest.mark.parametrize("older", [False, True], ids=["fresh", "made-by-an-older-orch"])
def test_sqlite_files_and_data_folder_are_private_whatever_the_umask(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, older: bool) -> None:
    import os
    import stat

    from orchestrator.core.paths import data_dir
    from orchestrator.engine import trainlog

    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    folder = data_dir()
    if older:  # what orch created under umask 022 before: world-readable
        folder.mkdir(parents=True, mode=0o755)
        (folder / "orch.db").touch(mode=0o644)
        folder.chmod(0o755)
        (folder / "orch.db").chmod(0o644)
    umask = os.umask(0o022)
    try:
        store = open_store(f"sqlite:///{folder / 'orch.db'}")
        try:
            store.list_jobs()  # the schema was written at open: -wal and -shm exist
            trainlog.save("j-000000000001", "step 1 loss 2.0\n")
            files = {name: stat.S_IMODE((folder / name).stat().st_mode)
                     for name in ("orch.db", "orch.db-wal", "orch.db-shm")}
        finally:
            store.close()
    finally:
        os.umask(umask)
    assert files == {"orch.db": 0o600, "orch.db-wal": 0o600, "orch.db-shm": 0o600}
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    log = trainlog.log_path("j-000000000001")
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
    assert stat.S_IMODE(log.parent.stat().st_mode) == 0o700


# --- the team queue on PostgreSQL (issue 23 §11) -------------------------------------------


def test_a_claim_skips_the_row_another_worker_is_claiming_instead_of_waiting(
        pg_server: Any) -> None:
    s = open_store(pg_server.create_database())
    try:
        first = s.create_job(**_job_kwargs())
        second = s.create_job(**_job_kwargs())
        # Another worker's claim transaction holds the oldest queued row.
        other = s.engine.connect()
        tx = other.begin()
        other.exec_driver_sql("SELECT id FROM job WHERE id = %(id)s FOR UPDATE",
                              {"id": first.id})
        got: list[Any] = []
        claimer = threading.Thread(target=lambda: got.append(s.claim_next("w2", 30)),
                                   daemon=True)
        claimer.start()
        claimer.join(timeout=30)
        waited = claimer.is_alive()
        tx.rollback()
        other.close()
        claimer.join(timeout=30)
        assert not waited, "the claim queued up behind another worker's row lock"
        assert got and got[0] is not None and got[0].id == second.id
        assert s.get_job(first.id).status == "queued"
    finally:
        s.close()
