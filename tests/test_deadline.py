"""The deadline policy (core/deadline.py): each rule with plain values, and its guarantees.

The guarantee is the paper's (Wu et al., NSDI '24, §3.3): with the Safety Net, a job whose
deadline on-demand could meet from the start meets it whatever spot does. It is checked by
replaying the policy over arbitrary traces (core/deadlinesim.py) with hypothesis.
"""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from orchestrator.core import deadlinesim as ds
from orchestrator.core.deadline import (
    Choice,
    Machine,
    Market,
    Mode,
    Restart,
    Rule,
    Situation,
    Work,
    decide,
    spot_cost_factor,
)
from providers.spottrace import SpotTrace

H = 3600.0
RESTART = Restart(boot_s=300, download_s=240, resume_s=60)  # 10 min
MARKET = Market(Decimal("0.234"), Decimal("0.468"), 0.3, RESTART, RESTART)


def situation(work_h: float, left_h: float, *, done_h: float = 0.0, elapsed_h: float = 0.0,
              on: Machine = Machine.NONE, spot: bool = True, unsaved_h: float = 0.0,
              checkpoint_s: float = 1800, starting_s: float = 0.0) -> Situation:
    """A job of `work_h` hours (1 step a second) with `left_h` hours to its deadline."""
    work = Work(steps_total=int(work_h * H), steps_done=int(done_h * H), steps_per_s=1.0,
                steps_unsaved=int(unsaved_h * H))
    return Situation(work, elapsed_h * H, left_h * H, on, spot, checkpoint_s,
                     starting_s=starting_s, detect_s=60, check_every_s=300)


# Safety net here: spot restart 10 min + a checkpoint interval 30 min + detect 1 min +
# on-demand restart 10 min + check 5 min = 56 min of slack to move onto spot.


def test_spot_when_it_can_be_had_and_the_slack_covers_a_restart_and_a_fallback() -> None:
    d = decide(situation(10, 12), MARKET)
    assert (d.choice, d.rule) == (Choice.SPOT, Rule.TAKING_RISKS)
    assert d.numbers["safety_net_s"] == 56 * 60 and not d.will_miss


def test_safety_net_on_demand_when_the_slack_cannot_absorb_one_more_restart() -> None:
    d = decide(situation(10, 10.9), MARKET)  # 54 min of slack < 56
    assert (d.choice, d.rule) == (Choice.ON_DEMAND, Rule.SAFETY_NET)
    assert "on-demand to the end" in d.reason


def test_the_margins_budget_a_slow_on_demand_restart() -> None:
    """The Safety Net and the drift rule's fallback hold only if the on-demand restart that
    follows a preemption is no longer than they budget: they take a slow one (the 90th
    percentile measured, `slow_extra_s`); costs and the fastest way to finish do not."""
    slow = Market(MARKET.spot_per_hour, MARKET.on_demand_per_hour, 0.3, RESTART,
                  Restart(boot_s=300, download_s=240, resume_s=60, slow_extra_s=600))
    usual = decide(situation(10, 11), MARKET)  # 60 min of slack, the net 56 min
    assert (usual.choice, usual.rule) == (Choice.SPOT, Rule.TAKING_RISKS)
    d = decide(situation(10, 11), slow)  # the net 66 min: a slow fallback no longer fits
    assert (d.choice, d.rule) == (Choice.ON_DEMAND, Rule.SAFETY_NET)
    assert d.numbers["safety_net_s"] == 66 * 60
    # On spot, 50 min of slack: more than a preemption and a usual fallback (46 min), less
    # than with a slow one (56 min): move while it still finishes in time.
    on_spot = situation(10, 8.5 + 50 / 60, done_h=1.5, elapsed_h=4, on=Machine.SPOT)
    assert decide(on_spot, MARKET).rule is Rule.EXPLOITATION
    moved = decide(on_spot, slow)
    assert (moved.choice, moved.rule) == (Choice.ON_DEMAND, Rule.DRIFT)
    assert moved.numbers["fallback_s"] == 56 * 60
    # The fastest way to finish is the usual one: 10 h of work and a 10 min restart fit in
    # 10.2 h whatever a slow restart would take.
    assert not decide(situation(10, 10.2, spot=False), slow).will_miss
    assert spot_cost_factor(slow, situation(10, 12), from_on_demand=True) == spot_cost_factor(
        MARKET, situation(10, 12), from_on_demand=True)
    with pytest.raises(ValueError, match="slow_extra_s"):
        Restart(slow_extra_s=-1)


