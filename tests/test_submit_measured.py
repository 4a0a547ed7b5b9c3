"""`orch submit` estimates with the throughput orch measured, as `orch plan` does.

The recorded estimate is what a job's deadline policy plans with before its first step and
what the checkpoint interval is sized from: before, submit planned with the formula alone
(bench/deadline.py's jobs were estimated at 9 s of training for 96 s).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import orchfork

from orchestrator.core import throughput
from orchestrator.core.planning import total_tokens
from orchestrator.core.spec import load_job
from orchestrator.records.store import open_store

ROOT = Path(__file__).resolve().parent.parent


def test_submit_plans_with_measured_throughput(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path)}
    env.pop("ORCH_DB_URL", None)
    job = ROOT / "examples" / "quickstart.yml"
    first = orchfork.run(["submit", str(job), "--dry-run", "--json"], env=env, cwd=ROOT,
                         timeout=60)
    assert first.returncode == 0, first.stderr
    before = json.loads(first.stdout)["placement"]
    loaded = load_job(job)
    tokens_per_s = total_tokens(loaded) / 96.0  # as if measured: 96 s of training
    store = open_store(f"sqlite:///{tmp_path / 'orch' / 'orch.db'}")
    store.add_throughput(json.loads(first.stdout)["job_id"], before["gpu"],
                         before["gpu_count"], loaded.spec.method,
                         throughput.size_class(loaded.architecture.params), tokens_per_s)
    store.close()
    again = orchfork.run(["submit", str(job), "--dry-run", "--json"], env=env, cwd=ROOT,
                         timeout=60)
    assert again.returncode == 0, again.stderr
    after = json.loads(again.stdout)["placement"]
    assert after["throughput_source"].startswith("measured"), after["throughput_source"]
    assert after["est_training_hours"] == round(96 / 3600, 4)
