"""When spot capacity can be had: availability traces, a seeded generator, their statistics (pure).

A trace is what Wu et al. ("Can't Be Late", NSDI '24, §2.1) collected on AWS and published
as skypilot-org/spot-traces: over time, whether an interruptible machine of one kind can be
rented. Here it is the list of the hours in which it can, `[start, end)` from hour 0. A
machine rented at hour t is preempted at the end of the interval that holds t; between
intervals none can be rented. `from_samples` reads the published format (one sample every
`gap_seconds`, a sample > 0 = available: the repository's README, "the number of available
instances at a specific tick").

`generate` draws a trace from a `Regime`: an alternating renewal process (how long spot lasts,
how long it is gone), lognormal when a median is given (the published traces' lifetimes are
heavy-tailed: means 3-7x their medians) and exponential otherwise. Drawn independently, such
heavy-tailed spells already give the swings the paper describes (availability "can change from
100% to 0% within hours", §2.2): the generated traces' 6-hour-window availability quartiles
match the published ones (docs/deadline.md). `summarize` measures a trace the way docs/deadline.md
reports the published ones, so a generated trace can be checked against what it imitates.

Shared by the simulated cloud (providers/sim/spotmarket.py replays a regime) and the
deadline estimator in orchestrator/core (which draws traces from a prior rate).
"""

from __future__ import annotations

import bisect
import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class Spell:
    """A distribution of durations in hours: lognormal with this median, or exponential."""

    mean_h: float
    median_h: float | None = None

    def __post_init__(self) -> None:
        if not (self.mean_h > 0 and math.isfinite(self.mean_h)):
            raise ValueError(f"a spell's mean must be > 0 hours (got {self.mean_h})")
        if self.median_h is not None and not 0 < self.median_h <= self.mean_h:
            raise ValueError(f"a lognormal spell needs 0 < median <= mean "
                             f"(got median {self.median_h}, mean {self.mean_h})")

    def draw(self, rng: random.Random) -> float:
        """One duration, in hours."""
        if self.median_h is None:
            return rng.expovariate(1.0 / self.mean_h)
        # Lognormal: median = e^mu, mean = e^(mu + sigma^2 / 2).
        sigma = math.sqrt(2.0 * math.log(self.mean_h / self.median_h))
        return rng.lognormvariate(math.log(self.median_h), sigma)


@dataclass(frozen=True)
class Regime:
    """A spot market's behaviour: spot lasts `lifetime`, then is gone for `wait`, in turn."""

    name: str
    lifetime: Spell
    wait: Spell

    @property
    def availability(self) -> float:
        """The share of time spot can be had, in the long run."""
        return self.lifetime.mean_h / (self.lifetime.mean_h + self.wait.mean_h)


def exponential(preemptions_per_hour: float, wait_mean_h: float, name: str = "prior") -> Regime:
    """The memoryless regime of a rate: lifetimes with mean 1/rate, waits with `wait_mean_h`."""
    if not preemptions_per_hour > 0:
        raise ValueError(f"a preemption rate must be > 0 per hour (got {preemptions_per_hour})")
    return Regime(name, Spell(1.0 / preemptions_per_hour), Spell(max(wait_mean_h, 1e-6)))


@dataclass(frozen=True)
class SpotTrace:
    """The hours, from 0 to `horizon_h`, during which spot can be rented (sorted, disjoint)."""

    horizon_h: float
    intervals: tuple[tuple[float, float], ...]
    _starts: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_starts", tuple(start for start, _ in self.intervals))

    def _index(self, t: float) -> int:
        """Index of the last interval starting at or before `t` (-1: none)."""
        return bisect.bisect_right(self._starts, t) - 1

    def available(self, t: float) -> bool:
        """Whether spot can be rented at hour `t`."""
        i = self._index(t)
        return i >= 0 and t < self.intervals[i][1]

    def preempted_at(self, t: float) -> float | None:
        """When a machine rented at hour `t` is preempted (None: spot is gone at `t`)."""
        i = self._index(t)
        if i < 0 or t >= self.intervals[i][1]:
            return None
        return self.intervals[i][1]

    def next_available(self, t: float) -> float | None:
        """The first hour at or after `t` when spot can be rented (None: not before the end)."""
        if self.available(t):
            return t
        i = self._index(t) + 1
        return self.intervals[i][0] if i < len(self.intervals) else None


class Availability(Protocol):
    """What a replay reads of a market: a `SpotTrace`, or several pools of one (`Pools`)."""

    @property
    def horizon_h(self) -> float: ...

    def available(self, t: float) -> bool: ...

    def preempted_at(self, t: float) -> float | None: ...

    def next_available(self, t: float) -> float | None: ...


