"""`orch plan` for a job with `resources.deadline_hours` (issue 41, docs/deadline.md).

After the placements: each strategy's expected cost, chance of missing the deadline and
hours (`core.deadlineplan`), with the preemption rate used. A deadline no placement can
meet is refused before anything is rented, naming the fastest placement and the deadline
it needs (exit 3, as the plan's other refusals).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from orchestrator.core import preemption, savers
from orchestrator.core.preemption import Rate

if TYPE_CHECKING:
    from orchestrator.core.checkpointing import Interval, Spot
    from orchestrator.core.deadlineplan import DeadlinePlan
    from orchestrator.core.planning import Plan
    from orchestrator.core.restarts import Measured
    from orchestrator.core.scheduler import Placement
    from orchestrator.core.spec import LoadedJob


def estimates(plan: Plan) -> DeadlinePlan | None:
    """The deadline estimates of `plan`'s job (None: no deadline, or no spot to weigh)."""
    res = plan.job.spec.resources
    if res.deadline_hours is None:
        return None
    from orchestrator.core import deadlineplan  # its simulator: only for a job with a deadline

    compared = deadlineplan.compared(plan.ranking.placements)
    spot = compared[0]
    rate = rate_of(spot.offer.provider, spot.offer.gpu) if spot is not None else None
    keys = {(p.offer.provider, p.offer.gpu) for p in compared if p is not None}
    return deadlineplan.for_plan(plan.ranking.placements, res.deadline_hours,
                                 rate or preemption.rate(),
                                 checkpoint=spot_checkpoints(plan, spot, rate),
                                 measured=restart_times(keys))


def spot_checkpoints(plan: Plan, spot: Placement | None, rate: Rate | None) -> Interval:
    """How often the job would checkpoint on the spot placement (as the engine renders it:
    `Inputs.checkpoint_interval`), or `ORCH_CHECKPOINT_EVERY_S` without one."""
    from orchestrator.core import checkpointing
    from orchestrator.core.settings import settings
    from orchestrator.core.sizing import checkpoint_bytes

    longest = settings().checkpoint_every_s
    if spot is None or rate is None:
        return checkpointing.interval(longest)
    size = checkpoint_bytes(spot.estimate.workload or savers.fallback(plan.workload),
                            spot.estimate.strategy)
    return checkpointing.interval(longest, spot_risk(spot, rate), size)


def spot_risk(spot: Placement, rate: Rate | None = None) -> Spot:
    """What the engine chooses a spot rental's checkpoint interval from (engine/hostchecks
    `spot_risk`), read-only: the GPU's preemption rate (`rate`, else orch's history with the
    prior) and the host check's disk floor for the offer's download rate."""
    from orchestrator.core.checkpointing import Spot
    from playbooks.hostreport import thresholds

    rate = rate or rate_of(spot.offer.provider, spot.offer.gpu)
    return Spot(rate.preemptions_per_hour, thresholds().disk.floor(spot.offer.pull_bytes_per_s))


def restart_times(keys: set[tuple[str, str]]) -> dict[tuple[str, str], Measured]:
    """The measured rental-to-first-step seconds of each (provider, GPU) of `keys`,
    read-only (none: the plan's boot + download stand)."""
    from orchestrator.core.paths import default_db_url
    from orchestrator.records.readonly import Unavailable, restart_times

    try:
        return restart_times(default_db_url(), keys)
    except Unavailable:
        return {}


def rates() -> dict[tuple[str, str], Rate]:
    """Every (provider, GPU)'s learned spot preemption rate, read-only (none: the prior's)."""
    from orchestrator.core.paths import default_db_url
    from orchestrator.records.readonly import Unavailable, preemption_rates

    try:
        return preemption_rates(default_db_url())
    except Unavailable:  # the plan notes an unreadable database once; the prior stands
        return {}


def rate_of(provider: str, gpu: str) -> Rate:
    """`provider`'s spot `gpu` preemption rate: orch's history with the prior, or the prior."""
    return rates().get((provider, gpu)) or preemption.rate()


def short(rate: Rate) -> str:
    """A table cell: `0.30/h prior` or `0.25/h (2 in 10 h)`."""
    if not rate.hours:
        return f"{rate.preemptions_per_hour:.2f}/h prior"
    return f"{rate.preemptions_per_hour:.2f}/h ({rate.interruptions} in {rate.hours:.0f} h)"


def without_deadline(job: LoadedJob) -> LoadedJob:
    """`job` with no deadline (to find its fastest placement)."""
    resources = job.spec.resources.model_copy(update={"deadline_hours": None})
    return job._replace(spec=job.spec.model_copy(update={"resources": resources}))


def too_short(job: LoadedJob, fastest: Plan) -> str:
    """The refusal of a deadline shorter than the fastest placement needs."""
    best = min(fastest.ranking.placements, key=lambda p: p.est_hours)
    o = best.offer
    need = math.ceil(best.est_hours * 100) / 100
    return (f"error: {job.path}: resources.deadline_hours: {job.spec.resources.deadline_hours:g} "
            f"h is shorter than the fastest placement needs ({best.est_hours:.2f} h on "
            f"{'spot' if o.interruptible else 'on-demand'} {o.gpu} x{o.gpu_count}, "
            f"{o.provider}); set deadline_hours to at least {need:g} or remove it")
