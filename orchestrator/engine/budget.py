"""`resources.max_cost` over the whole job, as docs/job-file.md defines it ("Most USD for
the whole job"), not only over the first placement's estimate.

The plan judges one placement's estimate against the budget; the bill can still run past it:
a preemption re-places the job (another boot and download, and the work since its last
checkpoint again), a host trains slower than estimated, a stall waits for the watchdog.
So the engine holds the bill itself to it:
- **a re-placement** is judged against what is left (max_cost minus what the job's machines
  have billed so far, `Ledger.costs`); when nothing fits in that, the job fails naming the
  budget, what was spent and what the cheapest placement would cost;
- **while a machine runs** the monitor reads the bill every `EVERY_S` seconds; once it
  reaches max_cost the job stops and fails (`StopKind.BUDGET`), its machine released. A
  hard cap, as a spend limit is meant to be: what the job trained is not delivered (set
  max_cost with headroom over `orch plan`'s estimate). It overshoots by at most the
  seconds between two reads at the machine's price.
The charged bill only: a registered monthly server's rent is paid whatever a job does
(amortised, not charged), so it never stops a job.
"""

from __future__ import annotations

import time
from decimal import Decimal

from orchestrator.core import money, scheduler
from orchestrator.core.states import EventKind, StopKind
from orchestrator.engine.runner_core import JobFailed, RunState, Stop

EVERY_S = 5.0  # between reads of the bill while a machine runs (the overshoot's bound)


def left(state: RunState, constraints: scheduler.Constraints
         ) -> tuple[scheduler.Constraints, Decimal]:
    """`constraints` with `max_cost` narrowed to what is left of it, and what the job's
    machines have billed so far. JobFailed when nothing is left."""
    budget = constraints.max_cost
    if budget is None:
        return constraints, Decimal(0)
    spent, _ = state.ledger.costs()
    if spent <= 0:
        return constraints, spent
    if spent >= budget:
        reached(state, spent, budget)
        raise JobFailed(f"resources.max_cost {money.usd(budget)} is spent: this job's "
                        f"machines have billed {money.usd(spent)}, nothing is left to place "
                        "it again; raise resources.max_cost and submit it again")
    return constraints._replace(max_cost=budget - spent), spent


def no_fit(message: str, budget: Decimal | None, spent: Decimal) -> str:
    """The scheduler's no-fit message for a re-placement judged against what is left."""
    if budget is None or spent <= 0:
        return message
    return (f"{money.usd(spent)} of resources.max_cost {money.usd(budget)} is spent on this "
            f"job's earlier machines, {money.usd(budget - spent)} is left: {message}")


def reached(state: RunState, spent: Decimal, budget: Decimal) -> None:
    """Tell whoever asked (`notify`: job.budget_reached, scope job) that it stops work, once
    (the placement asks at every search)."""
    if state.budget_told:
        return
    state.budget_told = True
    state.notices.emit(EventKind.JOB_BUDGET_REACHED, {
        "scope": "job", "spent_usd": str(money.money(spent)),
        "budget_usd": str(budget.normalize())})


class Cap:
    """The monitor's check of the bill against `max_cost` (see the module doc)."""

    def __init__(self, state: RunState, max_cost: Decimal | None) -> None:
        self.state = state
        self.max_cost = max_cost
        self.last = 0.0

    def tick(self) -> None:
        if self.max_cost is None or self.state.stop is not None:
            return
        now = time.monotonic()
        if now - self.last < EVERY_S:
            return
        self.last = now
        spent, _ = self.state.ledger.costs()
        if spent >= self.max_cost:
            reached(self.state, spent, self.max_cost)
            self.state.signal(Stop(StopKind.BUDGET, (
                f"resources.max_cost {money.usd(self.max_cost)} reached: this job's machines "
                f"have billed {money.usd(spent)}; stopped and released, nothing delivered "
                "(raise resources.max_cost, with headroom over `orch plan`'s estimate, and "
                "submit it again)")))
