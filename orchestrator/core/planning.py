"""Assemble a plan: job file → workload → offers (catalog + registered servers) → ranking."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, NamedTuple

from orchestrator.core import evalsizing, offerbook, savers, scheduler, warmfit
from orchestrator.core.delivery import Delivery, plan_delivery
from orchestrator.core.money import usd
from orchestrator.core.savers import Choice
from orchestrator.core.savers import choices as savers_choices
from orchestrator.core.scheduler import Constraints, Extras, Placement, Ranking
from orchestrator.core.sizing import MemoryEstimate, Workload
from orchestrator.core.spec import LoadedJob
from orchestrator.core.throughput import Measured, MeasuredKey
from orchestrator.core.utc import iso_z
from playbooks import images
from providers import catalog
from providers.base import Billing, Offer, Requirements
from providers.catalog import snapshot
from providers.dedicated.compute import RegisteredServer, server_offers

# Adapters with live offers; the engine asks them, `orch plan` too when a key is configured
# (the catalog stands in for them otherwise).
LIVE_PROVIDERS = frozenset({"vastai", "runpod"})
DISK_GB = 100  # the disk a rental is searched and priced with (engine Options.disk_gb)
# Whose machines are containers of the trainer image (no Docker): the live ones and the
# per-second catalog that stands in for them. Their evaluation installs vLLM first.
CONTAINER_RENTALS = LIVE_PROVIDERS | {"cloud"}

__all__ = ["Plan", "RegisteredServer", "make_plan", "server_offers"]


class Plan(NamedTuple):
    """What `orch plan` shows and `orch submit` records."""

    job: LoadedJob
    workload: Workload
    ranking: Ranking
    chosen: Placement
    unpriced: tuple[catalog.UnpricedTier, ...]
    # Each saver "auto" turned on, and the cheapest placement without it (None: no fit).
    without_savers: tuple[tuple[Choice, Placement | None], ...] = ()
    # Where vLLM serves the evaluation (None: the job has no eval, or nothing holds it).
    evaluation: evalsizing.EvalPlan | None = None
    # A machine kept warm by an earlier job that the plan uses, and what it saves.
    warm: warmfit.Saving | None = None
    warm_machines: tuple[warmfit.WarmMachine, ...] = ()

    @property
    def estimate(self) -> MemoryEstimate:
        return self.chosen.estimate

    @property
    def choices(self) -> tuple[Choice, ...]:
        """What the planner decided for the job's "auto" settings on the chosen placement."""
        return savers_choices(self.workload, self.estimate)

    def to_dict(self, alternatives: int = 20) -> dict[str, Any]:
        """The `orch plan --json` object."""
        est = self.estimate
        spec = self.job.spec
        return {
            "job": spec.name,
            "file": str(self.job.path),
            "spec_hash": self.job.spec_hash,
            "base_model": spec.base_model.repo,
            "params": self.workload.arch.params,
            "trainable_params": self.workload.trainable_params,
            "tokens": {"per_epoch": self.job.dataset.tokens,
                       "epochs": spec.training.epochs,
                       "total": total_tokens(self.job._replace(done=0.0)),
                       # What this job trains: less when it resumes from a checkpoint.
                       "left": total_tokens(self.job),
                       "source": self.job.dataset.source},
            "estimate": estimate_dict(est),
            # resources.layout as asked ("auto" or a pin) and the layout the plan uses.
            "layout": {"requested": self.workload.layout, "used": est.strategy.value},
            "savers": [{"setting": f"training.{c.name}", "value": c.value,
                        "saved_bytes_per_gpu": c.saved_bytes, "why": c.describe()}
                       for c in self.choices],
            "savers_why": saver_lines(self),
            "placement": placement_dict(self.chosen),
            "alternatives": [placement_dict(p)
                             for p in self.ranking.placements[1:1 + alternatives]],
            "feasible": len(self.ranking.placements),
            "rejected": dict(self.ranking.rejected),
            "unpriced_tiers": [f"{u.provider}:{u.name}" for u in self.unpriced],
            "evaluation": None if self.evaluation is None else self.evaluation.to_dict(),
            "why": why(self),
            "delivery": self.delivery.to_dict(),
            "warm": self.warm_dict(),
        }

    def warm_dict(self) -> dict[str, Any] | None:
        """The warm machine the plan uses, with the fresh placement it beats (None: none)."""
        if self.warm is None:
            return None
        wid = warmfit.warm_id(self.warm.warm.offer)
        m = next(m for m in self.warm_machines if m.warm_id == wid)
        fresh = self.warm.fresh
        return {"warm_id": wid, "instance_id": m.instance_id, "provider": m.offer.provider,
                "parked_by": m.parked_by, "expires_at": iso_z(m.expires_at),
                "model_cached": self.warm.warm.duration.model_pull == 0,
                "est_cost": str(self.warm.warm.est_cost),
                "fresh_est_cost": None if fresh is None else str(fresh.est_cost),
                "saves": None if self.warm.saves is None else str(self.warm.saves)}

    @property
    def delivery(self) -> Delivery:
        """What the job delivers and where, with its time and cost on the chosen host (a
        part of the chosen placement's cost: `Placement.duration.delivery`)."""
        c = self.chosen
        hours = Decimal(str(c.est_hours))
        hourly = c.est_cost / hours if hours > 0 else Decimal(0)
        return plan_delivery(self.job, self.workload.trainable_params, hourly)


