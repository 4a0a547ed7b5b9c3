"""Grid vs TPE + early stopping over the simulated landscape, offline (no engine, no sim).

What bench/sweep_search.py will measure through the product, reckoned here with the pure
functions alone (orchestrator/core/search.py over simhost/standins/landscape.py), to choose
the defaults and show the target is reachable: search_usd <= 0.35 x grid_usd with
search_best within 1 % of grid_best.

The space: learning rate {1e-4, 2e-4, 5e-4} x LoRA rank {8, 16, 32} x epochs {1, 2, 3}
(27 runs). A run pays setup (boot and model download) + its training steps + (when it ends)
merge and eval, at one price per machine-second, so dollars are proportional to the
seconds reckoned here. `max_parallel` workers; the search proposes as workers free up (a
cron tick proposes one run per free slot) and checks a running trial at every eval report.
Usage:
    python bench/search_offline.py [--seeds 16] [--trials 22] [--workers 3]
                                   [--min-fraction 0.05] [--eta 3] [--pruner asha]
                                   [--setup-s 150] [--warm-s 20] [--finish-s 120]
The last line reads `grid_usd=... search_usd=... grid_best=... search_best=...` (the median
seed's, by cost ratio); each seed's numbers come first.
"""

from __future__ import annotations

import argparse
import heapq
import statistics
import sys
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from orchestrator.core import search  # noqa: E402
from orchestrator.core.search import Prune, TrialRecord, TrialState  # noqa: E402
from orchestrator.core.searchspec import EarlyStopSpec, Param  # noqa: E402
from simhost.standins import landscape  # noqa: E402

SPACE = (Param("training.learning_rate", "choice", choices=(1.0e-4, 2.0e-4, 5.0e-4)),
         Param("lora.r", "choice", choices=(8, 16, 32)),
         Param("training.epochs", "choice", choices=(1, 2, 3)))
STEPS_PER_EPOCH = 30
EVAL_STEPS = 3
SETUP_S = 150.0  # boot + image + model download of a fresh machine
WARM_S = 20.0  # a run on a machine the previous run left warm (resources.keep_warm)
STEP_S = 30.0  # one optimizer step (15 minutes an epoch)
FINISH_S = 120.0  # merge + eval of a run that ends
PRICE_PER_S = Decimal("2.69") / 3600  # an H100's hourly price, per second


def config(params: dict[str, Any]) -> dict[str, Any]:
    """The axolotl keys the landscape reads."""
    return {"learning_rate": params["training.learning_rate"], "lora_r": params["lora.r"],
            "num_epochs": params["training.epochs"], "adapter": "lora"}


def run_seconds(steps: int, finished: bool) -> float:
    """A run's machine-seconds after its setup."""
    return steps * STEP_S + (FINISH_S if finished else 0.0)


def grid(seed: int, workers: int) -> tuple[float, float]:
    """(machine-seconds, best final eval loss) of the full grid (`workers` machines, each
    kept warm for the next run)."""
    import itertools

    seconds, best = 0.0, float("inf")
    for i, combo in enumerate(itertools.product(*(p.choices for p in SPACE))):
        params = dict(zip((p.key for p in SPACE), combo, strict=True))
        total = STEPS_PER_EPOCH * params["training.epochs"]
        seconds += (SETUP_S if i < workers else WARM_S) + run_seconds(total, True)
        best = min(best, landscape.final_loss(config(params), seed))
    return seconds, best


@dataclass
class Running:
    number: int
    params: dict[str, Any]
    total: int
    started: float
    curve: list[tuple[int, float]] = field(default_factory=list)


