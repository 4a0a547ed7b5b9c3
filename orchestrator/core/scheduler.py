"""Rank placements over offers and registered servers; pick the cheapest that fits (pure)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import ROUND_CEILING, Decimal
from typing import NamedTuple

from orchestrator.core import evalsizing, money, savers, sizing, throughput
from orchestrator.core.evalsizing import EvalWork
from orchestrator.core.sizing import GIB, MemoryEstimate, Workload
from providers.base import Billing, GpuSpec, Offer


class Constraints(NamedTuple):
    """The job's `resources:` limits, as plain values."""

    spot: str = "allowed"  # allowed | required | never
    gpus: frozenset[str] | None = None  # canonical GPU names; None = any
    max_gpus: int = 8
    gpu_count: int | None = None  # exactly this many GPUs (resources.gpu_count)
    providers: frozenset[str] | None = None
    servers: frozenset[str] | None = None  # registered servers by name; None = any
    max_price_per_hour: Decimal | None = None
    max_cost: Decimal | None = None
    deadline_hours: float | None = None


# The offer ids of machines kept warm by earlier jobs (core.warmfit).
WARM_PREFIX = "warm:"


class Extras(NamedTuple):
    """What a host bills a job beyond its compute phases, the same on every offer: the hours
    it spends sending the results (core.delivery)."""

    delivery_hours: float = 0.0
    cheaper: str | None = None  # a cheaper delivery route, said when the budget is short


class Placement(NamedTuple):
    """One way to run the job, with its estimate and cost."""

    offer: Offer
    estimate: MemoryEstimate
    duration: throughput.Duration
    # Marginal dollars for the whole job: the host's every billed hour (boot, model download,
    # training, merge, evaluation, delivery), as the bill counts them (`orch show`, `orch cost`).
    est_cost: Decimal
    amortised_cost: Decimal | None = None  # share of a monthly rent already paid

    @property
    def est_hours(self) -> float:
        return self.duration.total

    def breakdown(self) -> str:
        """What the cost is made of: the machine's billed hours by phase."""
        o = self.offer
        rate = (f" at {money.usd(o.price_per_hour)}/h" if o.price_per_hour is not None else
                f" at {money.usd(o.monthly_price)}/month" if o.monthly_price is not None
                else "")
        phases = ", ".join(f"{name} {_span(hours)}" for name, hours in
                           self.duration.phases().items() if hours > 0)
        return f"{self.est_hours:.2f} h of {o.gpu} x{o.gpu_count}{rate} ({phases})"

    def sort_key(self) -> tuple[Decimal, float, str, str, int]:
        """Cost, then time, then a stable identity: ties never depend on input order."""
        o = self.offer
        return (self.est_cost, round(self.est_hours, 9), o.provider, o.offer_id, o.gpu_count)

    def to_dict(self) -> dict[str, object]:
        """JSON-ready summary (the `placement` shape of `orch plan --json`)."""
        o = self.offer
        return {
            "provider": o.provider,
            "offer_id": o.offer_id,
            "gpu": o.gpu,
            "gpu_count": o.gpu_count,
            "billing": o.billing.value,
            "interruptible": o.interruptible,
            "registered": o.registered,
            "price_per_hour": None if o.price_per_hour is None else str(o.price_per_hour),
            "monthly_price": None if o.monthly_price is None else str(o.monthly_price),
            "strategy": self.estimate.strategy.value,
            "required_bytes_per_gpu": self.estimate.required_bytes,
            "est_hours": round(self.est_hours, 4),
            "est_training_hours": round(self.duration.training, 4),
            "est_overhead_hours": round(self.duration.overhead, 4),
            "est_evaluation_hours": round(self.duration.evaluation, 4),
            "est_delivery_hours": round(self.duration.delivery, 4),
            "throughput_source": self.duration.source,
            "est_cost": str(self.est_cost),
            "amortised_cost": None if self.amortised_cost is None else str(self.amortised_cost),
        }


def _span(hours: float) -> str:
    """Hours as people read them: `3.14 h`, `16 min`, `<1 min`."""
    if hours >= 1:
        return f"{hours:.2f} h"
    return f"{hours * 60:.0f} min" if hours * 60 >= 0.5 else "<1 min"


@dataclass(frozen=True)
class Ranking:
    """Every feasible placement, cheapest first, and why the others were left out."""

    placements: tuple[Placement, ...]
    rejected: Mapping[str, int] = field(default_factory=dict)  # reason -> offers
    # The cheapest placement that fit but cost more than resources.max_cost: when the
    # budget is what left everything out, the error leads with it.
    over_budget: Placement | None = None

    @property
    def chosen(self) -> Placement | None:
        return self.placements[0] if self.placements else None


class NoFit(Exception):
    """No offer can run the job; the message states the smallest need and the largest offer."""