def placement_dict(p: Placement) -> dict[str, Any]:
    """A placement's JSON shape with where its offer's price comes from (`source`: "live",
    "snapshot 2026-12-06", "seed catalog", "registered", "kept warm", "simulated")."""
    return {**p.to_dict(), "source": snapshot.label(p.offer)}


def estimate_dict(est: MemoryEstimate) -> dict[str, Any]:
    """JSON shape of a MemoryEstimate."""
    return {
        "method": est.method,
        "gpu_count": est.gpu_count,
        "strategy": est.strategy.value,
        "peak_bytes": est.peak_bytes,
        "required_bytes": est.required_bytes,
        "headroom": est.headroom,
        "host_ram_bytes": est.host_ram_bytes,
        "components": dict(est.components),
        "savers": list(est.savers),
        "notes": list(est.notes),
    }


def workload_from(job: LoadedJob) -> Workload:
    """The sizing inputs of a validated job."""
    s = job.spec
    return Workload(
        arch=job.architecture,
        method=s.method,
        sequence_len=s.training.sequence_len,
        micro_batch_size=s.training.micro_batch_size,
        optimizer=s.training.optimizer,
        gradient_checkpointing=s.training.gradient_checkpointing,
        lora_r=s.lora.r,
        lora_modules=s.lora.modules,
        lora_dropout=s.lora.dropout,
        headroom=s.resources.headroom,
        cross_entropy=s.training.cross_entropy,
        activation_offloading=s.training.activation_offloading,
        layout=s.resources.layout,
    )


def host_disk_gb(job: LoadedJob, minimum: int = DISK_GB) -> int:
    """Disk (GB) the job's host needs: the base model's cache (x1.1, as the model_cache
    playbook checks), the merged model beside it, and 10 GB for checkpoints, the data and
    the image's caches. A rental's disk is asked for (and billed) at this size."""
    model = job.architecture.params * 2  # bf16 safetensors
    merged = model if job.spec.method != "full" else 0
    need = model * 1.1 + merged + 10e9
    return max(minimum, math.ceil(need / 1e9))


def extras_for(job: LoadedJob) -> Extras:
    """What every placement of `job` bills beyond its compute phases: the delivery's hours."""
    # The hours do not depend on the host; the cheaper route's wording needs a rate.
    delivery = plan_delivery(job, workload_from(job).trainable_params, Decimal(1))
    return Extras(delivery_hours=delivery.hours, cheaper=delivery.cheaper(with_cost=False))


def total_tokens(job: LoadedJob) -> int:
    """Tokens left to train over all epochs: all of them, or what a checkpoint the job
    resumes from has not trained yet (`LoadedJob.done`)."""
    return max(1, round(job.dataset.tokens * job.spec.training.epochs * (1 - job.done)))


