"""Spot or on-demand for a job with a deadline: the policies of "Can't Be Late" (pure).

The policies are Wu et al., "Can't Be Late: Optimizing Spot Instance Savings under
Deadlines" (NSDI '24). Both modes keep the rules of §3.3, in the paper's words:
- Thrifty: nothing is rented once the work is done.
- Safety Net: when the job is idle and R(t) < C(t) + 2d, switch to on-demand and stay on it
  until the end (R: time left to the deadline, C: computation left, d: changeover delay).
- Exploitation: once on a spot machine, stay on it until it is preempted.
`Mode.GREEDY` is §3.4: spot whenever it can be had, waiting otherwise, on-demand only from
the Safety Net. `Mode.UNIFORM_PROGRESS` is §5.2.2, which adds:
- Uniform Progress: when idle and cp(t) < ep(t), switch to on-demand to catch up; the
  expected progress is the straight line ep(t) = t * C(0) / R(0) (§5.2.1).
- Taking Risks: switch to spot whenever it is available, even when behind.
- Hysteresis: on on-demand, stay until cp(t) >= ep(t + 2d); past it with no spot to be had,
  release on-demand and wait (the authors' simulator: idle when ahead and no spot).
The paper finds Uniform Progress cheaper than Greedy for its 48-hour jobs with a 0.2 h
changeover; for orch's jobs (hours, with a changeover of a restart plus the work since a
checkpoint) Greedy is often the cheaper: core/deadlinesim.estimate replays both for the job
and the plan keeps the cheaper (docs/deadline.md has the numbers).

What orch adds, each for a fact of its own machines:
- d is not one number. Each choice has its own restart (`Restart`: boot, model download,
  resume from the last mirrored checkpoint), and a preemption also loses the work since the
  last durable checkpoint plus the time until orch notices (`Situation.checkpoint_every_s`,
  `detect_s`). The Safety Net's "2d" is the spot restart + the most a preemption loses + the
  on-demand restart that follows it, plus one check interval of margin; the hysteresis's d
  is the spot restart + the work a preemption loses on average (half an interval) as the
  paper's d includes "progress loss caused by gaps between checkpoints" (§3.1).
  The on-demand restart in the Safety Net's margin and in the drift rule's trigger is a slow
  one (`Restart.slow_extra_s`: the 90th percentile of orch's measured restarts): the
  guarantee holds only if the fallback's restart takes no longer than budgeted, and half of
  all restarts take longer than the median. Costs, `will_miss` and whether a move still
  finishes in time use the median.
- The preemption rate. The paper's policies are parameter-free; orch knows each provider's
  and GPU's interruptions per hour (orchestrator/core/preemption.py), so spot is only taken
  when its expected cost per hour of progress is below on-demand's: the paper's §5.4 rule
  for a known next spot lifetime o ("o/(o - d) < k" from idle, "(o + kd)/(o - d) < k" from
  on-demand), with the lifetime's expectation under exponential lifetimes.
- Drift. The paper's guarantee assumes C and d are known (§5.6); orch's rate is measured as
  the job runs. On spot, if the slack no longer covers one preemption and the on-demand
  restart, the job moves to on-demand while it still can.

`decide` takes the job's situation and the market and returns the choice with its rule and
numbers; it never reads a clock or a database (the engine and the simulation in
core/deadlinesim.py call it with the values they hold).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from decimal import Decimal
from enum import StrEnum


class Machine(StrEnum):
    """What the job runs on now."""

    NONE = "none"  # nothing: not started, preempted, or waiting for spot
    SPOT = "spot"
    ON_DEMAND = "on_demand"


class Choice(StrEnum):
    """What the job should run on."""

    SPOT = "spot"
    ON_DEMAND = "on_demand"
    WAIT = "wait"  # nothing for now: no spot can be had and the job is ahead of schedule


class Mode(StrEnum):
    """Which of the paper's policies decides; both keep its Safety Net, so both meet the
    deadline whenever it can be met."""

    UNIFORM_PROGRESS = "uniform_progress"  # §5.2.2: keep up with ep(t), with hysteresis
    GREEDY = "greedy"  # §3.4: spot whenever it can be had, on-demand only from the Safety Net


class Rule(StrEnum):
    """Which rule made the choice (the paper's names, §3.3 and §5.2.2, and orch's own)."""

    DONE = "done"
    CANNOT_MEET = "cannot_meet"  # no choice finishes by the deadline any more
    SAFETY_NET = "safety_net"
    DRIFT = "drift"  # on spot, the slack fell below what one preemption costs
    HYSTERESIS = "hysteresis"
    UNIFORM_PROGRESS = "uniform_progress"
    TAKING_RISKS = "taking_risks"
    EXPLOITATION = "exploitation"
    SPOT_NOT_WORTH = "spot_not_worth"  # spot's expected cost per progress >= on-demand's
    WAIT = "wait"
    # orch's own: the job's interruptions on spot reached its attempt limit (`max_attempts`):
    # on-demand to the end, where a generic limit would fail a job the Safety Net can finish.
    ATTEMPTS = "attempts"


@dataclass(frozen=True)
class Work:
    """The job's training, in steps at the measured rate, and what follows it."""

    steps_total: int
    steps_done: int  # in the newest durable (mirrored) checkpoint
    steps_per_s: float  # measured on this job (or the plan's estimate before the first step)
    steps_unsaved: int = 0  # done since that checkpoint: lost if this machine goes
    after_training_s: float = 0.0  # merge, evaluation and delivery after the last step

    def __post_init__(self) -> None:
        if not self.steps_per_s > 0 or not math.isfinite(self.steps_per_s):
            raise ValueError(f"steps_per_s must be > 0 (got {self.steps_per_s})")
        if not 0 <= self.steps_done <= self.steps_total or self.steps_unsaved < 0:
            raise ValueError(f"steps: {self.steps_done} done, {self.steps_unsaved} unsaved "
                             f"of {self.steps_total}")

    @property
    def total_s(self) -> float:
        """C(0): the whole job's work in seconds, at the measured rate."""
        return self.steps_total / self.steps_per_s + self.after_training_s

    def left_s(self, *, keep: bool) -> float:
        """C(t): seconds of work left, staying on this machine (`keep`) or moving."""
        done = self.steps_done + (self.steps_unsaved if keep else 0)
        return max(0, self.steps_total - done) / self.steps_per_s + self.after_training_s