def constraint_failure(o: Offer, c: Constraints) -> str | None:
    if c.spot == "never" and o.interruptible:
        return "interruptible, but resources.spot is never"
    if c.spot == "required" and not o.interruptible:
        return "not interruptible, but resources.spot is required"
    if c.gpus is not None and o.gpu not in c.gpus:
        return "GPU not in resources.gpus"
    if o.gpu_count > c.max_gpus:
        return "more GPUs than resources.max_gpus"
    if c.gpu_count is not None and o.gpu_count != c.gpu_count:
        return "GPU count is not resources.gpu_count"
    if c.providers is not None and o.provider not in c.providers:
        return "provider not in resources.providers"
    if c.servers is not None and not (o.registered and o.offer_id.removeprefix("server:")
                                      in c.servers):
        return "not a server in resources.servers"
    if (c.max_price_per_hour is not None and o.price_per_hour is not None
            and o.price_per_hour > c.max_price_per_hour):
        return "above resources.max_price_per_hour"
    return None


def rank(
    w: Workload,
    tokens: int,
    offers: Iterable[Offer],
    gpus: Mapping[str, GpuSpec],
    constraints: Constraints = Constraints(),
    cached_on: frozenset[str] = frozenset(),
    measured: Mapping[throughput.MeasuredKey, throughput.Measured] | None = None,
    evaluation: EvalWork | None = None,
    extras: Extras = Extras(),
) -> Ranking:
    """All placements that fit and satisfy the constraints, cheapest (then fastest) first.

    `cached_on` holds offer ids whose host already has the base model (no pull);
    `measured` maps (GPU, count, method, size class) to throughput learned from finished
    jobs; where a key has a figure it replaces the formula. With `evaluation`, a machine
    must also serve the trained model (the engine evaluates on the training machine) and
    the evaluation's hours are part of each placement's; `extras` adds the delivery's
    hours to every placement's.
    """
    rejected: Counter[str] = Counter()
    placements: list[Placement] = []
    over_budget: Placement | None = None
    # Offers repeat the same few shapes; size and time each shape once, price each offer.
    fit_cache: dict[tuple[object, ...], MemoryEstimate | None] = {}
    misfits: dict[tuple[object, ...], str] = {}
    time_cache: dict[tuple[object, ...], throughput.Duration | None] = {}
    for offer in offers:
        why = constraint_failure(offer, constraints)
        if why:
            rejected[why] += 1
            continue
        if not sizing.candidate_strategies(offer.gpu_count, w):
            rejected[WRONG_COUNT] += 1
            continue
        gpu = gpus[offer.gpu]
        key = (offer.gpu_count, offer.gpu_memory_bytes, offer.ram_bytes, gpu.scaling)
        if key not in fit_cache:
            fit_cache[key] = savers.fit(w, offer.gpu_count, offer.gpu_memory_bytes,
                                        offer.ram_bytes, gpu)
        est = fit_cache[key]
        if est is None:
            if key not in misfits:
                misfits[key] = misfit(w, offer, gpu)
            rejected[misfits[key]] += 1
            continue
        dur = timed(w, tokens, offer, gpu, est, cached_on, measured, time_cache, evaluation,
                    extras)
        if dur is None:
            rejected[NO_EVAL_MEMORY] += 1
            continue
        placed = priced(offer, est, dur, constraints, extras)
        if isinstance(placed, str):
            rejected[placed] += 1
            if placed == OVER_BUDGET:
                unlimited = priced(offer, est, dur, constraints._replace(max_cost=None), extras)
                if isinstance(unlimited, Placement) and (
                        over_budget is None or unlimited.sort_key() < over_budget.sort_key()):
                    over_budget = unlimited
            continue
        placements.append(placed)
    placements.sort(key=Placement.sort_key)
    return Ranking(tuple(placements), dict(rejected), over_budget)


def misfit(w: Workload, offer: Offer, gpu: GpuSpec) -> str:
    """Why `w` does not fit `offer`: GPU memory, or for a pinned offload layout the host RAM
    (unknown, or known and too small while the GPUs would hold the rest)."""
    if w.layout not in sizing.OFFLOADED:
        return NO_MEMORY
    if offer.ram_bytes is None:
        return NO_RAM
    unlimited = savers.fit(w, offer.gpu_count, offer.gpu_memory_bytes, 1 << 62, gpu)
    return NO_MEMORY if unlimited is None else SMALL_RAM


