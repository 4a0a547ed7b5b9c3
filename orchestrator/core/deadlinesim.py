"""A job with a deadline replayed over a spot trace, and what each strategy is expected to cost.

`replay` runs one job through one availability trace (providers/spottrace.py) under one
strategy, event by event: a machine is rented, restarts (`deadline.Restart`), progresses one
second of work per second, saves a durable checkpoint every `checkpoint_every_s` of work, and
a spot machine is preempted at the end of the trace's interval it was rented in, losing the
work since its last checkpoint; orch notices `detect_s` later (billed, as the simulated cloud
bills a preempted machine until it is terminated). The strategy is asked again at every
event: a preemption, spot appearing or going, the time its decision said to ask again. The
engine also asks periodically for drift (the rate changing); here the estimates are exact,
so that never fires and is not simulated.

`estimate` is what `orch plan` shows for a job with a deadline: for each strategy (on-demand
only, spot only, orch's policy) the expected dollars and the chance of missing the deadline,
on-demand's exactly, the others over `runs` traces drawn from the provider's preemption rate
(a seeded Monte Carlo: the same inputs give the same numbers). `fastest` says whether any
choice can meet the deadline at all, for refusing a job before anything is rented.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from enum import StrEnum

from orchestrator.core import money
from orchestrator.core.deadline import Choice, Machine, Market, Mode, Situation, Work, decide
from providers import spottrace
from providers.spottrace import Availability, SpotTrace

# A strategy: the choice now, and when to ask again if nothing happens (None: at the next event).
Strategy = Callable[[Situation], tuple[Choice, float | None]]
_MIN_STEP_S = 1.0  # a decision that asks again "now" is asked a second later
_MAX_EVENTS = 100_000
_ON_TIME_S = 1e-6  # finishing this close after the deadline is on time (float rounding)


class Plan(StrEnum):
    """The strategies compared for a job with a deadline."""

    ON_DEMAND = "on_demand"  # on-demand from start to end
    SPOT = "spot"  # spot whenever it can be had, waiting otherwise; never on-demand
    POLICY = "policy"  # orch's policy (core/deadline.py)


@dataclass(frozen=True)
class Job:
    """What the replay runs: seconds of work, the deadline, how often it saves its state."""

    work_s: float  # training and what follows it, at the job's rate
    window_s: float  # from the start to the deadline
    checkpoint_every_s: float
    detect_s: float = 60.0
    check_every_s: float = 300.0


@dataclass(frozen=True)
class Outcome:
    """One replay: when the job finished (None: not within the horizon) and what it billed."""

    finished_s: float | None
    spot_s: float  # billed seconds of spot machines
    on_demand_s: float
    preemptions: int
    rentals: int

    def missed(self, job: Job) -> bool:
        """Whether it finished after the deadline, or not at all."""
        return self.finished_s is None or self.finished_s > job.window_s + _ON_TIME_S

    def cost(self, market: Market) -> Decimal:
        """Dollars billed: each machine's seconds at its hourly price."""
        return (_dollars(market.spot_per_hour, self.spot_s)
                + _dollars(market.on_demand_per_hour, self.on_demand_s))


def _dollars(per_hour: Decimal, seconds: float) -> Decimal:
    return money.money(per_hour * Decimal(repr(seconds)) / 3600)


def strategy(plan: Plan, market: Market, mode: Mode = Mode.UNIFORM_PROGRESS) -> Strategy:
    """The decision function of `plan` on `market` (the policy's in `mode`)."""
    if plan is Plan.ON_DEMAND:
        return lambda s: (Choice.ON_DEMAND, None)
    if plan is Plan.SPOT:
        return lambda s: ((Choice.SPOT, None) if s.on is Machine.SPOT or s.spot_available
                          else (Choice.WAIT, None))

    def policy(s: Situation) -> tuple[Choice, float | None]:
        d = decide(s, market, mode)
        return d.choice, d.recheck_after_s
    return policy


@dataclass
class _Run:
    """The replay's state between events."""

    t: float = 0.0
    durable: float = 0.0  # work in the newest checkpoint
    on: Machine = Machine.NONE
    rented_at: float = 0.0
    ready_at: float = 0.0  # when the machine it is on takes its first step
    preempt_at: float = math.inf
    spot_s: float = 0.0
    on_demand_s: float = 0.0
    preemptions: int = 0
    rentals: int = 0

    def progress(self, t: float) -> float:
        return self.durable + max(0.0, t - self.ready_at) if self.on is not Machine.NONE \
            else self.durable

    def bill(self, until: float) -> None:
        if self.on is Machine.SPOT:
            self.spot_s += until - self.rented_at
        elif self.on is Machine.ON_DEMAND:
            self.on_demand_s += until - self.rented_at


