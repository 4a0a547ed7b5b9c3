"""How long starting a job on a fresh machine really takes, from orch's own records.

The deadline policy weighs each choice's restart (docs/deadline.md, "d per choice"): before a
job's first step on a machine it has only the plan's boot + model download, which leaves out
everything else between the rental and the first step (SSH, the host check, set-up, the
dataset, the trainer loading the model and a checkpoint). Issue 41's bench measured that part
at about as long as the boot itself, and a policy told half the real restart enters spot with
too little slack, then moves to on-demand a minute later and pays for both. So orch measures
it: per provider and GPU, the median over its newest WINDOW rentals that reached a training
step of the seconds from the rental (`instance.created_at`) to the job's first
`train.progress` event on that machine. The policy takes the larger of the plan's figure and
this (`engine/deadlines.py`); `orch plan`'s deadline estimate reads the same rows.

The median is what a restart usually costs; half of them take longer. The margins that guard
the deadline (the Safety Net, the drift rule: one more on-demand restart must still fit)
budget a slow one, the SLOW_QUANTILE of the same rentals: with the median there, a job whose
on-demand restart ran long missed its deadline in issue 41's bench (docs/deadline.md).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from datetime import datetime
from typing import NamedTuple

# Only recent rentals speak for a key: images, the trainer and the provider change.
WINDOW = 20
# The restart the deadline's margins budget: 90 % of the window's rentals started sooner.
SLOW_QUANTILE = 0.9

Key = tuple[str, str]  # provider, GPU


class Measured(NamedTuple):
    """The median seconds from rental to first step, over `rentals` rentals, and a slow one
    (SLOW_QUANTILE of them; the longest of fewer than two)."""

    seconds: float
    rentals: int
    slow: float

    def describe(self) -> str:
        if self.rentals == 1:
            return f"{self.seconds:.0f} s (1 rental)"
        return (f"{self.seconds:.0f} s (median of {self.rentals} rentals; "
                f"{SLOW_QUANTILE:.0%} within {self.slow:.0f} s)")


def slow_of(times: list[float]) -> float:
    """The SLOW_QUANTILE of `times`, interpolated between the measured ones (never beyond the
    longest; one is its own): the restart a margin that must hold budgets."""
    if not times:
        raise ValueError("a slow restart needs at least one measured restart")
    ordered = sorted(times)
    at = (len(ordered) - 1) * SLOW_QUANTILE
    low = math.floor(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def measured(rows: Iterable[tuple[str, str, datetime, datetime | None]]) -> dict[Key, Measured]:
    """(provider, GPU, rented at, first step at or None), newest first within each key,
    -> each key's median over its newest WINDOW rentals that reached a step."""
    seen: dict[Key, list[float]] = {}
    for provider, gpu, rented, first_step in rows:
        if first_step is None or first_step < rented:
            continue
        times = seen.setdefault((provider, gpu), [])
        if len(times) < WINDOW:
            times.append((first_step - rented).total_seconds())
    return {key: Measured(statistics.median(v), len(v), slow_of(v))
            for key, v in sorted(seen.items())}
