"""Scheduler: the expected placements from whole-job cost, no-fit errors, properties."""

from __future__ import annotations

import random
import sqlite3
from dataclasses import replace
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from orchestrator.core import money, scheduler, sizing, throughput
from orchestrator.core.architectures import lookup
from orchestrator.core.planning import RegisteredServer, make_plan, server_offers, total_tokens
from orchestrator.core.scheduler import Constraints, NoFit
from orchestrator.core.sizing import GIB, Strategy, Workload
from orchestrator.core.spec import load_job
from orchestrator.core.throughput import Measured
from orchestrator.records import readonly
from providers import catalog
from providers.base import Billing, Offer

TOKENS = 6_000_000


def job(repo: str, method: str = "qlora", **kw: object) -> Workload:
    return Workload(lookup(repo).architecture, method, **kw)  # type: ignore[arg-type]


def choose(w: Workload, c: Constraints = Constraints(), extra: list[Offer] | None = None,
           tokens: int = TOKENS) -> scheduler.Placement:
    offers = [*catalog.load().offers, *(extra or [])]
    return scheduler.choose(w, tokens, offers, catalog.gpus(), c)[0]


def test_qlora_8b_goes_to_rtx3090_spot() -> None:
    p = choose(job("meta-llama/Llama-3.1-8B"))
    assert (p.offer.gpu, p.offer.gpu_count, p.offer.interruptible) == ("RTX 3090", 1, True)


@pytest.mark.parametrize("repo", ["Qwen/Qwen2.5-32B", "meta-llama/Llama-3.1-70B"])
def test_qlora_32b_and_70b_go_to_a100_spot(repo: str) -> None:
    p = choose(job(repo, micro_batch_size=1))
    assert (p.offer.gpu, p.offer.gpu_count, p.offer.interruptible) == ("A100 80GB", 1, True)


def test_qlora_14b_fits_a_24gb_card_at_moderate_length() -> None:
    p = choose(job("Qwen/Qwen2.5-14B", sequence_len=1024, micro_batch_size=1))
    assert p.offer.gpu_memory_bytes <= 24576 * 2**20 and p.offer.interruptible


@pytest.mark.parametrize("repo", ["meta-llama/Llama-3.1-8B", "Qwen/Qwen2.5-32B",
                                  "meta-llama/Llama-3.1-70B"])
def test_spot_never_gives_the_on_demand_equivalent(repo: str) -> None:
    p = choose(job(repo, micro_batch_size=1), Constraints(spot="never"))
    assert not p.offer.interruptible
    assert (p.offer.gpu, p.offer.billing) == ("A100 80GB", Billing.PER_SECOND)


def test_full_32b_is_sharded_over_several_gpus() -> None:
    w = job("Qwen/Qwen2.5-32B", "full", micro_batch_size=1)
    # ZeRO-3 (fp32 master and moments, 12 bytes a parameter in 8-bit: 16 ÷ G) needs 8 GPUs;
    # FSDP2 under axolotl keeps bf16 shards and bf16 moments (6 ÷ G) and fits 4: cheaper.
    zero3 = choose(replace(w, layout="zero3"), tokens=2_000_000)
    assert zero3.offer.gpu_count == 8 and zero3.estimate.strategy is Strategy.ZERO3
    auto = choose(w, tokens=2_000_000)
    assert auto.offer.gpu_count == 4 and auto.estimate.strategy is Strategy.FSDP2
    assert auto.est_cost < zero3.est_cost


def test_full_32b_adamw_needs_more_than_the_catalog_offers() -> None:
    w = job("Qwen/Qwen2.5-32B", "full", optimizer="adamw", micro_batch_size=1,
            layout="zero3")
    with pytest.raises(NoFit) as info:
        choose(w)
    msg = str(info.value)
    assert "needs at least" in msg and "zero3 on 8 GPUs" in msg
    assert "the largest eligible offer has 80.0 GiB per GPU" in msg
    assert "does not fit in GPU memory" in msg
    # A registered 8x H200 node fits it, sharded, at zero marginal cost.
    node = server_offers([RegisteredServer("hgx", "H200", 8, Decimal("25000"))])
    p = choose(w, extra=node)
    assert p.offer.offer_id == "server:hgx" and p.estimate.strategy is Strategy.ZERO3
    assert p.est_cost == 0 and p.amortised_cost is not None and p.amortised_cost > 0


