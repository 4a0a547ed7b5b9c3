"""Kill -9 at each point of a move from spot to on-demand (issue 41's crash matrix).

The real `orch` executable, a real SQLite file and the simulated cloud, as in
tests/test_engine_crash.py: a worker trains a job with a deadline on spot; the deadline is
brought closer (the job's start moved back, as if it had waited) so the policy moves it to
on-demand; ORCH_FAILPOINT kills the worker after the move is recorded (`move-decided`), after
the spot machine is released (`move-released`) or after the on-demand one is created
(`move-placed`). Once the lease lapses a worker takes the job over: it finishes on on-demand,
no machine is left running, and never were two of its machines alive at once.
"""

from __future__ import annotations

import json
import signal
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from test_engine_crash import (
    env,
    lease_lapsed,
    live_instances,
    orch,
    query,
    spawn,
    status,
    wait_for,
)

ROOT = Path(__file__).resolve().parent.parent
STEPS, STEP_S = 80, 0.4
__all__ = ["env"]


def job_file(env: dict[str, str]) -> Path:
    folder = Path(env["XDG_DATA_HOME"]).parent / "jobs"
    folder.mkdir(exist_ok=True)
    text = (ROOT / "examples" / "quickstart.yml").read_text()
    text = text.replace("  spot: allowed\n", "  spot: allowed\n  deadline_hours: 12\n")
    text = text.replace("data/", str(ROOT / "examples" / "data") + "/")
    path = folder / "job.yml"
    path.write_text(text)
    return path


def step(env: dict[str, str], job_id: str) -> int:
    rows = query(env, "SELECT max(json_extract(data_json, '$.step')) FROM event "
                      "WHERE kind = 'train.progress' AND job_id = ?", job_id)
    return int(rows[0][0] or 0) if rows else 0


def bring_the_deadline_closer(env: dict[str, str], job_id: str) -> None:
    """Leave the work, an on-demand restart and 25 s: less than a preemption needs."""
    (data,) = query(env, "SELECT data_json FROM event WHERE kind = 'deadline.decision' "
                         "AND job_id = ? ORDER BY id LIMIT 1", job_id)
    decided = json.loads(str(data[0]))
    left = ((STEPS - step(env, job_id)) * STEP_S + decided["after_training_s"]
            + decided["on_demand_restart_s"] + 25)
    start = datetime.now(UTC) - timedelta(seconds=12 * 3600 - left)
    path = Path(env["XDG_DATA_HOME"]) / "orch" / "orch.db"
    con = sqlite3.connect(path, timeout=30)
    with con:
        con.execute("UPDATE job SET created_at = ? WHERE id = ?",
                    (start.strftime("%Y-%m-%dT%H:%M:%S.%fZ"), job_id))
    con.close()


@pytest.mark.parametrize("point", ["move-decided", "move-released", "move-placed"])
def test_kill_9_mid_move_leaves_no_machine_and_finishes_on_demand(
        env: dict[str, str], point: str) -> None:
    env.update(ORCH_DEADLINE_CHECK_S="60", ORCH_SIM_TRAIN_STEPS=str(STEPS),
               ORCH_SIM_STEP_S=str(STEP_S))
    out = orch(env, "submit", str(job_file(env)), "--detach", "--json")
    job_id = json.loads(out.stdout)["job_id"]
    worker = spawn({**env, "ORCH_FAILPOINT": point}, "worker", "--once")
    try:
        wait_for(lambda: step(env, job_id) >= 5, what="training on spot")
        bring_the_deadline_closer(env, job_id)
        worker.wait(timeout=120)
    finally:
        worker.kill()
    assert worker.returncode == -signal.SIGKILL, f"not killed at {point}"
    assert query(env, "SELECT deadline_choice FROM job WHERE id = ?", job_id) == \
        [("on_demand",)]
    if point == "move-decided":  # the spot machine still runs; the takeover ends it
        assert len(live_instances(env)) == 1
    lease_lapsed(env)
    assert orch(env, "worker", "--once", timeout=300).returncode == 0
    assert status(env, job_id) == "succeeded"
    assert live_instances(env) == []
    rows = query(env, "SELECT interruptible, end_reason, created_at, terminated_at "
                      "FROM instance WHERE job_id = ? ORDER BY id", job_id)
    assert all(r[3] is not None for r in rows)
    spot = [r for r in rows if r[0]]
    on_demand = [r for r in rows if not r[0]]
    assert [r[1] for r in spot] == ["moved"] and [r[1] for r in on_demand] == ["released"]
    # Break before make: the spot machine ended before the on-demand one was rented.
    assert str(spot[0][3]) <= str(on_demand[0][2])
