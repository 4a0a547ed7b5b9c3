"""CPU time of one simulated-host command (simhost stand-ins) against `python -S -E -c pass`.

A simulated job runs ~60 of these (`docker inspect`, `dpkg-query`, `nvidia-smi`, ...), ~9,000
in a test run. Each is its host's bin/<cmd>, as an SSH session runs it: the compiled client
(simhost/bin/relay.c, see simhost/standins/client.py) hands the short ones to the host's init
(simhost/bin/_relay.py), which has imported the stand-ins once and forks a process per
command. Three real simulated hosts run each command: "relayed" (the default), "python
client" (SIMHOST_CLIENT=python: bin/<cmd> is a shell wrapper that starts `python -S -E
simhost/bin/<cmd>`, which relays), and "alone" (that wrapper, and SIMHOST_RELAY=0: the
command runs in the Python process it starts, importing the stand-ins each time). A relayed
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
def host(tmp: Path, name: str, env: dict[str, str]) -> Iterator[SimHost]:
    """A running simulated host (a real sshd on loopback and its init), prepared and started
    with `env` added to this process's environment."""
    key = tmp / f"{name}-key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        started = SimHost(tmp / name, key.with_suffix(".pub").read_text(),
                          SimHostOptions()).start()
    finally:
        os.environ.clear()
        os.environ.update(saved)
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
        python_client = {"SIMHOST_CLIENT": "python"}
        with host(tmp, "relaying", {}) as relaying, \
                host(tmp, "python", python_client) as python_relaying, \
                host(tmp, "alone", {**python_client, "SIMHOST_RELAY": "0"}) as alone:
            python = [sys.executable, "-S", "-E"]
            plain = {**os.environ, "SIMHOST_DIR": str(alone.dir)}
            base = cpu_ms([*python, "-c", "pass"], args.runs, plain, None)
            print(f"{'command':50} {'how':>14} {'cpu ms':>8} {'x python':>9}")
            print(f"{'python -S -E -c pass':50} {'':>14} {base:8.1f} {1.0:9.1f}")
            # how -> (the command's folder, its host, the host whose init relays or None)
            ways: dict[str, tuple[Path, SimHost, SimHost | None]] = {
                "alone": (alone.bin_dir, alone, None),
                "python client": (python_relaying.bin_dir, python_relaying, python_relaying),
                "relayed": (relaying.bin_dir, relaying, relaying)}
            if args.compare:
                (tmp / "ref").mkdir()
                ways = {args.compare: (exported(args.compare, tmp / "ref") / "bin", alone, None),
                        **ways}
            for command in COMMANDS:
                for how, (folder, on, init) in ways.items():
                    env = {**os.environ, "SIMHOST_DIR": str(on.dir)}
                    # REF's hosts had the shell wrapper in bin/ that "alone" has.
                    start = (["/bin/sh", "-c", 'exec "$@"', "sh", *python, str(folder / command[0])]
                             if how == args.compare else [str(folder / command[0])])
                    ms = cpu_ms([*start, *command[1:]], args.runs, env, init)
                    print(f"{' '.join(command):50} {how:>14} {ms:8.1f} {ms / base:9.1f}")


if __name__ == "__main__":
    main()