def constraints_from(job: LoadedJob) -> Constraints:
    """The job's resources section as scheduler constraints."""
    r = job.spec.resources
    gpus = None
    if r.gpus is not None:
        gpus = frozenset(name for g in r.gpus for name in catalog.resolve_gpu(g))
    return Constraints(
        spot=r.spot,
        gpus=gpus,
        max_gpus=r.max_gpus,
        gpu_count=r.gpu_count,
        providers=None if r.providers is None else frozenset(r.providers),
        servers=None if r.servers is None else frozenset(r.servers),
        max_price_per_hour=r.max_price_per_hour,
        max_cost=r.max_cost,
        deadline_hours=r.deadline_hours,
    )


def requirements(c: Constraints, disk_gb: int, min_cuda: str | None) -> list[Requirements]:
    """What to ask a live provider for a job with constraints `c`: one search per GPU count
    it allows (1, 2, 4, 8), any memory (the scheduler sizes), its spot rule and price cap."""
    spot = {"required": True, "never": False}.get(c.spot)
    return [Requirements(gpu_count=n, min_gpu_memory_bytes=0, gpus=c.gpus, interruptible=spot,
                         max_price_per_hour=c.max_price_per_hour, disk_gb=disk_gb,
                         min_cuda=min_cuda)
            for n in (1, 2, 4, 8) if n <= c.max_gpus]


def make_plan(
    job: LoadedJob,
    servers: list[RegisteredServer] | None = None,
    measured: Mapping[MeasuredKey, Measured] | None = None,
    live: Sequence[Offer] | None = None,
    warm: Sequence[warmfit.WarmMachine] = (),
    now: datetime | None = None,
    listed: Sequence[Offer] = (),
) -> Plan:
    """Rank every offer for `job` (timed by `measured` history where known); NoFit if none fits.

    `live`: offers the configured clouds returned just now. They replace the price catalogs
    and the market snapshot, estimates of a market nobody can rent from here; without them
    those are planned side by side (`snapshot.keyless_offers`, docs/providers.md).
    `listed`: the price lists of the providers the job names that have one (the caller
    asks `wiring.price_lists`); `warm`: the machines kept warm that the job may take.
    """
    w = workload_from(job)
    cat = catalog.load()
    named = job.spec.resources.providers
    offers = [*(live if live is not None else cat.offers), *server_offers(servers or [])]
    # Providers whose offers are a fixed price list, only for a job that names them
    # (`wiring.price_lists`: the simulated cloud is never chosen by accident).
    offers += [o for o in listed if named and o.provider in named]
    if live is None and (named is None or LIVE_PROVIDERS & set(named)):
        # Read only for a job that may use Vast.ai or RunPod (a `sim` job never parses it).
        snap = snapshot.load()
        offers += snapshot.offers(DISK_GB)  # with the disks a live offer's price holds
        for cloud in sorted(set(named or ()) & LIVE_PROVIDERS - snap.providers()):
            # A live provider the snapshot has no rows for: the per-second seed catalog
            # stands in for its prices; at run time the engine ranks its real offers.
            offers += [replace(o, provider=cloud) for o in cat.offers if o.provider == "cloud"]
    tokens, gpus, constraints = total_tokens(job), catalog.gpus(), constraints_from(job)
    # Machines earlier jobs kept warm (`now`: when their windows are judged), priced running
    # and, holding this job's model, without its download (docs/warm.md).
    warm_offers, cached = warm_offers_for(job, warm, now) if warm else ([], frozenset())
    offers += warm_offers
    # The evaluation runs on the training machine: the ranking keeps machines that serve the
    # model too and prices the evaluation's hours in each (evalsizing; issue 19).
    work = eval_work(job)
    # Everything the host bills counts: the delivery's hours too (issue 36 §4).
    extras = extras_for(job)
    chosen, ranking = scheduler.choose(w, tokens, offers, gpus, constraints, cached_on=cached,
                                       measured=measured, evaluation=work, extras=extras)
    # For each saver "auto" turned on: the cheapest placement without it, to show what it
    # bought (a cheaper GPU, or nothing but a fit at all).
    # A decision each, not a table: the offer book's pruned walk over one index.
    without: list[tuple[Choice, Placement | None]] = []
    book: offerbook.OfferBook | None = None
    for choice in savers_choices(w, chosen.estimate):
        if choice.value == savers.BASELINE[choice.name]:
            continue
        book = book or offerbook.OfferBook.of(offers)
        off = savers.without(w, choice.name)
        without.append((choice, offerbook.best(off, tokens, book, gpus, constraints,
                                               measured=measured, evaluation=work,
                                               extras=extras)))
    evaluation = None
    if work is not None:
        evaluation = evalsizing.place(work, chosen.offer, gpus.get(chosen.offer.gpu))
    # A tier without a published price is worth naming only to a job that may run there.
    unpriced = tuple(u for u in cat.unpriced
                     if named is None or u.provider in named or "dedicated" in named)
    return Plan(job=job, workload=w, ranking=ranking, chosen=chosen, unpriced=unpriced,
                without_savers=tuple(without), evaluation=evaluation,
                warm=warmfit.saving(ranking.placements), warm_machines=tuple(warm))


