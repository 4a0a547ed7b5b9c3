"""The least any policy could have paid: a clairvoyant schedule of each job over its own trace.

Wu et al. ("Can't Be Late", NSDI '24, §6) measure their policies against an omniscient one
that knows the whole spot trace in advance. This is that bound for issue 41's benches: for
one job (work, deadline, the restart of each kind of machine, the prices) and the spot trace
it ran against, `cheapest` finds by dynamic programming over time ticks the schedule of spot
and on-demand machines that finishes by the deadline for the fewest dollars, knowing when
spot comes and goes. It is a lower bound for every online policy on the same market, and is
given more than any can have: it loses no work to a preemption (it knows when one comes), is
billed nothing after one (no detection delay), and a machine rented within a tick of spot
ending still runs that tick. What it cannot do is what the market forbids: rent spot while
spot is gone, keep a spot machine past the end of the spell it was rented in, or make progress
during a machine's restart, which is billed.

`python bench/deadline_oracle.py DIR` reads a run kept by `bench/deadline.py --keep DIR` and
prints, per regime, what on-demand, spot only and the policy paid beside the clairvoyant
schedule of each policy job over the market it met (its GPU's trace from its submission, the
restarts and the work measured in that run's on-demand jobs). `bench/deadline.py` prints the
same at the end of each run.
"""

from __future__ import annotations

import argparse
import json
import math
import sqlite3
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from orchestrator.records.historyread import parse_stored  # noqa: E402
from providers.sim import spotmarket  # noqa: E402
from providers.spottrace import SpotTrace  # noqa: E402


@dataclass(frozen=True)
class Job:
    """One job in ticks: work, ticks to the deadline, each machine's restart (billed, no
    progress) and price per tick."""

    work: int
    window: int
    spot_restart: int
    on_demand_restart: int
    spot_per_tick: float
    on_demand_per_tick: float


def spells(trace: SpotTrace, start_h: float, tick_h: float, ticks: int) -> list[int]:
    """For each tick from trace hour `start_h`: which spot spell a machine rented at its
    start is in (numbered as met; -1: spot is gone), as the trace itself says
    (`preempted_at`: the spell's end names it). A machine runs on while the number stays."""
    ids: dict[float, int] = {}
    found = []
    for k in range(ticks):
        end = trace.preempted_at((start_h + k * tick_h) % trace.horizon_h)
        found.append(-1 if end is None else ids.setdefault(end, len(ids)))
    return found


def cheapest(job: Job, spell: Sequence[int], *pools: Sequence[int]) -> float | None:
    """The fewest dollars to finish `job` by its deadline knowing `spell` (one entry per tick,
    as `spells` gives), or None when not even on-demand from the start finishes in time.
    More `pools`: other spot pools the job accepts at the same price (other GPUs, zones),
    each its own spells; a spot machine is in one pool and ends with that pool's spell.

    States after each tick, each an array over the work done (0..work): idle; on spot (in
    each pool) with k restart ticks left (k = 0: making progress); on on-demand likewise. At
    each tick's start any machine may be released (keeping its work: the schedule knows the
    preemption is coming) and one rented; a spot machine whose spell ended is gone."""
    if job.work <= 0:
        return 0.0  # nothing to train: no machine
    inf = math.inf
    w = job.work
    every = (spell, *pools)
    idle = np.full(w + 1, inf)
    idle[0] = 0.0
    spots = [np.full((job.spot_restart + 1, w + 1), inf) for _ in every]
    od = np.full((job.on_demand_restart + 1, w + 1), inf)
    best = inf
    for t in range(min(job.window, *(len(s) for s in every))):
        free = np.minimum(idle, od.min(axis=0))
        for spot in spots:
            free = np.minimum(free, spot.min(axis=0))
        idle = free
        for i, (pool, spot) in enumerate(zip(every, spots, strict=True)):
            here = pool[t]
            if here < 0 or (t > 0 and here != pool[t - 1]):
                spot[:] = inf  # the spell it was rented in is over
            if here >= 0:
                spot[-1] = np.minimum(spot[-1], free)
            spots[i], done_spot = _tick(spot, job.spot_per_tick)
            best = min(best, done_spot)
        od[-1] = np.minimum(od[-1], free)
        od, done_od = _tick(od, job.on_demand_per_tick)
        best = min(best, done_od)
    return None if best == inf else best