def timed(w: Workload, tokens: int, offer: Offer, gpu: GpuSpec, est: MemoryEstimate,
          cached_on: frozenset[str],
          measured: Mapping[throughput.MeasuredKey, throughput.Measured] | None,
          cache: dict[tuple[object, ...], throughput.Duration | None],
          evaluation: EvalWork | None = None,
          extras: Extras = Extras()) -> throughput.Duration | None:
    """How long the job takes on `offer` with layout `est`, its `evaluation` and delivery
    included (None: the machine cannot serve the model for it); offers of one shape share it.

    The key is what `throughput.duration` depends on besides the job: the offer's shape
    (which fixes `est`), its boot and pull, whether the model is cached, a learned rate,
    and for the evaluation whether the machine is a container rental (vLLM installed first).
    """
    learned = measured.get(throughput.measured_key(w, offer.gpu, offer.gpu_count)) \
        if measured else None
    cached = offer.offer_id in cached_on
    rental = evaluation is not None and offer.provider in evaluation.rentals
    key = (offer.gpu, offer.gpu_count, offer.gpu_memory_bytes, offer.ram_bytes,
           offer.boot_minutes, offer.pull_gbps, cached, learned, rental)
    if key in cache:
        return cache[key]
    dur = throughput.duration(est.workload or w, tokens, offer, gpu, est.strategy,
                              model_cached=cached, measured=learned)._replace(
        delivery=extras.delivery_hours)
    served = None if evaluation is None else evalsizing.on_machine(evaluation, offer, gpu)
    found = cache[key] = (dur if evaluation is None else
                          None if served is None else dur._replace(evaluation=served[1]))
    return found


def priced(offer: Offer, est: MemoryEstimate, dur: throughput.Duration,
           c: Constraints, extras: Extras = Extras()) -> Placement | str:
    """`offer` placed for `dur` hours, or the constraint (as a rejection reason) it breaks.

    The cost is the whole bill: the machine for every hour of `dur` (delivery included), as
    the engine records it (`runner_core.Ledger.costs`)."""
    if c.deadline_hours is not None and dur.total > c.deadline_hours:
        return "slower than resources.deadline_hours"
    cost = money.job_cost(offer, dur.total)
    if c.max_cost is not None and cost > c.max_cost:
        return OVER_BUDGET
    if (c.max_price_per_hour is not None and offer.price_per_hour is None
            and cost / Decimal(repr(dur.total)) > c.max_price_per_hour):
        # A new monthly rental has no hourly price; what it costs this job per hour
        # (a whole month's commitment over the job's hours) is what the limit is about.
        return "above resources.max_price_per_hour"
    amortised = None
    if offer.billing is Billing.MONTHLY and offer.registered and offer.monthly_price:
        amortised = money.amortised_share(offer.monthly_price, dur.total)
    return Placement(offer, est, dur, cost, amortised)


def smallest_need(w: Workload, max_gpus: int = 8, gpu_count: int | None = None
                  ) -> MemoryEstimate:
    """The least per-GPU memory any layout of `w` needs (sharded over the most GPUs)."""
    best: MemoryEstimate | None = None
    for count in (1, 2, 4, 8) if gpu_count is None else (gpu_count,):
        if count > max_gpus:
            break
        for strategy in sizing.candidate_strategies(count, w):
            if strategy in sizing.OFFLOADED and w.layout == "auto":
                continue  # offload needs a known host RAM; report the GPU-only need
            for v in savers.variants(w):  # with every saver the job allows
                if sizing.layout_problem(strategy, count, str(v.optimizer)):
                    continue
                est = sizing.estimate(v, count, strategy)
                if best is None or est.required_bytes < best.required_bytes:
                    best = est
    if best is None:
        raise NoFit(sizing.pin_problem(w.layout, gpu_count, max_gpus, str(w.optimizer))
                    or f"resources.layout {w.layout} runs on no GPU count this job allows "
                       f"(max_gpus {max_gpus}); set resources.layout: auto or allow more GPUs")
    return best


def choose(
    w: Workload,
    tokens: int,
    offers: Iterable[Offer],
    gpus: Mapping[str, GpuSpec],
    constraints: Constraints = Constraints(),
    cached_on: frozenset[str] = frozenset(),
    measured: Mapping[throughput.MeasuredKey, throughput.Measured] | None = None,
    evaluation: EvalWork | None = None,
    extras: Extras = Extras(),
) -> tuple[Placement, Ranking]:
    """The cheapest feasible placement (arguments as `rank`), or NoFit explaining the gap."""
    offers = list(offers)
    ranking = rank(w, tokens, offers, gpus, constraints, cached_on, measured, evaluation,
                   extras)
    if ranking.chosen is not None:
        return ranking.chosen, ranking
    raise NoFit(no_fit_message(w, offers, ranking, constraints, extras))