def replay(job: Job, market: Market, trace: Availability, decide_now: Strategy,
           horizon_s: float | None = None) -> Outcome:
    """One job through `trace` (hours from the job's start) under `decide_now`."""
    end = horizon_s if horizon_s is not None else trace.horizon_h * 3600
    run = _Run()
    for _ in range(_MAX_EVENTS):
        if run.t >= end:
            break
        choice, again = decide_now(_situation(job, run, trace))
        _switch(run, choice, market, trace, job)
        done_at = (run.ready_at + job.work_s - run.durable) if run.on is not Machine.NONE \
            else math.inf
        wake = run.t + max(_MIN_STEP_S, again) if again is not None else math.inf
        nxt = min(done_at, run.preempt_at, _next_change(trace, run), wake, end)
        if nxt == done_at and done_at <= end:
            run.bill(done_at)
            return Outcome(done_at, run.spot_s, run.on_demand_s, run.preemptions, run.rentals)
        if nxt == run.preempt_at:
            _preempted(run, job)
        else:
            run.t = nxt
    run.bill(min(run.t, end))
    return Outcome(None, run.spot_s, run.on_demand_s, run.preemptions, run.rentals)


def _situation(job: Job, run: _Run, trace: Availability) -> Situation:
    done = run.progress(run.t)
    saved = max(run.durable, math.floor(done / job.checkpoint_every_s) * job.checkpoint_every_s)
    total = math.ceil(job.work_s)
    work = Work(steps_total=total, steps_done=min(int(saved), total), steps_per_s=1.0,
                steps_unsaved=max(0, int(done - saved)))
    return Situation(work=work, elapsed_s=run.t, time_left_s=job.window_s - run.t, on=run.on,
                     spot_available=_spot_until(trace, run.t) is not None,
                     checkpoint_every_s=job.checkpoint_every_s,
                     starting_s=max(0.0, run.ready_at - run.t), detect_s=job.detect_s,
                     check_every_s=job.check_every_s)


def _switch(run: _Run, choice: Choice, market: Market, trace: Availability, job: Job) -> None:
    """Leave the machine it is on for `choice` (the work since the last checkpoint is lost)."""
    wanted = {Choice.SPOT: Machine.SPOT, Choice.ON_DEMAND: Machine.ON_DEMAND,
              Choice.WAIT: Machine.NONE}[choice]
    ends = _spot_until(trace, run.t) if wanted is Machine.SPOT else None
    if wanted is run.on or (wanted is Machine.SPOT and ends is None):
        return
    if run.on is not Machine.NONE:
        run.bill(run.t)
        run.durable = _saved(run.progress(run.t), run.durable, job)
    run.on, run.rented_at, run.preempt_at = wanted, run.t, math.inf
    if wanted is Machine.NONE:
        return
    run.rentals += 1
    restart = market.spot_restart if wanted is Machine.SPOT else market.on_demand_restart
    run.ready_at = run.t + restart.seconds
    if ends is not None:
        run.preempt_at = ends


def _saved(progress: float, durable: float, job: Job) -> float:
    """The work in the newest checkpoint once `progress` was reached."""
    if progress >= job.work_s:
        return job.work_s
    return max(durable, math.floor(progress / job.checkpoint_every_s) * job.checkpoint_every_s)


def _preempted(run: _Run, job: Job) -> None:
    at = run.preempt_at
    run.durable = _saved(run.progress(at), run.durable, job)
    noticed = at + job.detect_s  # billed until orch notices and terminates it
    run.bill(noticed)
    run.preemptions += 1
    run.on, run.preempt_at, run.t = Machine.NONE, math.inf, noticed


def _spot_until(trace: Availability, t: float) -> float | None:
    """When spot that can be rented at second `t` goes (inf: not within the trace; None: it
    cannot be rented). An interval ending within a microsecond of `t` counts as gone: seconds
    and the trace's hours round differently, and a machine preempted on rental never runs."""
    ends = trace.preempted_at(t / 3600)
    if ends is None:
        return None
    if ends >= trace.horizon_h:
        return math.inf
    return ends * 3600 if ends * 3600 > t + 1e-6 else None


def _next_change(trace: Availability, run: _Run) -> float:
    """The next time spot appears or goes (what a waiting or on-demand job reacts to)."""
    if run.on is Machine.SPOT:
        return math.inf
    ends = _spot_until(trace, run.t)
    if ends is not None:
        return ends
    starts = trace.next_available(run.t / 3600 + 1e-9)
    return math.inf if starts is None else max(starts * 3600, run.t + 1e-3)


