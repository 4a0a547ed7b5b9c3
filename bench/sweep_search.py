"""A full grid against TPE + early stopping over the same space on `sim`, side by side (issue 38).

The space: learning rate {1e-4, 2e-4, 5e-4} x LoRA rank {8, 16, 32} x epochs {1, 2, 3} (27
configurations) over an 8B LoRA job that holds out an eval split (`val_set_size: 0.05`,
`eval_steps: 3`). Both sweeps run through the product as cron and a small fleet would:
`orch sweep FILE` every second (start to start: cron's minute, scaled) and --workers
`orch worker` processes, `max_parallel` --workers, `resources.keep_warm` for both. The grid
runs all 27; the search runs `search: {sampler: tpe, trials: 22, seed: --seed}` with
`early_stop: {metric: train.eval_loss, min_fraction: 0.01, reduction_factor: 4}`: optuna's
own defaults for its SuccessiveHalvingPruner (optuna 5.1.0,
optuna/pruners/_successive_halving.py: `reduction_factor=4`, and `min_resource="auto"`,
`_estimate_min_resource`: 1 % of the longest run's steps; Ray Tune's ASHA also defaults to
a reduction factor of 4 and a first rung at the first report). The first rung is then the
first eval report (step 3), where a losing run has cost least; docs/sweeps-search.md has
the per-trial records that led here. The objective is the final `train.eval_loss` (min),
which the simulated trainer reports by the landscape of docs/sim-landscape.md.

Setup and training are realistic, scaled down in wall time by --scale (default 1/60: a
real minute is a second here), as bench/sweep_cost.py scales them: boot from the
per-second catalog, the 8B model's download over its pull rate, 30 steps an epoch of
--step-s real seconds. Dollars are the simulated cloud's own meter (`SimCloud.billed` and
`cost`: every instance, create to terminate, each started second; the warm windows
included, the last ones ended as cron's `orch reconcile` would), next to what orch
recorded for the runs (`orch cost`). `orch sweep show` of each sweep is printed (every
trial, its rungs, what it cost); --keep DIR keeps each sweep's database and the meter's
bill per machine for reading afterwards. Asserts nothing (machines are noisy). Usage:
    python bench/sweep_search.py [--scale 0.0167] [--step-s 30] [--workers 3] [--seed 0]
                                 [--keep DIR]
The last line reads `grid_usd=... search_usd=... grid_best=... search_best=...`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.sweep_cost import setup  # noqa: E402
from providers.sim.compute import SimCloud  # noqa: E402

ORCH = shutil.which("orch", path=str(Path(sys.executable).parent)) or "orch"
STEPS_PER_EPOCH = 30
JOB = """name: search-base
base_model: meta-llama/Llama-3.1-8B
method: lora
lora: {{r: 16, alpha: 32, dropout: 0.05, target: all-linear}}
training: {{sequence_len: 1024, micro_batch_size: 2, gradient_accumulation_steps: 4,
           epochs: 1, learning_rate: 2.0e-4, val_set_size: 0.05}}
trainer: {{extra: {{eval_steps: 3}}}}
dataset: {{path: data/train.jsonl, format: alpaca}}
resources: {{spot: never, providers: [sim], keep_warm: {keep}}}
"""
SPACE = """base: job.yml
grid:
  training.learning_rate: [1.0e-4, 2.0e-4, 5.0e-4]
  lora.r: [8, 16, 32]
  training.epochs: [1, 2, 3]
