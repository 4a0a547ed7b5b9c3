"""Jobs with deadlines on the simulated cloud's spot markets, three strategies side by side.

Issue 41's bench through the product: for each regime of providers/sim/spot_regimes.yaml
(ORCH_SIM_SPOT_REGIME; seeded; time-scaled by ORCH_SIM_SPOT_SECONDS_PER_HOUR), --jobs seeded
jobs run under each strategy, each as its own `orch submit` (the job's clock, and so its
deadline, starts when it is submitted), --parallel at a time:
- on-demand: `resources.spot: never`;
- spot only: `spot: required` (a job with a deadline waits while spot is gone);
- policy: `spot: allowed`, orch's deadline contract (orchestrator/engine/deadlines.py).
Every job has the same `deadline_hours`. Dollars are the simulated cloud's own per-second
meter (`SimCloud.charged_seconds`) at each instance's price; a deadline is missed when the
job did not succeed by `created_at + deadline_hours`.

Jobs (seeded, --seed): training of --work-h trace hours (2) on one GPU of A100 80GB,
RTX 5090, H100 PCIe by turn (each its own trace of the regime) at the catalog's prices (spot
at half of on-demand), a deadline at the training over a job fraction drawn from 0.4 to 0.8
plus --slack-s for the merge and delivery. All regimes run at once in one pool of --parallel
`orch submit`s (each regime its own records and market), so the machine is never idle on one
regime's tail. The load average and CPU use while it runs are printed (a starved machine
makes every restart longer than the policy was told).

The clock: --seconds-per-hour wall seconds per trace hour (48), and every duration the
policy weighs is scaled by the same factor (48/3600), so a job sees the same market and
makes the same choices as one 75 times slower:
    trace                    real engine            here (48 s per trace hour)
    training (2 h)           2 h                    96 s (48 steps of --step-s 2 s)
    restart: rent, boot,     ~5 min (catalog boot)  the sim's rent + SSH + host check +
      check, setup, resume   + download             stand-ins: 6.4-8.3 s median to the
                                                    trainer's start in the 50-job runs
                                                    (8-10 trace min; fastest 5.5-5.8 s)
    checkpoint interval      15 min (on spot:       12 s (ORCH_CHECKPOINT_EVERY_S; under
                               Young's, 1-15 min)   the 1 min floor of the spot interval,
                                                    core/checkpointing: so on spot too)
    deadline check           300 s                  4 s (ORCH_DEADLINE_CHECK_S)
    spot market              1 h                    48 s (ORCH_SIM_SPOT_SECONDS_PER_HOUR)
    progress poll            5 s                    2 s (ORCH_POLL_S, one step; not scaled:
                                                    the end noticed <= 2.5 trace min late)
    preemption noticed       2 s (watch)            0.5 s (the sim's watch: 37 trace s)
The job's dataset says its size in tokens (`dataset.tokens`) so that orch's step count, and
with it the checkpoint interval (`save_steps`), is that of the stand-in's training. The
restart is the one duration not set by a setting: it is the simulated cloud's real work, and
is kept in proportion only while the machine is not starved (hence the load line).

The spot seconds are also priced at a documented marketplace ratio (--ratio, default 3.33:
the paper's AWS V100 ratio, docs/deadline.md); the policy's choices do not change with it
here, as spot is cheaper per hour of progress at both prices. The last line reads
`ondemand_usd=... spot_usd=... policy_usd=... spot_missed=... policy_missed=...` over all
regimes at the catalog's prices. Usage:
    python bench/deadline.py [--jobs 50] [--parallel 24] [--regimes calm,bursty,heavy]
        [--seconds-per-hour 48] [--work-h 2] [--step-s 2] [--seed 41] [--keep DIR]
Every job trains as long (the simulated trainer's steps), and the stand-in's throughput is
recorded first as orch would have measured it (`calibrate`): the plan's estimate of the
training, what the policy plans with before it measures the job's rate, is then right.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import deadline_oracle  # noqa: E402
from providers.sim.compute import SimCloud  # noqa: E402

ORCH = shutil.which("orch", path=str(Path(sys.executable).parent)) or "orch"
STRATEGIES = {"ondemand": "never", "spot": "required", "policy": "allowed",
              "calibrate": "never"}
# Each GPU model has its own trace in a simulated market: jobs spread over three see three
# independent markets of the regime, not one (their prices differ; every strategy runs the
# same jobs, so the ratios compare like with like). The sim's GPUs with spot and on-demand.
GPUS = ("A100 80GB", "RTX 5090", "H100 PCIe")
DISK_FLOOR = 125e6  # bytes/s: the host check's disk floor at the catalog's 2 Gbit/s
PER_STEP = 1024 * 2 * 4  # tokens per step of the quickstart job (sequence x batch x accumulation)


@dataclass(frozen=True)
class Spec:
    """One seeded job: training steps and the deadline in wall seconds."""

    steps: int
    deadline_s: float


@dataclass
class Tally:
    """One strategy's totals in one regime."""

    usd: Decimal = Decimal(0)
    usd_at_ratio: Decimal = Decimal(0)  # spot priced at its GPU's on-demand / --ratio
    missed: int = 0
    jobs: int = 0

    def add(self, other: Tally) -> None:
        self.usd += other.usd
        self.usd_at_ratio += other.usd_at_ratio
        self.missed += other.missed
        self.jobs += other.jobs