@dataclass(frozen=True)
class Restart:
    """What starting the job on a new machine costs in time before its next step."""

    boot_s: float = 0.0  # rent → SSH and GPU checks pass
    download_s: float = 0.0  # base model (and image) onto the machine
    resume_s: float = 0.0  # checkpoint uploaded (no volume) and loaded, trainer started
    # How much longer than `seconds` a slow restart takes (core/restarts: the 90th percentile
    # of those measured). Only the margins that must hold budget it (the Safety Net, the
    # drift rule's fallback); costs and the fastest way to finish use `seconds`.
    slow_extra_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.slow_extra_s >= 0:
            raise ValueError(f"slow_extra_s must be >= 0 (got {self.slow_extra_s})")

    @property
    def seconds(self) -> float:
        """The whole restart, as it usually goes."""
        return self.boot_s + self.download_s + self.resume_s

    @property
    def slow_s(self) -> float:
        """The restart a margin budgets: a slow one."""
        return self.seconds + self.slow_extra_s


@dataclass(frozen=True)
class Market:
    """Prices and behaviour of the spot and on-demand machines the job can have."""

    spot_per_hour: Decimal
    on_demand_per_hour: Decimal
    preemptions_per_hour: float  # of a running spot machine of this provider and GPU
    spot_restart: Restart = field(default_factory=Restart)
    on_demand_restart: Restart = field(default_factory=Restart)

    def __post_init__(self) -> None:
        if self.preemptions_per_hour < 0 or not math.isfinite(self.preemptions_per_hour):
            raise ValueError(f"preemptions_per_hour must be >= 0 "
                             f"(got {self.preemptions_per_hour})")


