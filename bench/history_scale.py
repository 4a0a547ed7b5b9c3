"""History scale: `orch history`/`cost`/`sql` on 100,000 jobs against an empty history.

Builds a history of N jobs (each with ~5 events, 1-2 instances and a few metrics) in a temp
dir, then measures whole-process wall time (median of --runs) of each command on that
history and on an empty one, in the same run, and prints the ratio (target: within 2x),
plus each command's start-up cost against `python -c pass`. Asserts nothing (machines here
are noisy). Usage:
    python bench/history_scale.py [--jobs 100000] [--runs 5] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import random
import shlex
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET = 2.0  # issue: each command on 100k jobs within 2x of the same on an empty history

# The commands measured, as argv after `orch`. Extend here (e.g. `sweep show NAME`); a
# "{sweep}" placeholder is replaced by the name of a sweep that exists in the big history.
COMMANDS: list[list[str]] = [
    ["history", "--since", "30d"],
    ["cost", "--by", "month"],
    ["sql", "SELECT count(*) FROM job"],
    ["sweep", "show", "{sweep}"],
]

PROVIDERS = [("vastai", True), ("runpod", False), ("cloud", True), ("cloud", False),
             ("dedicated", False)]
GPUS = ["RTX 4090", "A100 80GB", "H100 SXM", "H100 PCIe", "H200", "B200"]
MODELS = ["meta-llama/Llama-3.1-8B", "Qwen/Qwen2.5-7B", "Qwen/Qwen2.5-14B",
          "Qwen/Qwen2.5-32B", "meta-llama/Llama-3.1-70B"]
METHODS = ["qlora", "lora", "full"]
STATUSES = ["succeeded"] * 16 + ["failed", "failed", "cancelled", "queued"]


def _t(dt: datetime) -> str:
    return dt.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def build(db: Path, jobs: int, seed: int = 7) -> None:
    """Create the schema with open_store, then bulk-insert `jobs` jobs with executemany."""
    from orchestrator.records.store import open_store

    open_store(f"sqlite:///{db}").close()
    rnd = random.Random(seed)
    now = datetime.now(UTC)
    span = timedelta(days=365)
    sweeps = [(f"s-{i:012x}", f"sweep-{i}", '{"objective":{"goal":"max",'
               '"metric":"eval.exact_match"}}', None, _t(now - span))
              for i in range(max(1, jobs // 500))]
    if jobs == 0:
        # The empty history still knows the sweep `sweep show` asks for, with no runs yet.
        con = sqlite3.connect(db)
        with con:
            con.executemany("INSERT INTO sweep (id, name, spec_json, budget_micros, "
                            "created_at) VALUES (?, ?, ?, ?, ?)", sweeps)
        con.close()
        return
    job_rows, event_rows, inst_rows, metric_rows = [], [], [], []
    for n in range(jobs):
        jid = f"j-{n:012x}"
        created = now - span * rnd.random()
        started = created + timedelta(minutes=rnd.uniform(1, 30))
        hours = rnd.uniform(0.2, 12)
        finished = started + timedelta(hours=hours)
        status = rnd.choice(STATUSES)
        provider, spot = rnd.choice(PROVIDERS)
        gpu, count = rnd.choice(GPUS), rnd.choice([1, 1, 2, 4, 8])
        price = rnd.randint(200_000, 3_000_000) * count
        cost = 0 if provider == "dedicated" else int(price * hours)
        sweep = sweeps[n % len(sweeps)][0] if sweeps and n % 3 == 0 else None
        interrupted = spot and rnd.random() < 0.1
        job_rows.append((
            jid, f"job-{n}", status, rnd.choice(METHODS), rnd.choice(MODELS), "{}", "0" * 64,
            sweep, provider, gpu, count, "monthly" if provider == "dedicated" else "per_second",
            spot, hours, cost, cost, 1 if interrupted else 0, _t(created), _t(finished),
            _t(started), None if status == "queued" else _t(finished),
            0 if provider != "dedicated" else int(price * hours / 10), 1 if interrupted else 0,
            rnd.randint(10, 200) if interrupted else 0))
        for k, kind in enumerate(("planned", "state", "step.changed", "step.changed", "state")):
            event_rows.append((jid, _t(created + timedelta(minutes=k)), kind, f"{kind} {k}"))
        for attempt in range(2 if interrupted else 1):
            end = finished if attempt == (1 if interrupted else 0) else started + timedelta(
                hours=hours / 2)
            inst_rows.append((
                jid, provider, f"i-{n}-{attempt}", gpu, count,
                "monthly" if provider == "dedicated" else "per_second", spot, price,
                "terminated", _t(started), _t(end), attempt, cost // (attempt + 1),
                "interrupted" if interrupted and attempt == 0 else "released"))
        for step in (100, 200, 300):
            metric_rows.append((jid, "train_loss", rnd.uniform(0.5, 2), step, _t(finished)))
        if status == "succeeded":
            metric_rows.append((jid, "eval.exact_match", rnd.random(), None, _t(finished)))
    con = sqlite3.connect(db)
    with con:
        con.executemany("INSERT INTO sweep (id, name, spec_json, budget_micros, created_at) "
                        "VALUES (?, ?, ?, ?, ?)", sweeps)
        con.executemany(
            "INSERT INTO job (id, name, status, method, base_model, spec_json, spec_hash, "
            "sweep_id, provider, gpu, gpu_count, billing, interruptible, est_hours, "
            "est_cost_micros, cost_micros, attempt, created_at, updated_at, started_at, "
            "finished_at, amortised_micros, interruptions, lost_steps) "
            "VALUES (" + ", ".join("?" * 24) + ")", job_rows)
        con.executemany("INSERT INTO event (job_id, at, kind, message) VALUES (?, ?, ?, ?)",
                        event_rows)
        con.executemany(
            "INSERT INTO instance (job_id, provider, provider_instance_id, gpu, gpu_count, "
            "billing, interruptible, price_per_hour_micros, state, created_at, terminated_at, "
            "attempt, cost_micros, end_reason) VALUES (" + ", ".join("?" * 14) + ")",
            inst_rows)
        con.executemany("INSERT INTO metric (job_id, name, value, step, at) "
                        "VALUES (?, ?, ?, ?, ?)", metric_rows)
    con.execute("ANALYZE")  # as a long-lived history would have after `orch` maintenance
    con.close()


def measure(argv: list[str], runs: int, env: dict[str, str]) -> float:
    """Median wall seconds of `argv` over `runs` runs, after one warm-up run."""
    subprocess.run(argv, env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=True)
    walls = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run(argv, env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=True)
        walls.append(time.perf_counter() - t)
    return statistics.median(walls)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--keep", type=Path, help="build the big history here and keep it")
    ap.add_argument("--orch", help="command prefix to run instead of the orch beside this "
                    "interpreter (the venv's console script), e.g. 'python my_shim.py'")
    args = ap.parse_args()
    orch = shlex.split(args.orch) if args.orch else [str(Path(sys.executable).with_name("orch"))]
    with tempfile.TemporaryDirectory() as tmp:
        big = (args.keep or Path(tmp)) / "big.db"
        empty = Path(tmp) / "empty.db"
        for path in (big, empty):
            for suffix in ("", "-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)
        t = time.perf_counter()
        build(big, args.jobs)
        print(f"built {args.jobs:,} jobs in {time.perf_counter() - t:.1f} s "
              f"({big.stat().st_size / 2**20:.0f} MiB)")
        build(empty, 0)
        base_env = {k: v for k, v in os.environ.items() if k != "ORCH_DB_URL"}
        env_big = {**base_env, "ORCH_DB_URL": f"sqlite:///{big}"}
        env_empty = {**base_env, "ORCH_DB_URL": f"sqlite:///{empty}"}
        python = measure([sys.executable, "-c", "pass"], args.runs, base_env)
        print(f"python -c pass: {python * 1000:.1f} ms")
        print(f"{'command':34} {'empty ms':>9} {f'{args.jobs // 1000}k ms':>9} "
              f"{'ratio':>6} {'start-up x python':>18}")
        for cmd in COMMANDS:
            argv = [*orch, *(a.replace("{sweep}", "sweep-0") for a in cmd)]
            e = measure(argv, args.runs, env_empty)
            b = measure(argv, args.runs, env_big)
            flag = "ok" if b / e <= TARGET else f"over {TARGET:.0f}x target"
            name = "orch " + " ".join(cmd)
            print(f"{name[:34]:34} {e * 1000:9.1f} {b * 1000:9.1f} {b / e:6.2f} "
                  f"{e / python:18.1f}  {flag}")


if __name__ == "__main__":
    main()
