"""core/divergence: when a run is taken as diverged for good (training.stop_on_nan)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.core.divergence import NAN_LOGS, REASON_PREFIX, diverged, fate

NAN = math.nan


def test_three_nan_logs_in_a_row_are_a_divergence_from_the_first() -> None:
    assert NAN_LOGS == 3
    assert diverged({10: 2.1, 20: NAN, 30: NAN}) is None  # two: not yet
    found = diverged({10: 2.1, 20: NAN, 30: NAN, 40: NAN})
    assert found is not None and (found.first, found.last, found.logs) == (20, 40, 3)
    assert "from step 20 to step 40 (3 logs)" in found.reason()
    assert found.reason().startswith(REASON_PREFIX)  # what the sweep search reads back
    assert "training.stop_on_nan: false" in found.reason()
    # Read late, in one poll: the run reaches back to its first `nan`.
    late = diverged({1: 2.0, 2: NAN, 3: NAN, 4: NAN, 5: NAN, 6: NAN})
    assert late is not None and (late.first, late.last, late.logs) == (2, 6, 5)


def test_a_number_in_between_or_at_the_end_is_no_divergence() -> None:
    assert diverged({1: NAN, 2: NAN, 3: 1.9, 4: NAN, 5: NAN}) is None
    assert diverged({1: NAN, 2: NAN, 3: NAN, 4: 1.9}) is None  # it came back (fp16's scaler)
    assert diverged({}) is None
    # Steps are ordered by number, not by the mapping's order (a takeover's log re-read).
    assert diverged({3: NAN, 1: 2.0, 4: NAN, 2: NAN}) is not None
    with pytest.raises(ValueError, match="logs must be >= 1"):
        diverged({1: NAN}, logs=0)


@given(st.dictionaries(st.integers(0, 50), st.sampled_from([NAN, 1.0]), max_size=20),
       st.integers(1, 5))
def test_it_is_exactly_the_newest_logs_being_nan(losses: dict[int, float], logs: int) -> None:
    newest = [losses[s] for s in sorted(losses)[-logs:]]
    found = diverged(losses, logs)
    assert (found is not None) == (len(newest) == logs and all(math.isnan(v) for v in newest))
    if found is not None:
        run = [s for s in sorted(losses) if s >= found.first]
        assert all(math.isnan(losses[s]) for s in run) and len(run) == found.logs
        before = [s for s in sorted(losses) if s < found.first]
        assert not before or not math.isnan(losses[before[-1]])


def test_its_fate_is_said_as_the_event_data_has_it() -> None:
    assert fate(None) == "it trains on"
    assert fate(3) == ("orch stops it if the loss is nan at 3 logged steps in a row, as "
                       "training.stop_on_nan says")