def test_no_spot_and_behind_uniform_progress_catches_up_on_demand() -> None:
    # 4 h of 10 done after 6 h of 15: the line says 4 h, it has 3.9.
    d = decide(situation(10, 9, done_h=3.9, elapsed_h=6, spot=False), MARKET)
    assert (d.choice, d.rule) == (Choice.ON_DEMAND, Rule.UNIFORM_PROGRESS)


def test_no_spot_and_ahead_waits_and_says_when_to_ask_again() -> None:
    d = decide(situation(10, 9, done_h=5, elapsed_h=6, spot=False), MARKET)
    assert (d.choice, d.rule) == (Choice.WAIT, Rule.WAIT)
    # Behind the line at t = 5 h / (10/15) = 7.5 h: in 1.5 h; the safety net is later.
    assert d.recheck_after_s == pytest.approx(1.5 * H)
    greedy = decide(situation(10, 9, done_h=3.9, elapsed_h=6, spot=False), MARKET, Mode.GREEDY)
    assert (greedy.choice, greedy.rule) == (Choice.WAIT, Rule.WAIT)  # greedy only waits


def test_hysteresis_keeps_on_demand_until_two_changeovers_ahead() -> None:
    # d = restart 10 min + half a checkpoint interval 15 min + detect 1 min = 26 min.
    s = situation(10, 10, done_h=3, elapsed_h=5, on=Machine.ON_DEMAND)
    d = decide(s, MARKET)
    assert (d.choice, d.rule) == (Choice.ON_DEMAND, Rule.HYSTERESIS)
    share, two_d = 10 / 15, 2 * 26 * 60
    target = (5 * H + two_d) * share
    assert d.recheck_after_s == pytest.approx((target - 3 * H) / (1 - share))
    run = (d.recheck_after_s + 60) / H  # a minute past it (steps are whole seconds)
    later = situation(10, 10 - run, done_h=3 + run, elapsed_h=5 + run, on=Machine.ON_DEMAND)
    assert decide(later, MARKET).choice is Choice.SPOT  # caught up: spot again
    early = situation(10, 10 - run + 0.05, done_h=3 + run - 0.05, elapsed_h=5 + run - 0.05,
                      on=Machine.ON_DEMAND)
    assert decide(early, MARKET).rule is Rule.HYSTERESIS
    assert decide(s, MARKET, Mode.GREEDY).choice is Choice.ON_DEMAND  # greedy stays


def test_on_spot_stays_until_preempted_while_a_fallback_fits() -> None:
    d = decide(situation(10, 9, done_h=2, elapsed_h=3, on=Machine.SPOT), MARKET)
    assert (d.choice, d.rule) == (Choice.SPOT, Rule.EXPLOITATION) and not d.at_risk


def test_drift_moves_to_on_demand_while_it_still_finishes_in_time() -> None:
    # The measured rate fell: 8.5 h of work left, 9 h to go: 30 min of slack < 46 min.
    d = decide(situation(10, 9, done_h=1.5, elapsed_h=4, on=Machine.SPOT), MARKET)
    assert (d.choice, d.rule) == (Choice.ON_DEMAND, Rule.DRIFT)
    # 5 min of slack: moving (10 min restart) would miss; staying meets it unless preempted.
    late = decide(situation(10, 8.6, done_h=1.5, elapsed_h=4, on=Machine.SPOT), MARKET)
    assert (late.choice, late.rule, late.at_risk) == (Choice.SPOT, Rule.EXPLOITATION, True)


def test_a_deadline_nothing_can_meet_is_said_at_once_with_the_fastest_choice() -> None:
    d = decide(situation(10, 10), MARKET)  # on-demand needs 10 h + its 10 min restart
    assert d.will_miss and d.rule is Rule.CANNOT_MEET and d.choice is Choice.ON_DEMAND
    assert d.miss_by_s == pytest.approx(600)
    running = decide(situation(10, 7.5, done_h=2, on=Machine.SPOT, unsaved_h=0.1), MARKET)
    assert running.will_miss and running.choice is Choice.SPOT  # staying is fastest
    assert running.miss_by_s == pytest.approx(0.4 * H, abs=1)