def test_registered_idle_h100_wins_at_zero_marginal_cost() -> None:
    mine = server_offers([RegisteredServer("box1", "H100 SXM", 1, Decimal("2190"))])
    p = choose(job("meta-llama/Llama-3.1-8B"), extra=mine)
    assert p.offer.offer_id == "server:box1" and p.est_cost == 0
    busy = server_offers([RegisteredServer("box1", "H100 SXM", 1, Decimal("2190"),
                                           status="busy")])
    assert busy == []


def test_new_monthly_rental_is_ranked_at_a_whole_month() -> None:
    offers = [*catalog.load().offers]
    ranking = scheduler.rank(job("meta-llama/Llama-3.1-8B"), TOKENS, offers, catalog.gpus())
    monthly = [p for p in ranking.placements if p.offer.billing is Billing.MONTHLY]
    assert monthly and all(p.est_cost == Decimal("2190") for p in monthly)
    assert ranking.placements[-1].offer.billing is Billing.MONTHLY


def test_unpublished_prices_are_never_planned() -> None:
    cat = catalog.load()
    assert {u.name for u in cat.unpriced} >= {"1xH200", "8xH200", "8xB200"}
    assert not any(o.gpu in {"H200", "B200", "B300"} for o in cat.offers)


def test_constraints_are_respected() -> None:
    w = job("meta-llama/Llama-3.1-8B")
    assert choose(w, Constraints(gpus=frozenset({"RTX 4090"}))).offer.gpu == "RTX 4090"
    assert choose(w, Constraints(spot="required")).offer.interruptible
    with pytest.raises(NoFit, match="above resources.max_cost"):
        choose(w, Constraints(max_cost=Decimal("0.01")))
    with pytest.raises(NoFit, match="slower than resources.deadline_hours"):
        choose(w, Constraints(deadline_hours=0.01))
    with pytest.raises(NoFit, match="provider not in resources.providers"):
        choose(w, Constraints(providers=frozenset({"dedicated"})))
    p = choose(w, Constraints(max_price_per_hour=Decimal("0.2"), spot="required"))
    assert p.offer.price_per_hour is not None and p.offer.price_per_hour <= Decimal("0.2")


def test_max_price_per_hour_applies_to_new_monthly_rentals() -> None:
    w = job("meta-llama/Llama-3.1-8B")
    with pytest.raises(NoFit, match="above resources.max_price_per_hour"):
        choose(w, Constraints(gpus=frozenset({"H100 SXM"}), max_price_per_hour=Decimal("0.5")))
    # A registered server costs this job nothing per hour: it passes any price limit.
    mine = server_offers([RegisteredServer("box1", "H100 SXM", 1, Decimal("2190"))])
    p = choose(w, Constraints(max_price_per_hour=Decimal("0.01")), extra=mine)
    assert p.offer.offer_id == "server:box1"


def test_no_fit_from_constraints_says_which_and_how_to_fix() -> None:
    w = job("meta-llama/Llama-3.1-8B")
    with pytest.raises(NoFit) as info:
        choose(w, Constraints(providers=frozenset({"dedicated"})))
    msg = str(info.value)
    assert "no offer passes the job's resources constraints" in msg
    assert "provider not in resources.providers" in msg and "orch servers add" in msg
    with pytest.raises(NoFit) as info:
        choose(w, Constraints(max_cost=Decimal("0.001")))
    assert "the cheapest that fits costs $" in str(info.value)
    assert "Try resources.max_cost: " in str(info.value)
    assert "shorter training.sequence_len" not in str(info.value)


