"""What `orch plan` says of a job with a deadline: each strategy's expected cost and risk.

From the plan's ranking, the cheapest spot and the cheapest on-demand placement give the
prices, the work (training, merge, evaluation and delivery hours, on-demand's estimate) and
the restarts (boot + model download of each); the spot GPU's preemption rate is given
(`core.preemption.Rate`: the prior, or orch's history where the caller has it).
`core.deadlinesim.estimate` replays on-demand only, spot only and the policy over seeded
traces of that rate (docs/deadline.md, "Wiring it in": `orch plan`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from orchestrator.core import checkpointing, restarts
from orchestrator.core import deadlinesim as ds
from orchestrator.core.checkpointing import Interval
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
    market: Market | None = None  # the prices and restarts the estimates were made with
    # Where each restart came from: "plan" (boot + download) or "measured: ..." (core.restarts).
    restart_source: tuple[str, str] = ("plan", "plan")
    checkpoint: Interval | None = None  # how often the job checkpoints on spot

    def to_dict(self) -> dict[str, object]:
        """`orch plan --json`'s `deadline` object."""
        out: dict[str, object] = {
            "deadline_hours": self.hours, "preemptions": self.rate.describe(),
            "preemptions_per_hour": round(self.rate.preemptions_per_hour, 4),
            "strategies": [e.to_dict() for e in self.estimates.all()]}
        if self.market is not None:
            out["restarts"] = {
                "spot_s": round(self.market.spot_restart.seconds, 1),
                "spot_source": self.restart_source[0],
                "on_demand_s": round(self.market.on_demand_restart.seconds, 1),
                # What the deadline's margins budget for the fallback to on-demand.
                "on_demand_slow_s": round(self.market.on_demand_restart.slow_s, 1),
                "on_demand_source": self.restart_source[1]}
        if self.checkpoint is not None:
            out["spot_checkpoint_every_s"] = round(self.checkpoint.seconds, 1)
        return out

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
        if self.market is not None:
            m, (ss, ods) = self.market, self.restart_source
            od_restart = m.on_demand_restart
            budget = (f"; its margins budget a slow one, {od_restart.slow_s / 60:.1f} min"
                      if od_restart.slow_extra_s > 0 else "")
            out.append(f"restarts: spot {m.spot_restart.seconds / 60:.1f} min ({ss}), "
                       f"on-demand {od_restart.seconds / 60:.1f} min ({ods}{budget})")
        if self.checkpoint is not None:
            out.append(f"checkpoints on spot: {self.checkpoint.describe()}")
        return out


def restart_of(p: Placement, seen: Mapping[restarts.Key, restarts.Measured],
               own_s: float | None = None) -> tuple[Restart, str]:
    """The plan's boot + download, or the restart measured if longer, and which it is: `own_s`
    (the engine's run, rental to its first step) when given, else orch's recent rentals of
    that provider's GPU (`core.restarts`). One rule for `orch plan` and the engine's policy."""
    boot, pull = p.duration.boot * 3600, p.duration.model_pull * 3600
    history = seen.get((p.offer.provider, p.offer.gpu))
    if own_s:
        seconds, source = own_s, f"measured on this run: {own_s:.0f} s"
    elif history is not None:
        seconds, source = history.seconds, f"measured: {history.describe()}"
    else:
        seconds, source = 0.0, "plan"
    # A slow restart of that provider's GPU (its history's 90th percentile), beyond the one
    # planned with: what the deadline's margins budget (core/deadline.Restart.slow_extra_s).
    usual = max(seconds, boot + pull)
    extra = max(0.0, history.slow - usual) if history is not None else 0.0
    if seconds <= boot + pull:
        return Restart(boot_s=boot, download_s=pull, slow_extra_s=extra), "plan"
    return Restart(boot_s=boot, download_s=pull, resume_s=seconds - boot - pull,
                   slow_extra_s=extra), source


def compared(placements: tuple[Placement, ...]) -> tuple[Placement | None, Placement | None]:
    """The cheapest spot and the cheapest on-demand placement of a ranking: what a deadline's
    estimate compares (and whose restarts the caller reads)."""
    return (next((p for p in placements if p.offer.interruptible), None),
            next((p for p in placements if not p.offer.interruptible), None))


def for_plan(placements: tuple[Placement, ...], deadline_hours: float,
             rate: Rate, runs: int = 64,
             checkpoint: Interval | None = None,
             measured: Mapping[restarts.Key, restarts.Measured] | None = None,
             ) -> DeadlinePlan | None:
    """The estimates for a job with `deadline_hours` over its ranked `placements`; None
    when there is no spot or no on-demand placement to compare. `checkpoint`: how often it
    checkpoints on spot (default: the engine's default interval). `measured`: the restarts
    orch measured (`core.restarts`), where it has any."""
    checkpoint = checkpoint or checkpointing.interval(CHECKPOINT_EVERY_S)
    checkpoint_every_s = checkpoint.seconds
    spot, od = compared(placements)
    if spot is None or od is None or spot.offer.price_per_hour is None \
            or od.offer.price_per_hour is None:
        return None
    d = od.duration
    work_s = (d.training + d.merge + d.evaluation + d.delivery) * 3600
    job = ds.Job(work_s=work_s, window_s=deadline_hours * 3600,
                 checkpoint_every_s=min(checkpoint_every_s, max(1.0, d.training * 3600)))
    (spot_restart, spot_source), (od_restart, od_source) = (
        restart_of(spot, measured or {}), restart_of(od, measured or {}))
    market = Market(spot_per_hour=spot.offer.price_per_hour,
                    on_demand_per_hour=od.offer.price_per_hour,
                    preemptions_per_hour=rate.preemptions_per_hour,
                    spot_restart=spot_restart, on_demand_restart=od_restart)
    return DeadlinePlan(deadline_hours, ds.estimate(job, market, rate.wait_mean_h, runs),
                        rate, od, spot, market, (spot_source, od_source), checkpoint)
