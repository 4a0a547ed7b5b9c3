"""The fast decision (offerbook.best, offerbook.top) picks exactly what the full ranking ranks
first (the k first, in its order)."""

from __future__ import annotations

import random
from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.core import scheduler
from orchestrator.core.architectures import lookup
from orchestrator.core.evalsizing import EvalWork
from orchestrator.core.offerbook import OfferBook, best, top
from orchestrator.core.scheduler import Constraints
from orchestrator.core.sizing import Workload
from orchestrator.core.throughput import Measured, size_class
from providers import catalog
from providers.base import Billing, Offer

GPUS = catalog.gpus()
TOKENS = 5_000_000
MODELS = ["meta-llama/Llama-3.2-1B", "meta-llama/Llama-3.1-8B", "Qwen/Qwen2.5-14B",
          "Qwen/Qwen2.5-32B", "meta-llama/Llama-3.1-70B"]


def _offer(i: int, gpu: str, count: int, spot: bool, cents: int, kind: str, ram_gb: int | None,
           boot: float, pull: float) -> Offer:
    common = {"provider": ("vastai", "runpod", "cloud")[i % 3], "offer_id": f"o{i}",
              "gpu": gpu, "gpu_count": count, "gpu_memory_bytes": GPUS[gpu].memory_bytes,
              "ram_bytes": None if ram_gb is None else ram_gb * 10**9, "boot_minutes": boot,
              "pull_gbps": pull}
    if kind in ("monthly", "registered"):
        return Offer(billing=Billing.MONTHLY, interruptible=False, price_per_hour=None,
                     monthly_price=Decimal(cents), registered=kind == "registered", **common)
    billing = Billing.PER_MINUTE if kind == "per_minute" else Billing.PER_SECOND
    # Few distinct prices: ties in cost must be broken exactly as the ranking does.
    return Offer(billing=billing, interruptible=spot, price_per_hour=Decimal(cents) / 100,
                 **common)


def offers_st() -> st.SearchStrategy[list[Offer]]:
    one = st.tuples(st.sampled_from(sorted(GPUS)), st.sampled_from([1, 2, 4, 8]),
                    st.booleans(), st.integers(5, 60),
                    st.sampled_from(["per_second"] * 4 + ["per_minute", "monthly",
                                                           "registered"]),
                    st.none() | st.sampled_from([64, 512, 2048]),
                    st.sampled_from([0.0, 2.0, 5.0]), st.sampled_from([1.0, 2.0, 10.0]))
    return st.lists(one, max_size=60).map(
        lambda rows: [_offer(i, *row) for i, row in enumerate(rows)])


auto_or = st.sampled_from
workload_st = st.builds(
    lambda repo, method, seq, mb, opt, gc, ce, ao: Workload(
        lookup(repo).architecture, method, sequence_len=seq, micro_batch_size=mb,
        optimizer=opt, gradient_checkpointing=gc, cross_entropy=ce, activation_offloading=ao),
    st.sampled_from(MODELS), st.sampled_from(["qlora", "lora", "full"]),
    st.sampled_from([512, 2048, 4096]), st.sampled_from([1, 2]),
    auto_or(["auto", "adamw", "adamw_8bit"]), auto_or(["auto", True, False]),
    auto_or(["auto", "plain", "cut", "liger"]), auto_or(["auto", False]),
)
constraint_st = st.builds(
    Constraints,
    spot=st.sampled_from(["allowed", "required", "never"]),
    gpus=st.none() | st.sets(st.sampled_from(sorted(GPUS)), min_size=1).map(frozenset),
    max_gpus=st.sampled_from([1, 2, 4, 8]),
    gpu_count=st.none() | st.sampled_from([1, 2, 4]),
    providers=st.none() | st.sets(st.sampled_from(["vastai", "runpod", "cloud"]),
                                  min_size=1).map(frozenset),
    max_price_per_hour=st.none() | st.integers(10, 400).map(lambda c: Decimal(c) / 100),
    max_cost=st.none() | st.integers(5, 500).map(lambda c: Decimal(c) / 100),
    deadline_hours=st.none() | st.floats(0.3, 20),
)


