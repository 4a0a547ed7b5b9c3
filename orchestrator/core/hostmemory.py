"""What orch does with what it remembers of a machine, and whether to move a slow job (pure).

`advise` turns a machine's remembered observations (host-check results, finished runs'
measured speed against their plan, each with its UTC time) into a stance for the next
placement: avoid it for a while (a failed check), price it by what it delivers (effective
price = price / delivered fraction, fading back to rated), or use it as any other. A
registered monthly server is never avoided: its advice only reports. `move_or_stay` decides
whether a training running far below its plan is cheaper finished elsewhere, counting the
work left, the setup there and the work redone from the last checkpoint.

The policy figures are data (data/hostmemory.yaml, each with its reason). The engine keeps
the observations (phase B: a records table keyed by provider and machine id) and calls these.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from enum import StrEnum
from functools import cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from providers.base import Offer
from providers.datacache import read_yaml

_DATA = Path(__file__).with_name("data") / "hostmemory.yaml"
_MICRO = Decimal("0.000001")


class _Policy(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class FailedCheckPolicy(_Policy):
    """How long a machine that failed a check is avoided."""

    avoid_hours: float = Field(gt=0)
    repeat_window_hours: float = Field(gt=0)
    repeat_avoid_hours: float = Field(gt=0)


class SlowPolicy(_Policy):
    """How a measured speed prices a machine, and for how long."""

    half_life_hours: float = Field(gt=0)
    forget_after_hours: float = Field(gt=0)
    ignore_above: float = Field(gt=0, le=1)
    avoid_below: float = Field(gt=0, le=1)


class MovePolicy(_Policy):
    """When a slow training is considered for a move."""

    slow_below: float = Field(gt=0, le=1)
    min_observed_s: float = Field(ge=0)
    margin: float = Field(ge=0, lt=1)


class ServerPolicy(_Policy):
    """When a registered monthly server's host check is run again (core/servercheck.py)."""

    recheck_after_hours: float = Field(gt=0)


class Policy(_Policy):
    """data/hostmemory.yaml."""

    failed_check: FailedCheckPolicy
    slow: SlowPolicy
    move: MovePolicy
    server: ServerPolicy


@cache
def policy() -> Policy:
    """The policy file, validated (read once)."""
    return Policy.model_validate(read_yaml(_DATA))


class Source(StrEnum):
    """Where an observation comes from."""

    CHECK = "check"  # the pre-flight host check (playbooks/hostcheck.py)
    RUN = "run"  # a finished training: measured tokens/s against the plan's


@dataclass(frozen=True)
class Observation:
    """One thing orch learnt about a machine at `at` (UTC).

    `failed`: a check that failed (its reason in `why`); `delivered`: the measured speed as a
    fraction of what a healthy machine of the model delivers (None: not measured).
    """

    at: datetime
    source: Source
    failed: bool = False
    delivered: float | None = None
    why: str = ""

    def __post_init__(self) -> None:
        if self.at.tzinfo is None:
            raise ValueError("observation times are UTC-aware datetimes")
        if self.delivered is not None and not self.delivered >= 0:
            raise ValueError(f"a delivered fraction is >= 0 (got {self.delivered})")


class Stance(StrEnum):
    """What the next placement does with the machine."""

    USE = "use"  # as any other machine
    PRICE = "price"  # ranked at price / delivered
    AVOID = "avoid"  # not rented until `until`
    REPORT = "report"  # a registered server: used, and what was seen is shown


@dataclass(frozen=True)
class Advice:
    """The stance, the delivered fraction it prices by (1.0: as rated), until when, and why."""

    stance: Stance
    delivered: float = 1.0
    until: datetime | None = None
    reason: str = ""

    def effective_price(self, price_per_hour: Decimal) -> Decimal:
        """What the machine costs per hour of a healthy one's work: price / delivered."""
        if self.delivered >= 1.0:
            return price_per_hour
        fraction = Decimal(str(round(self.delivered, 4)))
        return (price_per_hour / fraction).quantize(_MICRO, rounding=ROUND_HALF_UP)


