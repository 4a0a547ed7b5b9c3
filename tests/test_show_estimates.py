"""`orch show` compares the planner's estimate with what a finished job took and cost.

A real job runs on the simulated cloud (real sshd on loopback, the real pipeline); the
actual figures are read back from the database the run wrote, never from the estimate.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
from decimal import Decimal
from pathlib import Path
from typing import Any

import orchfork
import pytest
from termutil import ROOT


def orch(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    proc = orchfork.run(list(args), env=env, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path_factory.mktemp("xdg")),
           "ORCH_SIM_TRAIN_STEPS": "3", "ORCH_SIM_STEP_S": "0.2", "ORCH_POLL_S": "0.1"}
    for name in ("ORCH_DB_URL", "NO_COLOR", "COLUMNS"):
        env.pop(name, None)
    orch(env, "submit", "examples/quickstart.yml")
    job_id = json.loads(orch(env, "jobs", "--json").stdout)[0]["job_id"]
    db = next(Path(env["XDG_DATA_HOME"]).rglob("*.db"))
    return {"env": env, "id": job_id, "db": db}


def test_show_json_has_estimated_and_actual_hours_and_cost(finished: dict[str, Any]) -> None:
    shown = json.loads(orch(finished["env"], "show", finished["id"], "--json").stdout)
    assert shown["status"] == "succeeded", shown
    with sqlite3.connect(finished["db"]) as con:
        est_hours, est_micros, cost_micros, tokens, train_s, placed = con.execute(
            "SELECT est_hours, est_cost_micros, cost_micros, tokens, train_seconds, "
            "placement_json FROM job "
            "WHERE id = ?", (finished["id"],)).fetchone()
        spans = con.execute("SELECT (julianday(terminated_at) - julianday(created_at)) * 24 "
                            "FROM instance WHERE job_id = ?", (finished["id"],)).fetchall()
    assert shown["est_hours"] == est_hours > 0
    assert shown["hours"] == pytest.approx(sum(s for (s,) in spans), rel=1e-3)
    assert 0 < shown["hours"] < est_hours  # the simulated run is seconds, the plan is not
    # Money is a decimal string; compare values, not spellings ("0.000260" is 260 micro-USD).
    assert Decimal(shown["est_cost"]) == Decimal(est_micros) / 1_000_000
    assert Decimal(shown["cost"]) == Decimal(cost_micros) / 1_000_000
    assert shown["training_hours"] == pytest.approx(train_s / 3600)
    assert shown["tokens_per_s"] == pytest.approx(tokens / train_s)
    # The quickstart's data set is tiny: the training estimate is a fraction of the total.
    placement = json.loads(placed)["placement"]
    assert shown["est_training_hours"] == placement["est_training_hours"] < est_hours
    assert shown["throughput_source"] == placement["throughput_source"]
    assert shown["throughput_source"].startswith("formula, ")


def test_show_prints_estimated_vs_actual(finished: dict[str, Any]) -> None:
    env = {**finished["env"], "COLUMNS": "200"}
    shown = json.loads(orch(env, "show", finished["id"], "--json").stdout)
    text = orch(env, "show", finished["id"]).stdout
    cost_line = next(line for line in text.splitlines() if line.strip().startswith("cost:"))
    assert "estimated $" in cost_line and "%" in cost_line
    time_line = next(line for line in text.splitlines() if line.strip().startswith("time:"))
    billed = re.search(r"time: ([\d.]+) (h|min|s) billed \(estimated ([\d.]+) (h|min|s), "
                       r"([+-]\d+)%\); training ([\d.]+) (h|min|s) at ([\d,]+) tokens/s "
                       r"\(estimated [\d.]+ (h|min|s)", time_line)
    assert billed, time_line
    unit = {"h": 1.0, "min": 1 / 60, "s": 1 / 3600}
    assert float(billed[1]) * unit[billed[2]] == pytest.approx(shown["hours"], abs=0.05 / 60)
    # Shown to one decimal of its unit (1.8 min for 0.0293 h): within half that digit.
    assert float(billed[3]) * unit[billed[4]] == pytest.approx(
        shown["est_hours"], abs=0.05 * unit[billed[4]])
    assert int(billed[5]) == round((shown["hours"] / shown["est_hours"] - 1) * 100)
    assert int(billed[8].replace(",", "")) == round(shown["tokens_per_s"])
