"""Spot availability traces: the generator is seeded, and its regimes match what they imitate.

The `matched` numbers of providers/sim/spot_regimes.yaml are the published traces' (Wu et al.,
NSDI '24; skypilot-org/spot-traces, printed by scripts/spot_trace_stats.py); the traces are
not vendored here, so the generated statistics are checked against those numbers.
"""

from __future__ import annotations

import math
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.core import deadlinesim as ds
from orchestrator.core.deadline import Market, Restart
from providers import spottrace
from providers.sim import spotmarket
from providers.spottrace import Regime, Spell, SpotTrace

REGIME = Regime("test", Spell(2.0, 0.5), Spell(1.0, 0.4))


def test_the_same_seed_gives_the_same_trace_and_another_seed_another() -> None:
    a = spottrace.generate(REGIME, 7, 500.0)
    assert a == spottrace.generate(REGIME, 7, 500.0)
    assert a.intervals != spottrace.generate(REGIME, 8, 500.0).intervals


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32), life=st.floats(0.05, 20), wait=st.floats(0.05, 20),
       spread=st.floats(1.0, 8.0), horizon=st.floats(1.0, 400.0))
def test_a_trace_is_sorted_disjoint_and_within_its_horizon(
        seed: int, life: float, wait: float, spread: float, horizon: float) -> None:
    regime = Regime("h", Spell(life, life / spread), Spell(wait))
    trace = spottrace.generate(regime, seed, horizon)
    assert trace.horizon_h == horizon
    previous_end = -math.inf
    for start, end in trace.intervals:
        assert 0.0 <= start < end <= horizon
        assert start > previous_end  # a gap between two intervals, never an overlap
        previous_end = end


def test_available_preempted_at_and_next_available_read_the_intervals() -> None:
    trace = SpotTrace(10.0, ((1.0, 3.0), (5.0, 6.0)))
    assert not trace.available(0.5) and trace.available(1.0) and not trace.available(3.0)
    assert trace.preempted_at(2.0) == 3.0 and trace.preempted_at(4.0) is None
    assert trace.next_available(0.0) == 1.0 and trace.next_available(3.5) == 5.0
    assert trace.next_available(2.5) == 2.5 and trace.next_available(7.0) is None


def test_the_published_format_reads_a_sample_above_zero_as_available() -> None:
    # One sample an hour: 0 1 1 0 2 -> available [1, 3) and [4, 5) (2 = two instances).
    trace = spottrace.from_samples([0, 1, 1, 0, 2], 3600)
    assert trace == SpotTrace(5.0, ((1.0, 3.0), (4.0, 5.0)))
    with pytest.raises(ValueError, match="gap_seconds"):
        spottrace.from_samples([1], 0)


def test_summarize_counts_a_hand_made_trace() -> None:
    trace = SpotTrace(12.0, ((0.0, 2.0), (3.0, 4.0), (6.0, 12.0)))
    s = spottrace.summarize([trace], window_h=6.0)
    assert s.availability == pytest.approx(9 / 12)
    assert s.preemptions_per_hour == pytest.approx(2 / 9)  # the last runs to the end
    assert (s.lifetime_mean_h, s.lifetime_median_h) == (pytest.approx(3.0), 2.0)
    assert (s.wait_mean_h, s.wait_median_h) == (pytest.approx(1.5), 1.5)
    assert (s.window_p25, s.window_p75) == (pytest.approx(0.5 + 0.125), pytest.approx(0.875))


def test_spells_refuse_what_no_distribution_has() -> None:
    with pytest.raises(ValueError, match="mean"):
        Spell(0.0)
    with pytest.raises(ValueError, match="median"):
        Spell(1.0, 2.0)
    with pytest.raises(ValueError, match="rate"):
        spottrace.exponential(0.0, 1.0)


@pytest.mark.parametrize("name", sorted(spotmarket.regimes()))
def test_each_regime_generates_the_statistics_it_is_documented_to_match(name: str) -> None:
    spec = spotmarket.regimes()[name]
    # 100,000 hours: lognormal lifetimes are heavy-tailed (calm's mean is 7x its median), so
    # the sample rate is within a few percent only over thousands of them.
    got = spottrace.summarize([spottrace.generate(spec.regime, seed, 5000.0)
                               for seed in range(20)])
    want = spec.matched
    assert got.availability == pytest.approx(want["availability"], abs=0.03)
    assert got.preemptions_per_hour == pytest.approx(want["preemptions_per_hour"], rel=0.10)
    # Spells drawn independently already swing like the traces' 6-hour windows.
    for q in ("window_p25", "window_p50", "window_p75"):
        assert getattr(got, q) == pytest.approx(want[q], abs=0.10), q
    # The spells' own means are the documented ones (so the rate is 1 / mean lifetime).
    assert 1 / spec.regime.lifetime.mean_h == pytest.approx(want["preemptions_per_hour"],
                                                            rel=0.01)


def test_regimes_are_ordered_calm_to_heavy() -> None:
    rates = {n: s.matched["preemptions_per_hour"] for n, s in spotmarket.regimes().items()}
    assert rates["calm"] < rates["bursty"] < rates["heavy"]


def test_pools_spot_while_any_has_it_a_machine_ends_with_its_own_pool() -> None:
    """Several spot pools a job accepts: spot can be had while any has it; a machine rented
    at t is in the first pool with spot then and is preempted when that pool's spell ends,
    even when another pool still has spot (it restarts there: a new rental)."""
    first = SpotTrace(10.0, ((0.0, 2.0), (5.0, 6.0)))
    second = SpotTrace(10.0, ((1.0, 4.0),))
    pools = spottrace.Pools((first, second))
    assert pools.horizon_h == 10.0
    assert [pools.available(t) for t in (0.5, 1.5, 3.0, 4.5, 5.5, 7.0)] == [
        True, True, True, False, True, False]
    assert pools.preempted_at(1.5) == 2.0  # the first pool's machine, preferred
    assert pools.preempted_at(2.5) == 4.0  # only the second has spot
    assert pools.preempted_at(4.5) is None
    assert pools.next_available(4.5) == 5.0 and pools.next_available(6.5) is None
    with pytest.raises(ValueError, match="at least one"):
        spottrace.Pools(())


def test_spot_only_over_a_second_pool_misses_fewer_deadlines() -> None:
    """One pool is the trace itself; a second, independent pool adds spot: spot only,
    replayed over both, misses fewer deadlines in the heavy regime."""
    regime = spotmarket.regime("heavy")
    market = Market(Decimal("0.234"), Decimal("0.468"), 1.09, Restart(600), Restart(600))
    missed = {1: 0, 2: 0}
    for seed in range(40):
        a, b = (spottrace.generate(regime, seed * 2 + k, 60.0) for k in (0, 1))
        job = ds.Job(work_s=4 * 3600, window_s=7 * 3600, checkpoint_every_s=600)
        alone = ds.replay(job, market, a, ds.strategy(ds.Plan.SPOT, market))
        assert ds.replay(job, market, spottrace.Pools((a,)),
                         ds.strategy(ds.Plan.SPOT, market)) == alone
        both = ds.replay(job, market, spottrace.Pools((a, b)), ds.strategy(ds.Plan.SPOT,
                                                                           market))
        missed[1] += alone.missed(job)
        missed[2] += both.missed(job)
    assert missed[2] < missed[1]