def specs(n: int, seed: int, work_h: float, per_hour: float, slack_s: float,
          step_s: float) -> list[Spec]:
    """`n` seeded jobs: the same training, a deadline at a job fraction of 0.4 to 0.8."""
    rng = random.Random(seed)
    work = work_h * per_hour
    return [Spec(max(1, round(work / step_s)), work / rng.uniform(0.4, 0.8) + slack_s)
            for _ in range(n)]


def calibrate(home: Path, env: dict[str, str], spec: Spec, step_s: float) -> None:
    """Record the throughput orch would have measured of the stand-in trainer on this GPU
    (orch records none on a simulated cloud): the plan's estimate of the training, which
    the policy plans with until it has measured the job's own rate, is then the real one."""
    from orchestrator.core import throughput
    from orchestrator.core.planning import total_tokens
    from orchestrator.core.spec import load_job
    from orchestrator.records.store import open_store

    path = job_file(home / "jobs", 0, "calibrate", spec)
    done = subprocess.run([ORCH, "submit", str(path), "--dry-run", "--json"], env=env,
                          cwd=ROOT, capture_output=True, text=True, check=True)
    job_id = json.loads(done.stdout)["job_id"]
    loaded = load_job(path)
    store = open_store(f"sqlite:///{home / 'orch' / 'orch.db'}")
    for gpu in GPUS:
        store.add_throughput(job_id, gpu, 1, loaded.spec.method,
                             throughput.size_class(loaded.architecture.params),
                             total_tokens(loaded) / (spec.steps * step_s))
    store.close()


def job_file(folder: Path, i: int, strategy: str, spec: Spec) -> Path:
    """The quickstart job without its evaluation, on one GPU of GPUS by turn (the stand-in
    trains no faster on two, which the plan would expect), with the deadline."""
    text = (ROOT / "examples" / "quickstart.yml").read_text()
    text = text.replace("eval:\n  eval_set: data/eval.jsonl\n", "")
    # The dataset's size is the stand-in's steps: orch's step count, and so its checkpoint
    # interval (`save_steps`), is then that of the training that runs.
    text = text.replace("  format: alpaca\n",
                        f"  format: alpaca\n  tokens: {spec.steps * PER_STEP}\n")
    text = text.replace("name: quickstart-qwen25-05b", f"name: {strategy}-{i}")
    text = text.replace("  spot: allowed\n", f"  spot: {STRATEGIES[strategy]}\n"
                        f"  gpus: [{GPUS[i % len(GPUS)]}]\n  gpu_count: 1\n"
                        f"  deadline_hours: {spec.deadline_s / 3600:.6f}\n")
    path = folder / f"{strategy}-{i}.yml"
    path.write_text(text)
    return path


def run_one(env: dict[str, str], path: Path, spec: Spec) -> None:
    subprocess.run([ORCH, "submit", str(path), "--json"], env={
        **env, "ORCH_SIM_TRAIN_STEPS": str(spec.steps)}, cwd=ROOT, capture_output=True,
        timeout=3600, check=False)


def tally(home: Path, ratio: Decimal) -> dict[str, Tally]:
    """Each strategy's dollars (the cloud's meter) and deadlines missed, from the records."""
    con = deadline_oracle.open_run(home)
    cloud = SimCloud(home / "orch" / "sim")
    found = {s: Tally() for s in STRATEGIES}
    names: dict[str, str] = {}
    for job_id, name, status, created, finished, spec_json in con.execute(
            "SELECT id, name, status, created_at, finished_at, spec_json FROM job"):
        strategy = name.split("-")[0]
        names[job_id] = strategy
        if strategy == "calibrate":
            continue
        hours = float(json.loads(spec_json)["resources"]["deadline_hours"])
        t = found[strategy]
        t.jobs += 1
        epoch = deadline_oracle.epoch
        late = finished is None or epoch(finished) - epoch(created) > hours * 3600
        t.missed += int(status != "succeeded" or late)
    rows = con.execute("SELECT job_id, provider_instance_id, price_per_hour_micros, "
                       "interruptible, gpu FROM instance WHERE provider_instance_id IS NOT "
                       "NULL").fetchall()
    on_demand = {gpu: price for _, _, price, spot, gpu in rows if not spot}
    for job_id, iid, price, spot, gpu in rows:
        seconds = cloud.charged_seconds(iid)
        t = found[names[job_id]]
        t.usd += Decimal(price) * seconds / 3600 / 1_000_000
        hourly = Decimal(on_demand.get(gpu, price * 2)) / ratio if spot else Decimal(price)
        t.usd_at_ratio += hourly * seconds / 3600 / 1_000_000
    con.close()
    return found