@dataclass(frozen=True)
class Situation:
    """Where the job stands now."""

    work: Work
    elapsed_s: float  # since the job's clock started (t in ep(t))
    time_left_s: float  # until the deadline: R(t)
    on: Machine
    spot_available: bool  # a spot offer that fits the job can be rented now
    checkpoint_every_s: float  # training seconds between durable checkpoints
    starting_s: float = 0.0  # until the machine it is on takes its first step (restart left)
    detect_s: float = 60.0  # from a preemption to orch acting on it
    check_every_s: float = 300.0  # how often the engine asks again while nothing happens


@dataclass(frozen=True)
class Decision:
    """The choice, the rule that made it, and the numbers it was made from."""

    choice: Choice
    rule: Rule
    reason: str
    will_miss: bool = False  # no choice finishes by the deadline (say so now)
    miss_by_s: float = 0.0  # by how much the fastest choice misses it
    at_risk: bool = False  # on spot with no room to move: a preemption now misses it
    recheck_after_s: float | None = None  # ask again then, if nothing happens before
    numbers: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class _Derived:
    """The quantities every rule reads, in seconds."""

    left_keep: float  # C(t) staying
    left_move: float  # C(t) moving (unsaved work redone)
    loss: float  # the most a preemption costs beyond the restart
    d_spot: float
    d_od: float
    net: float  # Safety Net: slack a move to spot needs
    fallback: float  # slack a running spot machine needs (one preemption + on-demand)
    d: float  # the paper's changeover delay: restart and the work a preemption loses on average
    share: float  # C(0)/R(0): the uniform progress line's slope
    progress: float  # cp(t)


def _derive(s: Situation, m: Market) -> _Derived:
    w = s.work
    loss = s.checkpoint_every_s + s.detect_s
    d_spot, d_od = m.spot_restart.seconds, m.on_demand_restart.seconds
    # The fallback to on-demand must fit even when its restart runs slow.
    d_od_slow = m.on_demand_restart.slow_s
    window = s.elapsed_s + s.time_left_s
    share = w.total_s / window if window > 0 else math.inf
    keep = w.left_s(keep=True) + (s.starting_s if s.on is not Machine.NONE else 0.0)
    return _Derived(
        left_keep=keep, left_move=w.left_s(keep=False), loss=loss,
        d_spot=d_spot, d_od=d_od, net=d_spot + loss + d_od_slow + s.check_every_s,
        fallback=loss + d_od_slow + s.check_every_s,
        d=d_spot + s.checkpoint_every_s / 2 + s.detect_s, share=share,
        progress=w.total_s - w.left_s(keep=s.on is not Machine.NONE))


def spot_cost_factor(m: Market, s: Situation, *, from_on_demand: bool) -> Decimal:
    """Expected dollars per hour of progress on spot, over on-demand's per hour (< 1: cheaper).

    A spot machine lives T ~ Exp(rate) hours from its rental; it bills T plus the time until
    orch notices the preemption, and progresses for T - restart, less the work since the last
    checkpoint (half an interval on average). So per hour of progress it bills
    e^(rate * restart) * (1 + rate * detect) / (1 - rate * interval / 2) hours. From
    on-demand, each spot stint also costs the on-demand restart that follows it (§5.4).
    """
    rate = m.preemptions_per_hour / 3600.0  # per second
    kept = 1.0 - rate * s.checkpoint_every_s / 2
    if kept <= 0:
        return Decimal("Infinity")
    # Per stint: cost spot * (1/rate + detect) [+ on-demand * its restart], progress
    # e^(-rate * restart) * kept / rate; the ratio, multiplied through by rate:
    cost = m.spot_per_hour * Decimal(repr(1.0 + rate * s.detect_s))
    if from_on_demand:
        cost += m.on_demand_per_hour * Decimal(repr(rate * m.on_demand_restart.seconds))
    stretch = Decimal(repr(math.exp(rate * m.spot_restart.seconds) / kept))
    return cost * stretch / m.on_demand_per_hour