def test_no_fit_names_smallest_need_and_largest_offer() -> None:
    w = job("meta-llama/Llama-3.1-70B", "lora", sequence_len=32768, micro_batch_size=8,
            gradient_checkpointing=False)
    with pytest.raises(NoFit) as info:
        choose(w)
    msg = str(info.value)
    assert "the job needs at least" in msg and "GiB per GPU" in msg
    assert "H100 PCIe" in msg or "A100 80GB" in msg


# --- properties -----------------------------------------------------------------------------

GPUS = catalog.gpus()


def _offer(gpu: str, count: int, spot: bool, cents: int, i: int, kind: str,
           ram_gb: int | None) -> Offer:
    ram = None if ram_gb is None else ram_gb * 10**9
    common = {"provider": f"p{i % 3}", "offer_id": f"o{i}", "gpu": gpu, "gpu_count": count,
              "gpu_memory_bytes": GPUS[gpu].memory_bytes, "ram_bytes": ram,
              "boot_minutes": float(i % 7)}
    if kind == "metered":
        return Offer(billing=Billing.PER_SECOND if i % 2 else Billing.PER_MINUTE,
                     interruptible=spot, price_per_hour=Decimal(cents) / 100, **common)
    return Offer(billing=Billing.MONTHLY, interruptible=False, price_per_hour=None,
                 monthly_price=Decimal(cents), registered=kind == "registered", **common)


offer_st = st.builds(
    _offer, st.sampled_from(sorted(GPUS)), st.sampled_from([1, 2, 4, 8]), st.booleans(),
    st.integers(5, 5000), st.integers(0, 10_000),
    st.sampled_from(["metered", "metered", "metered", "monthly", "registered"]),
    st.none() | st.sampled_from([64, 512, 2048]),
)


def _oracle_cost(w: Workload, offers: list[Offer], c: Constraints) -> Decimal | None:
    """The cheapest cost by brute force over offers x every layout, independent of rank()."""
    best: Decimal | None = None
    for o in offers:
        if (c.spot == "never" and o.interruptible) or (c.spot == "required"
                                                        and not o.interruptible):
            continue
        if o.gpu_count > c.max_gpus:
            continue
        hours = [throughput.duration(w, TOKENS, o, GPUS[o.gpu], strategy).total
                 for strategy in sizing.candidate_strategies(o.gpu_count, w)
                 if sizing.estimate(w, o.gpu_count, strategy).fits(o.gpu_memory_bytes,
                                                                   o.ram_bytes)]
        for h in hours:
            cost = money.job_cost(o, h)
            # A new monthly rental's price per hour is its commitment over the job's hours
            # on its fastest layout: a slower layout spreads the same month over more hours
            # but makes it no cheaper a rate to work at (hypothesis found an offload layout
            # slipping under max_price_per_hour that way).
            hourly = o.price_per_hour if o.price_per_hour is not None else \
                money.job_cost(o, min(hours)) / Decimal(repr(min(hours)))
            if c.max_price_per_hour is not None and hourly > c.max_price_per_hour:
                continue
            best = cost if best is None else min(best, cost)
    return best
workload_st = st.builds(
    job,
    st.sampled_from(["meta-llama/Llama-3.2-1B", "meta-llama/Llama-3.1-8B", "Qwen/Qwen2.5-14B",
                     "Qwen/Qwen2.5-32B", "meta-llama/Llama-3.1-70B"]),
    st.sampled_from(["qlora", "lora", "full"]),
)
# Only these three drawn, the rest at their defaults (builds() on a NamedTuple draws every field).
constraint_st = st.fixed_dictionaries(dict(
    spot=st.sampled_from(["allowed", "required", "never"]),
    max_gpus=st.sampled_from([1, 2, 4, 8]),
    max_price_per_hour=st.none() | st.integers(10, 2000).map(lambda c: Decimal(c) / 100),
)).map(lambda drawn: Constraints(**drawn))


@settings(max_examples=150, deadline=None)
@given(workload_st, st.lists(offer_st, max_size=30, unique_by=lambda o: o.offer_id),
       constraint_st, st.randoms(use_true_random=False))