def checkpoint_s(regime: str, args: argparse.Namespace) -> float:
    """The checkpoint interval in trace seconds: 15 min, or with --checkpoint young the
    shortest one orch gives a spot machine of the bench's job in `regime` on GPUS
    (core/checkpointing: Young's for the regime's preemption rate and the job's QLoRA
    checkpoint, as the planner trains it on that GPU, at the disk floor), which the bench
    scales as it scales the others (the real write time and rate go into it unscaled, so it
    is the real engine's interval). It is a setting of the whole run: the on-demand machines
    checkpoint as often, which costs them nothing here (they are not preempted, and the
    stand-in's writes take no training time)."""
    if args.checkpoint == "fixed":
        return 900.0
    from orchestrator.core import checkpointing, savers, sizing
    from orchestrator.core.planning import workload_from
    from orchestrator.core.spec import load_job
    from providers import catalog
    from providers.sim import spotmarket

    rate = spotmarket.regimes()[regime].matched["preemptions_per_hour"]
    requested = workload_from(load_job(ROOT / "examples" / "quickstart.yml"))
    found = []
    for name in GPUS:
        gpu = catalog.gpus()[name]
        est = savers.fit(requested, 1, gpu.memory_bytes, None, gpu)
        w = est.workload if est is not None and est.workload else savers.fallback(requested)
        found.append(checkpointing.interval(900.0, checkpointing.Spot(rate, DISK_FLOOR),
                                            sizing.checkpoint_bytes(w)).seconds)
    return min(found)


def prepare(name: str, root: Path, args: argparse.Namespace) -> tuple[Path, dict[str, str],
                                                                      list[tuple[Path, Spec]]]:
    """One regime's home (its own records and simulated market), environment and jobs."""
    home = root / name
    (home / "jobs").mkdir(parents=True)
    shutil.copytree(ROOT / "examples" / "data", home / "jobs" / "data")
    (home / "orch" / "sim").mkdir(parents=True)
    env = {**os.environ, "XDG_DATA_HOME": str(home), "ORCH_SIM_SPOT_REGIME": name,
           "ORCH_SIM_SPOT_SEED": str(args.seed),
           "ORCH_SIM_SPOT_SECONDS_PER_HOUR": str(args.seconds_per_hour),
           "ORCH_DEADLINE_CHECK_S": f"{300 / 3600 * args.seconds_per_hour:.3f}",
           "ORCH_CHECKPOINT_EVERY_S":
               f"{checkpoint_s(name, args) / 3600 * args.seconds_per_hour:.3f}",
           "ORCH_SIM_STEP_S": str(args.step_s), "ORCH_POLL_S": str(args.step_s),
           "ORCH_LEASE_S": "15"}
    for key in ("ORCH_DB_URL", "VAST_API_KEY", "RUNPOD_API_KEY", "ORCH_FAILPOINT"):
        env.pop(key, None)
    jobs = specs(args.jobs, args.seed, args.work_h, args.seconds_per_hour, args.slack_s,
                 args.step_s)
    calibrate(home, env, jobs[0], args.step_s)
    work = [(job_file(home / "jobs", i, s, spec), spec)
            for i, spec in enumerate(jobs) for s in STRATEGIES if s != "calibrate"]
    return home, env, work


class Load:
    """The machine's load while the bench runs: the 1-minute load average and the share of
    CPU time busy (all processes, the bench's and anyone else's), sampled every 15 s."""

    def __init__(self) -> None:
        self.loads: list[float] = []
        self.busy: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    @staticmethod
    def _cpu() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        idle = fields[3] + fields[4]  # idle + iowait
        return sum(fields) - idle, sum(fields)

    def _sample(self) -> None:
        before = self._cpu()
        while not self._stop.wait(15):
            now = self._cpu()
            self.loads.append(os.getloadavg()[0])
            self.busy.append((now[0] - before[0]) / max(1, now[1] - before[1]))
            before = now

    def summary(self) -> str:
        """Mean and peak of each, and the cores."""
        self._stop.set()
        if not self.loads:
            return "load: no sample"
        return (f"load avg {sum(self.loads) / len(self.loads):.1f} (peak "
                f"{max(self.loads):.1f}) on {os.cpu_count()} cores, CPU busy "
                f"{100 * sum(self.busy) / len(self.busy):.0f}% (peak {100 * max(self.busy):.0f}%)")


