"""The deadline contract of one run: spot or on-demand, asked of `core.deadline.decide`.

A job with `resources.deadline_hours` and `spot: allowed` is driven by the policy of "Can't
Be Late" (Wu et al., NSDI '24; docs/deadline.md), in its Greedy mode (§3.4: spot whenever it
can be had, on-demand only from the Safety Net; for orch's jobs of hours with restarts of
minutes the cheaper of the two, docs/deadline.md "The offline bench"). `Contract` is asked:
- before every rental (the first, and the re-placement after a preemption or a move): the
  cheapest spot and on-demand placements of a fresh search give the prices, the restarts
  (boot + model download, or the restart this run measured) and the spot GPU's preemption
  rate (`records.preemptions`: the prior, then orch's history); the choice narrows the
  search to spot (`required`) or on-demand (`never`), or defers the job (`wait`);
- every `ORCH_DEADLINE_CHECK_S` while the job trains on spot (the monitor thread), with
  the rate of steps measured on this machine and the newest mirrored checkpoint: when the
  slack no longer covers a preemption and an on-demand restart (`Rule.DRIFT`), the job moves.

A move is break before make, persisted before acting: the choice `on_demand` and the
`deadline.move` event are committed in one transaction (`job.deadline_choice`), then the
spot machine is terminated (`end_reason = moved`), then the job is placed again on
on-demand and resumes from its last mirrored checkpoint. Releasing the spot machine first
means there is never a second machine to leak or pay for, whatever crashes when (a takeover
reads `deadline_choice` and terminates a spot machine it adopts before renting); the price is
the spot machine's progress during the on-demand restart, which the Safety Net and the drift
rule already budget (their margins include the on-demand restart), and which a resume from
the last mirrored checkpoint would not keep anyway. Once on on-demand the job stays there
(the Safety Net's "stay until the end", and Greedy's rule). A job that cannot finish in
time whatever happens says so once (`deadline.will_miss`) and keeps going on the fastest
choice.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal

from orchestrator.core import checkpointing, preemption, scheduler
from orchestrator.core.deadline import (
    Choice,
    Decision,
    Machine,
    Market,
    Mode,
    Restart,
    Rule,
    Situation,
    Work,
    decide,
)
from orchestrator.core.deadlineplan import restart_of
from orchestrator.core.jobstatus import JobStatus
from orchestrator.core.restarts import Key as RestartKey
from orchestrator.core.restarts import Measured as MeasuredRestart
from orchestrator.core.settings import settings
from orchestrator.core.states import EndReason, EventKind, StopKind
from orchestrator.engine import hostchecks, recovery
from orchestrator.engine.jobinputs import Inputs
from orchestrator.engine.placement import Placement, hourly_rate
from orchestrator.engine.runner_core import (
    Deferred,
    Placed,
    RunState,
    Stop,
    failpoint,
    log,
)
from orchestrator.engine.teardown import Teardown
from orchestrator.records import preemptions, restarts
from orchestrator.records.store import Job, LeaseLost, StoreError, utcnow

MODE = Mode.GREEDY
# The placement's search narrowed to one kind (resources.spot's words).
SPOT_RULE = {Choice.SPOT: "required", Choice.ON_DEMAND: "never"}


@dataclass
class _Seen:
    """The market as the last search before a rental saw it."""

    market: Market
    rate_text: str
    spot: scheduler.Placement | None
    on_demand: scheduler.Placement | None

    def plan(self) -> scheduler.Placement:
        """The placement whose estimate stands for the work before it is measured."""
        found = self.on_demand or self.spot
        assert found is not None
        return found


class Contract:
    """The deadline policy of one run (see the module doc); inactive without a deadline."""

    def __init__(self, state: RunState, inputs: Inputs, *, requeue: bool) -> None:
        self.state = state
        self.ledger = state.ledger
        self.inputs = inputs
        self.requeue = requeue  # a worker defers a waiting job; `orch submit` waits here
        res = inputs.loaded.spec.resources
        self.hours = res.deadline_hours
        self.active = self.hours is not None and res.spot == "allowed"
        # `spot: required` with a deadline waits for spot while it is gone (the deadline is
        # only watched) instead of failing for want of an offer.
        self.spot_only = self.hours is not None and res.spot == "required"
        self.check_s = settings().deadline_check_s
        self.seen: _Seen | None = None
        self.on = Machine.NONE
        self.placed_at = 0.0  # monotonic: when the machine it is on was placed
        self.restart_s: float | None = None  # measured: placed -> first step
        self.samples: list[tuple[float, int]] = []  # (monotonic, step) on this machine
        self.stale: int | None = None
        self.last_check = time.monotonic()
        self.moved = False
        self.every_s: float | None = None  # the last situation's checkpoint interval
        # The training's steps as the job's events said them (`_steps`), and the newest
        # progress event read looking for them.
        self.total: int | None = None
        self.events_read = 0
        # A job resumed from another's checkpoint (`--resume-from`) has that step durable.
        self.kept_step = (inputs.resume.step or 0) if inputs.resume is not None else 0
        self.warned = self.active and bool(state.store.events_after(
            state.job_id, kinds=(EventKind.DEADLINE_WILL_MISS,)))

    # --- before renting ---------------------------------------------------------------

    def before_renting(self, placement: Placement, tried: set[tuple[str, str]]) -> None:
        """Narrow `placement`'s search to the policy's choice; while it says `wait`, defer
        the job (a worker) or wait here (`orch submit`) and ask again. The offers tried
        before are worth a try again: a spot offer preempted then is back when spot is
        (the choice may leave it as the only offer of its kind)."""
        if self.active or self.spot_only:
            tried.clear()
        while (decision := self._choose(placement)) is not None:
            self._wait(decision)

    def _choose(self, placement: Placement) -> Decision | None:
        """Set the search's spot rule; the decision when it is to wait, else None."""
        if self.spot_only:
            if placement.cheapest(SPOT_RULE[Choice.SPOT]) is None:
                return Decision(Choice.WAIT, Rule.WAIT, "resources.spot is required and no "
                                "spot can be had now")
            return None
        if not self.active:
            return None
        placement.spot_rule = None
        if self.ledger.job().deadline_choice is Choice.ON_DEMAND:
            placement.spot_rule = SPOT_RULE[Choice.ON_DEMAND]  # the Safety Net: to the end
            return None
        seen = self._search(placement)
        if seen is None:
            return None  # nothing fits either way: the placement says why
        decision = decide(self._situation(seen, Machine.NONE, seen.spot is not None),
                          seen.market, MODE)
        self._record(decision, seen)
        if decision.choice is Choice.WAIT:
            return decision
        placement.spot_rule = SPOT_RULE[decision.choice]
        return None

    def spot_went(self, placement: Placement) -> bool:
        """The rental of a search narrowed to spot failed and no spot is listed now: spot
        went between the policy's search and the create (a market that changes by the
        minute). Wait a check interval, True: the caller asks the policy again (it sees no
        spot), as when spot is gone at the search, instead of failing the job."""
        narrowed = self.spot_only or (self.active
                                      and placement.spot_rule == SPOT_RULE[Choice.SPOT])
        if not narrowed or placement.cheapest(SPOT_RULE[Choice.SPOT]) is not None:
            return False
        self._wait(Decision(Choice.WAIT, Rule.WAIT, "the spot offer went between the search "
                            "and the rental"))
        return True

    def _search(self, placement: Placement) -> _Seen | None:
        spot = placement.cheapest(SPOT_RULE[Choice.SPOT])
        on_demand = placement.cheapest(SPOT_RULE[Choice.ON_DEMAND])
        if spot is None and on_demand is None:
            return None
        od_price = hourly_rate(on_demand.offer) if on_demand is not None else None
        spot_price = hourly_rate(spot.offer) if spot is not None else None
        od = od_price if od_price is not None else (spot_price or Decimal(0)) * 2
        rate = (preemptions.rate_of(self.state.store, spot.offer.provider, spot.offer.gpu)
                if spot is not None else preemption.rate())
        seen_restarts = restarts.measured(self.state.store, {
            (p.offer.provider, p.offer.gpu) for p in (spot, on_demand) if p is not None})
        market = Market(spot_per_hour=spot_price if spot_price is not None else od,
                        on_demand_per_hour=od if od > 0 else Decimal("0.000001"),
                        preemptions_per_hour=rate.preemptions_per_hour,
                        spot_restart=self._restart(spot or on_demand, seen_restarts),
                        on_demand_restart=self._restart(on_demand or spot, seen_restarts))
        self.seen = _Seen(market, rate.describe(), spot, on_demand)
        return self.seen

    def _restart(self, p: scheduler.Placement | None,
                 seen: dict[RestartKey, MeasuredRestart]) -> Restart:
        """Boot + model download as estimated, or, if longer, the restart measured: this
        run's own (rental to first step), else orch's recent rentals of that provider's GPU
        (`deadlineplan.restart_of`, as `orch plan` weighs it)."""
        return Restart() if p is None else restart_of(p, seen, self.restart_s)[0]

    def _wait(self, decision: Decision) -> None:
        # A recheck of 0 s (the Safety Net's trigger is now) is asked again at once: `or`
        # read it as "none" and waited a whole check interval, which is the margin's.
        again = decision.recheck_after_s
        wait = min(self.check_s, self.check_s if again is None else again)
        message = f"deadline: waiting for spot ({decision.reason}); asked again in {wait:.0f}s"
        if self.requeue:
            raise Deferred(message, utcnow() + timedelta(seconds=max(1.0, wait)))
        self.ledger.set(JobStatus.QUEUED, message, {"retry_in_s": wait})
        until = time.monotonic() + wait
        while time.monotonic() < until:
            self.state.check_stop()
            time.sleep(min(0.5, max(0.0, until - time.monotonic())))

    def out_of_attempts(self, job: Job, max_attempts: int) -> str | None:
        """Why the job fails instead of being placed again (`recovery.out_of_attempts`),
        under the contract: interruptions on spot that reach the limit take the Safety Net,
        on-demand to the end, which no preemption ends; after that only on-demand machines'
        interruptions count. Spot's preemptions are what the contract weighs and plans for:
        the limit failed a job whose deadline on-demand could still meet (the product
        bench's heavy market, 1 job in 50, after 6 preemptions in 2.5 min)."""
        if not self.active:
            return recovery.out_of_attempts(job, max_attempts)
        if job.deadline_choice is not Choice.ON_DEMAND:
            if job.interruptions >= max_attempts:
                self.state.store.record_deadline(
                    job.id, self.ledger.owner, Choice.ON_DEMAND, EventKind.DEADLINE_DECISION,
                    f"deadline: on_demand ({Rule.ATTEMPTS}): {job.interruptions} interruptions "
                    f"reached the job's limit of {max_attempts}; on-demand to the end",
                    {"choice": Choice.ON_DEMAND.value, "rule": Rule.ATTEMPTS.value,
                     "interruptions": job.interruptions, "max_attempts": max_attempts})
            return None
        lost = sum(1 for r in self.state.store.instances_of(job.id)
                   if r.end_reason is EndReason.INTERRUPTED and not r.interruptible)
        if lost >= max_attempts:
            return (f"gave up after {lost} interruptions of on-demand machines (preempted or "
                    f"lost hosts); see `orch show {job.id}`")
        return None

    # --- the machine it is on ---------------------------------------------------------

    def after_adopt(self, adopted: Placed | None, teardown: Teardown,
                    placement: Placement) -> Placed | None:
        """After a takeover: a spot machine the policy had decided to leave is terminated
        before anything is rented (a crash between the move's record and its release)."""
        if adopted is None or not self.active:
            return adopted
        if self.ledger.job().deadline_choice is Choice.ON_DEMAND and self._spot(adopted):
            self.ledger.event(EventKind.DEADLINE_MOVE, "deadline: the job was moving to "
                              "on-demand; terminating the spot machine it was on",
                              {"instance": adopted.inst.instance_id, "resumed": True})
            teardown.release(adopted.row_id, EndReason.MOVED)
            return None
        self._search(placement)  # prices and restarts for the checks while it runs
        return adopted

    def placed(self, placed: Placed) -> None:
        """The job is on `placed` now (rented or adopted)."""
        if not self.active:
            return
        self.on = Machine.SPOT if self._spot(placed) else Machine.ON_DEMAND
        self.state.save_steps = None  # the last machine's; the host session renders this one's
        self.placed_at = self.last_check = time.monotonic()
        self.samples = []
        self.stale = self.ledger.progress.step  # the last machine's: not this one's progress
        if self.moved and self.on is Machine.ON_DEMAND:
            failpoint("move-placed")

    def _spot(self, placed: Placed) -> bool:
        row = next((r for r in self.state.store.instances_of(self.state.job_id)
                    if r.id == placed.row_id), None)
        return bool(row is not None and row.interruptible)

    # --- while it runs (the monitor thread) -------------------------------------------

    def tick(self) -> None:
        """Measure the rate; every check interval on spot, ask the policy and move if told."""
        if not self.active or self.on is Machine.NONE:
            return
        now = time.monotonic()
        step = self.ledger.progress.step
        if step is not None and step != self.stale and (
                not self.samples or step != self.samples[-1][1]):
            self.stale = None
            if not self.samples:
                self.restart_s = now - self.placed_at
            self.samples.append((now, step))
        # Every check interval, and about once per checkpoint (each new durable step
        # changes the work a preemption loses).
        every = self.check_s
        rate = self._rate()
        if rate is not None and self.seen is not None:
            every = min(every, self._save_steps(self.seen) / rate)
        if now - self.last_check < every or self.seen is None:
            return
        self.last_check = now
        try:
            self._check()
        except (LeaseLost, StoreError) as exc:  # the monitor's own checks report these
            log.info("deadline check of job %s: %s", self.state.job_id, exc)

    def _check(self) -> None:
        assert self.seen is not None
        if self.ledger.progress.status is not JobStatus.TRAINING or self.state.stop is not None:
            return
        decision = decide(self._situation(self.seen, self.on, True), self.seen.market, MODE)
        if decision.will_miss:
            self._warn(decision)
        if self.on is Machine.SPOT and decision.choice is Choice.ON_DEMAND:
            self._move(decision)

    def _move(self, decision: Decision) -> None:
        """Persist the move, then stop the attempt: the runner releases the spot machine."""
        self.state.store.record_deadline(
            self.state.job_id, self.ledger.owner, Choice.ON_DEMAND, EventKind.DEADLINE_MOVE,
            f"deadline: moving to on-demand: {decision.reason}", self._data(decision))
        self.moved = True
        self.on = Machine.NONE  # being left: no second move until the next machine
        failpoint("move-decided")
        self.state.signal(Stop(StopKind.MOVED, f"moved to on-demand by the deadline policy "
                               f"({decision.rule})"))

    # --- what the policy is told ------------------------------------------------------

    def _situation(self, seen: _Seen, on: Machine, spot_available: bool) -> Situation:
        job = self.ledger.job()
        assert self.hours is not None
        elapsed = (utcnow() - job.created_at).total_seconds()
        work, every = self._work(seen)
        self.every_s = every
        starting = 0.0
        if on is not Machine.NONE and not self.samples:
            restart = (seen.market.spot_restart if on is Machine.SPOT
                       else seen.market.on_demand_restart)
            starting = max(0.0, restart.seconds - (time.monotonic() - self.placed_at))
        return Situation(work=work, elapsed_s=elapsed, time_left_s=self.hours * 3600 - elapsed,
                         on=on, spot_available=spot_available, checkpoint_every_s=every,
                         starting_s=starting, detect_s=self.state.opts.watch_s,
                         check_every_s=self.check_s)

    def _work(self, seen: _Seen) -> tuple[Work, float]:
        """The work left (steps at the measured rate, else the plan's seconds) and the
        training seconds between checkpoints."""
        d = seen.plan().duration
        after = self._after(seen)
        total, durable = self._steps()
        rate = self._rate()
        every: float | None = None
        if total is None or rate is None:
            train_s = max(1.0, d.training * 3600)
            if total is not None:  # steps known from an earlier machine, not their rate
                # The trainer counts the whole run's steps; a job resumed from another's
                # checkpoint (`--resume-from`) was planned for the rest only.
                rate = total * (1 - min(self.inputs.loaded.done, 0.99)) / train_s
            else:  # no steps known: the work in the plan's seconds, one "step" a second
                total, durable, rate = math.ceil(train_s), 0, 1.0
                every = min(train_s, self._interval(seen).seconds)
        current = self.ledger.progress.step or durable
        unsaved = max(0, current - durable) if self.on is not Machine.NONE else 0
        done = min(durable, total)
        if every is None:
            every = self._save_steps(seen) / rate
        return Work(total, done, rate, min(unsaved, total - done), after), every

    def _save_steps(self, seen: _Seen) -> int:
        """The steps between checkpoints: the machine's own (as the host session rendered
        it), else what a spot machine would be given (Young's interval for its rate)."""
        if self.on is not Machine.NONE and self.state.save_steps is not None:
            return self.state.save_steps
        p, spot = self._spot_of(seen)
        return self.inputs.save_steps(p.offer.gpu_count, spot, p.estimate.workload,
                                      p.estimate.strategy)

    def _interval(self, seen: _Seen) -> checkpointing.Interval:
        """The training seconds between checkpoints a spot machine would be given."""
        p, spot = self._spot_of(seen)
        return self.inputs.checkpoint_interval(spot, p.estimate.workload, p.estimate.strategy)

    @staticmethod
    def _spot_of(seen: _Seen) -> tuple[scheduler.Placement, checkpointing.Spot | None]:
        """The spot placement and what its checkpoint interval is chosen from (the on-demand
        one and None without spot), as the host session will render it."""
        if seen.spot is None:
            return seen.plan(), None
        return seen.spot, checkpointing.Spot(seen.market.preemptions_per_hour,
                                             hostchecks.disk_floor(seen.spot.offer))

    @staticmethod
    def _after(seen: _Seen) -> float:
        """Seconds of merge, evaluation and delivery after the last step (the plan's)."""
        d = seen.plan().duration
        return (d.merge + d.evaluation + d.delivery) * 3600

    def _steps(self) -> tuple[int | None, int]:
        """(total steps, the step of the newest mirrored checkpoint) from the job's events:
        its mirrored checkpoints (a few), and its progress events (thousands in a long job)
        only until one says the total, from where the last check stopped. (An id committed
        out of order on PostgreSQL could be passed over there; every progress event carries
        the same total, so the next one says it.)"""
        job_id = self.state.job_id
        durable = max((e.data().step or 0 for e in self.state.store.events_after(
            job_id, kinds=(EventKind.CHECKPOINT_MIRRORED,))), default=self.kept_step)
        if self.total is None and not self.ledger.progress.total:
            for e in self.state.store.events_after(job_id, self.events_read,
                                                   (EventKind.TRAIN_PROGRESS,)):
                self.events_read = max(self.events_read, e.id or 0)
                if e.data().total:
                    self.total = e.data().total
                    break
        total = self.ledger.progress.total or self.total
        return (int(total) if total else None), durable

    def _rate(self) -> float | None:
        """Steps per second measured on this machine (None: not two steps yet)."""
        if len(self.samples) < 2:
            return None
        (t0, s0), (t1, s1) = self.samples[0], self.samples[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 and s1 > s0 else None

    # --- what it says -----------------------------------------------------------------

    def _data(self, decision: Decision) -> dict[str, object]:
        assert self.seen is not None
        m = self.seen.market
        return {"choice": decision.choice.value, "rule": decision.rule.value,
                "mode": MODE.value, "will_miss": decision.will_miss,
                "spot_usd_per_hour": str(m.spot_per_hour),
                "on_demand_usd_per_hour": str(m.on_demand_per_hour),
                "preemptions": self.seen.rate_text,
                "spot_restart_s": round(m.spot_restart.seconds, 1),
                "on_demand_restart_s": round(m.on_demand_restart.seconds, 1),
                # the on-demand restart the margins budget: a slow one (core/restarts)
                "on_demand_slow_restart_s": round(m.on_demand_restart.slow_s, 1),
                "after_training_s": round(self._after(self.seen), 1),
                # the training seconds a preemption's loss was weighed by
                "checkpoint_every_s": None if self.every_s is None else round(self.every_s, 1),
                **decision.numbers}

    def _record(self, decision: Decision, seen: _Seen) -> None:
        choice = Choice.ON_DEMAND if decision.choice is Choice.ON_DEMAND else None
        self.state.store.record_deadline(
            self.state.job_id, self.ledger.owner, choice, EventKind.DEADLINE_DECISION,
            f"deadline: {decision.choice} ({decision.rule}): {decision.reason}",
            self._data(decision))
        if decision.will_miss:
            self._warn(decision)

    def _warn(self, decision: Decision) -> None:
        """Say once that the deadline will be missed whatever happens."""
        if self.warned:
            return
        self.warned = True
        data = {"miss_by_s": round(decision.miss_by_s, 1), "fastest": decision.choice.value,
                "rule": Rule.CANNOT_MEET.value, "reason": decision.reason, **decision.numbers}
        self.state.tell(EventKind.DEADLINE_WILL_MISS,
                        f"deadline: will miss it by {decision.miss_by_s / 60:.0f} min "
                        f"whatever happens: {decision.reason}; continuing on "
                        f"{decision.choice} (the fastest)", data)
