"""CPU time of one simulated-host command (simhost stand-ins) against `python -S -E -c pass`.

A simulated job runs ~56 of these (`docker inspect`, `dpkg-query`, `nvidia-smi`, ...), each a
fresh `python -S -E` process, so their start-up is paid ~56 times a job and ~100 jobs a test
run. Prints the median CPU (user+sys) ms per command and the ratio to a bare interpreter;
CPU, not wall time, because it is far less disturbed by other load on a shared machine.
`--compare REF` also runs the stand-ins of git REF (exported to a temporary directory), each
right before this tree's. Asserts nothing. Usage:
    python bench/standins.py [--runs 30] [--compare main]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from simhost import SimHostOptions  # noqa: E402

COMMANDS = (["id", "-u"], ["docker", "--version"], ["nvidia-smi", "-L"], ["df", "-B1", "/"],
            ["dpkg-query", "-W", "curl"])


def cpu_ms(argv: list[str], runs: int, env: dict[str, str]) -> float:
    """Median CPU ms of `argv` over `runs` runs, after one warm-up (it writes the .pyc files)."""
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    samples = []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        samples.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return statistics.median(samples) * 1000


def exported(ref: str, into: Path) -> Path:
    """The simhost/ folder of git `ref`, exported under `into`."""
    archive = subprocess.run(["git", "archive", ref, "simhost"], cwd=ROOT, check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "simhost"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--compare", metavar="REF", help="also time git REF's stand-ins (e.g. main)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        # A host directory with the default options: what the commands read, where events go
        # (the commands see an installed driver and Docker; dpkg-query finds no curl).
        state = Path(tmp) / "host" / "state"
        state.mkdir(parents=True)
        (state / "options.json").write_text(json.dumps(asdict(SimHostOptions())))
        (state / "id").write_text("bench\n")
        env = {**os.environ, "SIMHOST_DIR": str(state.parent)}
        trees = {"this tree": ROOT / "simhost"}
        if args.compare:
            (Path(tmp) / "ref").mkdir()
            trees = {args.compare: exported(args.compare, Path(tmp) / "ref"), **trees}
        python = [sys.executable, "-S", "-E"]
        base = cpu_ms([*python, "-c", "pass"], args.runs, env)
        print(f"{'command':34} {'tree':>12} {'cpu ms':>8} {'x python':>9}")
        print(f"{'python -S -E -c pass':34} {'':>12} {base:8.1f} {1.0:9.1f}")
        for command in COMMANDS:
            for name, tree in trees.items():
                ms = cpu_ms([*python, str(tree / "bin" / command[0]), *command[1:]],
                            args.runs, env)
                print(f"{' '.join(command):34} {name:>12} {ms:8.1f} {ms / base:9.1f}")


if __name__ == "__main__":
    main()