def test_spot_not_worth_it_at_a_high_preemption_rate() -> None:
    stormy = Market(Decimal("0.234"), Decimal("0.468"), 3.0, RESTART, RESTART)
    d = decide(situation(10, 20), stormy)
    assert (d.choice, d.rule) == (Choice.ON_DEMAND, Rule.SPOT_NOT_WORTH)
    assert d.numbers["spot_cost_factor"] > 1


def test_the_restart_still_under_way_counts_against_the_slack() -> None:
    running = situation(10, 11, on=Machine.SPOT)
    starting = situation(10, 11, on=Machine.SPOT, starting_s=900)
    assert decide(running, MARKET).rule is Rule.EXPLOITATION
    assert decide(starting, MARKET).rule is Rule.DRIFT  # 45 min of slack left, not 60


@settings(max_examples=40, deadline=None)
@given(rate=st.floats(0.0, 5.0), more=st.floats(0.01, 5.0),
       checkpoint=st.floats(60, 3600), restart=st.floats(0, 3600))
def test_spot_costs_more_per_hour_of_progress_as_preemptions_grow(
        rate: float, more: float, checkpoint: float, restart: float) -> None:
    r = Restart(restart)
    s = situation(10, 20, checkpoint_s=checkpoint)
    low = spot_cost_factor(Market(Decimal(1), Decimal(2), rate, r, r), s, from_on_demand=False)
    high = spot_cost_factor(Market(Decimal(1), Decimal(2), rate + more, r, r), s,
                            from_on_demand=False)
    assert low <= high
    assert spot_cost_factor(Market(Decimal(1), Decimal(2), 0.0, r, r), s,
                            from_on_demand=False) == Decimal("0.5")


situations = st.builds(
    lambda work, left, done, unsaved, on, spot, ckpt, rate: situation(
        work, left, done_h=min(done, work), elapsed_h=max(0.0, 2 * work - left), on=on,
        spot=spot, unsaved_h=min(unsaved, work - min(done, work)), checkpoint_s=ckpt),
    st.floats(0.5, 48), st.floats(0.1, 100), st.floats(0, 48), st.floats(0, 1),
    st.sampled_from(list(Machine)), st.booleans(), st.floats(60, 3600), st.floats(0, 3))


@settings(max_examples=300, deadline=None)
@given(s=situations, mode=st.sampled_from(list(Mode)))
def test_never_onto_spot_when_the_slack_cannot_absorb_one_more_restart(
        s: Situation, mode: Mode) -> None:
    d = decide(s, MARKET, mode)
    net = (RESTART.seconds + s.checkpoint_every_s + s.detect_s + RESTART.seconds
           + s.check_every_s)
    if d.choice is Choice.SPOT and s.on is not Machine.SPOT and not d.will_miss:
        assert s.time_left_s - s.work.left_s(keep=False) >= net
        assert s.spot_available
    if s.on is Machine.SPOT and d.choice is Choice.SPOT and d.rule is not Rule.DONE \
            and not (d.at_risk or d.will_miss):
        fallback = s.checkpoint_every_s + s.detect_s + RESTART.seconds + s.check_every_s
        assert s.time_left_s - s.work.left_s(keep=True) >= fallback


traces = st.lists(st.tuples(st.floats(0, 200), st.floats(0.01, 30)), max_size=40).map(
    lambda spans: SpotTrace(400.0, tuple(_disjoint(spans))))


