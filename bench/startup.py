"""Whole-process wall time of `orch` commands against `python -c pass`, in the same run.

Prints medians and ratios; asserts nothing (machines here are noisy). Usage:
    python bench/startup.py [--runs 15]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET = 10.0  # issue: `orch plan` within 10x a bare interpreter start


def measure(argv: list[str], runs: int, env: dict[str, str]) -> tuple[float, float]:
    """Median wall and CPU (user+sys) seconds of `argv` over `runs` runs, after a warm-up.

    CPU time is reported beside wall time because it is far less disturbed by other load
    on a shared 2-core machine.
    """
    subprocess.run(argv, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, check=True)
    walls, cpus = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        subprocess.run(argv, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, check=True)
        walls.append(time.perf_counter() - t)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return statistics.median(walls), statistics.median(cpus)


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
        base: tuple[float, float] | None = None
        print(f"{'command':34} {'wall ms':>8} {'x python':>9} {'cpu ms':>8} {'x python':>9}")
        for name, argv in cases.items():
            wall, cpu = measure(argv, args.runs, env)
            base = base or (wall, cpu)
            flag = ""
            if name.startswith("orch plan"):
                flag = "  ok" if wall / base[0] <= TARGET else f"  over {TARGET:.0f}x target"
            print(f"{name:34} {wall * 1000:8.1f} {wall / base[0]:9.1f} {cpu * 1000:8.1f} "
                  f"{cpu / base[1]:9.1f}{flag}")


if __name__ == "__main__":
    main()
