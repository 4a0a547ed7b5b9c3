"""Commands agree on what can run (issue 12 §3): without a provider that could run a job,
every path that queues work (submit, submit -d, submit --dry-run, sweep, sweep --dry-run)
exits 3 and records nothing; `plan` shows catalog prices as an estimate and says who would
run the job here, or what to configure.

Real processes against a real SQLite file; no API keys unless a test sets one.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
from pathlib import Path

import orchfork
import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    e = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "xdg"),
         "XDG_CONFIG_HOME": str(tmp_path / "config")}
    for name in ("ORCH_DB_URL", "VAST_API_KEY", "RUNPOD_API_KEY"):
        e.pop(name, None)
    return e


def orch(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return orchfork.run(list(args), env=env, cwd=ROOT, timeout=120)


def recorded(env: dict[str, str]) -> int:
    db = Path(env["XDG_DATA_HOME"]) / "orch" / "orch.db"
    if not db.exists():
        return 0
    with sqlite3.connect(db) as con:
        try:
            return int(con.execute("SELECT count(*) FROM job").fetchone()[0]) + int(
                con.execute("SELECT count(*) FROM sweep").fetchone()[0])
        except sqlite3.OperationalError:
            return 0


@pytest.mark.parametrize("args", [
    ["submit", "examples/qlora-8b.yml"],
    ["submit", "-d", "examples/qlora-8b.yml"],
    ["submit", "--dry-run", "examples/qlora-8b.yml"],
    ["sweep", "examples/sweep-lr.yml"],
    ["sweep", "--dry-run", "examples/sweep-lr.yml"],
])
def test_nothing_is_queued_that_nothing_here_can_run(env: dict[str, str],
                                                    args: list[str]) -> None:
    proc = orch(env, *args)
    assert proc.returncode == 3, (proc.returncode, proc.stdout, proc.stderr)
    assert "nothing can run this job here" in proc.stderr
    assert "VAST_API_KEY" in proc.stderr and "Nothing was recorded" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert recorded(env) == 0


def test_a_named_provider_without_a_key_is_named(env: dict[str, str], tmp_path: Path) -> None:
    job = tmp_path / "job.yml"
    shutil.copytree(EXAMPLES / "data", tmp_path / "data")
    text = (EXAMPLES / "quickstart.yml").read_text().replace("providers: [sim]",
                                                               "providers: [runpod]")
    job.write_text(text)
    env["VAST_API_KEY"] = "a-key-for-another-provider"
    proc = orch(env, "submit", "-d", str(job))
    assert proc.returncode == 3, proc.stderr
    assert "runpod: no API key" in proc.stderr and "vastai" not in proc.stderr.split("(")[1]
    assert recorded(env) == 0


def test_with_a_key_the_same_job_is_queued(env: dict[str, str]) -> None:
    env["VAST_API_KEY"] = "test-key"  # no request is made: queueing does not call the API
    proc = orch(env, "submit", "--dry-run", "--json", "examples/qlora-8b.yml")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["status"] == "planned"
    assert recorded(env) == 1


def test_plan_says_catalog_prices_are_an_estimate_and_who_runs_it(env: dict[str, str]) -> None:
    proc = orch(env, "plan", "examples/qlora-8b.yml")
    assert proc.returncode == 0, proc.stderr
    assert "Chosen: cloud RTX 3090" not in proc.stdout
    assert "Chosen: RTX 3090 x1 at the cloud catalog's prices (an estimate)" in proc.stdout
    assert "Runs on: nothing configured here can run it" in proc.stdout
    assert "Set VAST_API_KEY or RUNPOD_API_KEY" in proc.stdout

    env["VAST_API_KEY"] = "test-key"
    proc = orch(env, "plan", "examples/qlora-8b.yml")
    assert "Runs on: vastai, whose live offers" in proc.stdout
    out = json.loads(orch(env, "plan", "examples/qlora-8b.yml", "--json").stdout)
    assert out["runs_on"] == ["vastai"]
    assert recorded(env) == 0


def test_plan_for_the_simulated_cloud_runs_on_sim(env: dict[str, str]) -> None:
    proc = orch(env, "plan", "examples/quickstart.yml")
    assert proc.returncode == 0 and "Runs on: sim" in proc.stdout, proc.stderr


def test_a_credentials_fifo_does_not_block(env: dict[str, str], tmp_path: Path) -> None:
    folder = tmp_path / "config" / "orch"
    folder.mkdir(parents=True)
    os.mkfifo(folder / "credentials", 0o600)
    proc = orch(env, "plan", "examples/qlora-8b.yml")
    assert proc.returncode == 0, proc.stderr
    assert "is not a regular file" in proc.stdout
