"""The offline bench's policy told the near future (bench/deadline_offline.py `peeking`): what
knowing when a spot spell ends and when spot comes back is worth to orch's policy.

Each case is one the plain policy cannot see coming, so each fails if `peeking` were the
policy alone."""

from __future__ import annotations

from decimal import Decimal

import benchmod

from orchestrator.core import deadlinesim as ds
from orchestrator.core.deadline import Market, Mode, Restart
from providers.spottrace import SpotTrace

offline = benchmod.load("deadline_offline")
RESTART = Restart(boot_s=300.0, download_s=240.0, resume_s=60.0)  # 10 min
MARKET = Market(Decimal("0.234"), Decimal("0.468"), 0.3, RESTART, RESTART)
JOB_2H = 7200.0


def _both(trace: SpotTrace, window_h: float) -> tuple[ds.Outcome, ds.Outcome]:
    job = ds.Job(work_s=JOB_2H, window_s=window_h * 3600, checkpoint_every_s=900.0)
    plain = ds.replay(job, MARKET, trace, ds.strategy(ds.Plan.POLICY, MARKET, Mode.GREEDY))
    told = ds.replay(job, MARKET, trace, offline.peeking(trace, MARKET, Mode.GREEDY))
    assert not plain.missed(job) and not told.missed(job)
    return plain, told


def test_a_spell_too_short_to_pay_for_its_restart_is_not_rented() -> None:
    # 24 min of spot first: a 10-min restart, then 14 min of work and no checkpoint, which
    # the paper's rule for a known lifetime refuses at a 2:1 price (o / (o - d) = 4.4 > 2).
    trace = SpotTrace(100.0, ((0.0, 0.4), (0.6, 100.0)))
    plain, told = _both(trace, window_h=4.0)
    assert (plain.rentals, plain.preemptions) == (2, 1)
    assert (told.rentals, told.preemptions) == (1, 0)
    assert told.cost(MARKET) < plain.cost(MARKET)


def test_a_gap_longer_than_the_slack_is_ridden_on_on_demand_then_spot() -> None:
    # Spot is gone for the first hour. Waiting for it would spend the slack down to the
    # Safety Net at 49 min, then on-demand to the end; told that spot comes back at 1 h, the
    # policy runs on-demand meanwhile, keeps its slack and moves to spot when it is back.
    trace = SpotTrace(100.0, ((1.0, 100.0),))
    plain, told = _both(trace, window_h=3.5)
    assert plain.spot_s == 0 and plain.on_demand_s > JOB_2H
    assert 0 < told.on_demand_s <= 3600 and told.spot_s > 0
    assert told.cost(MARKET) < plain.cost(MARKET)


def test_a_job_inside_the_safety_nets_margin_stays_on_on_demand_when_spot_comes_back() -> None:
    # 30 min of slack, less than the Safety Net's margin (a spot restart, a checkpoint
    # interval, detection, a slow on-demand restart and a check: 41 min): on-demand at once,
    # and to the end, though a long spell comes at 30 min. A move to spot there would leave
    # no room for the fallback if it were preempted.
    trace = SpotTrace(100.0, ((0.5, 100.0),))
    plain, told = _both(trace, window_h=2.5)
    assert plain.spot_s == 0 and told.spot_s == 0
    assert told.on_demand_s == plain.on_demand_s
