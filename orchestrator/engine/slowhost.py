"""Moving a training that runs far below its plan on a rented machine (issue 40 §3).

`SlowWatch` follows the training's steps as the pipeline polls them. Once the rate has been
measured for the policy's while (`hostmemory.MovePolicy.min_observed_s`), it asks
`hostmemory.move_or_stay` whether finishing elsewhere is cheaper than staying: the steps
left at the measured rate and this machine's price, against the setup elsewhere (what this
attempt's own setup took: boot, check, model download), the steps left and those since the
last checkpoint at the plan's rate. A move is the existing resume path: the machine's
measured fraction is remembered (a `run` observation: priced or avoided next time) and the
attempt stops as an interruption, so the job is placed again and resumes from its newest
checkpoint. A registered server is never moved from (its rent is paid).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from orchestrator.core.hostmemory import MoveCase, MoveDecision, Source, move_or_stay, policy
from orchestrator.core.states import StopKind
from orchestrator.engine.runner_core import Ledger, Placed, Stop
from orchestrator.records.store import utcnow


class SlowWatch:
    """Measures one attempt's training rate against its plan and stops it when a move pays."""

    def __init__(self, ledger: Ledger, placed: Placed, planned_s: float | None,
                 save_steps: int, observed_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ledger = ledger
        self.placed = placed
        self.planned_s = planned_s  # the plan's training seconds (None: no plan, no move)
        self.save_steps = max(1, save_steps)
        rules = policy()
        if observed_s is not None:
            rules = rules.model_copy(update={"move": rules.move.model_copy(
                update={"min_observed_s": observed_s})})
        self.rules = rules
        self.clock = clock
        self.first: tuple[float, int] | None = None  # (when, step) of the first step seen
        self.setup_s: float | None = None
        self.decided = False

    def sample(self, step: int | None, total: int | None) -> None:
        """A poll saw `step` of `total`: raise Stop(interrupted) when moving pays."""
        if self.decided or step is None or not total or not self.planned_s:
            return
        now = self.clock()
        if self.first is None:
            # This attempt's setup: from its instance's create to the first step (boot,
            # connect, check, model download): what a new machine would take again.
            self.first, self.setup_s = (now, step), self._since_create()
            return
        since, first_step = self.first
        observed = now - since
        if step <= first_step or observed < self.rules.move.min_observed_s:
            return
        decision = self.decide(step, total, (step - first_step) / observed, observed)
        if decision is not None and decision.move:
            self.move(decision, (step - first_step) / observed * self.planned_s / total)

    def decide(self, step: int, total: int, rate: float, observed: float) -> MoveDecision | None:
        """move_or_stay for the steps left (None: this machine's price is unknown)."""
        price = self.placed.inst.price_per_hour
        if price is None or not self.planned_s:
            return None
        case = MoveCase(remaining=float(total - step), measured_rate=rate,
                        planned_rate=total / self.planned_s, price_here=price,
                        price_elsewhere=price, setup_elsewhere_s=self.setup_s or 0.0,
                        redo=float(step % self.save_steps), observed_s=observed)
        return move_or_stay(case, self.rules)

    def _since_create(self) -> float:
        for row in self.ledger.store.instances_of(self.ledger.job_id):
            if row.id == self.placed.row_id:
                return max(0.0, (utcnow() - row.created_at).total_seconds())
        return 0.0

    def move(self, decision: MoveDecision, delivered: float) -> None:
        """Remember the machine's speed and stop the attempt (re-placed, resumed)."""
        self.decided = True
        inst = self.placed.inst
        if inst.machine_id:
            self.ledger.store.record_host_observation(
                inst.provider, inst.machine_id, Source.RUN, failed=False,
                delivered=round(delivered, 4), why=f"trained at {delivered:.0%} of its plan; "
                f"moved: {decision.reason}", job_id=self.ledger.job_id)
        self.ledger.event("host.slow_move", f"{inst.provider} instance {inst.instance_id} "
                          f"trains at {delivered:.0%} of the plan: {decision.reason}; moving "
                          "to another machine (resumes from the last checkpoint)",
                          {"instance": inst.instance_id, "machine_id": inst.machine_id,
                           "delivered": round(delivered, 4),
                           "stay_usd": str(decision.stay_usd),
                           "move_usd": str(decision.move_usd)})
        raise Stop(StopKind.INTERRUPTED, f"moved off {inst.provider} instance "
                   f"{inst.instance_id}: trained at {delivered:.0%} of the plan "
                   f"(${decision.move_usd} to move against ${decision.stay_usd} to stay)",
                   given_up=True)


def planned_seconds(est_train_hours: float | None, done: float = 0.0) -> float | None:
    """The plan's training seconds for the whole run (None: the job has no plan to measure
    against). `done`: the share a checkpoint it resumed from holds (`LoadedJob.done`), which
    its plan left out, where the trainer's step count (what a rate is measured against)
    counts the whole run."""
    if not est_train_hours or done >= 1:
        return None
    return est_train_hours * 3600 / (1 - done)