@example(job("Qwen/Qwen2.5-14B", "qlora"),  # a $5/month A100: 2.1 h single, 4.1 h offloaded
         [_offer("A100 80GB", 1, False, 123, 0, "metered", None),
          _offer("A100 80GB", 1, False, 5, 2, "monthly", 64)],
         Constraints(max_gpus=1, max_price_per_hour=Decimal("1.22")), random.Random(0))
def test_chosen_is_never_costlier_and_ranking_is_deterministic(
    w: Workload, offers: list[Offer], c: Constraints, rnd: object
) -> None:
    ranking = scheduler.rank(w, TOKENS, offers, GPUS, c)
    shuffled = list(offers)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    again = scheduler.rank(w, TOKENS, shuffled, GPUS, c)
    assert [p.offer.offer_id for p in ranking.placements] == \
        [p.offer.offer_id for p in again.placements]
    for p in ranking.placements:
        assert p.estimate.required_bytes <= p.offer.gpu_memory_bytes
        assert p.offer.gpu_count <= c.max_gpus
        assert not (c.spot == "never" and p.offer.interruptible)
        assert not (c.spot == "required" and not p.offer.interruptible)
    oracle = _oracle_cost(w, offers, c)
    assert (ranking.chosen is None) == (oracle is None)
    if ranking.chosen is not None:
        best = ranking.chosen
        assert best.est_cost == oracle  # nothing feasible, in any layout, is cheaper
        assert all(best.est_cost <= p.est_cost for p in ranking.placements)
        ties = [p for p in ranking.placements if p.est_cost == best.est_cost]
        assert all(best.est_hours <= p.est_hours + 1e-9 for p in ties)
    else:
        with pytest.raises(NoFit, match="needs at least") as info:
            scheduler.choose(w, TOKENS, offers, GPUS, c)
        assert "GiB per GPU" in str(info.value) and "Left out:" in str(info.value)
    # Every offer is either placed or counted as rejected for a reason.
    assert len(ranking.placements) + sum(ranking.rejected.values()) == len(offers)


@settings(max_examples=60, deadline=None)
@given(workload_st)
def test_no_offer_fits_below_the_smallest_need(w: Workload) -> None:
    need = scheduler.smallest_need(w)
    small = Offer("x", "tiny", "RTX 3090", 8, need.required_bytes - 1, Billing.PER_SECOND,
                  False, Decimal("1"))
    assert scheduler.rank(w, TOKENS, [small], GPUS).chosen is None
    assert need.required_bytes > 0 and need.required_bytes / GIB < 10_000


# --- throughput learned from history --------------------------------------------------------

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
# The table as migration 0002 creates it (without the job foreign key: no job rows here).
THROUGHPUT_DDL = """CREATE TABLE throughput_observation (id INTEGER PRIMARY KEY, job_id TEXT,
    gpu TEXT, gpu_count INTEGER, method TEXT, size_class TEXT, tokens_per_s REAL,
    observed_at TEXT)"""