NO_MEMORY = "does not fit in GPU memory"
NO_EVAL_MEMORY = "cannot serve the trained model for the evaluation (GPU memory)"
WRONG_COUNT = "GPU count does not suit resources.layout"
NO_RAM = "host RAM unknown, and resources.layout offloads to it"
SMALL_RAM = "host RAM too small for the state resources.layout offloads to it"
OVER_BUDGET = "above resources.max_cost"
# What to change for each reason an offer was left out.
_ADVICE = {
    NO_MEMORY: "a shorter training.sequence_len, a smaller micro_batch_size, method qlora, "
               "or a larger server registered with `orch servers add`",
    "interruptible, but resources.spot is never": "resources.spot: allowed",
    "not interruptible, but resources.spot is required": "resources.spot: allowed",
    "GPU not in resources.gpus": "more GPU models in resources.gpus (or any)",
    "more GPUs than resources.max_gpus": "a higher resources.max_gpus",
    "GPU count is not resources.gpu_count": "another resources.gpu_count, or leave it out",
    "provider not in resources.providers": "more providers in resources.providers (or any), "
                                           "or `orch servers add` for `dedicated`",
    "above resources.max_price_per_hour": "a higher resources.max_price_per_hour",
    "not a server in resources.servers": "more servers in resources.servers (see `orch "
                                         "servers list`), or remove it to use any provider",
    "slower than resources.deadline_hours": "a later resources.deadline_hours",
    NO_EVAL_MEMORY: "a shorter training.sequence_len (vLLM's context), method qlora (the "
                    "4-bit base is served with the adapter), more GPUs per machine "
                    "(resources.max_gpus), or no eval section",
    WRONG_COUNT: "resources.layout: auto, or a layout for that many GPUs",
    NO_RAM: "resources.layout: auto, or offers whose host RAM is known (RunPod's listed "
            "pods, live Vast.ai offers, the dedicated-host tiers that publish it)",
    SMALL_RAM: "resources.layout: auto, more GPUs per machine (resources.max_gpus), or a "
               "machine with more host RAM",
    "above resources.max_cost": "a higher resources.max_cost",
}


def no_fit_message(w: Workload, offers: list[Offer], ranking: Ranking,
                   constraints: Constraints, extras: Extras = Extras()) -> str:
    """Why nothing was placed: the smallest need, the largest eligible offer, what to change.

    When offers fit but all cost more than resources.max_cost, the money comes first: the
    memory figures do not say what to change then.
    """
    cheapest = ranking.over_budget
    if cheapest is not None and constraints.max_cost is not None:
        o = cheapest.offer
        reasons = "; ".join(f"{n} {r}" for r, n in sorted(ranking.rejected.items()))
        return (f"no placement fits resources.max_cost: the cheapest that fits costs "
                f"{money.usd(cheapest.est_cost)} > max_cost "
                # the user's own figure as written: rounded to cents, $0.00001 read "$0.0000"
                f"${constraints.max_cost.normalize():f} ({o.provider}: {cheapest.breakdown()}). "
                "Try resources.max_cost: "
                f"{_round_up_cents(cheapest.est_cost)} or more, or fewer training.epochs"
                + f". Left out: {reasons}."
                + (f" {extras.cheaper}." if extras.cheaper else ""))
    need = smallest_need(w, constraints.max_gpus, constraints.gpu_count)
    plural = "s" if need.gpu_count > 1 else ""
    need_txt = (f"the job needs at least {need.required_bytes / GIB:.1f} GiB per GPU "
                f"({need.strategy.value} on {need.gpu_count} GPU{plural}, headroom "
                f"{need.headroom:.0%})")
    eligible = [o for o in offers if constraint_failure(o, constraints) is None]
    largest = max(eligible, key=lambda o: (o.gpu_memory_bytes, o.gpu_count), default=None)
    if largest is None:
        offer_txt = "no offer passes the job's resources constraints"
    else:
        offer_txt = (f"the largest eligible offer has {largest.gpu_memory_bytes / GIB:.1f} GiB "
                     f"per GPU ({largest.gpu} x{largest.gpu_count}, {largest.provider})")
    reasons = "; ".join(f"{n} {r}" for r, n in sorted(ranking.rejected.items())) or "no offers"
    advice = [_ADVICE[r] for r in sorted(ranking.rejected) if r in _ADVICE]
    if w.layout != "auto" and "resources.layout: auto" not in " ".join(advice):
        advice.insert(0, "resources.layout: auto (orch then shards or offloads where needed)")
    tail = f" Try {'; or '.join(advice)}." if advice else ""
    pinned = f"resources.layout {w.layout}: " if w.layout != "auto" else ""
    return f"{pinned}no placement fits: {need_txt}; {offer_txt}. Left out: {reasons}.{tail}"


def _round_up_cents(value: Decimal) -> str:
    """The smallest whole-cent budget that covers `value` (what to write in the job file)."""
    return str(value.quantize(Decimal("0.01"), rounding=ROUND_CEILING))
