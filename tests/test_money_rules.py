"""One money rounding rule, exact values in --json, one tie order for the best run (issue 25,
item 5): what orch prints against what the documented SQL prints in plain `sqlite3`.

The history is a real SQLite file written by `orch sweep` (the sim sweep example); costs,
finish times and metrics are then set through the store, as a worker would record them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from contextlib import closing
from datetime import timedelta
from pathlib import Path

import orchfork
import pytest
from sqlmodel import col, select

from orchestrator.records.store import Job, open_store, utcnow

ROOT = Path(__file__).resolve().parent.parent
ORCH = str(Path(sys.executable).parent / "orch")
SQLITE3 = shutil.which("sqlite3")


@pytest.fixture
def history(tmp_path: Path) -> dict[str, object]:
    """The sim sweep's 4 runs: run 0 and run 1 succeed with the same exact-match score, run 0
    finishing later; costs $1.005, $0.00015, $2.675 and 0."""
    db = tmp_path / "orch.db"
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "ORCH_DB_URL": f"sqlite:///{db}"}
    orchfork.run(["sweep", "examples/sweep-sim.yml"], env=env, cwd=ROOT, check=True, timeout=120)
    with closing(open_store(env["ORCH_DB_URL"])) as store:
        with store.session() as s:
            jobs = list(s.exec(select(Job).order_by(col(Job.name))))
        now = utcnow()
        for job, cost, late in zip(jobs, (1_005_000, 150, 2_675_000, 0), (60, 0, 30, 0),
                                   strict=True):
            with store.transaction() as s:
                row = s.get(Job, job.id)
                assert row is not None
                row.status, row.cost_micros = "succeeded", cost
                row.started_at, row.finished_at = now - timedelta(hours=1), \
                    now - timedelta(seconds=100 - late)
            store.add_metrics(job.id, {"eval.exact_match": 0.5 if job.name[-1] in "01"
                                       else 0.25})
    return {"env": env, "db": db, "ids": [j.id for j in jobs]}


def orch(h: dict[str, object], *args: str) -> str:
    env = h["env"]
    assert isinstance(env, dict)
    return orchfork.run(list(args), env=env, cwd=ROOT, check=True, timeout=120).stdout


def sqlite(h: dict[str, object], query: str) -> list[list[str]]:
    assert SQLITE3, "the sqlite3 shell is needed (Debian's sqlite3)"
    out = subprocess.run([SQLITE3, "-separator", "\t", str(h["db"]), query], check=True,
                         capture_output=True, text=True).stdout
    return [line.split("\t") for line in out.splitlines()]


def test_orch_rounds_money_as_the_documented_sql_does(history: dict[str, object]) -> None:
    by_sql = dict(sqlite(history, "SELECT id, CASE WHEN cost_micros >= 1000000 THEN "
                                  "printf('$%.2f', cost_micros / 1e6) ELSE "
                                  "printf('$%.4f', cost_micros / 1e6) END FROM job"))
    shown = json.loads(orch(history, "sweep", "show", "sim-lr-sweep", "--json"))
    text = orch(history, "sweep", "show", "sim-lr-sweep")
    for run in shown["runs"]:
        # The text shows the SQL's rounding ($1.005 -> $1.01, $0.00015 -> $0.0002) ...
        assert re.search(rf"{run['job_id']}\t.*\t\{by_sql[run['job_id']]}\t", text), \
            (by_sql[run["job_id"]], text)
    # ... and --json the exact amounts.
    assert sorted(r["cost"] for r in shown["runs"]) == \
        ["0.000000", "0.000150", "1.005000", "2.675000"]


def test_cost_json_has_exact_gpu_time(history: dict[str, object]) -> None:
    out = json.loads(orch(history, "cost", "--json"))
    for r in [*out["rows"], out["total"]]:
        # GPU time as an exact integer beside the display rounding of gpu_hours.
        assert isinstance(r["gpu_seconds"], int) and isinstance(r["spot_gpu_seconds"], int)
        assert r["cost"] == "3.680150"


def test_best_run_ties_go_to_the_first_finished_everywhere(history: dict[str, object]) -> None:
    ids = history["ids"]
    assert isinstance(ids, list)
    first_finished = ids[1]  # run 0 and run 1 tie on 0.5; run 1 finished a minute earlier
    shown = json.loads(orch(history, "sweep", "show", "sim-lr-sweep", "--json"))
    assert shown["best"]["job_id"] == first_finished
    view = sqlite(history, "SELECT job_id FROM v_best_run_per_sweep")
    assert view == [[first_finished]]
    schema = (ROOT / "docs" / "schema.md").read_text()
    block = schema.split("Best run of each sweep by its eval exact-match score:", 1)[1]
    query = re.search(r"```sql\n(.*?)```", block, re.S)
    assert query
    assert [row[1] for row in sqlite(history, query.group(1))] == [first_finished]