def _observations(path: Path, rows: list[tuple[str, int, str, str, float]]) -> str:
    """A SQLite file holding `rows` as throughput observations, oldest first; its URL."""
    con = sqlite3.connect(path)
    con.execute(THROUGHPUT_DDL)
    for i, (gpu, count, method, size, rate) in enumerate(rows):
        at = f"2025-01-01T00:{i // 60:02d}:{i % 60:02d}.000000Z"
        con.execute("INSERT INTO throughput_observation (job_id, gpu, gpu_count, method, "
                    "size_class, tokens_per_s, observed_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (f"job{i}", gpu, count, method, size, rate, at))
    con.commit()
    con.close()
    return f"sqlite:///{path}"


def test_size_class_is_the_nearest_common_size() -> None:
    assert throughput.size_class(lookup("meta-llama/Llama-3.1-8B").architecture.params) == "8B"
    assert throughput.size_class(7_615_616_512) == "8B"  # Qwen2.5-7B shares the class
    assert throughput.size_class(494_032_768) == "0.5B"
    assert throughput.size_class(70_553_706_496) == "70B"
    assert throughput.size_class(10**15) == "405B"
    with pytest.raises(ValueError):
        throughput.size_class(0)


def test_rank_uses_the_measured_figure_for_the_matching_key_only() -> None:
    w = job("meta-llama/Llama-3.1-8B")
    offers = catalog.load().offers
    seen = Measured(10_000.0, 3)
    key = ("RTX 4090", 1, "qlora", "8B")
    ranking = scheduler.rank(w, TOKENS, offers, GPUS, measured={key: seen})
    by_key = {(p.offer.gpu, p.offer.gpu_count): p for p in ranking.placements}
    p4090 = by_key[("RTX 4090", 1)]
    assert p4090.duration.source == "measured 10,000 tokens/s (3 jobs)"
    assert p4090.duration.training == pytest.approx(TOKENS / 10_000 / 3600)
    assert p4090.to_dict()["throughput_source"] == p4090.duration.source
    assert all(p.duration.source.startswith("formula, ")
               for p in ranking.placements if p is not p4090)
    # Another method or model size has its own history.
    for other in [("RTX 4090", 1, "lora", "8B"), ("RTX 4090", 1, "qlora", "14B")]:
        again = scheduler.rank(w, TOKENS, offers, GPUS, measured={other: seen})
        assert all(p.duration.source.startswith("formula, ") for p in again.placements)


def test_measured_throughput_takes_the_median_of_the_newest_20(tmp_path: Path) -> None:
    # 5 old slow runs, then 20 recent ones: 10 at 900, 10 at 1100 tokens/s.
    rows = [("RTX 4090", 1, "qlora", "8B", 10.0)] * 5
    rows += [("RTX 4090", 1, "qlora", "8B", 900.0 if i % 2 else 1100.0) for i in range(20)]
    rows += [("A100 80GB", 2, "lora", "14B", 5000.0), ("A100 80GB", 2, "lora", "14B", -1.0)]
    got = readonly.measured_throughput(_observations(tmp_path / "orch.db", rows))
    assert got == {("RTX 4090", 1, "qlora", "8B"): Measured(1000.0, 20),
                   ("A100 80GB", 2, "lora", "14B"): Measured(5000.0, 1)}
    assert got[("A100 80GB", 2, "lora", "14B")].describe() == \
        "measured 5,000 tokens/s (1 job)"


def test_plan_uses_measured_history_and_shows_its_source(tmp_path: Path) -> None:
    job_file = load_job(EXAMPLES / "qlora-8b.yml")
    chosen = make_plan(job_file).chosen.offer
    rows = [(chosen.gpu, chosen.gpu_count, "qlora", "8B", rate) for rate in (40.0, 50.0, 9e9)]
    url = _observations(tmp_path / "orch.db", rows)
    plan = make_plan(job_file, measured=readonly.measured_throughput(url))
    mine = [p for p in plan.ranking.placements
            if (p.offer.gpu, p.offer.gpu_count) == (chosen.gpu, chosen.gpu_count)]
    assert mine and all(p.duration.source == "measured 50 tokens/s (3 jobs)" for p in mine)
    assert mine[0].duration.training == pytest.approx(
        total_tokens(job_file) / 50 / 3600)
    # 50 tokens/s is far slower than the formula: another GPU wins now.
    assert plan.chosen.offer.gpu != chosen.gpu or plan.chosen.offer.gpu_count != \
        chosen.gpu_count
    assert plan.to_dict()["alternatives"]


def test_no_table_or_no_file_means_the_formula(tmp_path: Path) -> None:
    old = tmp_path / "old.db"
    sqlite3.connect(old).close()
    for url in [f"sqlite:///{old}", f"sqlite:///{tmp_path / 'absent.db'}", "sqlite://"]:
        assert readonly.measured_throughput(url) == {}
    assert not (tmp_path / "absent.db").exists()  # read-only: nothing created
    plan = make_plan(load_job(EXAMPLES / "qlora-8b.yml"),
                     measured=readonly.measured_throughput(f"sqlite:///{old}"))
    assert plan.chosen.duration.source.startswith("formula, ")
