"""Whole-process wall time of `orch` commands against `python -c pass`, in the same run.

Prints medians and ratios; asserts nothing (machines here are noisy). Each command's ratio is
to `python -c pass` timed alternately with it, run for run. `--compare REF` also
times the same commands from git REF (exported to a temporary directory), each right
before this tree's, so "before" and "after" see about the same machine load. Bytecode is cached in a
temporary PYTHONPYCACHEPREFIX (as an installed package has its .pyc files), even where
PYTHONDONTWRITEBYTECODE is set. Usage:
    python bench/startup.py [--runs 15] [--compare main]
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
TARGET = 10.0  # issue 24: `orch plan` within ~10x a bare interpreter start


def measure(argv: list[str], runs: int, env: dict[str, str], base: list[str],
            base_env: dict[str, str]) -> tuple[float, float, float, float]:
    """Median wall and CPU (user+sys) seconds of `argv` over `runs` runs, after a warm-up,
    and of `base` (`python -c pass`), run right before each of them.

    Each command is compared with the bare interpreter timed alternately with it: the load
    of a shared machine drifts within a minute, and a baseline timed once at the start
    skews every ratio after it. CPU time is reported beside wall time because it is far
    less disturbed by other load on a shared 2-core machine.
    """
    def once(cmd: list[str], cmd_env: dict[str, str]) -> tuple[float, float]:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        subprocess.run(cmd, env=cmd_env, cwd=ROOT, stdout=subprocess.DEVNULL, check=True)
        wall = time.perf_counter() - t
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime

    subprocess.run(argv, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, check=True)
    own: list[tuple[float, float]] = []
    bare: list[tuple[float, float]] = []
    for _ in range(runs):
        bare.append(once(base, base_env))
        own.append(once(argv, env))
    return (statistics.median(w for w, _ in own), statistics.median(c for _, c in own),
            statistics.median(w for w, _ in bare), statistics.median(c for _, c in bare))


def cases(orch: list[str]) -> dict[str, list[str]]:
    """The commands timed, run through `orch` (a console script or `python -c ...`)."""
    return {
        "orch --help": [*orch, "--help"],
        **{f"orch plan examples/{n}.yml": [*orch, "plan", f"examples/{n}.yml"]
           for n in ("qlora-8b", "qlora-70b", "lora-14b", "full-32b")},
        "orch plan --json qlora-8b": [*orch, "plan", "--json", "examples/qlora-8b.yml"],
        "orch jobs (empty db)": [*orch, "jobs"],
    }


def exported(ref: str, into: Path) -> list[str]:
    """`orch` as of git `ref`, exported under `into`: a `python -c` running its entry point."""
    archive = subprocess.run(["git", "archive", ref], cwd=ROOT, check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    # The entry point moved: orchestrator/cli.py, orchestrator/entry.py, the
    # orchestrator.cli.entry fast path, now the typer app itself; older refs keep working.
    o = into / "orchestrator"
    if (o / "cli" / "app.py").exists():
        entry = "orchestrator.cli.entry" if (o / "cli" / "entry.py").exists() \
            else "orchestrator.cli.app"
    else:
        entry = "orchestrator" + "." + ("entry" if (o / "entry.py").exists() else "cli")
    return [sys.executable, "-c",
            f"import sys; sys.path.insert(0, {str(into)!r}); sys.argv[0] = 'orch'; "
            f"from {entry} import main; main()"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--compare", metavar="REF", help="also time git REF (e.g. main)")
    args = ap.parse_args()
    orch = shutil.which("orch") or str(Path(sys.executable).with_name("orch"))
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "XDG_DATA_HOME": tmp, "PYTHONPYCACHEPREFIX": f"{tmp}/pyc"}
        env.pop("ORCH_DB_URL", None)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        runs: dict[str, list[str]] = {}
        old: dict[str, list[str]] = {}
        if args.compare:
            (Path(tmp) / "ref").mkdir()
            old = cases(exported(args.compare, Path(tmp) / "ref"))
        for name, argv in cases([orch]).items():
            if name in old:
                runs[f"{args.compare}: {name}"] = old[name]
            runs[name] = argv
        # The ref keeps its own data directory: a database one version migrated may be one
        # the other cannot open (a newer schema revision), as `orch jobs` would then fail.
        ref_env = {**env, "XDG_DATA_HOME": f"{tmp}/ref-data"}
        Path(ref_env["XDG_DATA_HOME"]).mkdir()
        from_ref = {f"{args.compare}: {name}" for name in old}
        bare = [sys.executable, "-c", "pass"]
        print(f"{'command':40} {'wall ms':>8} {'x python':>9} {'cpu ms':>8} {'x python':>9}")
        bare_walls: list[float] = []
        for name, argv in runs.items():
            wall, cpu, base_wall, base_cpu = measure(
                argv, args.runs, ref_env if name in from_ref else env, bare, env)
            bare_walls.append(base_wall)
            flag = ""
            if "orch plan" in name:
                flag = "  ok" if wall / base_wall <= TARGET else f"  over {TARGET:.0f}x target"
            print(f"{name:40} {wall * 1000:8.1f} {wall / base_wall:9.1f} {cpu * 1000:8.1f} "
                  f"{cpu / base_cpu:9.1f}{flag}")
        print(f"x python: against `python -c pass` timed alternately with the command "
              f"({min(bare_walls) * 1000:.1f} to {max(bare_walls) * 1000:.1f} ms over the rows)")


if __name__ == "__main__":
    main()
