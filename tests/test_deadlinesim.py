"""Replaying a job over a spot trace (core/deadlinesim.py) and the plan's estimates."""

from __future__ import annotations

from decimal import Decimal

import pytest

from orchestrator.core import deadlinesim as ds
from orchestrator.core.deadline import Choice, Market, Mode, Restart
from providers.spottrace import SpotTrace

H = 3600.0
MARKET = Market(Decimal("0.25"), Decimal("0.50"), 0.5, Restart(600), Restart(600))


def test_spot_only_loses_the_work_since_its_checkpoint_and_bills_until_noticed() -> None:
    # Spot from 0 to 2 h, gone 1 h, then back for good. 3 h of work, a checkpoint per 30 min.
    trace = SpotTrace(100.0, ((0.0, 2.0), (3.0, 100.0)))
    job = ds.Job(work_s=3 * H, window_s=10 * H, checkpoint_every_s=1800, detect_s=60)
    out = ds.replay(job, MARKET, trace, ds.strategy(ds.Plan.SPOT, MARKET))
    # First machine: 10 min restart, 1 h 50 min of work, checkpointed at 1.5 h; preempted
    # at 2 h, noticed at 2 h 1 min. Second: rented at 3 h, 10 min restart, 1.5 h left.
    assert out.preemptions == 1 and out.rentals == 2
    assert out.finished_s == pytest.approx(3 * H + 600 + 1.5 * H)
    assert out.spot_s == pytest.approx((2 * H + 60) + (600 + 1.5 * H))
    assert out.on_demand_s == 0
    assert out.cost(MARKET) == (Decimal("0.25") * Decimal(repr(out.spot_s)) / 3600
                                ).quantize(Decimal("0.000001"))


def test_on_demand_only_costs_its_restart_and_the_work() -> None:
    job = ds.Job(work_s=4 * H, window_s=5 * H, checkpoint_every_s=900)
    out = ds.replay(job, MARKET, SpotTrace(50.0, ()), ds.strategy(ds.Plan.ON_DEMAND, MARKET))
    assert out.finished_s == pytest.approx(4 * H + 600) and out.spot_s == 0
    assert out.cost(MARKET) == Decimal("2.083333")  # 4 h 10 min at $0.50


def test_the_policy_falls_back_to_on_demand_when_spot_goes_and_the_slack_is_short() -> None:
    # 5 h of work, 6 h to the deadline; spot goes after 1 h and never comes back.
    trace = SpotTrace(100.0, ((0.0, 1.0),))
    job = ds.Job(work_s=5 * H, window_s=6 * H, checkpoint_every_s=600, detect_s=60)
    out = ds.replay(job, MARKET, trace, ds.strategy(ds.Plan.POLICY, MARKET, Mode.GREEDY))
    assert out.finished_s is not None and out.finished_s <= job.window_s
    assert out.preemptions == 1 and out.spot_s > 0 and out.on_demand_s > 0
    spot_only = ds.replay(job, MARKET, trace, ds.strategy(ds.Plan.SPOT, MARKET))
    assert spot_only.missed(job) and spot_only.finished_s is None


def test_estimates_are_seeded_and_on_demand_is_exact() -> None:
    job = ds.Job(work_s=8 * H, window_s=12 * H, checkpoint_every_s=1800)
    first = ds.estimate(job, MARKET, wait_mean_h=1.0, runs=24, seed=5)
    assert first == ds.estimate(job, MARKET, wait_mean_h=1.0, runs=24, seed=5)
    assert first.on_demand.cost == Decimal("4.083333") and first.on_demand.p_miss == 0
    assert first.policy.p_miss == 0 and first.policy.mode in set(Mode)
    assert first.policy.cost < first.on_demand.cost  # half-price spot pays here
    assert first.spot.cost < first.policy.cost and first.spot.p_miss > 0
    assert [e.to_dict()["strategy"] for e in first.all()] == ["on_demand", "spot", "policy"]
    other = ds.estimate(job, MARKET, wait_mean_h=1.0, runs=24, seed=6)
    assert other.spot != first.spot


def test_no_preemptions_means_spot_runs_through() -> None:
    calm = Market(Decimal("0.25"), Decimal("0.50"), 0.0, Restart(600), Restart(600))
    job = ds.Job(work_s=8 * H, window_s=9 * H, checkpoint_every_s=1800)
    est = ds.estimate(job, calm, wait_mean_h=1.0, runs=4)
    assert est.spot.p_miss == 0 and est.spot.cost == Decimal("2.041667")
    assert est.policy.cost == est.spot.cost


def test_fastest_names_the_quickest_choice_and_whether_it_meets_the_deadline() -> None:
    job = ds.Job(work_s=10 * H, window_s=10 * H, checkpoint_every_s=1800)
    late = ds.fastest(job, MARKET)
    assert (late.choice, late.meets) == (Choice.ON_DEMAND, False)
    assert late.miss_by_h == pytest.approx(600 / H)
    quick = Market(Decimal("0.25"), Decimal("0.50"), 0.5, Restart(60), Restart(600))
    assert ds.fastest(ds.Job(10 * H, 11 * H, 1800), quick).choice is Choice.SPOT
