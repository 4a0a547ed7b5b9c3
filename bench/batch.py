"""A batch of short jobs through several workers on the simulated cloud, and a preemption.

Reports, in one run:
- billed seconds outside training as a share of all billed seconds (target < 10 %): what
  orch's own work (renting, connecting, toolkit, model pull, merge, eval, copying artifacts,
  teardown) costs around the training the user pays for;
- the time from an instance's preemption to orch noticing it and to the job running on a
  new instance (target < 10 s).
Asserts nothing (these machines are noisy). Usage:
    python bench/batch.py [--jobs 20] [--workers 4] [--steps 40] [--step-s 0.5]
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from orchestrator.core.spec import load_job  # noqa: E402
from orchestrator.engine.submission import record_job  # noqa: E402
from orchestrator.records.store import open_store  # noqa: E402
from providers.sim.compute import SimCloud  # noqa: E402

ORCH = shutil.which("orch", path=str(Path(sys.executable).parent)) or "orch"


def _t(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _env(tmp: Path, steps: int, step_s: float) -> dict[str, str]:
    env = {**os.environ, "XDG_DATA_HOME": str(tmp), "ORCH_SIM_TRAIN_STEPS": str(steps),
           "ORCH_SIM_STEP_S": str(step_s), "ORCH_LEASE_S": "15"}
    for key in ("ORCH_DB_URL", "VAST_API_KEY", "RUNPOD_API_KEY"):
        env.pop(key, None)
    return env


def _queue(tmp: Path, n: int) -> None:
    os.environ["XDG_DATA_HOME"] = str(tmp)
    store = open_store(f"sqlite:///{tmp / 'orch' / 'orch.db'}")
    loaded = load_job(ROOT / "examples" / "quickstart.yml")
    for _ in range(n):
        record_job(store, loaded)
    store.close()


def batch(jobs: int, workers: int, steps: int, step_s: float) -> None:
    """Run the batch and print the billed-time breakdown."""
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        env = _env(tmp, steps, step_s)
        _queue(tmp, jobs)
        started = time.monotonic()
        procs = [subprocess.Popen([ORCH, "worker", "--once", "--quiet"], env=env, cwd=ROOT)
                 for _ in range(workers)]
        for p in procs:
            p.wait()
        wall = time.monotonic() - started
        con = sqlite3.connect(tmp / "orch" / "orch.db")
        rows = con.execute("SELECT provider_instance_id, created_at, terminated_at FROM "
                           "instance WHERE terminated_at IS NOT NULL").fetchall()
        # What the cloud billed (its own per-second meter, create to terminate), not orch's
        # timestamps around the calls.
        cloud = SimCloud(tmp / "orch" / "sim")
        billed = sum(cloud.charged_seconds(iid) if iid else math.ceil(_t(b) - _t(a))
                     for iid, a, b in rows)
        train = sum(r[0] or 0 for r in con.execute("SELECT train_seconds FROM job"))
        done = dict(con.execute("SELECT status, count(*) FROM job GROUP BY status").fetchall())
        phases = con.execute(
            "SELECT json_extract(data_json, '$.status'), at FROM event WHERE kind = 'state' "
            "AND job_id IN (SELECT id FROM job) ORDER BY job_id, id").fetchall()
        con.close()
        SimCloud(tmp / "orch" / "sim").terminate_all()
    share = (billed - train) / billed if billed else float("nan")
    print(f"batch: {jobs} jobs x {steps} steps of {step_s}s through {workers} workers in "
          f"{wall:.1f}s: {done}")
    print(f"  billed instance seconds      {billed:10.0f}")
    print(f"  of which training            {train:10.1f}")
    print(f"  outside training (overhead)  {billed - train:10.1f}  = {share:6.1%} of billed "
          f"(target < 10%)  {'OK' if share < 0.10 else 'OVER'}; "
          f"{(billed - train) / max(1, jobs):.1f} s per job")
    per_job = (billed - train) / max(1, jobs)
    print("  at this per-job overhead, the share for other training lengths (extrapolated): "
          + ", ".join(f"{t:.0f} s {per_job / (per_job + t):.1%}" for t in (20, 60, 120, 600)))
    spent: dict[str, float] = {}
    for (status, at), (_, nxt) in zip(phases, phases[1:], strict=False):
        if status in ("succeeded", "failed", "cancelled"):
            continue  # the next row is another job's first state
        spent[status] = spent.get(status, 0.0) + max(0.0, _t(nxt) - _t(at))
    print("  wall seconds per phase, all jobs: " + ", ".join(
        f"{k} {v:.1f}" for k, v in sorted(spent.items(), key=lambda kv: -kv[1])))


def preemption(steps: int, step_s: float) -> None:
    """Preempt a spot instance mid-training; time detection and re-placement."""
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        env = _env(tmp, steps, step_s)
        _queue(tmp, 1)
        db = tmp / "orch" / "orch.db"
        worker = subprocess.Popen([ORCH, "worker", "--once", "--quiet"], env=env, cwd=ROOT)
        try:
            deadline = time.monotonic() + 120
            iid = None
            while time.monotonic() < deadline:
                con = sqlite3.connect(db, timeout=10)
                n = con.execute("SELECT count(*) FROM event WHERE kind = 'train.progress'"
                                ).fetchone()[0]
                row = con.execute("SELECT provider_instance_id FROM instance").fetchone()
                con.close()
                if n >= 2 and row and row[0]:
                    iid = row[0]
                    break
                time.sleep(0.05)
            if iid is None:
                print("preemption: training never started")
                return
            t0 = time.time()
            SimCloud(tmp / "orch" / "sim").preempt(iid)
            worker.wait(timeout=300)
            con = sqlite3.connect(db)
            noticed = con.execute("SELECT min(at) FROM event WHERE kind = 'state' AND "
                                  "json_extract(data_json, '$.status') = 'interrupted'"
                                  ).fetchone()[0]
            replaced = con.execute("SELECT min(at) FROM event WHERE kind = 'instance.created'"
                                   " AND id > (SELECT min(id) FROM event WHERE kind = "
                                   "'instance.created')").fetchone()[0]
            status = con.execute("SELECT status FROM job").fetchone()[0]
            con.close()
        finally:
            worker.kill()
            SimCloud(tmp / "orch" / "sim").terminate_all()
    if noticed is None or replaced is None:
        print(f"preemption: not re-placed (job {status})")
        return
    print(f"preemption: noticed after {_t(noticed) - t0:5.2f}s, running again on a new "
          f"instance after {_t(replaced) - t0:5.2f}s (target < 10s); job {status}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=20)
    ap.add_argument("--workers", type=int, default=4)
    # One minute of training per job: short for a fine-tune, long against the stand-ins'
    # few seconds of set-up, merge and eval (pass --steps 40 --step-s 0.5 for 20 s jobs).
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--step-s", type=float, default=1.0)
    args = ap.parse_args()
    preemption(20, 0.3)
    batch(args.jobs, args.workers, args.steps, args.step_s)


if __name__ == "__main__":
    main()
