"""Whole-process wall time of `orch` commands against `python -c pass`, in the same run.

Prints medians and ratios; asserts nothing (machines here are noisy). Usage:
    python bench/startup.py [--runs 15]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET = 10.0  # issue: `orch plan` within 10x a bare interpreter start


def wall(argv: list[str], runs: int, env: dict[str, str]) -> float:
    """Median wall seconds of `argv` over `runs` runs (after one warm-up)."""
    subprocess.run(argv, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, check=True)
    samples = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run(argv, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, check=True)
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    orch = shutil.which("orch") or str(Path(sys.executable).with_name("orch"))
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "XDG_DATA_HOME": tmp}
        env.pop("ORCH_DB_URL", None)
        cases = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "orch --help": [orch, "--help"],
            **{f"orch plan examples/{n}.yml": [orch, "plan", f"examples/{n}.yml"]
               for n in ("qlora-8b", "qlora-70b", "lora-14b", "full-32b")},
            "orch plan --json qlora-8b": [orch, "plan", "--json", "examples/qlora-8b.yml"],
            "orch jobs (empty db)": [orch, "jobs"],
        }
        base = None
        print(f"{'command':42} {'median ms':>10} {'x python':>9}")
        for name, argv in cases.items():
            t = wall(argv, args.runs, env)
            base = base or t
            flag = "" if name.startswith("python") or not name.startswith("orch plan") else (
                "  ok" if t / base <= TARGET else f"  over {TARGET:.0f}x target")
            print(f"{name:42} {t * 1000:10.1f} {t / base:9.1f}{flag}")


if __name__ == "__main__":
    main()
