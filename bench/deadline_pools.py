"""A deadline job that accepts several spot pools: what a second and third pool save, on
generated markets and on the published traces of real zones.

A job that accepts several GPU models (`resources.gpus`), or a cloud's several zones, or a
marketplace's several hosts, has several spot pools, each with its own availability: spot can
be had while any of them has it, and a machine preempted in one can restart in another
(`providers/spottrace.Pools`; the engine does this as it is: the policy's search sees spot
while any accepted GPU has it, tests/test_deadline_engine.py
`test_preempted_on_one_gpus_spot_it_moves_to_anothers_spot`). How much that saves depends on
how independent the pools are, so this bench measures it two ways, with the pure core only
(core/deadlinesim.replay, as bench/deadline_offline.py), orch's policy as it runs (Young's
checkpoint interval on spot, each checkpoint's write counted):

1. Generated: per regime of providers/sim/spot_regimes.yaml, each job meets 1, 2 or 3 pools
   drawn independently from the regime (the simulated cloud's per-GPU markets are such).
2. Published (`--traces DIR`, a clone of skypilot-org/spot-traces): the zones each regime is
   modelled on, replayed as recorded; each job meets one zone (by turn) or all of them at
   the same instant, so whatever the zones share (a region's capacity) is kept. Printed with
   the zones' joint availability against what independent zones would give.

Each job's on-demand bill is the same in every column (on-demand has no pools to use); the
clairvoyant bound (bench/deadline_oracle.cheapest with the pools) is the least any policy
could pay for the same jobs on the same pools. Usage:
    python bench/deadline_pools.py [--jobs 50] [--seed 41] [--traces DIR]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import deadline_offline as off  # noqa: E402
from orchestrator.core import deadlinesim as ds  # noqa: E402
from orchestrator.core import preemption  # noqa: E402
from orchestrator.core.deadline import Market, Mode  # noqa: E402
from providers import spottrace  # noqa: E402
from providers.sim import spotmarket  # noqa: E402
from providers.spottrace import Pools, SpotTrace  # noqa: E402

# The zones each regime is modelled on (docs/deadline.md, "The simulated spot markets").
PUBLISHED = {
    "calm": ("availability/1-node/aws-02-15-2023", [f"us-west-2{z}_v100_1" for z in "abc"]),
    "bursty": ("availability/1-node/aws-02-15-2023", [f"us-east-1{z}_v100_1" for z in "cdf"]),
    "heavy": ("availability/1-node/aws-10-26-2022", [f"us-west-2{z}_v100_8" for z in "ab"]),
}


def replay_jobs(name: str, n: int, seed: int, horizon_h: float,
                pools_at: list[tuple[str, list[SpotTrace]]], rate: float) -> Counter[str]:
    """Every job of `name` under on-demand and orch's policy over each labelled set of pool
    traces (`pools_at`: label, one year-long trace per pool), its clairvoyant bound too."""
    totals: Counter[str] = Counter()
    arrivals = random.Random(seed + 1)
    wait_prior = preemption.prior().wait_mean_h
    for i, (job, od_job, restart) in enumerate(off.jobs(n, seed, (2.0, 12.0), (off.YOUNG,),
                                                         rate, charge_writes=True)):
        market = Market(off.SPOT, off.ON_DEMAND, rate, restart, restart)
        hours = 3 * job.window_s / 3600 + 24
        start = arrivals.uniform(0, horizon_h - hours)
        chosen = ds.estimate(job, market, wait_prior, seed=i).policy.mode or Mode.GREEDY
        od = ds.replay(od_job, market, SpotTrace(hours, ()), ds.strategy(ds.Plan.ON_DEMAND,
                                                                           market))
        totals["ondemand"] += int(od.cost(market) * 1_000_000)
        for label, years in pools_at:
            seen = [off.window(y, start, hours) for y in years]
            if label == "one":  # one pool of several, by turn
                seen = [seen[i % len(seen)]]
            got = ds.replay(job, market, Pools(tuple(seen)),
                            ds.strategy(ds.Plan.POLICY, market, chosen))
            totals[f"{label}_usd"] += int(got.cost(market) * 1_000_000)
            totals[f"{label}_missed"] += got.missed(job)
            totals[f"{label}_bound"] += int(off.clairvoyant(job, market, *seen) * 1_000_000)
    return totals


def joint(traces: list[SpotTrace], step_h: float = 0.05) -> tuple[float, float, float]:
    """Mean availability of one pool, of any of them as recorded, and of any of them were
    they independent (1 - the product of each one's unavailability)."""
    horizon = min(t.horizon_h for t in traces)
    ticks = [k * step_h for k in range(int(horizon / step_h))]
    each = [sum(t.available(h) for h in ticks) / len(ticks) for t in traces]
    anyof = sum(any(t.available(h) for t in traces) for h in ticks) / len(ticks)
    independent = 1.0
    for a in each:
        independent *= 1.0 - a
    return sum(each) / len(each), anyof, 1.0 - independent


def ratio(c: Counter[str], key: str) -> str:
    return f"{c[key] / c['ondemand']:.3f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--seed", type=int, default=41)
    parser.add_argument("--traces", type=Path,
                        help="a clone of skypilot-org/spot-traces: also replay its zones")
    args = parser.parse_args()
    started = time.process_time()
    print("generated pools, independent (policy / on-demand, clairvoyant in brackets, "
          "policy missed):")
    print(f"{'regime':8} {'1 pool':>22} {'2 pools':>22} {'3 pools':>22}")
    total: Counter[str] = Counter()
    for name, spec in spotmarket.regimes().items():
        rate = spec.matched["preemptions_per_hour"]
        years = [spottrace.generate(spec.regime, args.seed + 1000 * k, off.YEAR_H)
                 for k in range(3)]
        c = replay_jobs(name, args.jobs, args.seed, off.YEAR_H,
                        [(str(k), years[:k]) for k in (1, 2, 3)], rate)
        total.update(c)
        print(f"{name:8} " + " ".join(
            f"{ratio(c, f'{k}_usd'):>7} ({ratio(c, f'{k}_bound')}) {c[f'{k}_missed']:>3} miss"
            for k in (1, 2, 3)))
    print(f"{'all':8} " + " ".join(
        f"{ratio(total, f'{k}_usd'):>7} ({ratio(total, f'{k}_bound')}) "
        f"{total[f'{k}_missed']:>3} miss" for k in (1, 2, 3)))
    if args.traces is not None:
        published(args)
    print(f"{time.process_time() - started:.0f} s of CPU")
    return 0