def _tick(state: np.ndarray, per_tick: float) -> tuple[np.ndarray, float]:
    """One tick on a kind of machine: restarts count down, running ones progress; the cost
    of those that finish in it, then dropped (nothing is rented once the work is done)."""
    after = np.full_like(state, math.inf)
    after[:-1] = state[1:] + per_tick
    after[0, 1:] = np.minimum(after[0, 1:], state[0, :-1] + per_tick)
    done = float(after[0, -1])
    after[0, -1] = math.inf
    return after, done


def open_run(home: Path) -> sqlite3.Connection:
    """A kept regime's database, read-only: a folder without one is not given an empty one."""
    return sqlite3.connect(f"file:{home / 'orch' / 'orch.db'}?mode=ro", uri=True)


def epoch(text: str) -> float:
    """A stored time column as epoch seconds."""
    at = parse_stored(text)
    assert at is not None
    return at.timestamp()


class Unmeasured(Exception):
    """A kept run lacks what the bound is computed from (a finished on-demand job, a price)."""


@dataclass(frozen=True)
class Measured:
    """What a run's on-demand jobs measured (medians): from the rental to the trainer's start
    (the end of the `train/start-training` step: everything a restart costs before training),
    and from there to the job's end (the training, the merge and the delivery)."""

    restart_s: float
    work_s: float
    jobs: int


def measured(con: sqlite3.Connection, strategy: str) -> Measured:
    """Medians over the finished jobs named `strategy-*`, each on its last machine."""
    restarts, works = [], []
    for finished, started, rented in con.execute(
            "SELECT j.finished_at, (SELECT MIN(e.at) FROM event e WHERE e.job_id = j.id AND "
            "e.kind IN ('step.ok', 'step.changed') AND e.message = 'train/start-training' "
            "AND e.at >= r.rented), r.rented FROM job j JOIN (SELECT job_id, MAX(created_at) "
            "AS rented FROM instance WHERE provider_instance_id IS NOT NULL GROUP BY job_id) "
            "r ON r.job_id = j.id WHERE j.name LIKE ? AND j.status = 'succeeded'",
            (f"{strategy}-%",)):
        if started and finished:
            restarts.append(epoch(started) - epoch(rented))
            works.append(epoch(finished) - epoch(started))
    if not restarts:
        raise Unmeasured(f"no finished {strategy} job whose trainer started")
    return Measured(statistics.median(restarts), statistics.median(works), len(restarts))


@dataclass(frozen=True)
class Bound:
    """A regime's clairvoyant dollars over its policy jobs, how many could not finish in time
    even so (none, when on-demand from the start meets every deadline), and what the jobs
    were made of."""

    clairvoyant: Decimal
    jobs: int
    infeasible: int
    measured: Measured


def regime(home: Path, tick_s: float = 1.0) -> Bound:
    """The clairvoyant schedule of each policy job in `home` (a regime's folder of a kept
    run) over its GPU's trace from the second it was submitted. Rounded to ticks in the
    bound's favour: work and restarts down, the time to the deadline up."""
    con = open_run(home)
    try:
        return _regime(con, home, tick_s)
    finally:
        con.close()