@dataclass(frozen=True)
class Pools:
    """Several spot pools a job accepts (GPU models, zones, a marketplace's hosts), each its
    own trace, in the order a rental prefers them (the cheapest first). Spot can be had while
    any pool has it; a machine rented at hour t is in the first pool that has spot then and
    is preempted at the end of that pool's spell, whatever the others do."""

    traces: tuple[SpotTrace, ...]

    def __post_init__(self) -> None:
        if not self.traces:
            raise ValueError("pools: at least one trace")

    @property
    def horizon_h(self) -> float:
        return min(t.horizon_h for t in self.traces)

    def available(self, t: float) -> bool:
        return any(trace.available(t) for trace in self.traces)

    def preempted_at(self, t: float) -> float | None:
        for trace in self.traces:
            ends = trace.preempted_at(t)
            if ends is not None:
                return ends
        return None

    def next_available(self, t: float) -> float | None:
        found = [n for trace in self.traces if (n := trace.next_available(t)) is not None]
        return min(found) if found else None


def generate(regime: Regime, seed: int, horizon_h: float) -> SpotTrace:
    """A trace of `horizon_h` hours drawn from `regime`; the same seed gives the same trace."""
    rng = random.Random(seed)
    available = rng.random() < regime.availability  # start in the long-run state
    t, intervals = 0.0, []
    while t < horizon_h:
        end = min(horizon_h, t + (regime.lifetime if available else regime.wait).draw(rng))
        if available and end > t:
            intervals.append((t, end))
        t, available = end, not available
    return SpotTrace(horizon_h, tuple(intervals))


def from_samples(samples: Sequence[int | float], gap_s: float) -> SpotTrace:
    """A trace from the published format: one sample per `gap_s` seconds, > 0 = available."""
    if gap_s <= 0:
        raise ValueError(f"gap_seconds must be > 0 (got {gap_s})")
    gap_h, intervals, start = gap_s / 3600.0, [], None
    for i, value in enumerate(samples):
        if value > 0 and start is None:
            start = i * gap_h
        elif value <= 0 and start is not None:
            intervals.append((start, i * gap_h))
            start = None
    horizon = len(samples) * gap_h
    if start is not None:
        intervals.append((start, horizon))
    return SpotTrace(horizon, tuple(intervals))


@dataclass(frozen=True)
class TraceStats:
    """What docs/deadline.md reports of a trace, published or generated."""

    hours: float
    availability: float  # share of the hours spot could be rented
    preemptions_per_hour: float  # ends of availability per hour of availability
    lifetime_mean_h: float
    lifetime_median_h: float
    wait_mean_h: float
    wait_median_h: float
    # Availability in 6-hour windows (the paper's Figure 2, right): quartiles
    window_p25: float
    window_p50: float
    window_p75: float


def summarize(traces: Sequence[SpotTrace], window_h: float = 6.0) -> TraceStats:
    """Pooled statistics of `traces` (intervals cut by a trace's ends count as they are)."""
    lives: list[float] = []
    waits: list[float] = []
    windows: list[float] = []
    hours = up = 0.0
    ends = 0
    for trace in traces:
        hours += trace.horizon_h
        lives += [end - start for start, end in trace.intervals]
        up += sum(end - start for start, end in trace.intervals)
        ends += sum(1 for _, end in trace.intervals if end < trace.horizon_h)
        edges = [0.0] + [x for interval in trace.intervals for x in interval] + [trace.horizon_h]
        waits += [b - a for a, b in zip(edges[::2], edges[1::2], strict=True) if b > a]
        windows += _windows(trace, window_h)
    q = statistics.quantiles(windows, n=4, method="inclusive") if len(windows) > 1 else [0.0] * 3
    return TraceStats(
        hours=hours, availability=up / hours if hours else 0.0,
        preemptions_per_hour=ends / up if up else math.inf,
        lifetime_mean_h=statistics.fmean(lives) if lives else 0.0,
        lifetime_median_h=statistics.median(lives) if lives else 0.0,
        wait_mean_h=statistics.fmean(waits) if waits else 0.0,
        wait_median_h=statistics.median(waits) if waits else 0.0,
        window_p25=q[0], window_p50=q[1], window_p75=q[2])


def _windows(trace: SpotTrace, window_h: float) -> list[float]:
    """The share of each whole `window_h` window that was available."""
    shares = []
    for k in range(int(trace.horizon_h // window_h)):
        lo, hi = k * window_h, (k + 1) * window_h
        covered = sum(max(0.0, min(hi, end) - max(lo, start)) for start, end in trace.intervals
                      if end > lo and start < hi)
        shares.append(covered / window_h)
    return shares
