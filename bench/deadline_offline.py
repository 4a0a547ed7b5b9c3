"""Jobs with deadlines under each spot regime, three strategies side by side, without the engine.

The offline half of issue 41's bench: what bench/deadline.py (phase B) measures through the
product on the simulated cloud, computed here with the pure functions alone, to see which
targets the policy and the regimes can reach before the engine is wired. For each regime of
providers/sim/spot_regimes.yaml, --jobs jobs (seeded) each replay one trace of that regime
(orchestrator/core/deadlinesim.replay) under on-demand only, spot only, and orch's policy,
whose mode (uniform progress or greedy) is chosen per job by `deadlinesim.estimate` from what
orch would know before renting: the regime's preemption rate (as its history would learn it)
and the prior's mean wait (core/preemption.py). Each mode's own total is printed too, and the
clairvoyant bound (bench/deadline_oracle.py: the least any policy could pay for the job on
its trace, knowing it in advance and losing no work). Beside them, what the policy pays when told
when each spot spell ends and when spot comes back (`peeking`: what a perfect forecast of both
is worth to the policy's rules, docs/deadline.md "What knowing the near future is worth").

Each job meets the market at a random hour of one year-long trace of the regime, as jobs
submitted at any time do (and as bench/deadline.py's jobs meet the simulated cloud's market).
A trace drawn afresh for each job starts every job at the start of a spot spell or of a gap,
never inside one: with heavy-tailed spells and gaps, a job arriving at a random time lands in
a longer one than a fresh draw (the inspection paradox). An earlier version did that, which
made spot dearer than it is in calm and heavy and cheaper in bursty.

Jobs (seeded, --seed): training of 2 to 12 hours (--work-h); a deadline at that over a job fraction
(work / time to the deadline, as the paper calls it) drawn from 0.4 to 0.8; an A100 80GB at
the per-second catalog's prices ($0.234 spot, $0.468 on-demand an hour: spot at half price,
providers/catalog/cloud.yaml); a restart of 5 min boot (the catalog's boot_minutes), the base
model's download at the catalog's 2 Gbit/s (8B, 14B, 32B or 70B in bf16: 1 to 9 min) and
1 min to resume; a checkpoint every 15 or 30 min of training (--checkpoint-min; `young`: the
interval orch gives a spot machine, core/checkpointing, for the regime's rate and a QLoRA
checkpoint of the job's model); preemptions noticed after 60 s. A checkpoint costs no time
unless --charge-writes: then each stalls training for its write (that checkpoint at the
host check's 125 MB/s), and the on-demand runs checkpoint every 15 min, as the engine's do.
--slow-restart F: the policy's margins budget an on-demand restart F of it longer than every
real one is (what the engine's slow-restart margin costs when restarts do not vary).
Usage:
    python bench/deadline_offline.py [--jobs 50] [--seed 41] [--regimes calm,bursty,heavy]
        [--spot-usd 0.234] [--work-h 2,12] [--checkpoint-min 15,30] [--charge-writes]
        [--slow-restart 0]
The last line reads `ondemand_usd=... spot_usd=... policy_usd=... spot_missed=...
policy_missed=...` over all regimes.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import sys
import time
from collections import Counter
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import deadline_oracle  # noqa: E402
from orchestrator.core import checkpointing, preemption, sizing  # noqa: E402
from orchestrator.core import deadlinesim as ds  # noqa: E402
from orchestrator.core.architectures import known_models  # noqa: E402
from orchestrator.core.deadline import (  # noqa: E402
    Choice,
    Machine,
    Market,
    Mode,
    Restart,
    Rule,
    Situation,
    decide,
)
from orchestrator.core.settings import CHECKPOINT_EVERY_S  # noqa: E402
from providers import spottrace  # noqa: E402
from providers.sim import spotmarket  # noqa: E402
from providers.spottrace import SpotTrace  # noqa: E402

SPOT, ON_DEMAND = Decimal("0.234"), Decimal("0.468")  # A100 80GB, providers/catalog/cloud.yaml
# Each job's base model and its download at the catalog's 2 Gbit/s (16, 28, 64, 140 GB).
MODELS = (("meta-llama/llama-3.1-8b", 64), ("qwen/qwen2.5-14b", 112), ("qwen/qwen2.5-32b", 256),
          ("meta-llama/llama-3.1-70b", 560))
DISK_FLOOR = 125e6  # bytes/s: the host check's disk floor at the catalog's 2 Gbit/s
YOUNG = -1.0  # --checkpoint-min young: core/checkpointing's interval for the regime's rate
YEAR_H = 24 * 365.0
TICK_S = 60.0  # the clairvoyant schedule's time step


def window(trace: SpotTrace, start_h: float, hours: float) -> SpotTrace:
    """`trace` seen from hour `start_h` for `hours`: what a job submitted then meets."""
    return SpotTrace(hours, tuple((max(0.0, a - start_h), min(hours, b - start_h))
                                  for a, b in trace.intervals
                                  if b > start_h and a < start_h + hours))


def clairvoyant(job: ds.Job, market: Market, trace: SpotTrace, *pools: SpotTrace) -> float:
    """The least dollars that finish `job` on `trace` (and other spot `pools` at the same
    price) in time (deadline_oracle.cheapest, in minutes: work and restarts rounded down, the
    time to the deadline up, in its favour)."""
    ticks = math.ceil(job.window_s / TICK_S)
    found = deadline_oracle.cheapest(deadline_oracle.Job(
        work=math.floor(job.work_s / TICK_S), window=ticks,
        spot_restart=int(market.spot_restart.seconds // TICK_S),
        on_demand_restart=int(market.on_demand_restart.seconds // TICK_S),
        spot_per_tick=float(market.spot_per_hour) * TICK_S / 3600,
        on_demand_per_tick=float(market.on_demand_per_hour) * TICK_S / 3600),
        *(deadline_oracle.spells(t, 0.0, TICK_S / 3600, ticks) for t in (trace, *pools)))
    return math.inf if found is None else found


def peeking(trace: SpotTrace, market: Market, mode: Mode) -> ds.Strategy:
    """orch's policy told two things no online policy knows, to price that knowledge: when
    the spot spell it could rent ends, and when spot comes back while it is gone.

    - A spell is rented only if worth it by the paper's rule for a known spot lifetime o
      (Wu et al. §5.4): o / (o - d) < k from idle, (o + k d_od) / (o - d) < k from
      on-demand, k = on-demand's price over spot's, d the policy's changeover (restart, half
      a checkpoint interval, detection); otherwise the policy decides as if spot were gone
      (a waiting job then waits for that spell's end: the rule below counts any spell as
      spot's return, even one not worth renting).
    - While spot is gone, a job the policy would leave waiting runs on on-demand instead if
      spot comes back only after the Safety Net would fire (waiting would spend the slack
      that later spot needs); on on-demand it moves to spot when spot is back, worth it and
      the slack covers the Safety Net's margin, and stays on on-demand otherwise.
    Everything else (the Safety Net, drift, the mode while idle or on spot) is the policy's
    own. It is one use of a perfect forecast, not the best: it can pay more than the policy
    (a spell refused as not worth renting is waited through, though waiting spends slack).
    """
    k = float(market.on_demand_per_hour / market.spot_per_hour)

    def worth(s: Situation) -> bool:
        ends = trace.preempted_at(s.elapsed_s / 3600)
        if ends is None:
            return False
        o = ends * 3600 - s.elapsed_s
        d = market.spot_restart.seconds + s.checkpoint_every_s / 2 + s.detect_s
        if o <= d:
            return False
        if s.on is Machine.ON_DEMAND:
            return (o + k * market.on_demand_restart.seconds) / (o - d) < k
        return o / (o - d) < k

    def policy(s: Situation) -> tuple[Choice, float | None]:
        if s.spot_available and s.on is not Machine.SPOT and not worth(s):
            s = dataclasses.replace(s, spot_available=False)
        d = decide(s, market, mode)
        if d.rule in (Rule.DONE, Rule.CANNOT_MEET) or s.on is Machine.SPOT:
            return d.choice, d.recheck_after_s
        room = s.time_left_s - s.work.left_s(keep=False)
        net = d.numbers["safety_net_s"]
        if s.on is Machine.ON_DEMAND:
            if s.spot_available and room >= net:
                return Choice.SPOT, None
            return Choice.ON_DEMAND, None
        if d.choice is Choice.WAIT:
            back = trace.next_available(s.elapsed_s / 3600 + 1e-9)
            if back is None or back * 3600 - s.elapsed_s > room - net:
                return Choice.ON_DEMAND, None
        return d.choice, d.recheck_after_s
    return policy


def qlora_bytes(repo: str) -> int:
    """A QLoRA checkpoint of `repo` (fp32 adapters, r 16 on every linear, 8-bit AdamW's
    moments), as core/checkpointing sizes it."""
    arch = known_models()[repo].architecture
    return sizing.checkpoint_bytes(sizing.Workload(arch=arch, method="qlora",
                                                   optimizer="adamw_8bit"))


def jobs(n: int, seed: int, hours: tuple[float, float] = (2.0, 12.0),
         checkpoint_s: tuple[float, ...] = (900.0, 1800.0), rate: float = 0.0,
         charge_writes: bool = False) -> list[tuple[ds.Job, ds.Job, Restart]]:
    """`n` seeded jobs, their twin on on-demand and their restart. Each checkpoints at one of
    `checkpoint_s` (YOUNG: core/checkpointing's interval for `rate` preemptions an hour and the
    job's checkpoint); its twin every ORCH_CHECKPOINT_EVERY_S (the engine's interval on a
    machine that is not preempted). `charge_writes`: each checkpoint stalls training for its
    write time (the work grows by write / interval, which the policy also sees: orch measures
    the rate with the stalls); without it the twin is the job."""
    rng = random.Random(seed)
    found = []
    for _ in range(n):
        work_h = rng.uniform(*hours)
        fraction = rng.uniform(0.4, 0.8)
        repo, download_s = rng.choice(MODELS)
        restart = Restart(boot_s=300.0, download_s=download_s, resume_s=60.0)
        every = rng.choice(checkpoint_s)
        size = qlora_bytes(repo)
        write = size / DISK_FLOOR  # seconds the checkpoint stalls training
        if every == YOUNG:  # given the regime's own rate: what orch's history would learn
            every = checkpointing.interval(CHECKPOINT_EVERY_S,
                                           checkpointing.Spot(rate, DISK_FLOOR), size).seconds
        job = ds.Job(work_s=work_h * 3600 * (1 + write / every if charge_writes else 1),
                     window_s=work_h / fraction * 3600, checkpoint_every_s=every, detect_s=60.0)
        od = dataclasses.replace(
            job, work_s=work_h * 3600 * (1 + write / CHECKPOINT_EVERY_S if charge_writes
                                         else 1), checkpoint_every_s=CHECKPOINT_EVERY_S)
        found.append((job, od if charge_writes else job, restart))
    return found


def run_regime(name: str, n: int, seed: int, spot: Decimal = SPOT,
               work_h: tuple[float, float] = (2.0, 12.0),
               checkpoint_s: tuple[float, ...] = (900.0, 1800.0),
               charge_writes: bool = False, slow: float = 0.0) -> Counter[str]:
    """Dollars and misses of every strategy over `n` jobs in regime `name`. `slow`: the
    policy's margins budget an on-demand restart that much longer than the real one (a
    share of it: what a slow restart costs when every restart is the median)."""
    spec = spotmarket.regimes()[name]
    wait_prior = preemption.prior().wait_mean_h
    totals: Counter[str] = Counter()
    year = spottrace.generate(spec.regime, seed, YEAR_H)
    arrivals = random.Random(seed + 1)
    rate = spec.matched["preemptions_per_hour"]
    for i, (job, od_job, restart) in enumerate(
            jobs(n, seed, work_h, checkpoint_s, rate, charge_writes)):
        market = Market(spot, ON_DEMAND, rate, restart, restart)
        believed = dataclasses.replace(market, on_demand_restart=dataclasses.replace(
            restart, slow_extra_s=slow * restart.seconds))
        hours = 3 * job.window_s / 3600 + 24
        trace = window(year, arrivals.uniform(0, YEAR_H - hours), hours)
        chosen = ds.estimate(job, believed, wait_prior, seed=i).policy.mode or Mode.GREEDY
        runs = {"ondemand": ds.strategy(ds.Plan.ON_DEMAND, market),
                "spot": ds.strategy(ds.Plan.SPOT, market),
                "policy": ds.strategy(ds.Plan.POLICY, believed, chosen),
                "greedy": ds.strategy(ds.Plan.POLICY, believed, Mode.GREEDY),
                "uniform": ds.strategy(ds.Plan.POLICY, believed, Mode.UNIFORM_PROGRESS),
                "peek": peeking(trace, believed, chosen)}
        for key, decide_now in runs.items():
            outcome = ds.replay(od_job if key == "ondemand" else job, market, trace, decide_now)
            totals[f"{key}_micros"] += int(outcome.cost(market) * 1_000_000)
            totals[f"{key}_missed"] += outcome.missed(job)
        totals[f"chose_{chosen.value}"] += 1
        totals["clairvoyant_micros"] += int(clairvoyant(job, market, trace) * 1_000_000)
    return totals


def usd(micros: int) -> str:
    return f"{Decimal(micros) / 1_000_000:.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--seed", type=int, default=41)
    parser.add_argument("--regimes", default=",".join(spotmarket.regimes()))
    parser.add_argument("--spot-usd", type=Decimal, default=SPOT,
                        help="spot $/h against on-demand's $0.468 (default: the catalog's)")
    parser.add_argument("--work-h", default="2,12", help="training hours: low,high")
    parser.add_argument("--checkpoint-min", default="15,30",
                        help="minutes between checkpoints, one drawn per job from this list "
                        "('young': orch's spot interval for the regime's rate)")
    parser.add_argument("--slow-restart", type=float, default=0.0,
                        help="the policy's margins budget an on-demand restart this share "
                        "longer than every real one (the product bench's 90th percentile "
                        "is 0.3-0.5 of the median above it); measures what the margin costs")
    parser.add_argument("--charge-writes", action="store_true",
                        help="each checkpoint stalls training for its write time (a QLoRA "
                        "adapter of the job's model at 125 MB/s)")
    args = parser.parse_args()
    every = tuple(YOUNG if x.strip() == "young" else 60.0 * float(x)
                  for x in args.checkpoint_min.split(","))
    if any(e <= 0 and e != YOUNG for e in every):
        parser.error(f"--checkpoint-min: minutes > 0 or 'young' (got {args.checkpoint_min})")
    started = time.process_time()
    total: Counter[str] = Counter()
    for name in args.regimes.split(","):
        low, high = (float(x) for x in args.work_h.split(","))
        c = run_regime(name, args.jobs, args.seed, args.spot_usd, (low, high), every,
                       args.charge_writes, args.slow_restart)
        total.update(c)
        od = c["ondemand_micros"]
        print(f"{name}: ondemand_usd={usd(od)} spot_usd={usd(c['spot_micros'])} "
              f"policy_usd={usd(c['policy_micros'])} ({c['policy_micros'] / od:.3f} x on-demand;"
              f" greedy {c['greedy_micros'] / od:.3f}, uniform progress "
              f"{c['uniform_micros'] / od:.3f}; chose greedy for {c['chose_greedy']}; "
              f"knowing the spell's end and spot's return {c['peek_micros'] / od:.3f} "
              f"(missed {c['peek_missed']}); clairvoyant {c['clairvoyant_micros'] / od:.3f}) "
              f"spot_missed={c['spot_missed']} policy_missed={c['policy_missed']} "
              f"(greedy {c['greedy_missed']}, uniform {c['uniform_missed']})")
    od = total["ondemand_micros"]
    print(f"all regimes: policy {total['policy_micros'] / od:.3f} x on-demand, knowing the "
          f"spell's end and spot's return {total['peek_micros'] / od:.3f}, clairvoyant "
          f"{total['clairvoyant_micros'] / od:.3f}; "
          f"{time.process_time() - started:.1f} s of CPU")
    print(f"ondemand_usd={usd(od)} spot_usd={usd(total['spot_micros'])} "
          f"policy_usd={usd(total['policy_micros'])} spot_missed={total['spot_missed']} "
          f"policy_missed={total['policy_missed']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