max_parallel: {workers}
objective: {{metric: train.eval_loss, goal: min}}
"""
SEARCH = """search: {{sampler: tpe, trials: 22, seed: {seed}}}
early_stop: {{metric: train.eval_loss, goal: min, min_fraction: 0.01, reduction_factor: 4}}
"""


@dataclass
class Result:
    usd: Decimal  # the simulated cloud's meter
    recorded_usd: Decimal  # what orch recorded for the runs (`orch cost`)
    billed_s: int
    machines: int
    best: float | None
    runs: int
    pruned: int
    wall_s: float


def _env(tmp: Path, scale: float, step_s: float) -> dict[str, str]:
    # Llama-3.1-8B is gated: `sim` wants a token for it, as the Hub does (any token).
    env = {"HF_TOKEN": "hf_bench_token", **os.environ, "XDG_DATA_HOME": str(tmp / "xdg"),
           **setup(scale), "ORCH_SIM_TRAIN_STEPS": str(STEPS_PER_EPOCH),
           "ORCH_SIM_STEP_S": f"{step_s * scale:.3f}"}
    for key in ("ORCH_DB_URL", "VAST_API_KEY", "RUNPOD_API_KEY", "ORCH_FAILPOINT"):
        env.pop(key, None)
    return env


def _orch(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([ORCH, *args], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=1800, check=False)
    if done.returncode not in (0, 3):
        raise SystemExit(f"orch {' '.join(args)} failed: {done.stderr[-2000:]}")
    return done


def _finished(con: sqlite3.Connection, runs: int) -> bool:
    rows = con.execute("SELECT status FROM job").fetchall()
    return len(rows) >= runs and all(r[0] in ("succeeded", "failed", "cancelled", "pruned")
                                     for r in rows)


def run_sweep(name: str, search: bool, scale: float, step_s: float, workers: int,
              keep_s: int, seed: int = 0, keep: Path | None = None) -> Result:
    """One sweep through the product; what the cloud billed and what it found."""
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        shutil.copytree(ROOT / "examples" / "data", tmp / "data")
        (tmp / "job.yml").write_text(JOB.format(keep=f"{keep_s}s"))
        (tmp / "sweep.yml").write_text(f"name: {name}\n" + SPACE.format(workers=workers)
                                       + (SEARCH.format(seed=seed) if search else ""))
        env = _env(tmp, scale, step_s)
        runs = 22 if search else 27
        started = time.monotonic()
        _orch(env, tmp, "sweep", "sweep.yml", "-q")
        fleet = [subprocess.Popen([ORCH, "worker", "--poll", "0.5", "-q"], env=env, cwd=tmp,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for _ in range(workers)]
        db = tmp / "xdg" / "orch" / "orch.db"
        try:
            tick = time.monotonic()
            while True:  # cron: a tick every second (a minute, scaled), start to start
                tick += 1.0
                time.sleep(max(0.0, tick - time.monotonic()))
                _orch(env, tmp, "sweep", "sweep.yml", "-q")
                with sqlite3.connect(db, timeout=30) as con:
                    if _finished(con, runs):
                        break
        finally:
            for w in fleet:
                w.send_signal(signal.SIGTERM)
            for w in fleet:
                w.wait(timeout=120)
        wall = time.monotonic() - started
        cloud = SimCloud(tmp / "xdg" / "orch" / "sim")
        while cloud.list():  # the warm windows end as cron's reconcile ends them
            time.sleep(0.5)
            _orch(env, tmp, "reconcile")
        recorded = Decimal(json.loads(_orch(env, tmp, "cost", "--json").stdout)
                           ["total"]["cost"])
        with sqlite3.connect(db) as con:
            statuses = [r[0] for r in con.execute("SELECT status FROM job")]
            best = con.execute(
                "SELECT min(m.value) FROM metric m JOIN job j ON j.id = m.job_id WHERE "
                "j.status = 'succeeded' AND m.name = 'train.eval_loss' AND m.step IS NULL"
            ).fetchone()[0]
        billed = cloud.billed()
        print(_orch(env, tmp, "sweep", "show", name).stdout, flush=True)
        if keep is not None:  # the sweep's records, for reading its trials afterwards
            (keep / name).mkdir(parents=True, exist_ok=True)
            with sqlite3.connect(db) as src, sqlite3.connect(keep / name / "orch.db") as dst:
                src.backup(dst)  # with what the write-ahead log holds
            (keep / name / "billed.json").write_text(json.dumps(
                {i: [s, str(cloud.cost(i))] for i, s in billed.items()}))
        return Result(sum((cloud.cost(i) for i in billed), Decimal(0)), recorded,
                      sum(billed.values()), len(billed), best, len(statuses),
                      statuses.count("pruned"), wall)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1 / 60,
                        help="wall seconds per real second of setup and training")
    parser.add_argument("--step-s", type=float, default=30.0,
                        help="real seconds of one optimizer step (30 steps an epoch)")
    parser.add_argument("--workers", type=int, default=3, help="orch workers (max_parallel)")
    parser.add_argument("--keep-warm-s", type=float, default=300.0,
                        help="real seconds of resources.keep_warm (scaled too)")
    parser.add_argument("--seed", type=int, default=0, help="the search's seed (TPE)")
    parser.add_argument("--keep", type=Path, default=None,
                        help="keep each sweep's database and the meter's bill in DIR/NAME")
    args = parser.parse_args()
    keep_s = max(1, round(args.keep_warm_s * args.scale))
    shaped = setup(args.scale)
    print(f"scaled by {args.scale:.4f}: boot {float(shaped['ORCH_SIM_BOOT_S']):.2f} s, model "
          f"{int(shaped['ORCH_SIM_MODEL_BYTES']) / 1e9:.1f} GB at "
          f"{float(shaped['ORCH_SIM_DOWNLOAD_BPS']) / 1e9:.1f} GB/s, a step "
          f"{args.step_s * args.scale:.2f} s ({STEPS_PER_EPOCH} an epoch), keep_warm {keep_s} s, "
          f"{args.workers} workers", flush=True)
    grid = run_sweep("grid", False, args.scale, args.step_s, args.workers, keep_s,
                     keep=args.keep)
    found = run_sweep("search", True, args.scale, args.step_s, args.workers, keep_s,
                      args.seed, args.keep)
    rows = [("runs (pruned)", f"{grid.runs} ({grid.pruned})", f"{found.runs} ({found.pruned})"),
            ("machines rented", grid.machines, found.machines),
            ("billed seconds", grid.billed_s, found.billed_s),
            ("dollars (sim meter)", grid.usd, found.usd),
            ("dollars (orch cost)", grid.recorded_usd, found.recorded_usd),
            ("best eval loss", grid.best, found.best),
            ("wall seconds", round(grid.wall_s, 1), round(found.wall_s, 1))]
    print(f"{'27-point space':<22}{'grid':>14}{'tpe+asha':>14}{'ratio':>10}")
    for label, a, b in rows:
        ratio = (f"{float(b) / float(a):.3f}" if isinstance(a, int | float | Decimal)
                 and isinstance(b, int | float | Decimal) and a else "")
        print(f"{label:<22}{a!s:>14}{b!s:>14}{ratio:>10}")
    print(f"grid_usd={grid.usd} search_usd={found.usd} grid_best={grid.best} "
          f"search_best={found.best}")


if __name__ == "__main__":
    main()
