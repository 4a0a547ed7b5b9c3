"""The preemption rate orch plans with (core/preemption.py): a documented prior that orch's
own history outweighs (gamma-Poisson posterior mean)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.core import preemption


def test_the_prior_is_documented_and_history_outweighs_it() -> None:
    p = preemption.prior()
    assert (p.preemptions_per_hour, p.wait_mean_h, p.weight_hours) == (0.298, 1.85, 10.0)
    assert "skypilot-org/spot-traces" in p.source
    assert preemption.rate().preemptions_per_hour == p.preemptions_per_hour
    assert preemption.rate().describe() == "0.30/h (prior)"
    # 3 interruptions in 10 h: (0.298 * 10 + 3) / 20.
    seen = preemption.rate(preemption.History(3, 10.0))
    assert seen.preemptions_per_hour == pytest.approx(0.299)
    assert seen.describe() == "0.30/h (3 in 10.0 h of running, prior 0.30/h over 10 h)"
    with pytest.raises(ValueError, match="history"):
        preemption.History(-1, 1.0)


@settings(max_examples=100, deadline=None)
@given(n=st.integers(0, 500), hours=st.floats(0.01, 5000))
def test_the_posterior_lies_between_the_prior_and_what_orch_saw(n: int, hours: float) -> None:
    p = preemption.prior()
    got = preemption.rate(preemption.History(n, hours)).preemptions_per_hour
    seen = n / hours
    assert min(p.preemptions_per_hour, seen) - 1e-12 <= got <= max(p.preemptions_per_hour,
                                                                     seen) + 1e-12
    more = preemption.rate(preemption.History(n * 10, hours * 10)).preemptions_per_hour
    assert abs(more - seen) <= abs(got - seen) + 1e-12  # more history, closer to it
