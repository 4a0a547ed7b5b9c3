"""A 6-run LoRA sweep on `sim`, fresh machines vs warm reuse (issue 22), side by side.

The same sweep (learning rate x LoRA rank over an 8B LoRA job) runs twice through the
product's own path, `orch sweep FILE` then one `orch worker --once`: once with every run on a
fresh machine (`resources.keep_warm: 0`), once with `keep_warm` so each run after the first
takes the machine the previous one parked. Setup is realistic, scaled down in wall time by
--scale (default 1/60: a real minute is a second here):
- boot (instance start and image pull): the per-second catalog's `boot_minutes`;
- base model download: the model's bf16 size (`throughput.model_download_bytes`) over the
  catalog's `pull_gbps`;
- training: --train-s (real seconds) per run.
Billed seconds and dollars are the simulated cloud's own meter (every instance, create to
terminate, each started second), so the warm case pays for its idle windows, the last one
included (it ends when its window closes: `orch reconcile` after the window, as cron would).
Every run's record is checked as complete as a fresh run's (succeeded, cost, metrics,
artifacts, events). Asserts nothing (machines are noisy). Usage:
    python bench/sweep_cost.py [--scale 0.0167] [--keep-warm-s 300] [--train-s 180]
The last line reads `fresh_billed_s=... warm_billed_s=... fresh_usd=... warm_usd=...`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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

from orchestrator.core import throughput  # noqa: E402
from orchestrator.core.planning import workload_from  # noqa: E402
from orchestrator.core.spec import load_job  # noqa: E402
from providers import catalog  # noqa: E402
from providers.sim.compute import SimCloud  # noqa: E402

ORCH = shutil.which("orch", path=str(Path(sys.executable).parent)) or "orch"
JOB = """name: lora-8b-sweep-base
base_model: meta-llama/Llama-3.1-8B
method: lora
lora: {{r: 16, alpha: 32, dropout: 0.05, target: all-linear}}
training: {{sequence_len: 1024, micro_batch_size: 2, gradient_accumulation_steps: 4,
           epochs: 1, learning_rate: 2.0e-4}}
dataset: {{path: data/train.jsonl, format: alpaca}}
eval: {{eval_set: data/eval.jsonl}}
resources: {{spot: never, providers: [sim], keep_warm: {keep}}}
"""
SWEEP = """name: warm-bench
base: job.yml
grid:
  training.learning_rate: [1.0e-4, 2.0e-4, 5.0e-4]
  lora.r: [8, 16]
max_parallel: 1
budget: 50
objective: {metric: eval.exact_match, goal: max}
"""


@dataclass
class Result:
    billed_s: int
    usd: Decimal
    wall_s: float
    machines: int
    complete: int  # runs whose record is complete
    runs: int


def setup(scale: float) -> dict[str, str]:
    """The simulated cloud's ORCH_SIM_* for realistic setup times, scaled down."""
    loaded = load_job(ROOT / "examples" / "qlora-8b.yml")
    model_bytes = throughput.model_download_bytes(workload_from(loaded))
    cat = catalog.load()
    per_second = next(o for o in cat.offers if o.provider == "cloud")
    bytes_per_s = per_second.pull_bytes_per_s
    return {"ORCH_SIM_BOOT_S": f"{per_second.boot_minutes * 60 * scale:.3f}",
            "ORCH_SIM_MODEL_BYTES": str(model_bytes),
            "ORCH_SIM_DOWNLOAD_BPS": f"{bytes_per_s / scale:.0f}"}


def complete(con: sqlite3.Connection, job_id: str) -> bool:
    """As a fresh run's record: succeeded, costed, scored, artifacts home, placed events."""
    status, cost, artifacts = con.execute(
        "SELECT status, cost_micros, artifacts_dir FROM job WHERE id = ?", (job_id,)).fetchone()
    metrics = {r[0] for r in con.execute("SELECT name FROM metric WHERE job_id = ?", (job_id,))}
    kinds = {r[0] for r in con.execute("SELECT kind FROM event WHERE job_id = ?", (job_id,))}
    return (status == "succeeded" and cost > 0 and bool(artifacts) and Path(artifacts).is_dir()
            and {"eval.exact_match", "train.loss"} <= metrics
            and {"connected", "metrics", "artifacts"} <= kinds)