def searched(seed: int, trials: int, workers: int, early: EarlyStopSpec,
             search_seed: int) -> tuple[float, float, int, int]:
    """(machine-seconds, best final, complete runs, pruned runs) of TPE + early stopping."""
    records: dict[int, TrialRecord] = {}
    running: dict[int, Running] = {}
    events: list[tuple[float, int, int]] = []  # (time, trial, step of the eval report)
    seconds, now = 0.0, 0.0
    machines = 0  # started so far; a run after the first on a machine pays WARM_S

    def fill() -> None:
        nonlocal machines, seconds
        free = workers - len(running)
        left = trials - len(records)
        for params in search.propose(SPACE, list(records.values()), seed=search_seed,
                                     n=min(free, left), goal="min", total=trials,
                                     prune_goal=early.goal):
            number = len(records)
            total = STEPS_PER_EPOCH * params["training.epochs"]
            records[number] = TrialRecord(number, params, TrialState.RUNNING)
            running[number] = Running(number, params, total, now)
            setup = SETUP_S if machines < workers else WARM_S
            machines = min(workers, machines + 1)
            seconds += setup
            heapq.heappush(events, (now + setup + EVAL_STEPS * STEP_S, number, EVAL_STEPS))

    fill()
    while events:
        now, number, step = heapq.heappop(events)
        run = running[number]
        cfg = config(run.params)
        run.curve.append((step, landscape.eval_loss(cfg, step / run.total, seed)))
        ended = step >= run.total
        decision = search.decide(early, list(records.values()), number, run.curve, run.total,
                                 study_name="bench", finished=ended)
        rec = records[number]
        rungs = (*rec.rungs, *decision.recorded)
        if isinstance(decision, Prune):
            records[number] = TrialRecord(number, run.params, TrialState.PRUNED, None, rungs)
            seconds += run_seconds(step, False)
            del running[number]
        elif ended:
            final = landscape.final_loss(cfg, seed)
            records[number] = TrialRecord(number, run.params, TrialState.COMPLETE, final, rungs)
            seconds += run_seconds(step, True)
            del running[number]
        else:
            records[number] = TrialRecord(number, run.params, TrialState.RUNNING, None, rungs)
            nxt = min(step + EVAL_STEPS, run.total)
            heapq.heappush(events, (now + (nxt - step) * STEP_S, number, nxt))
            continue
        fill()
    done = [r for r in records.values() if r.state == TrialState.COMPLETE]
    best = min(r.value for r in done if r.value is not None)
    return seconds, best, len(done), sum(r.state == TrialState.PRUNED for r in records.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=16, help="landscape seeds to try")
    parser.add_argument("--trials", type=int, default=22)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--min-fraction", type=float, default=0.05)
    parser.add_argument("--eta", type=int, default=3)
    parser.add_argument("--pruner", default="asha")
    parser.add_argument("--setup-s", type=float, default=SETUP_S,
                        help="seconds of a fresh machine before its first step")
    parser.add_argument("--warm-s", type=float, default=WARM_S,
                        help="seconds of a warm machine between two runs")
    parser.add_argument("--finish-s", type=float, default=FINISH_S,
                        help="seconds after the last step of a run that ends")
    args = parser.parse_args()
    globals().update(SETUP_S=args.setup_s, WARM_S=args.warm_s, FINISH_S=args.finish_s)
    early = EarlyStopSpec(metric="train.eval_loss", min_fraction=args.min_fraction,
                          reduction_factor=args.eta, pruner=args.pruner)
    rows = []
    for seed in range(args.seeds):
        g_s, g_best = grid(seed, args.workers)
        s_s, s_best, complete, pruned = searched(seed, args.trials, args.workers, early, seed)
        ratio, gap = s_s / g_s, (s_best - g_best) / g_best
        rows.append((ratio, seed, g_s, s_s, g_best, s_best))
        print(f"seed {seed}: cost ratio {ratio:.3f}, best {s_best:.4f} vs {g_best:.4f} "
              f"({100 * gap:+.2f} %), {complete} complete, {pruned} pruned", flush=True)
    ratios = [r[0] for r in rows]
    gaps = [(r[5] - r[4]) / r[4] for r in rows]
    both = sum(r <= 0.35 and g <= 0.01 for r, g in zip(ratios, gaps, strict=True))
    print(f"median cost ratio {statistics.median(ratios):.3f} (max {max(ratios):.3f}); "
          f"best within 1 %: {sum(g <= 0.01 for g in gaps)}/{len(gaps)}; "
          f"median gap {100 * statistics.median(gaps):.2f} %; both targets met: "
          f"{both}/{len(rows)}")
    ratio, _, g_s, s_s, g_best, s_best = sorted(rows)[len(rows) // 2]
    print(f"grid_usd={(Decimal(g_s) * PRICE_PER_S).quantize(Decimal('0.01'))} "
          f"search_usd={(Decimal(s_s) * PRICE_PER_S).quantize(Decimal('0.01'))} "
          f"grid_best={g_best:.4f} search_best={s_best:.4f}")


if __name__ == "__main__":
    main()