def _regime(con: sqlite3.Connection, home: Path, tick_s: float) -> Bound:
    saved = json.loads((home / "orch" / "sim" / spotmarket.ORIGIN_FILE).read_text())
    market = spotmarket.SpotMarket(spotmarket.regime(saved["regime"]), int(saved["seed"]),
                                   float(saved["origin"]), float(saved["seconds_per_hour"]))
    od = measured(con, "ondemand")
    prices = {(gpu, bool(spot)): int(price) for gpu, spot, price in con.execute(
        "SELECT gpu, interruptible, MAX(price_per_hour_micros) FROM instance "
        "GROUP BY gpu, interruptible")}
    total, jobs, infeasible = 0.0, 0, 0
    restart = math.floor(od.restart_s / tick_s)
    for created, spec_json in con.execute(
            "SELECT created_at, spec_json FROM job WHERE name LIKE 'policy-%'"):
        spec = json.loads(spec_json)["resources"]
        gpu = spec["gpus"][0]
        if (gpu, True) not in prices or (gpu, False) not in prices:
            raise Unmeasured(f"no spot and on-demand price of {gpu} in the run's instances")
        window = math.ceil(float(spec["deadline_hours"]) * 3600 / tick_s)
        job = Job(work=math.floor(od.work_s / tick_s), window=window, spot_restart=restart,
                  on_demand_restart=restart,
                  spot_per_tick=prices[gpu, True] / 1e6 / 3600 * tick_s,
                  on_demand_per_tick=prices[gpu, False] / 1e6 / 3600 * tick_s)
        found = cheapest(job, spells(market.trace(gpu), market.hour(epoch(created)),
                                     tick_s / market.seconds_per_hour, window))
        jobs += 1
        if found is None:
            infeasible += 1
        else:
            total += found
    return Bound(Decimal(f"{total:.6f}"), jobs, infeasible, od)


def report(found: dict[str, tuple[dict[str, Decimal], Bound]]) -> list[str]:
    """Lines for each regime and all: on-demand, policy, clairvoyant, and their ratios."""
    lines = [f"{'regime':8} {'on-demand':>10} {'spot only':>9} {'policy':>8} "
             f"{'clairvoyant':>11} {'policy/od':>9} {'clairvoyant/od':>14} "
             f"{'policy/clairvoyant':>18}"]
    od_all = po_all = cl_all = sp_all = Decimal(0)
    for name, (paid, bound) in found.items():
        od, sp, po, cl = paid["ondemand"], paid["spot"], paid["policy"], bound.clairvoyant
        od_all, sp_all, po_all, cl_all = od_all + od, sp_all + sp, po_all + po, cl_all + cl
        lines.append(f"{name:8} {od:>10.4f} {sp:>9.4f} {po:>8.4f} {cl:>11.4f} "
                     f"{_ratio(po, od):>9} {_ratio(cl, od):>14} {_ratio(po, cl):>18}"
                     + f"  (restart {bound.measured.restart_s:.1f} s, work "
                       f"{bound.measured.work_s:.1f} s: medians of {bound.measured.jobs} "
                       "on-demand jobs)"
                     + (f"  ({bound.infeasible} of {bound.jobs} cannot finish in time)"
                        if bound.infeasible else ""))
    lines.append(f"{'all':8} {od_all:>10.4f} {sp_all:>9.4f} {po_all:>8.4f} {cl_all:>11.4f} "
                 f"{_ratio(po_all, od_all):>9} {_ratio(cl_all, od_all):>14} "
                 f"{_ratio(po_all, cl_all):>18}")
    return lines


def _ratio(a: Decimal, b: Decimal) -> str:
    """`a / b` to three places, or "n/a" when b is nothing (no job could be bounded)."""
    return f"{a / b:.3f}" if b else "n/a"


def main() -> int:
    from bench.deadline import tally

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a folder kept by bench/deadline.py --keep")
    parser.add_argument("--tick-s", type=float, default=1.0, help="wall seconds per tick")
    args = parser.parse_args()
    if not args.run.is_dir():
        raise SystemExit(f"{args.run}: not a folder; give one kept by bench/deadline.py --keep")
    found = {}
    for home in sorted(p for p in args.run.iterdir()
                       if (p / "orch" / "sim" / spotmarket.ORIGIN_FILE).exists()
                       and any((p / "jobs").glob("policy-*.yml"))):
        try:
            paid = {s: t.usd for s, t in tally(home, Decimal("3.33")).items()}
            found[home.name] = (paid, regime(home, args.tick_s))
        except Unmeasured as exc:
            print(f"{home.name}: no bound: {exc}")
        except (sqlite3.Error, OSError, json.JSONDecodeError) as exc:  # not a whole run
            print(f"{home.name}: no bound: its records cannot be read ({exc!r})")
    if not found:
        raise SystemExit(f"{args.run}: no regime's records (kept by bench/deadline.py --keep)")
    print("\n".join(report(found)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
