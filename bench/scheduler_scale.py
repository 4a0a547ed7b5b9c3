"""Scheduler scale: time per job decision over 100 .. 10,000 offers, for up to 1,000 jobs.

Prints a table of per-decision times and the growth factor per 10x more offers; asserts
nothing. Usage: python bench/scheduler_scale.py [--jobs 1000] [--offers 100,1000,10000]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from decimal import Decimal

from orchestrator import scheduler
from orchestrator.architectures import lookup
from orchestrator.sizing import Workload
from providers import catalog
from providers.base import Billing, Offer

MODELS = ["meta-llama/Llama-3.2-1B", "meta-llama/Llama-3.1-8B", "Qwen/Qwen2.5-14B",
          "Qwen/Qwen2.5-32B", "meta-llama/Llama-3.1-70B"]


def make_offers(n: int, rnd: random.Random) -> list[Offer]:
    """A market like a live provider's: many hosts per GPU model, prices scattered."""
    gpus = catalog.gpus()
    names = sorted(gpus)
    offers = []
    for i in range(n):
        g = gpus[rnd.choice(names)]
        count = rnd.choice([1, 1, 1, 2, 4, 8])
        base = Decimal(rnd.randint(7, 400)) / 100
        offers.append(Offer(
            provider=rnd.choice(["vastai", "runpod", "cloud"]), offer_id=f"o{i}", gpu=g.name,
            gpu_count=count, gpu_memory_bytes=g.memory_bytes, billing=Billing.PER_SECOND,
            interruptible=rnd.random() < 0.5, price_per_hour=base * count,
            ram_bytes=rnd.choice([None, 64 * 10**9, 512 * 10**9, 2048 * 10**9]),
            boot_minutes=rnd.choice([2.0, 5.0, 8.0]), pull_gbps=rnd.choice([1.0, 2.0, 10.0])))
    return offers


def make_jobs(n: int, rnd: random.Random) -> list[Workload]:
    return [Workload(lookup(rnd.choice(MODELS)).architecture,
                     rnd.choice(["qlora", "lora", "full"]),
                     sequence_len=rnd.choice([512, 1024, 2048, 4096, 8192]),
                     micro_batch_size=rnd.choice([1, 2, 4]),
                     lora_r=rnd.choice([8, 16, 32, 64])) for _ in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--offers", default="100,1000,10000")
    args = ap.parse_args()
    rnd = random.Random(7)
    gpus = catalog.gpus()
    jobs = make_jobs(args.jobs, rnd)
    print(f"{'offers':>7} {'jobs':>6} {'median ms/job':>14} {'p95 ms/job':>11} "
          f"{'us/offer':>9} {'growth':>7}  fits/job")
    prev = None
    for n in [int(x) for x in args.offers.split(",")]:
        offers = make_offers(n, rnd)
        times, fits = [], 0
        for w in jobs:
            t = time.perf_counter()
            ranking = scheduler.rank(w, 5_000_000, offers, gpus)
            times.append(time.perf_counter() - t)
            fits += len(ranking.placements)
        med = statistics.median(times)
        p95 = sorted(times)[int(0.95 * (len(times) - 1))]
        growth = f"{med / prev:.1f}x" if prev else "-"
        print(f"{n:7d} {len(jobs):6d} {med * 1000:14.2f} {p95 * 1000:11.2f} "
              f"{med / n * 1e6:9.2f} {growth:>7}  {fits // len(jobs)}")
        prev = med


if __name__ == "__main__":
    main()
