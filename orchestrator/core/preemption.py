"""How often a provider's spot machines of one GPU are preempted: a prior and orch's history.

Preemptions of a running spot machine are counted as a Poisson process in hours of running.
Before orch has run any, the rate is the prior of data/preemption_prior.yaml (its source
and numbers are there and in docs/deadline.md). Once it has, the rate is the gamma-Poisson
posterior mean: the prior counts as `weight_hours` of running with `rate * weight_hours`
preemptions, added to what orch saw (`History`: interruptions and hours of running of
interruptible machines of that provider and GPU, phase B's query of the `instance` table), so

    rate = (prior_rate * weight_hours + interruptions) / (weight_hours + hours).

With no history it is the prior; after ten hours of running the two weigh the same; after a
hundred, the history is ~90% of it. The time spot stays gone after a preemption (`wait_mean_h`,
used by the plan's estimate) has no history yet and comes from the prior alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

from providers.datacache import read_yaml

_DATA = Path(__file__).resolve().parent / "data" / "preemption_prior.yaml"


class Prior(NamedTuple):
    """What orch assumes of a spot machine before it has seen any."""

    preemptions_per_hour: float
    wait_mean_h: float  # how long spot stays gone after a preemption, on average
    weight_hours: float  # how many hours of orch's own running the prior weighs as
    source: str


@dataclass(frozen=True)
class History:
    """What orch saw of one provider's spot machines of one GPU."""

    interruptions: int  # instances that ended preempted (end_reason = interrupted)
    hours: float  # hours those and the others ran, from rental to their end

    def __post_init__(self) -> None:
        if self.interruptions < 0 or self.hours < 0:
            raise ValueError(f"history: {self.interruptions} interruptions in {self.hours} h")


class Rate(NamedTuple):
    """The rate orch plans with, and what it is made of (for `orch prices` / `orch offers`)."""

    preemptions_per_hour: float
    wait_mean_h: float
    prior_per_hour: float
    interruptions: int
    hours: float
    weight_hours: float

    def describe(self) -> str:
        """`0.30/h (prior)` or `0.52/h (3 in 4.0 h of running, prior 0.30/h over 10 h)`."""
        if not self.hours:
            return f"{self.preemptions_per_hour:.2f}/h (prior)"
        return (f"{self.preemptions_per_hour:.2f}/h ({self.interruptions} in {self.hours:.1f} h "
                f"of running, prior {self.prior_per_hour:.2f}/h over {self.weight_hours:g} h)")


@cache
def _raw() -> dict[str, Any]:
    data: dict[str, Any] = read_yaml(_DATA)
    return data


def prior() -> Prior:
    """The documented prior (data/preemption_prior.yaml)."""
    raw = _raw()
    default = raw["default"]
    return Prior(float(default["preemptions_per_hour"]), float(default["wait_mean_h"]),
                 float(raw["weight_hours"]), str(raw["source"]))


def rate(history: History | None = None, start: Prior | None = None) -> Rate:
    """The posterior mean rate of preemptions per hour of running, given `history`."""
    p = start or prior()
    seen = history or History(0, 0.0)
    mean = ((p.preemptions_per_hour * p.weight_hours + seen.interruptions)
            / (p.weight_hours + seen.hours))
    return Rate(mean, p.wait_mean_h, p.preemptions_per_hour, seen.interruptions, seen.hours,
                p.weight_hours)


# End reasons of instance rows that never ran a machine: no hours, no interruption.
NEVER_RAN = frozenset({"capacity", "price_changed"})
# A row's (provider, GPU, end_reason, created_at, terminated_at) for `histories`.
RanRow = tuple[str, str, str | None, datetime, datetime | None]


def histories(rows: Iterable[RanRow], now: datetime) -> dict[tuple[str, str], History]:
    """What orch saw of each (provider, GPU)'s spot machines, from their instance rows (the
    interruptible ones that were created): `interrupted` ends counted, every row's hours
    from its creation to its end (now while it runs). A machine the deadline policy left
    (`moved`) counts its hours, not as an interruption."""
    counts: dict[tuple[str, str], tuple[int, float]] = {}
    for provider, gpu, reason, start, end in rows:
        if reason in NEVER_RAN:
            continue
        n, hours = counts.get((provider, gpu), (0, 0.0))
        ran = max(0.0, ((end or now) - start).total_seconds() / 3600)
        counts[(provider, gpu)] = (n + (reason == "interrupted"), hours + ran)
    return {key: History(n, hours) for key, (n, hours) in counts.items()}
