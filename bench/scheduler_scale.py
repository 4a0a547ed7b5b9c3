"""Scheduler scale: time per job decision over 100 .. 10,000 offers, for up to 1,000 jobs.

Times, per job, the two calls the product makes: `offerbook.top` (k = the engine's
`max_placements`, 5: the retry list `engine/placement.py` rents from, over an OfferBook built
once per market; `orch plan`'s saver comparisons use `offerbook.best`, its k = 1) and the
full ranking `scheduler.rank` (every offer priced: only for `orch plan`'s table). Shows
them side by side with their ratio, the index build, and counts retry lists that differ
from the ranking's first k (must be 0). Asserts nothing.
Usage: python bench/scheduler_scale.py [--jobs 1000] [--offers 100,1000,10000] [--auto]
(--auto leaves every memory saver to the planner, as a job file does by default.)
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from decimal import Decimal

from orchestrator.core import scheduler
from orchestrator.core.architectures import lookup
from orchestrator.core.offerbook import OfferBook, top
from orchestrator.core.sizing import Workload
from orchestrator.engine.runner_core import Options
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


def make_jobs(n: int, rnd: random.Random, auto: bool = False) -> list[Workload]:
    savers = {"optimizer": "auto", "gradient_checkpointing": "auto", "cross_entropy": "auto",
              "activation_offloading": "auto"} if auto else {}
    return [Workload(lookup(rnd.choice(MODELS)).architecture,
                     rnd.choice(["qlora", "lora", "full"]),
                     sequence_len=rnd.choice([512, 1024, 2048, 4096, 8192]),
                     micro_batch_size=rnd.choice([1, 2, 4]),
                     lora_r=rnd.choice([8, 16, 32, 64]), **savers)  # type: ignore[arg-type]
            for _ in range(n)]


def _stats(times: list[float]) -> tuple[float, float]:
    return statistics.median(times), sorted(times)[int(0.95 * (len(times) - 1))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--offers", default="100,1000,10000")
    ap.add_argument("--auto", action="store_true", help="savers left to the planner")
    args = ap.parse_args()
    rnd = random.Random(7)
    gpus = catalog.gpus()
    jobs = make_jobs(args.jobs, rnd, args.auto)
    k = Options().max_placements  # the engine's retry list
    print(f"{'offers':>7} {'jobs':>6} {'rank ms/job':>12} {'p95':>7} {f'top{k} ms/job':>12} "
          f"{'p95':>7} {'speed-up':>9} {'index ms':>9} {'differ':>7}")
    for n in [int(x) for x in args.offers.split(",")]:
        offers = make_offers(n, rnd)
        t = time.perf_counter()
        book = OfferBook.of(offers)  # once per market, shared by every job
        index_s = time.perf_counter() - t
        full, fast, differ = [], [], 0
        for w in jobs:
            t = time.perf_counter()
            ranked = scheduler.rank(w, 5_000_000, offers, gpus).placements[:k]
            full.append(time.perf_counter() - t)
            t = time.perf_counter()
            got = top(w, 5_000_000, book, gpus, k)
            fast.append(time.perf_counter() - t)
            differ += got != list(ranked)
        (fm, fp), (bm, bp) = _stats(full), _stats(fast)
        print(f"{n:7d} {len(jobs):6d} {fm * 1000:12.2f} {fp * 1000:7.2f} {bm * 1000:12.3f} "
              f"{bp * 1000:7.3f} {fm / bm:8.0f}x {index_s * 1000:9.1f} {differ:7d}")


if __name__ == "__main__":
    main()