@settings(max_examples=300, deadline=None)
@given(workload_st, offers_st(), constraint_st, st.data())
def test_best_is_the_rankings_first(w: Workload, offers: list[Offer], c: Constraints,
                                    data: st.DataObject) -> None:
    ids = [o.offer_id for o in offers]
    cached = frozenset(data.draw(st.sets(st.sampled_from(ids)) if ids else st.just(set())))
    measured = None
    if data.draw(st.booleans()):
        measured = {(g, n, w.method, size_class(w.arch.params)): Measured(rate, 1)
                    for g, n, rate in data.draw(st.lists(st.tuples(
                        st.sampled_from(sorted(GPUS)), st.sampled_from([1, 2, 4, 8]),
                        st.sampled_from([0.0, 500.0, 5000.0])), max_size=4))}
    # The evaluation on the training machine (issue 19): machines must serve the model too.
    ev = None
    if data.draw(st.booleans()):
        ev = EvalWork(w.arch, w.method, w.sequence_len, data.draw(st.sampled_from([0, 50])),
                      data.draw(st.sampled_from([0, 2])),
                      lora_params=0 if w.method == "full"
                      else w.arch.lora_params(16, w.lora_modules),
                      rentals=frozenset({"vastai", "runpod", "cloud"}) - {data.draw(
                          st.sampled_from(["vastai", "runpod", "cloud"]))})
    ranking = scheduler.rank(w, TOKENS, offers, GPUS, c, cached, measured, ev)
    # Some offers priced alone, outside the groups (machines kept warm, docs/warm.md): the
    # answer must not change.
    alone = data.draw(st.sets(st.sampled_from(ids)) if ids else st.just(set()))
    book = OfferBook.of(offers, alone=[o for o in offers if o.offer_id in alone])
    got = best(w, TOKENS, book, GPUS, c, cached, measured, ev)
    assert got == ranking.chosen
    # The engine's retry list: the ranking's k first, in its order.
    k = data.draw(st.integers(1, 6))
    assert top(w, TOKENS, book, GPUS, k, c, cached, measured, ev) == \
        list(ranking.placements[:k])


def test_best_agrees_at_market_scale() -> None:
    # The benchmark's market shape (bench/scheduler_scale.py), at a test-sized scale.
    rnd = random.Random(3)
    names = sorted(GPUS)
    offers = [_offer(i, rnd.choice(names), rnd.choice([1, 1, 2, 4, 8]), rnd.random() < 0.5,
                     rnd.randint(7, 400), "per_second", rnd.choice([None, 64, 512, 2048]),
                     rnd.choice([2.0, 5.0, 8.0]), rnd.choice([1.0, 2.0, 10.0]))
              for i in range(2000)]
    book = OfferBook.of(offers)
    for _ in range(20):
        w = Workload(lookup(rnd.choice(MODELS)).architecture,
                     rnd.choice(["qlora", "lora", "full"]),
                     sequence_len=rnd.choice([1024, 2048, 4096]),
                     cross_entropy=rnd.choice(["auto", "plain"]))
        ranking = scheduler.rank(w, TOKENS, offers, GPUS)
        assert best(w, TOKENS, book, GPUS) == ranking.chosen
        assert top(w, TOKENS, book, GPUS, 5) == list(ranking.placements[:5])


def test_the_training_floor_is_below_every_layouts_time() -> None:
    """`offerbook` skips groups by `throughput.training_seconds_floor`: it must never exceed
    the training time of any layout and saver choice the scheduler may pick."""
    from orchestrator.core import savers, throughput

    for repo in ("meta-llama/Llama-3.2-1B", "Qwen/Qwen2.5-32B"):
        for method in ("qlora", "lora", "full"):
            w = Workload(lookup(repo).architecture, method, sequence_len=2048,
                         optimizer="auto", gradient_checkpointing="auto",
                         cross_entropy="auto", activation_offloading="auto")
            for gpu in GPUS.values():
                for count in (1, 8):
                    floor = throughput.training_seconds_floor(w, TOKENS, gpu, count)
                    for layout in savers.layouts(w, count, gpu.scaling):
                        est = layout.estimate
                        exact = throughput.training_seconds(est.workload or w, TOKENS, gpu,
                                                            count, est.strategy)
                        assert floor <= exact * (1 + 1e-12), (repo, method, gpu.name, count)