def faded(delivered: float, age: timedelta, half_life_hours: float) -> float:
    """`delivered` measured `age` ago, its shortfall halving every `half_life_hours`."""
    halves = max(age.total_seconds(), 0.0) / 3600 / half_life_hours
    return 1.0 - (1.0 - min(delivered, 1.0)) * math.pow(0.5, halves)


def advise(observations: Sequence[Observation], now: datetime, *, kept: bool = False,
           rules: Policy | None = None) -> Advice:
    """The stance for a machine with `observations` at `now` (see the module docstring);
    `kept`: a registered monthly server (never avoided, only reported)."""
    rules = rules or policy()
    forget = timedelta(hours=rules.slow.forget_after_hours)
    failures = sorted((o for o in observations if o.failed), key=lambda o: o.at)
    failed = _failed(failures, now, rules.failed_check) if failures else None
    if failed is not None:
        until, seen = failed
        if kept:
            return Advice(Stance.REPORT, 1.0, until, f"{seen}; a registered server is not "
                          "avoided: check it (`orch servers check`)")
        return Advice(Stance.AVOID, 0.0, until, f"{seen}; avoided until {_day(until)}")
    measured = [o for o in observations if o.delivered is not None and now - o.at < forget]
    if not measured:
        return Advice(Stance.USE)
    latest = max(measured, key=lambda o: o.at)
    assert latest.delivered is not None
    fraction = faded(latest.delivered, now - latest.at, rules.slow.half_life_hours)
    if fraction >= rules.slow.ignore_above:
        return Advice(Stance.USE, reason=f"delivered {latest.delivered:.0%} on "
                      f"{_day(latest.at)}: within noise of rated now")
    seen = f"delivered {latest.delivered:.0%} ({latest.source.value}, {_day(latest.at)})"
    if kept:
        return Advice(Stance.REPORT, fraction, None, f"{seen}; a registered server is kept "
                      "in use: check it (`orch servers check`)")
    if fraction < rules.slow.avoid_below:
        until = _crossing(latest, rules.slow)
        return Advice(Stance.AVOID, fraction, until, f"{seen}: avoided until {_day(until)}")
    return Advice(Stance.PRICE, fraction, latest.at + forget,
                  f"{seen}: priced as delivering {fraction:.0%}")


@dataclass(frozen=True)
class Screened:
    """Offers after host memory: those kept (one to price at its effective price), the
    repriced offers as sold by (provider, offer id), one note per machine left out or
    repriced."""

    offers: list[Offer]
    sold: dict[tuple[str, str], Offer]
    notes: list[str]


def screen(offers: Sequence[Offer], seen: Mapping[tuple[str, str], Sequence[Observation]],
           now: datetime, rules: Policy | None = None) -> Screened:
    """`offers` less those of machines `seen` (observations by (provider, machine id)) says
    to avoid at `now`; those it says to price are kept at `Advice.effective_price` (the
    engine rents them as sold). A registered server is never left out nor repriced. The one
    rule the engine's placement and `orch plan` both rank by."""
    advice = {key: advise(found, now, rules=rules) for key, found in seen.items() if found}
    notes: list[str] = []
    kept: list[Offer] = []
    sold: dict[tuple[str, str], Offer] = {}
    for offer in offers:
        this = advice.get((offer.provider, offer.machine_id or ""))
        if this is None or offer.registered or this.stance not in (Stance.AVOID, Stance.PRICE):
            kept.append(offer)
            continue
        note = f"{offer.provider} machine {offer.machine_id}: {this.reason}"
        if note not in notes:
            notes.append(note)
        if this.stance is Stance.AVOID or offer.price_per_hour is None:
            continue
        sold[(offer.provider, offer.offer_id)] = offer
        kept.append(replace(offer, price_per_hour=this.effective_price(offer.price_per_hour)))
    return Screened(kept, sold, notes)


def _failed(failures: list[Observation], now: datetime,
            rule: FailedCheckPolicy) -> tuple[datetime, str] | None:
    """(until when, what was seen) while the last failed check still counts, else None."""
    last = failures[-1]
    window = timedelta(hours=rule.repeat_window_hours)
    repeated = len(failures) > 1 and last.at - failures[-2].at <= window
    until = last.at + timedelta(hours=rule.repeat_avoid_hours if repeated
                                else rule.avoid_hours)
    if now >= until:
        return None
    again = f" (failed {len(failures)} times)" if repeated else ""
    return until, (f"failed its host check on {_day(last.at)}{again}: "
                   f"{last.why or 'no reason recorded'}")