def warm_offers_for(job: LoadedJob, warm: Sequence[warmfit.WarmMachine],
                    now: datetime | None) -> tuple[list[Offer], frozenset[str]]:
    """The warm machines `job` may take, as offers, and those holding its base model (the
    caller leaves out an opt-in provider's machines unless the job names it)."""
    named = job.spec.resources.providers
    usable = {m.offer.provider for m in warm if named is None or m.offer.provider in named}
    base = job.spec.base_model
    return warmfit.offers(warm, providers=usable,
                          image=images.for_host(job.spec.trainer.image, "container"),
                          disk_gb=DISK_GB, model=(base.repo, base.revision),
                          now=now or datetime.now(UTC))


def eval_work(job: LoadedJob) -> evalsizing.EvalWork | None:
    """What the job's evaluation serves and generates (None: the job has no eval)."""
    e, s = job.spec.eval, job.spec
    if e.eval_set is None and not e.tasks:
        return None
    rows = 0
    if e.eval_set is not None:
        from orchestrator.core.userfiles import lines

        rows = sum(1 for line in lines(job.path.parent / e.eval_set) if line.strip())
    lora = 0 if s.method == "full" else job.architecture.lora_params(s.lora.r, s.lora.modules)
    # vLLM's context: lm-eval's requests too, when tasks run (playbooks/images.py).
    context = images.eval_context(s.training.sequence_len, bool(e.tasks))
    return evalsizing.EvalWork(job.architecture, s.method, context, rows,
                               len(e.tasks), s.lora.r, lora, rentals=CONTAINER_RENTALS)


def saver_lines(plan: Plan) -> list[str]:
    """One line per saver the planner turned on: what it saved and what it bought."""
    out = []
    for choice, alt in plan.without_savers:
        line = choice.describe()
        c = plan.chosen
        here = f"{c.offer.gpu} x{c.offer.gpu_count} at {usd(c.est_cost)}"
        if alt is None:
            line += f"; the job fits only with it ({here})"
        elif alt.est_cost > c.est_cost:
            line += (f"; fits {here} instead of {alt.offer.gpu} x{alt.offer.gpu_count} at "
                     f"{usd(alt.est_cost)}")
        else:
            line += f"; {here}, no dearer than without it"
        out.append(line)
    for choice in plan.choices:
        if choice.value == savers.BASELINE[choice.name]:
            out.append(f"{choice.describe()} (not needed to reach the cheapest placement)")
    return out


def why(plan: Plan) -> str:
    """One sentence on why the chosen placement won."""
    c = plan.chosen
    o = c.offer
    runner_up = plan.ranking.placements[1] if len(plan.ranking.placements) > 1 else None
    if o.registered:
        head = f"idle registered server {o.offer_id.removeprefix('server:')} costs nothing more"
    elif warmfit.is_warm(o):
        head = (f"cheapest whole-job cost: {o.gpu} x{o.gpu_count} kept warm by an earlier job "
                f"(no boot) at {usd(c.est_cost)}")
    else:
        head = (f"cheapest whole-job cost: {o.gpu} x{o.gpu_count} {_kind(o)} at "
                f"{usd(c.est_cost)}")
    if runner_up is None:
        return f"{head}; the only placement that fits"
    r = runner_up.offer
    return (f"{head}; next best {r.gpu} x{r.gpu_count} {_kind(r)} ({r.provider}) at "
            f"{usd(runner_up.est_cost)} in {runner_up.est_hours:.2f} h")


def _kind(o: Offer) -> str:
    if o.registered:
        return "registered"
    if o.billing is Billing.MONTHLY:
        return "monthly rental"
    return "spot" if o.interruptible else "on-demand"
