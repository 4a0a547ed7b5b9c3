"""What `orch plan` says of a job with a deadline: each strategy's expected cost and risk.

From the plan's ranking, the cheapest spot and the cheapest on-demand placement give the
prices, the work (training, merge, evaluation and delivery hours, on-demand's estimate) and
the restarts (boot + model download of each); the spot GPU's preemption rate is given
(`core.preemption.Rate`: the prior, or orch's history where the caller has it).
`core.deadlinesim.estimate` replays on-demand only, spot only and the policy over seeded
traces of that rate (docs/deadline.md, "Wiring it in": `orch plan`).
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.core import deadlinesim as ds
from orchestrator.core.deadline import Market, Restart
from orchestrator.core.preemption import Rate
from orchestrator.core.scheduler import Placement
from orchestrator.core.settings import CHECKPOINT_EVERY_S  # the engine's default interval


@dataclass(frozen=True)
class DeadlinePlan:
    """The estimates for one job with a deadline, and what they were made from."""

    hours: float
    estimates: ds.Estimates
    rate: Rate
    on_demand: Placement | None
    spot: Placement | None

    def to_dict(self) -> dict[str, object]:
        """`orch plan --json`'s `deadline` object."""
        return {"deadline_hours": self.hours, "preemptions": self.rate.describe(),
                "preemptions_per_hour": round(self.rate.preemptions_per_hour, 4),
                "strategies": [e.to_dict() for e in self.estimates.all()]}

    def lines(self) -> list[str]:
        """The table `orch plan` prints after the placements."""
        od = self.estimates.on_demand
        out = [f"deadline {self.hours:g} h: on-demand needs {od.hours:.2f} h",
               f"{'strategy':22}{'expected':>10}{'chance of missing':>20}{'hours':>8}"]
        for e in self.estimates.all():
            name = {"on_demand": "on-demand only", "spot": "spot only"}.get(
                e.plan.value, f"policy ({e.mode})" if e.mode else "policy")
            out.append(f"{name:22}{'$' + format(e.cost, 'f'):>10}{e.p_miss:>19.0%} "
                       f"{e.hours:>8.2f}")
        out.append(f"preemptions {self.rate.describe()}; spot gone "
                   f"{self.rate.wait_mean_h:.2f} h after one (prior)")
        return out


def _restart(p: Placement) -> Restart:
    return Restart(boot_s=p.duration.boot * 3600, download_s=p.duration.model_pull * 3600)


def for_plan(placements: tuple[Placement, ...], deadline_hours: float,
             rate: Rate, runs: int = 64,
             checkpoint_every_s: float = CHECKPOINT_EVERY_S) -> DeadlinePlan | None:
    """The estimates for a job with `deadline_hours` over its ranked `placements`; None
    when there is no spot or no on-demand placement to compare."""
    spot = next((p for p in placements if p.offer.interruptible), None)
    od = next((p for p in placements if not p.offer.interruptible), None)
    if spot is None or od is None or spot.offer.price_per_hour is None \
            or od.offer.price_per_hour is None:
        return None
    d = od.duration
    work_s = (d.training + d.merge + d.evaluation + d.delivery) * 3600
    job = ds.Job(work_s=work_s, window_s=deadline_hours * 3600,
                 checkpoint_every_s=min(checkpoint_every_s, max(1.0, d.training * 3600)))
    market = Market(spot_per_hour=spot.offer.price_per_hour,
                    on_demand_per_hour=od.offer.price_per_hour,
                    preemptions_per_hour=rate.preemptions_per_hour,
                    spot_restart=_restart(spot), on_demand_restart=_restart(od))
    return DeadlinePlan(deadline_hours, ds.estimate(job, market, rate.wait_mean_h, runs),
                        rate, od, spot)