def _crossing(latest: Observation, rule: SlowPolicy) -> datetime:
    """When `latest`'s faded fraction reaches `avoid_below` (at most when it is forgotten)."""
    assert latest.delivered is not None
    shortfall = 1.0 - latest.delivered
    limit = 1.0 - rule.avoid_below
    hours = rule.half_life_hours * math.log2(shortfall / limit) if shortfall > limit else 0.0
    return latest.at + timedelta(hours=min(hours, rule.forget_after_hours))


def _day(at: datetime) -> str:
    return at.strftime("%Y-%m-%d %H:%M UTC")


# --- moving a slow training ------------------------------------------------------------------


@dataclass(frozen=True)
class MoveCase:
    """A training running on a machine, and the best other placement for the rest of it.

    Work is in one unit throughout (tokens or optimizer steps); rates are that unit per
    second. `redo`: the work since the last checkpoint, which a move does again.
    """

    remaining: float
    measured_rate: float  # here, as measured
    planned_rate: float  # what the plan assumed (a healthy machine of the model)
    price_here: Decimal  # $/h
    price_elsewhere: Decimal  # $/h of the other placement
    setup_elsewhere_s: float  # boot, host check, model download, checkpoint restore there
    redo: float = 0.0
    observed_s: float = 0.0  # how long the measured rate has held

    def __post_init__(self) -> None:
        if self.remaining < 0 or self.redo < 0 or self.planned_rate <= 0:
            raise ValueError("remaining and redo are >= 0, the planned rate > 0 (got "
                             f"{self.remaining}, {self.redo}, {self.planned_rate})")
        if self.setup_elsewhere_s < 0 or self.observed_s < 0:
            raise ValueError("setup and observed seconds are >= 0")


@dataclass(frozen=True)
class MoveDecision:
    """Move or stay, with both sides' remaining seconds and dollars, and why."""

    move: bool
    stay_s: float
    move_s: float
    stay_usd: Decimal
    move_usd: Decimal
    reason: str


def _usd(price_per_hour: Decimal, seconds: float) -> Decimal:
    if math.isinf(seconds):
        return Decimal("Infinity")
    cost = price_per_hour * Decimal(str(round(seconds, 3))) / Decimal(3600)
    return cost.quantize(_MICRO, rounding=ROUND_HALF_UP)


def move_or_stay(case: MoveCase, rules: Policy | None = None) -> MoveDecision:
    """Whether finishing `case` elsewhere is cheaper than staying (policy: data/hostmemory.yaml
    `move`)."""
    rule = (rules or policy()).move
    stay_s = case.remaining / case.measured_rate if case.measured_rate > 0 else math.inf
    move_s = case.setup_elsewhere_s + (case.remaining + case.redo) / case.planned_rate
    stay_usd, move_usd = _usd(case.price_here, stay_s), _usd(case.price_elsewhere, move_s)
    ratio = case.measured_rate / case.planned_rate

    def decide(move: bool, reason: str) -> MoveDecision:
        return MoveDecision(move, stay_s, move_s, stay_usd, move_usd, reason)

    if ratio >= rule.slow_below:
        return decide(False, f"running at {ratio:.0%} of the plan: not slow enough to move "
                      f"(under {rule.slow_below:.0%})")
    if case.observed_s < rule.min_observed_s:
        return decide(False, f"running at {ratio:.0%} of the plan for {case.observed_s:.0f} s:"
                      f" measured too briefly (at least {rule.min_observed_s:.0f} s)")
    saving = stay_usd - move_usd
    if move_usd < stay_usd * (1 - Decimal(str(rule.margin))):
        return decide(True, f"running at {ratio:.0%} of the plan: moving costs ${move_usd} "
                      f"({move_s / 3600:.2f} h) against ${stay_usd} ({stay_s / 3600:.2f} h) "
                      f"staying, ${saving} saved")
    return decide(False, f"running at {ratio:.0%} of the plan, but moving costs ${move_usd} "
                  f"against ${stay_usd} staying (a move must save {rule.margin:.0%})")