def published(args: argparse.Namespace) -> None:
    """The zones each regime is modelled on, as recorded: one zone against all of them."""
    print("\npublished zones, as recorded (skypilot-org/spot-traces): one zone by turn "
          "against all of the regime's zones at once")
    print(f"{'regime':8} {'zones':>5} {'available: one':>15} {'any':>6} {'if independent':>15}"
          f" {'one zone':>22} {'all zones':>22}")
    total: Counter[str] = Counter()
    for name, (folder, zones) in PUBLISHED.items():
        traces = []
        for zone in zones:
            data = json.loads((args.traces / folder / f"{zone}.json").read_text())
            traces.append(spottrace.from_samples(data["data"],
                                                 float(data["metadata"]["gap_seconds"])))
        horizon = min(t.horizon_h for t in traces)
        rate = spotmarket.regimes()[name].matched["preemptions_per_hour"]
        c = replay_jobs(name, args.jobs, args.seed, horizon,
                        [("one", traces), ("all", traces)], rate)
        total.update(c)
        one, anyof, independent = joint(traces)
        print(f"{name:8} {len(zones):>5} {one:>15.3f} {anyof:>6.3f} {independent:>15.3f} "
              + " ".join(f"{ratio(c, f'{k}_usd'):>7} ({ratio(c, f'{k}_bound')}) "
                         f"{c[f'{k}_missed']:>3} miss" for k in ("one", "all")))
    print(f"{'all':8} {'':>5} {'':>15} {'':>6} {'':>15} " + " ".join(
        f"{ratio(total, f'{k}_usd'):>7} ({ratio(total, f'{k}_bound')}) "
        f"{total[f'{k}_missed']:>3} miss" for k in ("one", "all")))
    print(f"(on-demand ${Decimal(total['ondemand']) / 1_000_000:.2f} for the published jobs)")


if __name__ == "__main__":
    sys.exit(main())
