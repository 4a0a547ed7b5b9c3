"""CPU time of one simulated-host command (simhost stand-ins) against `python -S -E -c pass`.

A simulated job runs ~60 of these (`docker inspect`, `dpkg-query`, `nvidia-smi`, ...), each
started by `python -S -E simhost/bin/<cmd>`, ~9,000 in a test run. The short ones are relayed
to the host's init (simhost/bin/_relay.py), which has imported the stand-ins once and forks
a process per command; the others import them each time. Two real simulated hosts run each
command: one relaying (the default) and one started with SIMHOST_RELAY=0. A relayed
command's CPU is the starting process's plus what init spent on it (the forked processes'
time, read from init's reaped-children times in /proc). Prints the median CPU ms (user+sys)
per command and the ratio to a bare interpreter; CPU, not wall time, because it is far less
disturbed by other load on a shared machine. `--compare REF` also runs git REF's stand-ins
(exported to a temporary directory) started alone, each right before this tree's. Asserts
nothing. Usage:
    python bench/standins.py [--runs 30] [--compare main]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from simhost import SimHost, SimHostOptions  # noqa: E402

COMMANDS = (["id", "-u"], ["docker", "--version"], ["nvidia-smi", "-L"], ["df", "-B1", "/"],
            ["dpkg-query", "-W", "curl"],
            ["docker", "inspect", "-f", "{{.State.Status}}", "orch-train-x"])
TICK = os.sysconf("SC_CLK_TCK")


def init_cpu(host: SimHost | None) -> float:
    """Seconds of CPU of the processes the host's init forked and reaped so far."""
    if host is None:
        return 0.0
    pid = int((host.state_dir / "init.pid").read_text())
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rfind(")") + 2:].split()
    return (int(fields[13]) + int(fields[14])) / TICK  # cutime, cstime


def cpu_ms(argv: list[str], runs: int, env: dict[str, str], host: SimHost | None) -> float:
    """Median CPU ms of `argv` over `runs` runs, after one warm-up (it writes the .pyc files);
    with `host`, plus the mean that host's init spent per run."""
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    samples = []
    init_before = init_cpu(host)
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        samples.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    # init reaps its forks a little later (it polls every 0.5 s at most)
    subprocess.run([sys.executable, "-c", "import time; time.sleep(0.6)"])
    return (statistics.median(samples) + (init_cpu(host) - init_before) / runs) * 1000


def exported(ref: str, into: Path) -> Path:
    """The simhost/ folder of git `ref`, exported under `into`."""
    archive = subprocess.run(["git", "archive", ref, "simhost"], cwd=ROOT, check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "simhost"


@contextmanager
def host(tmp: Path, name: str, relay: bool) -> Iterator[SimHost]:
    """A running simulated host (a real sshd on loopback and its init)."""
    key = tmp / f"{name}-key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    if not relay:
        os.environ["SIMHOST_RELAY"] = "0"
    try:
        started = SimHost(tmp / name, key.with_suffix(".pub").read_text(),
                          SimHostOptions()).start()
    finally:
        os.environ.pop("SIMHOST_RELAY", None)
    try:
        yield started
    finally:
        started.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--compare", metavar="REF", help="also time git REF's stand-ins (e.g. main)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        with host(tmp, "relaying", True) as relaying, host(tmp, "alone", False) as alone:
            python = [sys.executable, "-S", "-E"]
            plain = {**os.environ, "SIMHOST_DIR": str(alone.dir)}
            base = cpu_ms([*python, "-c", "pass"], args.runs, plain, None)
            print(f"{'command':45} {'how':>12} {'cpu ms':>8} {'x python':>9}")
            print(f"{'python -S -E -c pass':45} {'':>12} {base:8.1f} {1.0:9.1f}")
            trees = {"alone": (ROOT / "simhost", alone, None),
                     "relayed": (ROOT / "simhost", relaying, relaying)}
            if args.compare:
                (tmp / "ref").mkdir()
                trees = {f"{args.compare}": (exported(args.compare, tmp / "ref"), alone, None),
                         **trees}
            for command in COMMANDS:
                for how, (tree, on, init) in trees.items():
                    env = {**os.environ, "SIMHOST_DIR": str(on.dir)}
                    ms = cpu_ms([*python, str(tree / "bin" / command[0]), *command[1:]],
                                args.runs, env, init)
                    print(f"{' '.join(command):45} {how:>12} {ms:8.1f} {ms / base:9.1f}")


if __name__ == "__main__":
    main()