def _disjoint(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    found: list[tuple[float, float]] = []
    for start, length in sorted(spans):
        if not found or start > found[-1][1]:
            found.append((start, min(400.0, start + length)))
    return found


@settings(max_examples=150, deadline=None)
@given(trace=traces, work_h=st.floats(0.5, 30), fraction=st.floats(0.2, 1.0),
       checkpoint=st.floats(60, 3600), rate=st.floats(0, 3), mode=st.sampled_from(list(Mode)),
       spot_restart=st.floats(0, 1800), od_restart=st.floats(0, 1800))
def test_the_policy_meets_every_deadline_on_demand_could_meet_whatever_spot_does(
        trace: SpotTrace, work_h: float, fraction: float, checkpoint: float, rate: float,
        mode: Mode, spot_restart: float, od_restart: float) -> None:
    market = Market(Decimal("0.2"), Decimal("0.5"), rate, Restart(spot_restart),
                    Restart(od_restart))
    job = ds.Job(work_s=work_h * H, window_s=work_h * H / fraction, checkpoint_every_s=checkpoint)
    on_demand = ds.replay(job, market, trace, ds.strategy(ds.Plan.ON_DEMAND, market))
    assume(not on_demand.missed(job))  # on-demand from the start meets it
    policy = ds.replay(job, market, trace, ds.strategy(ds.Plan.POLICY, market, mode))
    assert not policy.missed(job), policy


@settings(max_examples=100, deadline=None)
@given(work_h=st.floats(0.1, 50), window_h=st.floats(0.1, 100), restart=st.floats(0, 3600))
def test_on_demand_only_misses_exactly_when_nothing_could_meet_the_deadline(
        work_h: float, window_h: float, restart: float) -> None:
    market = Market(Decimal("0.2"), Decimal("0.5"), 1.0, Restart(restart), Restart(restart))
    job = ds.Job(work_s=work_h * H, window_s=window_h * H, checkpoint_every_s=600)
    outcome = ds.replay(job, market, SpotTrace(400.0, ()), ds.strategy(ds.Plan.ON_DEMAND,
                                                                         market))
    fastest = ds.fastest(job, market)
    assert outcome.missed(job) is (not fastest.meets)
    assert outcome.finished_s == pytest.approx(restart + work_h * H)


@settings(max_examples=150, deadline=None)
@given(trace=traces, work_h=st.floats(0.5, 30), fraction=st.floats(0.2, 1.0),
       checkpoint=st.floats(60, 3600), rate=st.floats(0, 3), mode=st.sampled_from(list(Mode)),
       spot_restart=st.floats(0, 1800), od_restart=st.floats(0, 1800),
       slow=st.floats(0, 1800), share=st.floats(0, 1))
def test_the_guarantee_holds_when_the_fallback_restart_runs_up_to_the_slow_one(
        trace: SpotTrace, work_h: float, fraction: float, checkpoint: float, rate: float,
        mode: Mode, spot_restart: float, od_restart: float, slow: float,
        share: float) -> None:
    """The policy plans with the usual on-demand restart and budgets a slow one; every
    on-demand restart of the replay takes anything up to that slow one. It still meets every
    deadline that on-demand, restarting that slowly from the start, could meet."""
    believed = Market(Decimal("0.2"), Decimal("0.5"), rate, Restart(spot_restart),
                      Restart(od_restart, slow_extra_s=slow))
    real = Market(Decimal("0.2"), Decimal("0.5"), rate, Restart(spot_restart),
                  Restart(od_restart + share * slow))
    job = ds.Job(work_s=work_h * H, window_s=work_h * H / fraction, checkpoint_every_s=checkpoint)
    on_demand = ds.replay(job, real, trace, ds.strategy(ds.Plan.ON_DEMAND, real))
    assume(not on_demand.missed(job))
    policy = ds.replay(job, real, trace, ds.strategy(ds.Plan.POLICY, believed, mode))
    assert not policy.missed(job), policy


def test_a_median_margin_misses_when_the_fallback_restart_runs_slow() -> None:
    """Why the margins budget a slow restart: planned with the usual one alone, a job that
    enters spot at the Safety Net's edge, is preempted and meets a slow on-demand restart
    misses; budgeting the slow one, it goes on-demand from the start and meets it."""
    # 2 h of work, checkpoints every 10 min; restarts 10 min, a slow on-demand one 20 min.
    # Spot from 0 until 1790 s: preempted 590 s after a checkpoint.
    job = ds.Job(work_s=2 * H, window_s=2 * H + 2200, checkpoint_every_s=600)
    real = Market(Decimal("0.2"), Decimal("0.5"), 0.3, Restart(600), Restart(1200))
    usual = Market(Decimal("0.2"), Decimal("0.5"), 0.3, Restart(600), Restart(600))
    budgeted = Market(Decimal("0.2"), Decimal("0.5"), 0.3, Restart(600),
                      Restart(600, slow_extra_s=600))
    trace = SpotTrace(400.0, ((0.0, 1790 / H),))
    assert not ds.replay(job, real, trace, ds.strategy(ds.Plan.ON_DEMAND, real)).missed(job)
    late = ds.replay(job, real, trace, ds.strategy(ds.Plan.POLICY, usual, Mode.GREEDY))
    assert late.missed(job) and late.preemptions == 1
    met = ds.replay(job, real, trace, ds.strategy(ds.Plan.POLICY, budgeted, Mode.GREEDY))
    assert not met.missed(job) and met.spot_s == 0
