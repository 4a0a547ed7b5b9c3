"""kill -9 at each point of a search sweep trial's life (issue 38): proposed, queued, running,
at a rung (the prune decided, the run not stopped yet), pruned. Whatever dies, no trial runs
twice, no machine is left running, and the study goes on at the next tick to its end.

Real `orch` processes (ORCH_FAILPOINT makes one SIGKILL itself at the point), a real SQLite
file and the simulated cloud.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import orchfork
import pytest

from providers.sim.compute import SimCloud

ROOT = Path(__file__).resolve().parent.parent
TRIALS = 4
SWEEP = f"""\
name: crash
base: jobs/quickstart.yml
grid:
  training.learning_rate: [1.0e-4, 2.0e-4, 5.0e-4]
  lora.r: [8, 16, 32]
search: {{sampler: tpe, trials: {TRIALS}, seed: 0}}
early_stop: {{metric: train.loss, min_fraction: 0.1, reduction_factor: 3}}
max_parallel: 2
objective: {{metric: eval.exact_match, goal: max}}
"""


@pytest.fixture
def env(tmp_path: Path) -> Iterator[dict[str, str]]:
    e = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "xdg"), "ORCH_LEASE_S": "3",
         "ORCH_SIM_TRAIN_STEPS": "30", "ORCH_SIM_STEP_S": "0.05"}
    for key in ("ORCH_DB_URL", "VAST_API_KEY", "RUNPOD_API_KEY", "ORCH_FAILPOINT"):
        e.pop(key, None)
    yield e
    SimCloud(Path(e["XDG_DATA_HOME"]) / "orch" / "sim").terminate_all()


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    shutil.copy(ROOT / "examples" / "quickstart.yml", jobs / "quickstart.yml")
    shutil.copytree(ROOT / "examples" / "data", jobs / "data")
    path = tmp_path / "sweep.yml"
    path.write_text(SWEEP)
    return path


def orch(env: dict[str, str], *args: str) -> int:
    return orchfork.run(list(args), env=env, cwd=ROOT, timeout=300).returncode


def query(env: dict[str, str], sql: str) -> list[tuple[object, ...]]:
    con = sqlite3.connect(Path(env["XDG_DATA_HOME"]) / "orch" / "orch.db", timeout=10)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def live(env: dict[str, str]) -> list[object]:
    return list(SimCloud(Path(env["XDG_DATA_HOME"]) / "orch" / "sim").list())


def crash(env: dict[str, str], sweep: Path, point: str) -> None:
    """Run the sweep (ticks and a worker) until the process at `point` kills itself."""
    dying = {**env, "ORCH_FAILPOINT": point}
    ticker = dying if point.startswith("sweep-") else env
    for _ in range(TRIALS):
        rc = orch(ticker, "sweep", str(sweep), "-q")
        if rc == -signal.SIGKILL:
            return
        assert rc == 0
        if orch(dying, "worker", "--once", "-q") == -signal.SIGKILL:
            return
    raise AssertionError(f"no process reached the failpoint {point}")


def finish(env: dict[str, str], sweep: Path) -> None:
    """What cron and the fleet do next: leases lapse, reconcile, ticks and workers."""
    time.sleep(3.5)  # ORCH_LEASE_S: the dead worker's lease lapses
    assert orch(env, "reconcile") == 0
    for _ in range(TRIALS + 1):
        assert orch(env, "sweep", str(sweep), "-q") == 0
        assert orch(env, "worker", "--once", "-q") == 0
        rows = query(env, "SELECT status FROM job")
        if len(rows) == TRIALS and all(r[0] in ("succeeded", "failed", "pruned")
                                       for r in rows):
            return
    raise AssertionError(f"the study did not end: {query(env, 'SELECT name, status FROM job')}")


@pytest.mark.parametrize("point", ["sweep-proposed", "sweep-queued", "training",
                                   "pruned-decided", "pruned"])
def test_kill_9_at_each_point_of_a_trial(env: dict[str, str], sweep: Path, point: str) -> None:
    planned = json.loads(orchfork.run(["sweep", str(sweep), "--dry-run", "--json"], env=env,
                                      cwd=ROOT, timeout=120).stdout)
    first = [r["params"] for r in planned["runs"]]  # what the first tick proposes
    crash(env, sweep, point)
    finish(env, sweep)
    jobs = query(env, "SELECT id, trial_number, status FROM job ORDER BY trial_number")
    assert [j[1] for j in jobs] == list(range(TRIALS))  # each trial once, none lost
    events = query(env, "SELECT job_id, data_json FROM event WHERE kind = 'queued' "
                        "ORDER BY job_id")
    params = [json.dumps(json.loads(str(d))["params"], sort_keys=True) for _, d in events]
    assert len(set(params)) == TRIALS  # no configuration ran twice
    by_number = {j[1]: j[0] for j in jobs}
    recorded = {str(job): json.loads(str(d))["params"] for job, d in events}
    assert [recorded[str(by_number[i])] for i in range(len(first))] == first
    # A rung is decided once; a pruned run stopped there (its end names that rung).
    rungs = query(env, "SELECT job_id, resource, count(*) FROM sweep_rung "
                       "GROUP BY job_id, resource HAVING count(*) > 1")
    assert rungs == []
    for job_id, _, status in jobs:
        prunes = query(env, f"SELECT resource FROM sweep_rung WHERE job_id = '{job_id}' "
                            "AND decision = 'prune'")
        assert (status == "pruned") == bool(prunes), (job_id, status, prunes)
        # Pruned once: nothing was checked (trained) past the rung that pruned it.
        assert len(prunes) <= 1, (job_id, prunes)
        if prunes:
            later = query(env, f"SELECT resource FROM sweep_rung WHERE job_id = '{job_id}' "
                               f"AND resource > {prunes[0][0]}")
            assert later == [], (job_id, prunes, later)
    if point in ("pruned-decided", "pruned"):
        assert any(j[2] == "pruned" for j in jobs)
    assert live(env) == []
    assert query(env, "SELECT count(*) FROM instance WHERE terminated_at IS NULL") == [(0,)]