def decide(s: Situation, m: Market, mode: Mode = Mode.UNIFORM_PROGRESS) -> Decision:
    """Spot, on-demand or wait, now, for a job in situation `s` on market `m`."""
    x = _derive(s, m)
    numbers = {"work_left_s": round(x.left_keep, 1), "time_left_s": round(s.time_left_s, 1),
               "slack_s": round(s.time_left_s - x.left_keep, 1),
               "safety_net_s": round(x.net, 1), "fallback_s": round(x.fallback, 1)}
    current = {Machine.SPOT: Choice.SPOT, Machine.ON_DEMAND: Choice.ON_DEMAND,
               Machine.NONE: Choice.WAIT}[s.on]
    if x.left_keep <= 0:
        return Decision(current, Rule.DONE, "nothing left to run", numbers=numbers)
    if (late := _cannot_meet(s, x, numbers)) is not None:
        return late
    if s.on is Machine.SPOT:
        return _on_spot(s, x, numbers)
    if s.on is Machine.ON_DEMAND:
        if mode is Mode.GREEDY:
            return Decision(Choice.ON_DEMAND, Rule.SAFETY_NET, "greedy: on-demand, once "
                            "taken, to the end", numbers=numbers)
        return _on_demand(s, m, x, numbers)
    return _idle(s, m, x, numbers, mode)


def _cannot_meet(s: Situation, x: _Derived, numbers: dict[str, float]) -> Decision | None:
    """The fastest way to finish, if even it misses the deadline."""
    if s.on is not Machine.NONE:
        fastest, choice = x.left_keep, Choice(s.on.value)  # stay: nothing is faster
    else:
        fastest, choice = x.left_move + x.d_od, Choice.ON_DEMAND
        if s.spot_available and x.left_move + x.d_spot < fastest:
            fastest, choice = x.left_move + x.d_spot, Choice.SPOT
    if fastest <= s.time_left_s:
        return None
    miss = fastest - s.time_left_s
    return Decision(choice, Rule.CANNOT_MEET,
                    f"the fastest way ({choice}) needs {_h(fastest)} and {_h(s.time_left_s)} "
                    f"are left: it misses the deadline by {_h(miss)} whatever happens",
                    will_miss=True, miss_by_s=miss, numbers=numbers)


def _on_spot(s: Situation, x: _Derived, numbers: dict[str, float]) -> Decision:
    slack = s.time_left_s - x.left_keep
    if slack >= x.fallback:
        return Decision(Choice.SPOT, Rule.EXPLOITATION,
                        f"on spot with {_h(slack)} of slack, more than a preemption and an "
                        f"on-demand restart take ({_h(x.fallback)}): stay until preempted",
                        numbers=numbers)
    if s.time_left_s >= x.left_move + x.d_od:
        return Decision(Choice.ON_DEMAND, Rule.DRIFT,
                        f"the slack fell to {_h(slack)}, below what a preemption and an "
                        f"on-demand restart take ({_h(x.fallback)}): move to on-demand while "
                        "it still finishes in time", numbers=numbers)
    return Decision(Choice.SPOT, Rule.EXPLOITATION,
                    f"only {_h(slack)} of slack: moving now would miss the deadline, staying "
                    "meets it unless this machine is preempted", at_risk=True,
                    numbers=numbers)


