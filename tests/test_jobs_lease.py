"""`orch jobs` says which worker drives a job and whether its lease still holds (issue 25,
"Smaller": a dead worker's job showed as `training` with no owner and no lease).

A real `orch worker` trains a job on the simulated cloud, recorded in a real PostgreSQL team
database, and is killed with SIGKILL, as a crashed or unplugged worker would be. `orch jobs`
is then read as the team trial read it, by a read-only role (docs/team.md's `analyst`), which
cannot requeue the job as a writer's `orch jobs` does: on a terminal, piped, and --json.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orchfork
import pytest
from termutil import ROOT, orch_exe, run_tty, visible

from providers.sim.compute import SimCloud


@pytest.fixture
def env(tmp_path: Path, pg_server: Any) -> Iterator[dict[str, str]]:
    url = str(pg_server.create_database())
    e = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "ORCH_LEASE_S": "3",
         "ORCH_SIM_TRAIN_STEPS": "60", "ORCH_SIM_STEP_S": "0.25", "ORCH_DB_URL": url}
    yield e
    SimCloud(tmp_path / ".local" / "share" / "orch" / "sim").terminate_all()


def read_only(env: dict[str, str], pg_server: Any) -> dict[str, str]:
    """The same database as docs/team.md's read-only role (GRANT SELECT only)."""
    import psycopg
    from pgserver import ROLE

    url = env["ORCH_DB_URL"]
    with psycopg.connect(host="127.0.0.1", port=pg_server.port, user=ROLE,
                         dbname=url.rsplit("/", 1)[1], autocommit=True) as conn:
        conn.execute("CREATE ROLE analyst LOGIN")
        conn.execute("GRANT SELECT ON ALL TABLES IN SCHEMA public TO analyst")
    return {**env, "ORCH_DB_URL": url.replace(f"{ROLE}@", "analyst@")}


def orch(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return orchfork.run(list(args), env=env, cwd=ROOT, timeout=120)


def jobs(env: dict[str, str]) -> list[dict[str, Any]]:
    proc = orch(env, "jobs", "--json")
    assert proc.returncode == 0, proc.stderr
    return list(json.loads(proc.stdout))


def wait_for(check: Callable[[], bool], what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_dead_workers_job_shows_its_owner_and_a_lapsed_lease(env: dict[str, str],
                                                                pg_server: Any) -> None:
    queued = orch(env, "submit", "examples/quickstart.yml", "--detach", "--json")
    assert queued.returncode == 0, queued.stderr
    job_id = json.loads(queued.stdout)["job_id"]
    analyst = read_only(env, pg_server)
    # Queued, nobody holds it: no owner, no lease.
    row = jobs(env)[0]
    assert (row["owner"], row["lease_expires_at"], row["lease"]) == (None, None, None)

    worker = subprocess.Popen([orch_exe(), "worker"], env=env, cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: jobs(env)[0]["status"] == "training", "training")
        row = jobs(env)[0]
        assert row["owner"].startswith("worker:") and f":{worker.pid}:" in row["owner"], row
        assert row["lease"] == "held" and row["lease_expires_at"].endswith("Z"), row
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=30)
    finally:
        worker.kill()
        worker.wait()

    # Nobody renews the lease now: it lapses, while the job still reads `training`.
    wait_for(lambda: jobs(analyst)[0]["lease"] == "lapsed", "the lease to lapse", timeout=60)
    row = jobs(analyst)[0]
    assert row["job_id"] == job_id and row["status"] == "training"
    assert f":{worker.pid}:" in row["owner"]

    code, out = run_tty(analyst, "jobs", cols=220)
    assert code == 0, out
    header, line = visible(out).splitlines()[:2]
    assert header.split() == ["id", "name", "status", "method", "placement", "est.", "h",
                              "est.", "cost", "cost", "created", "worker", "lease"]
    assert "training" in line and row["owner"] in line
    assert " lapsed " in line and line.rstrip().endswith(" ago"), line
    assert "\x1b[31mlapsed" in out  # red, as a failure is

    piped = orch(analyst, "jobs").stdout.splitlines()
    cells = dict(zip(piped[0].split("\t"), piped[1].split("\t"), strict=True))
    assert cells["worker"] == row["owner"] and cells["lease"].startswith("lapsed ")

    # A writer's next command requeues it (to resume from its checkpoint): no owner then.
    row = jobs(env)[0]
    assert row["status"] == "queued"
    assert (row["owner"], row["lease_expires_at"], row["lease"]) == (None, None, None)
    cancelled = orch(env, "cancel", job_id)  # no worker will take it here: tear it down
    assert cancelled.returncode == 0, cancelled.stderr