def run_sweep(keep: str, scale: float, train_s: float) -> Result:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        shutil.copytree(ROOT / "examples" / "data", tmp / "data")
        (tmp / "job.yml").write_text(JOB.format(keep=keep))
        (tmp / "sweep.yml").write_text(SWEEP)
        steps = 20
        # Llama-3.1-8B is gated: `sim` wants a token for it, as the Hub does (any token).
        env = {"HF_TOKEN": "hf_bench_token", **os.environ, "XDG_DATA_HOME": str(tmp / "xdg"),
               **setup(scale), "ORCH_SIM_TRAIN_STEPS": str(steps),
               "ORCH_SIM_STEP_S": f"{train_s * scale / steps:.3f}"}
        for key in ("ORCH_DB_URL", "VAST_API_KEY", "RUNPOD_API_KEY"):
            env.pop(key, None)

        def orch(*args: str) -> subprocess.CompletedProcess[str]:
            done = subprocess.run([ORCH, *args], env=env, cwd=tmp, capture_output=True,
                                  text=True, timeout=1800, check=False)
            if done.returncode not in (0, 3):
                raise SystemExit(f"orch {' '.join(args)} failed: {done.stderr[-2000:]}")
            return done

        orch("sweep", "sweep.yml")
        started = time.monotonic()
        orch("worker", "--once", "--quiet")
        wall = time.monotonic() - started
        # The last machine stays warm for its window: ended as cron's reconcile would.
        cloud = SimCloud(tmp / "xdg" / "orch" / "sim")
        while cloud.list():
            warm = json.loads(orch("warm", "--json").stdout)["warm"]
            left = [w for w in warm if w["state"] in ("parked", "ending")]
            if not left:
                break
            time.sleep(0.5)
            orch("reconcile")
        con = sqlite3.connect(tmp / "xdg" / "orch" / "orch.db")
        ids = [r[0] for r in con.execute("SELECT id FROM job ORDER BY created_at")]
        billed = cloud.billed()
        return Result(sum(billed.values()), sum((cloud.cost(i) for i in billed), Decimal(0)),
                      wall, len(billed), sum(complete(con, j) for j in ids), len(ids))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1 / 60,
                        help="wall seconds per real second of setup and training")
    parser.add_argument("--keep-warm-s", type=float, default=300.0,
                        help="real seconds of resources.keep_warm in the warm run (scaled too)")
    parser.add_argument("--train-s", type=float, default=180.0,
                        help="real seconds of training per run")
    args = parser.parse_args()
    shaped = setup(args.scale)
    print(f"setup per fresh machine, scaled by {args.scale:.4f}: boot "
          f"{float(shaped['ORCH_SIM_BOOT_S']):.2f} s, model "
          f"{int(shaped['ORCH_SIM_MODEL_BYTES']) / 1e9:.1f} GB at "
          f"{float(shaped['ORCH_SIM_DOWNLOAD_BPS']) / 1e9:.1f} GB/s; training "
          f"{args.train_s * args.scale:.2f} s per run; keep_warm "
          f"{max(1, round(args.keep_warm_s * args.scale))} s")
    fresh = run_sweep("0", args.scale, args.train_s)
    keep = f"{max(1, round(args.keep_warm_s * args.scale))}s"
    warm = run_sweep(keep, args.scale, args.train_s)
    rows = [("billed seconds", fresh.billed_s, warm.billed_s),
            ("dollars", fresh.usd, warm.usd), ("wall seconds", round(fresh.wall_s, 1),
                                               round(warm.wall_s, 1)),
            ("machines rented", fresh.machines, warm.machines),
            ("complete records", f"{fresh.complete}/{fresh.runs}",
             f"{warm.complete}/{warm.runs}")]
    print(f"{'6-run LoRA sweep':<18}{'fresh':>12}{'warm':>12}{'warm/fresh':>12}")
    for name, a, b in rows:
        ratio = (f"{float(b) / float(a):.2f}" if isinstance(a, int | float | Decimal) and a
                 else "")
        print(f"{name:<18}{a!s:>12}{b!s:>12}{ratio:>12}")
    print(f"fresh_billed_s={fresh.billed_s} warm_billed_s={warm.billed_s} "
          f"fresh_usd={fresh.usd} warm_usd={warm.usd}")


if __name__ == "__main__":
    main()
