"""The smaller frictions of the team trial (issue 25, "Smaller"), run as the user ran them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import orchfork

ROOT = Path(__file__).resolve().parent.parent
ORCH = str(Path(sys.executable).parent / "orch")


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return orchfork.run(list(args), env=env, cwd=ROOT, timeout=120)


def test_an_idle_worker_stopped_by_sigterm_says_it_was_idle(tmp_path: Path) -> None:
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    worker = subprocess.Popen([ORCH, "worker", "--poll", "0.2"], env=env, cwd=ROOT,
                              stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    assert worker.stderr is not None
    assert "database" in worker.stderr.readline()  # started and polling an empty queue
    worker.send_signal(signal.SIGTERM)
    _, err = worker.communicate(timeout=60)
    assert worker.returncode == 143
    assert "worker stopped (SIGTERM); it was idle: no job was running" in err
    assert "requeued" not in err


def test_cost_by_day_says_utc_and_a_wrong_option_is_one_line(tmp_path: Path) -> None:
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    assert run(env, "sweep", "examples/sweep-sim.yml").returncode == 0
    out = run(env, "cost", "--by", "day").stdout
    assert "days, weeks and months are UTC" in out
    bad = run(env, "cost", "--sweep", "x")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    assert bad.stderr.startswith("error: No such option '--sweep'"), bad.stderr


def test_sql_on_postgresql_prints_json_columns_as_json(tmp_path: Path, pg_server: object
                                                       ) -> None:
    url = str(pg_server.create_database())  # type: ignore[attr-defined]
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "ORCH_DB_URL": url}
    assert run(env, "sweep", "examples/sweep-sim.yml").returncode == 0
    query = "SELECT spec_json::json -> 'grid' AS grid FROM sweep"
    text = run(env, "sql", query)
    assert text.returncode == 0, text.stderr
    grid = json.loads(text.stdout.splitlines()[1])  # the row under the header, as JSON
    assert grid == {"lora.r": [8, 16], "training.learning_rate": [0.0001, 0.0002]}
    assert json.loads(run(env, "sql", query, "--json").stdout)["rows"] == [[grid]]
    csv_out = run(env, "sql", query, "--csv").stdout.splitlines()
    assert json.loads(json.loads('"' + csv_out[1].strip('"').replace('""', '\\"') + '"')) == grid