@dataclass(frozen=True)
class Expected:
    """One strategy's expected dollars, chance of missing the deadline and hours to finish."""

    plan: Plan
    cost: Decimal
    p_miss: float
    hours: float  # mean time to finish, of the runs that finished
    runs: int
    mode: Mode | None = None  # the policy's

    def to_dict(self) -> dict[str, object]:
        """JSON-ready (`orch plan --json`'s `deadline` entries, phase B)."""
        return {"strategy": self.plan.value, "mode": self.mode and self.mode.value,
                "expected_cost": str(self.cost), "p_miss": round(self.p_miss, 4),
                "expected_hours": round(self.hours, 3), "runs": self.runs}


@dataclass(frozen=True)
class Estimates:
    """What each strategy is expected to cost and risk for one job on one market."""

    on_demand: Expected
    spot: Expected
    policy: Expected  # in the mode expected to cost least (`policy.mode`)

    def all(self) -> tuple[Expected, Expected, Expected]:
        """On-demand only, spot only, the policy: the order `orch plan` shows them in."""
        return self.on_demand, self.spot, self.policy


def estimate(job: Job, market: Market, wait_mean_h: float, runs: int = 64,
             seed: int = 0) -> Estimates:
    """On-demand only, spot only and the policy: expected cost and chance of missing.

    Spot's lifetimes are exponential with the market's rate, the time without spot after
    one ends exponential with mean `wait_mean_h` (the prior's, core/preemption.py). The
    policy is replayed in each `Mode` over the same traces and the cheaper one is kept:
    which is cheaper depends on the job (docs/deadline.md), and both meet every deadline
    that can be met.
    """
    horizon_h = 3 * max(job.window_s, job.work_s) / 3600
    traces = [_trace(market, wait_mean_h, seed + i, horizon_h) for i in range(runs)]

    def over(plan: Plan, mode: Mode | None) -> Expected:
        decide_now = strategy(plan, market, mode or Mode.UNIFORM_PROGRESS)
        found = [replay(job, market, trace, decide_now) for trace in traces]
        return _summary(plan, job, market, found, mode)

    policies = [over(Plan.POLICY, mode) for mode in Mode]
    best = min(policies, key=lambda e: (e.p_miss, e.cost))
    return Estimates(_on_demand_only(job, market), over(Plan.SPOT, None), best)


def _trace(market: Market, wait_mean_h: float, seed: int, horizon_h: float) -> SpotTrace:
    if market.preemptions_per_hour <= 0:
        return SpotTrace(horizon_h, ((0.0, horizon_h),))
    regime = spottrace.exponential(market.preemptions_per_hour, wait_mean_h)
    return spottrace.generate(regime, seed, horizon_h)


def _on_demand_only(job: Job, market: Market) -> Expected:
    seconds = market.on_demand_restart.seconds + job.work_s
    return Expected(Plan.ON_DEMAND, _dollars(market.on_demand_per_hour, seconds),
                    1.0 if seconds > job.window_s + _ON_TIME_S else 0.0, seconds / 3600, 1)


def _summary(plan: Plan, job: Job, market: Market, outcomes: list[Outcome],
             mode: Mode | None = None) -> Expected:
    total = sum((o.cost(market) for o in outcomes), Decimal(0))
    done = [o.finished_s for o in outcomes if o.finished_s is not None]
    return Expected(plan, money.money(total / len(outcomes)),
                    sum(o.missed(job) for o in outcomes) / len(outcomes),
                    sum(done) / len(done) / 3600 if done else math.inf, len(outcomes), mode)


@dataclass(frozen=True)
class Fastest:
    """The quickest way to finish, and whether it meets the deadline."""

    choice: Choice
    hours: float
    meets: bool
    miss_by_h: float


def fastest(job: Job, market: Market) -> Fastest:
    """The choice that finishes soonest if nothing goes wrong (spot only if never preempted:
    a sure finish is on-demand's), for refusing a deadline no placement can meet."""
    od = market.on_demand_restart.seconds + job.work_s
    spot = market.spot_restart.seconds + job.work_s
    choice, seconds = (Choice.SPOT, spot) if spot < od else (Choice.ON_DEMAND, od)
    miss = max(0.0, seconds - job.window_s)
    # The same comparison as Outcome.missed: `seconds - window <= tol` can differ from it by
    # a rounding at the boundary (hypothesis found 7200 s of work, a 1e-6 s restart).
    return Fastest(choice, seconds / 3600, not seconds > job.window_s + _ON_TIME_S, miss / 3600)
