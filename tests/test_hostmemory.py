"""Host memory's pure decisions with plain values: how long a bad machine is avoided, how a
slow one is priced, that a registered server is only reported, and when a slow training moves."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.core.hostmemory import (
    Advice,
    MoveCase,
    Observation,
    Source,
    Stance,
    advise,
    faded,
    move_or_stay,
    policy,
)

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
H = timedelta(hours=1)


def failed(at: datetime, why: str = "the driver supports CUDA 12.8") -> Observation:
    return Observation(at, Source.CHECK, failed=True, why=why)


def slow(at: datetime, delivered: float, source: Source = Source.CHECK) -> Observation:
    return Observation(at, source, delivered=delivered)


def test_a_machine_nothing_is_known_of_is_used() -> None:
    assert advise([], T0) == Advice(Stance.USE)


def test_a_failed_check_avoids_the_machine_for_three_days() -> None:
    seen = [failed(T0)]
    advice = advise(seen, T0 + 71 * H)
    assert advice.stance is Stance.AVOID and advice.until == T0 + 72 * H
    assert advice.reason == ("failed its host check on 2026-12-01 12:00 UTC: the driver "
                             "supports CUDA 12.8; avoided until 2026-12-04 12:00 UTC")
    assert advise(seen, T0 + 72 * H).stance is Stance.USE


def test_failing_again_within_two_weeks_avoids_it_for_two_weeks() -> None:
    seen = [failed(T0), failed(T0 + 100 * H, "no route to the Hub")]
    advice = advise(seen, T0 + 200 * H)
    assert advice.stance is Stance.AVOID and advice.until == T0 + 436 * H
    assert "(failed 2 times): no route to the Hub" in advice.reason
    # Failures further apart are each a first one.
    apart = [failed(T0), failed(T0 + 400 * H)]
    assert advise(apart, T0 + 401 * H).until == T0 + 472 * H


def test_a_registered_server_is_reported_never_avoided() -> None:
    advice = advise([failed(T0)], T0 + H, kept=True)
    assert advice.stance is Stance.REPORT and advice.until == T0 + 72 * H
    assert "a registered server is not avoided" in advice.reason
    assert "orch servers check" in advice.reason
    slow_server = advise([slow(T0, 0.3)], T0, kept=True)
    assert slow_server.stance is Stance.REPORT and slow_server.delivered == pytest.approx(0.3)


def test_a_slow_machine_is_priced_by_what_it_delivers_and_fades_back() -> None:
    seen = [slow(T0, 0.6)]
    fresh = advise(seen, T0)
    assert fresh.stance is Stance.PRICE and fresh.delivered == pytest.approx(0.6)
    assert fresh.effective_price(Decimal("0.30")) == Decimal("0.500000")
    assert "delivered 60% (check, 2026-12-01 12:00 UTC)" in fresh.reason
    # Its shortfall halves every 48 h: 0.8 after two days, rated (noise) after four...
    assert advise(seen, T0 + 48 * H).delivered == pytest.approx(0.8)
    assert advise(seen, T0 + 95 * H).stance is Stance.PRICE
    assert advise(seen, T0 + 97 * H).stance is Stance.USE  # over 0.9: as rated
    # ...and a measurement is forgotten after two weeks whatever it was.
    assert advise([slow(T0, 0.01)], T0 + 336 * H).stance is Stance.USE


def test_a_very_slow_machine_is_avoided_until_its_fraction_fades_to_the_mark() -> None:
    seen = [slow(T0, 0.3)]
    advice = advise(seen, T0 + H)
    # 0.7 short of rated fades to 0.5 short in 48 h x log2(1.4) = 23.3 h.
    assert advice.stance is Stance.AVOID
    assert advice.until is not None
    assert (advice.until - T0).total_seconds() / 3600 == pytest.approx(23.30, abs=0.01)
    later = advise(seen, advice.until + timedelta(seconds=1))
    assert later.stance is Stance.PRICE and later.delivered == pytest.approx(0.5, abs=0.001)


def test_the_latest_measurement_counts() -> None:
    recovered = [slow(T0, 0.4, Source.RUN), slow(T0 + H, 0.97, Source.RUN)]
    assert advise(recovered, T0 + 2 * H).stance is Stance.USE
    worse = [slow(T0, 0.97), slow(T0 + H, 0.6, Source.RUN)]
    assert advise(worse, T0 + H).delivered == pytest.approx(0.6)


def test_observations_are_utc_and_fractions_not_negative() -> None:
    with pytest.raises(ValueError, match="UTC-aware"):
        Observation(datetime(2026, 12, 1), Source.CHECK)
    with pytest.raises(ValueError, match=">= 0"):
        Observation(T0, Source.RUN, delivered=-0.1)


observation = st.builds(
    Observation,
    at=st.integers(0, 30 * 24).map(lambda h: T0 + h * H),
    source=st.sampled_from(list(Source)),
    failed=st.booleans(),
    delivered=st.none() | st.floats(0.01, 1.5),
)


@given(st.lists(observation, max_size=6), st.integers(0, 40 * 24), st.booleans())
def test_advice_is_bounded_and_a_kept_server_is_never_avoided(
        seen: list[Observation], hours: int, kept: bool) -> None:
    now = T0 + hours * H
    advice = advise(seen, now, kept=kept)
    assert not (kept and advice.stance is Stance.AVOID)
    assert 0.0 <= advice.delivered <= 1.0
    if advice.stance in (Stance.USE, Stance.PRICE, Stance.REPORT) and advice.delivered > 0:
        assert advice.effective_price(Decimal("1.000000")) >= Decimal("1.000000")
    if advice.stance is Stance.AVOID:
        assert advice.until is not None and advice.until > now


def test_faded_never_overshoots_rated() -> None:
    assert faded(1.3, timedelta(0), 48) == 1.0
    assert faded(0.5, timedelta(hours=48), 48) == pytest.approx(0.75)


# --- moving a slow training ------------------------------------------------------------------

# 10 h of planned work left at 1,000 tokens/s, on a machine running at 400/s; another
# machine at the same price, 15 minutes to set up, 30 minutes of work since the checkpoint.
CASE: dict[str, Any] = dict(remaining=36e6, measured_rate=400.0, planned_rate=1000.0,
            price_here=Decimal("0.50"), price_elsewhere=Decimal("0.50"),
            setup_elsewhere_s=900.0, redo=1.8e6, observed_s=1800.0)


def test_a_training_at_40_percent_of_its_plan_moves() -> None:
    decision = move_or_stay(MoveCase(**CASE))
    assert decision.move
    assert decision.stay_s == pytest.approx(90_000) and decision.move_s == pytest.approx(38_700)
    assert (decision.stay_usd, decision.move_usd) == (Decimal("12.500000"),
                                                      Decimal("5.375000"))
    assert decision.reason == ("running at 40% of the plan: moving costs $5.375000 (10.75 h) "
                               "against $12.500000 (25.00 h) staying, $7.125000 saved")


@pytest.mark.parametrize(("change", "says"), [
    ({"measured_rate": 750.0}, "running at 75% of the plan: not slow enough to move"),
    ({"observed_s": 120.0}, "measured too briefly (at least 600 s)"),
    ({"remaining": 1e6}, "but moving costs"),  # little left: the setup does not pay back
    ({"price_elsewhere": Decimal("1.20")}, "but moving costs"),
    # An hour of planned work left, and the last checkpoint 1.5 h of work behind.
    ({"remaining": 3.6e6, "redo": 5.4e6}, "but moving costs"),
])
def test_a_training_stays_when_moving_does_not_pay(change: dict[str, Any],
                                                   says: str) -> None:
    decision = move_or_stay(MoveCase(**{**CASE, **change}))
    assert not decision.move and says in decision.reason


def test_a_stalled_training_moves_once_measured_long_enough() -> None:
    decision = move_or_stay(MoveCase(**{**CASE, "measured_rate": 0.0}))
    assert decision.move and decision.stay_usd == Decimal("Infinity")


def test_a_move_must_save_its_margin() -> None:
    margin = policy().move.margin  # 10 %: a saving of 5 % is not enough
    assert margin == 0.1
    # Staying costs 0.25 x remaining / 600 h; moving the same work at 1000/s costs 0.2375.
    case = MoveCase(remaining=3.6e6, measured_rate=600.0, planned_rate=1000.0,
                    price_here=Decimal("0.25"), price_elsewhere=Decimal("0.38"),
                    setup_elsewhere_s=0.0, observed_s=3600.0)
    decision = move_or_stay(case)
    assert decision.move_usd < decision.stay_usd and not decision.move


@given(st.floats(1, 1e9), st.floats(1, 5000), st.floats(1, 5000),
       st.decimals("0.01", "10", places=2), st.decimals("0.01", "10", places=2),
       st.floats(0, 7200), st.floats(0, 1e8))
def test_a_move_is_only_ever_decided_when_it_is_cheaper(
        remaining: float, measured: float, planned: float, here: Decimal, there: Decimal,
        setup: float, redo: float) -> None:
    decision = move_or_stay(MoveCase(remaining, measured, planned, here, there, setup, redo,
                                     observed_s=3600.0))
    if decision.move:
        assert decision.move_usd < decision.stay_usd
        assert measured < planned * policy().move.slow_below


def test_bad_cases_are_refused() -> None:
    with pytest.raises(ValueError, match="planned rate > 0"):
        MoveCase(1.0, 1.0, 0.0, Decimal(1), Decimal(1), 0.0)
    with pytest.raises(ValueError, match="setup and observed"):
        MoveCase(1.0, 1.0, 1.0, Decimal(1), Decimal(1), -1.0)
