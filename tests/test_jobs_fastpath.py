"""`orch jobs` reads SQLite without SQLAlchemy where the store would only read, and says the
same: the same rows, in the same order, as the store's listing; the store still opens the
database where it would create, upgrade or repair it (records/jobsread.py)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest

from orchestrator.cli.app import _job_dict
from orchestrator.core.jobstatus import RUNNING_STATUSES, in_order
from orchestrator.records import jobsread
from orchestrator.records.store import SCHEMA_HEAD, Store, open_store

ROOT = Path(__file__).resolve().parent.parent


def _jobs(store: Store) -> list[str]:
    ids = []
    for i, (status, gpu) in enumerate([("queued", None), ("training", "H100"),
                                       ("succeeded", "L40S"), ("failed", None)]):
        job = store.create_job(
            name=f"job-{i}", status="queued", method="lora", base_model="Qwen/Qwen2.5-7B",
            spec_json="{}", spec_hash="0" * 64, placement=None, provider="vastai" if gpu else None,
            gpu=gpu, gpu_count=1 if gpu else None, billing=None, interruptible=bool(i % 2),
            est_hours=1.5 * i, est_cost=Decimal("0.25") * i, event_kind="queued",
            event_message="", event_data=None)
        if status != "queued":
            with sqlite3.connect(str(store.engine.url.database)) as con:
                con.execute("UPDATE job SET status = ? WHERE id = ?", (status, job.id))
        ids.append(job.id)
    return ids


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'orch.db'}"


def test_the_fast_listing_is_the_stores(url: str) -> None:
    store = open_store(url)
    _jobs(store)
    owner_until = datetime.now(UTC) + timedelta(minutes=5)
    with sqlite3.connect(str(store.engine.url.database)) as con:  # a live worker's lease
        con.execute("UPDATE job SET lease_owner = 'w:1', lease_expires_at = ? "
                    "WHERE status = 'training'",
                    (owner_until.replace(tzinfo=None).isoformat(timespec="microseconds") + "Z",))
    now = datetime.now(UTC)
    assert jobsread.schema_head() == SCHEMA_HEAD
    for limit, status, statuses in [(50, None, None), (2, None, None),
                                    (50, "training", ("training",)),
                                    (50, "running", tuple(in_order(RUNNING_STATUSES)))]:
        fast = jobsread.recent_jobs(limit, statuses, url)
        assert fast is not None
        slow = store.list_jobs(limit=limit, status=status)
        assert [_job_dict(j, now) for j in fast] == [_job_dict(j, now) for j in slow]
        assert len(fast) == (1 if status is not None else min(limit, 4))


def test_the_store_opens_where_it_would_do_more_than_read(tmp_path: Path, url: str) -> None:
    assert jobsread.recent_jobs(50, None, url) is None  # no file: the store creates it
    assert not (tmp_path / "orch.db").exists()
    store = open_store(url)
    ids = _jobs(store)
    db = str(store.engine.url.database)
    with sqlite3.connect(db) as con:  # a worker died: its lease lapsed
        con.execute("UPDATE job SET lease_owner = 'w:1', lease_expires_at = "
                    "'2020-01-01T00:00:00.000000Z' WHERE id = ?", (ids[1],))
    assert jobsread.recent_jobs(50, None, url) is None
    store.requeue_lapsed()
    assert jobsread.recent_jobs(50, None, url) is not None
    with sqlite3.connect(db) as con:  # an older schema: the store upgrades it
        con.execute("UPDATE alembic_version SET version_num = '0008'")
    assert jobsread.recent_jobs(50, None, url) is None
    assert jobsread.recent_jobs(50, None, "postgresql+psycopg://u@h/db") is None


def test_orch_jobs_repairs_a_lapsed_lease_and_loads_no_sqlalchemy_otherwise(
        tmp_path: Path) -> None:
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path)}
    env.pop("ORCH_DB_URL", None)
    store = open_store(f"sqlite:///{tmp_path / 'orch' / 'orch.db'}")
    ids = _jobs(store)
    with sqlite3.connect(str(store.engine.url.database)) as con:
        con.execute("UPDATE job SET lease_owner = 'w:1', lease_expires_at = "
                    "'2020-01-01T00:00:00.000000Z' WHERE id = ?", (ids[1],))
    code = ("import atexit, sys\n"
            "atexit.register(lambda: print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'sqlmodel', 'sqlalchemy', 'alembic'}), file=sys.stderr))\n"
            "sys.argv = ['orch', 'jobs', '--json']\n"
            "from orchestrator.cli.app import main\n"
            "main()\n")
    for store_opened in (True, False):  # the first repairs (the store), the second reads
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert ("sqlalchemy" in out.stderr.strip().splitlines()[-1]) is store_opened
        assert '"status": "queued"' in out.stdout and '"status": "training"' not in out.stdout
