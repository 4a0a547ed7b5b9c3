"""`resources.max_cost` over the whole job, as docs/job-file.md defines it ("Most USD for
the whole job"), not only over the first placement's estimate.

The plan judges one placement's estimate against the budget; the bill can still run past it:
a preemption re-places the job (another boot and download, and the work since its last
checkpoint again), a host trains slower than estimated, a stall waits for the watchdog.
So the engine holds the bill itself to it:
- **while a machine runs** the monitor reads the bill (`Ledger.costs`: every machine of the
  job, the running one to now) every `EVERY_S` seconds; once it reaches max_cost the job
  stops and fails (`StopKind.BUDGET`), its machine released. A hard cap, as a spend limit
  is meant to be: the job is not finished (merging, evaluating, delivering are billed too),
  but it keeps what is home already, at no further cost (`Teardown.keep_checkpoint`): the
  trained model when the cap stops the evaluation, else the newest checkpoint orch had
  mirrored. It overshoots by at most the seconds between two reads at the machine's price.
  Not while releasing: the job is done then.
- **a re-placement** (after a preemption, a move, a failed host check) is refused when the
  bill has reached max_cost already. It is not refused for want of the whole job's estimate
  in what is left: the work done up to the last checkpoint is not paid again, and the cap
  stops the bill wherever it ends.
The charged bill only: a registered monthly server's rent is paid whatever a job does
(amortised, not charged), so it never stops a job.
"""

from __future__ import annotations

import threading
import time
from decimal import Decimal

from orchestrator.core import money
from orchestrator.core.jobstatus import JobStatus
from orchestrator.core.states import EventKind, StopKind
from orchestrator.engine.runner_core import JobFailed, RunState, Stop

EVERY_S = 5.0  # between reads of the bill while a machine runs (the overshoot's bound)
_TOLD = threading.Lock()  # the pipeline's and the monitor's threads both may say it


class BudgetSpent(JobFailed):
    """The job's machines have billed resources.max_cost: nothing may be rented for it."""


def check_left(state: RunState, budget: Decimal | None) -> None:
    """Before renting: BudgetSpent when the job's machines have billed `budget` already."""
    if budget is None:
        return
    spent, _ = state.ledger.costs()
    if spent >= budget:
        reached(state, spent, budget)
        raise BudgetSpent(f"resources.max_cost {money.usd(budget)} is spent: this job's "
                          f"machines have billed {money.usd(spent)}, nothing is left to "
                          "place it again; raise resources.max_cost and submit it again")


def reached(state: RunState, spent: Decimal, budget: Decimal) -> None:
    """Tell whoever asked (`notify`: job.budget_reached, scope job) that it stops work, once
    a run (the placement asks at every search, the monitor at every read)."""
    with _TOLD:
        if state.budget_told:
            return
        state.budget_told = True
    state.notices.emit(EventKind.JOB_BUDGET_REACHED, {
        "scope": "job", "spent_usd": str(money.money(spent)),
        "budget_usd": format(budget.normalize(), "f")})


class Cap:
    """The monitor's check of the bill against `max_cost` (see the module doc)."""

    def __init__(self, state: RunState, max_cost: Decimal | None) -> None:
        self.state = state
        self.max_cost = max_cost
        self.last = 0.0

    def tick(self) -> None:
        if self.max_cost is None or self.state.stop is not None \
                or self.state.ledger.progress.status is JobStatus.RELEASING:
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
                f"have billed {money.usd(spent)}; stopped and released (raise "
                "resources.max_cost, with headroom over `orch plan`'s estimate, and submit it "
                "again)")))