def _on_demand(s: Situation, m: Market, x: _Derived,
               numbers: dict[str, float]) -> Decision:
    ahead_of = (s.elapsed_s + 2 * x.d) * x.share  # ep(t + 2d)
    if x.progress < ahead_of:
        return Decision(Choice.ON_DEMAND, Rule.HYSTERESIS,
                        f"on on-demand until {_h(ahead_of)} of progress, uniform progress "
                        f"2d ahead (now {_h(x.progress)})",
                        recheck_after_s=_catch_up_s(x.progress, ahead_of, x.share),
                        numbers=numbers)
    room = s.time_left_s - x.left_move  # slack after leaving this machine
    if room < x.net:
        return Decision(Choice.ON_DEMAND, Rule.SAFETY_NET,
                        f"{_h(room)} of slack after leaving this machine is less than a "
                        f"spot restart and one fallback ({_h(x.net)}): stay to the end",
                        numbers=numbers)
    if not s.spot_available:
        return Decision(Choice.WAIT, Rule.WAIT,
                        f"ahead of uniform progress by 2d and no spot to be had: release the "
                        f"on-demand machine and wait ({_h(room - x.net)} before the safety "
                        "net)", recheck_after_s=room - x.net, numbers=numbers)
    factor = spot_cost_factor(m, s, from_on_demand=True)
    numbers["spot_cost_factor"] = round(float(factor), 4)
    if factor >= 1:
        return Decision(Choice.ON_DEMAND, Rule.SPOT_NOT_WORTH, _not_worth(m, factor),
                        numbers=numbers)
    return Decision(Choice.SPOT, Rule.TAKING_RISKS,
                    f"spot can be had at {factor:.2f}x on-demand's cost per hour of progress "
                    f"and {_h(room)} of slack covers its restart and a fallback",
                    numbers=numbers)


def _idle(s: Situation, m: Market, x: _Derived, numbers: dict[str, float],
          mode: Mode) -> Decision:
    room = s.time_left_s - x.left_move
    if room < x.net:
        return Decision(Choice.ON_DEMAND, Rule.SAFETY_NET,
                        f"{_h(room)} of slack is less than a spot restart, the most a "
                        f"preemption loses and an on-demand restart ({_h(x.net)}): "
                        "on-demand to the end", numbers=numbers)
    if s.spot_available:
        factor = spot_cost_factor(m, s, from_on_demand=False)
        numbers["spot_cost_factor"] = round(float(factor), 4)
        if factor >= 1:
            return Decision(Choice.ON_DEMAND, Rule.SPOT_NOT_WORTH, _not_worth(m, factor),
                            numbers=numbers)
        return Decision(Choice.SPOT, Rule.TAKING_RISKS,
                        f"spot at {factor:.2f}x on-demand's cost per hour of progress; "
                        f"{_h(room)} of slack covers a restart and a fallback "
                        f"({_h(x.net)})", numbers=numbers)
    expected = s.elapsed_s * x.share  # ep(t)
    if mode is Mode.GREEDY:
        return Decision(Choice.WAIT, Rule.WAIT, f"greedy: no spot; wait for it "
                        f"({_h(room - x.net)} before the safety net)", numbers=numbers,
                        recheck_after_s=room - x.net)
    if x.progress < expected:
        return Decision(Choice.ON_DEMAND, Rule.UNIFORM_PROGRESS,
                        f"no spot, and {_h(x.progress)} of progress is behind the uniform "
                        f"line ({_h(expected)}): on-demand to catch up", numbers=numbers)
    behind_in = x.progress / x.share - s.elapsed_s if x.share > 0 else math.inf
    return Decision(Choice.WAIT, Rule.WAIT,
                    f"no spot; ahead of uniform progress ({_h(x.progress)} of "
                    f"{_h(expected)}): wait for spot", numbers=numbers,
                    recheck_after_s=max(0.0, min(behind_in, room - x.net)))


def _catch_up_s(progress: float, target_now: float, share: float) -> float | None:
    """Seconds on on-demand until progress (1 s/s) passes a line rising at `share` s/s."""
    if share >= 1:
        return None
    return max(0.0, (target_now - progress) / (1.0 - share))


def _not_worth(m: Market, factor: Decimal) -> str:
    return (f"spot's expected cost per hour of progress is {factor:.2f}x on-demand's at "
            f"{m.preemptions_per_hour:g} preemptions per hour: on-demand")


def _h(seconds: float) -> str:
    """Seconds as people read them here: `2.5 h`, `40 min`."""
    if abs(seconds) >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.0f} min"