def regimes(names: list[str], args: argparse.Namespace
            ) -> tuple[dict[str, dict[str, Tally]], dict[str, Decimal | None]]:
    """Run every regime's jobs, all strategies, in one pool of --parallel (each regime its
    own records and market); their tallies, and the clairvoyant schedules' dollars of the
    policy's jobs over the markets they met (bench/deadline_oracle.py)."""
    with tempfile.TemporaryDirectory(prefix="deadline-") as d:
        root = Path(args.keep or d)
        prepared = {name: prepare(name, root, args) for name in names}
        # Regimes interleaved: every regime's jobs start early, none waits for another's tail.
        work = [(env, *jobs[i]) for i in range(3 * args.jobs)
                for _, env, jobs in prepared.values()]
        with ThreadPoolExecutor(args.parallel) as pool:
            list(pool.map(lambda w: run_one(*w), work))
        found = {name: tally(home, args.ratio) for name, (home, _, _) in prepared.items()}
        for home, _, _ in prepared.values():
            SimCloud(home / "orch" / "sim").terminate_all()
        bounds = {name: _bound(home) for name, (home, _, _) in prepared.items()}
    return found, bounds


def _bound(home: Path) -> Decimal | None:
    """The clairvoyant dollars of a regime's policy jobs; None (said) when its records lack
    what the bound is computed from, so a finished run still prints its table."""
    try:
        return deadline_oracle.regime(home).clairvoyant
    except deadline_oracle.Unmeasured as exc:
        print(f"{home.name}: no clairvoyant bound: {exc}", flush=True)
        return None


def _ratio(dollars: Decimal | None, on_demand: Decimal) -> str:
    return "n/a" if dollars is None or not on_demand else f"{dollars / on_demand:.3f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=50)
    p.add_argument("--parallel", type=int, default=24)
    p.add_argument("--regimes", default="calm,bursty,heavy")
    p.add_argument("--seconds-per-hour", type=float, default=48.0)
    p.add_argument("--work-h", type=float, default=2.0)
    p.add_argument("--slack-s", type=float, default=30.0)
    p.add_argument("--seed", type=int, default=41)
    p.add_argument("--ratio", type=Decimal, default=Decimal("3.33"))
    p.add_argument("--step-s", type=float, default=2.0)
    p.add_argument("--keep", help="a folder to keep each regime's records in")
    p.add_argument("--checkpoint", choices=("fixed", "young"), default="fixed",
                   help="15 trace minutes between checkpoints (fixed), or the interval orch "
                   "gives a spot machine in each regime (young), scaled")
    args = p.parse_args()
    market = f"on-demand/{args.ratio}"
    total = {s: Tally() for s in STRATEGIES}
    started = time.monotonic()
    print(f"{'regime':8} {'on-demand':>10} {'spot only (missed)':>20} {'policy (missed)':>17} "
          f"{'policy/od':>9} {'clairvoyant/od':>14} | at spot = {market}: {'policy/od':>9}")
    load = Load()
    everything, bounds = regimes(args.regimes.split(","), args)
    for name, found in everything.items():
        od, sp, po = found["ondemand"], found["spot"], found["policy"]
        print(f"{name:8} {od.usd:>10.4f} {sp.usd:>12.4f} ({sp.missed:>3}/{sp.jobs}) "
              f"{po.usd:>9.4f} ({po.missed:>3}/{po.jobs}) "
              f"{po.usd / od.usd if od.usd else 0:>9.3f} "
              f"{_ratio(bounds[name], od.usd):>14} | "
              f"{'':>14}{po.usd_at_ratio / od.usd_at_ratio if od.usd else 0:>9.3f}"
              f"  (on-demand missed {od.missed})", flush=True)
        for s in STRATEGIES:
            total[s].add(found[s])
    od, sp, po = total["ondemand"], total["spot"], total["policy"]
    known = [b for b in bounds.values() if b is not None]
    bound = sum(known, Decimal(0)) if len(known) == len(bounds) else None
    print(f"all      policy/od {po.usd / od.usd if od.usd else 0:.3f} (target <= 0.6), "
          f"clairvoyant/od {_ratio(bound, od.usd)} (the least any policy could "
          f"have paid on these markets), at spot at {market} "
          f"{po.usd_at_ratio / od.usd_at_ratio if od.usd else 0:.3f}; "
          f"on-demand missed {od.missed}; {time.monotonic() - started:.0f} s; "
          f"{load.summary()}")
    print(f"ondemand_usd={od.usd:.4f} spot_usd={sp.usd:.4f} policy_usd={po.usd:.4f} "
          f"spot_missed={sp.missed} policy_missed={po.missed}")


if __name__ == "__main__":
    main()
