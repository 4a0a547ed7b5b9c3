"""`orch plan`: load a job file, plan it, print the plan (the typer command calls `run`).

Imported only by the commands that plan (`orch plan`, `submit`, `render`): what it needs at
every plan is imported here, at module level. Planning needs neither the database layer
(SQLModel) nor SSH nor HTTP: live offers (httpx), the deadline's estimates and a Hub
dataset's sizing are imported only by a job that has them (bench/startup.py).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from orchestrator.cli import deadlineview
from orchestrator.cli.jobfile import EXIT_NO_FIT, load, money
from orchestrator.cli.jobfile import err as _err
from orchestrator.cli.tables import table
from orchestrator.cli.term import prose
from orchestrator.core.paths import default_db_url
from orchestrator.core.planning import (
    CONTAINER_RENTALS,
    DISK_GB,
    Plan,
    constraints_from,
    eval_work,
    make_plan,
    requirements,
    saver_lines,
)
from orchestrator.core.scheduler import NoFit
from orchestrator.core.spec import LoadedJob
from orchestrator.core.warmfit import is_warm
from orchestrator.engine.runnable import HOW_TO_CONFIGURE, Runners, runners
from orchestrator.engine.wiring import ADAPTERS, cloud_keys, clouds, declares, price_lists
from orchestrator.records.readonly import (
    Unavailable,
    host_observations,
    measured_throughput,
    parked_warm,
    registered_servers,
)
from playbooks.images import min_cuda
from providers.base import OptInOnly
from providers.catalog import snapshot

if TYPE_CHECKING:
    from orchestrator.engine.market import Market
    from providers.dedicated.compute import RegisteredServer

_T = TypeVar("_T")

GIB = 1024**3


def plan_job(job: LoadedJob, servers: list[RegisteredServer], market: Market | None = None
             ) -> Plan:
    """`job` planned on `market`'s live offers when some provider answered, else on the
    price catalogs; exits EXIT_NO_FIT (with the gap) when nothing fits."""
    live = list(market.offers) if market is not None and market.answered else None
    named = job.spec.resources.providers
    # An opt-in provider's warm machine only for a job that names it, as its fresh offers.
    warm = [m for m in without_db(parked_warm) or []
            if named is not None or not declares(m.offer.provider, OptInOnly)]
    try:
        return make_plan(job, servers, without_db(measured_throughput) or {}, live, warm=warm,
                         listed=price_lists(named))
    except NoFit as exc:
        if job.spec.resources.deadline_hours is not None and "deadline_hours" in str(exc):
            with contextlib.suppress(NoFit):  # it fits without the deadline: name the fastest
                quick = make_plan(deadlineview.without_deadline(job), servers,
                                  without_db(measured_throughput) or {}, live, warm=warm,
                                  listed=price_lists(named))
                _err(deadlineview.too_short(job, quick))
                raise SystemExit(EXIT_NO_FIT) from None
        _err(f"error: {job.path}: {exc}")
        _err(offers_line(market))  # where the offers were looked for, and why there
        raise SystemExit(EXIT_NO_FIT) from None


def _gib(n: int) -> str:
    return f"{n / GIB:,.2f} GiB"


def render_plan(plan: Plan, limit: int) -> None:
    job, w, est = plan.job, plan.workload, plan.estimate
    spec = job.spec
    epochs = spec.training.epochs
    out = [prose(f"{spec.name}: {spec.base_model.repo} ({w.arch.params / 1e9:.2f}B params), "
                 f"{spec.method}, {job.dataset.tokens:,} tokens x {epochs:g} epoch"
                 f"{'s' if epochs != 1 else ''} ({job.dataset.source})"), ""]
    o = plan.chosen.offer
    out.append(f"GPU memory per GPU on {o.gpu} x{o.gpu_count} ({est.strategy.value}):")
    rows: list[list[object]] = [[name, _gib(v)] for name, v in est.components.items()]
    rows.append(["peak", _gib(est.peak_bytes)])
    rows.append([f"required (+{est.headroom:.0%} headroom)", _gib(est.required_bytes)])
    if est.host_ram_bytes:
        rows.append(["host RAM (offloaded state)", _gib(est.host_ram_required)])
    out.append(table(["component", "bytes"], rows, right=[1]))
    out += [prose(f"  note: {note}", "        ") for note in est.notes]
    if est.savers:
        out.append(prose(f"  memory savers on: {', '.join(est.savers)}", "    "))
    out += [prose(f"  chosen by auto: {line}", "    ") for line in saver_lines(plan)]

    n = len(plan.ranking.placements)
    out += ["", f"Placements that fit ({n}), cheapest first:"]
    rows = []
    for i, p in enumerate(plan.ranking.placements[:limit], 1):
        po = p.offer
        rate = f"${po.price_per_hour:,.3f}" if po.price_per_hour is not None else (
            f"{money(po.monthly_price)}/mo" if po.monthly_price is not None else "-")
        cost = money(p.est_cost)
        if p.amortised_cost is not None:
            cost += f" (+{money(p.amortised_cost)} of rent)"
        billing = {"per_second": "per-sec", "per_minute": "per-min"}.get(po.billing.value,
                                                                          po.billing.value)
        where = f"{po.provider} (warm)" if is_warm(po) else po.provider
        rows.append([i, where, po.gpu, po.gpu_count, billing,
                     "yes" if po.interruptible else "no", rate, p.estimate.strategy.value,
                     f"{p.est_hours:.2f}", cost, snapshot.label(po)])
    out.append(table(["#", "provider", "GPU", "n", "billing", "spot", "$/h", "layout",
                      "est. h", "est. cost", "source"], rows, right=[0, 3, 6, 8, 9], mark=0,
                     drop=[4, 7, 10, 8, 5]))
    if n > limit:
        out.append(f"  ... {n - limit} more (--all or --json)")
    # A price catalog (`cloud`) or the market snapshot runs nothing: its offer is an
    # estimate, not where it runs.
    source = snapshot.label(o)
    if source.startswith("snapshot"):
        chosen = (f"{o.gpu} x{o.gpu_count} at {o.provider}'s listed prices ({source}; an "
                  "estimate)")
    elif o.provider in ADAPTERS:
        chosen = f"{o.provider} {o.gpu} x{o.gpu_count}"
    else:
        chosen = f"{o.gpu} x{o.gpu_count} at the {o.provider} catalog's prices (an estimate)"
    out += ["", prose(f"Chosen: {chosen}: {plan.to_dict(0)['why']}"),
            prose(f"Cost: {money(plan.chosen.est_cost)} for {plan.chosen.breakdown()}"),
            prose(f"Throughput: {plan.chosen.duration.source}"),
            prose(f"Delivery: {plan.delivery.describe()}")]
    out += eval_lines(plan)
    out += warm_lines(plan)
    if plan.ranking.rejected:
        out.append(prose("Left out: " + "; ".join(f"{k} {r}" for r, k in
                                                 sorted(plan.ranking.rejected.items()))))
    if plan.unpriced:
        names = ", ".join(f"{u.provider} {u.name}" for u in plan.unpriced)
        out.append(prose(f"Not planned, price not published: {names} "
                         "(register one you rent with `orch servers add`)"))
    print("\n".join(out))


def eval_lines(plan: Plan) -> list[str]:
    """The evaluation's placement: where vLLM serves what, memory per GPU, hours, dollars."""
    if plan.workload is None or plan.evaluation is None:
        if eval_work(plan.job) is None:
            return []
        return [prose("Evaluation: no machine orch plans holds the served model; lower "
                      "training.sequence_len or use method qlora")]
    e = plan.evaluation
    est = e.estimate
    parts = ", ".join(f"{name} {_gib(v)}" for name, v in est.components.items())
    return [prose(f"Evaluation (vLLM, {e.placement} machine): {e.why}; "
                  f"{e.offer.gpu} x{est.tensor_parallel} of {_gib(e.offer.gpu_memory_bytes)}, "
                  f"{e.hours:.2f} h, {money(e.cost)} ({parts}; at "
                  f"gpu_memory_utilization {est.utilization:g})")]


def warm_lines(plan: Plan) -> list[str]:
    """When a machine kept warm by an earlier job would run this one, and what it saves."""
    warm = plan.warm_dict()
    if warm is None:
        return []
    fresh = ("" if warm["saves"] is None else
             f" vs {money(warm['fresh_est_cost'])} on the cheapest fresh machine (saves "
             f"{money(warm['saves'])}: no boot"
             + (", base model already on its disk)" if warm["model_cached"] else ")"))
    return [prose(f"Warm: {warm['provider']} instance {warm['instance_id']}, kept warm by "
                  f"job {warm['parked_by']} until {warm['expires_at'][11:19]} UTC, would run "
                  f"it: est. {money(warm['est_cost'])}{fresh}; if another job takes it "
                  "first, a fresh machine is rented")]


def servers_for_plan() -> list[RegisteredServer]:
    """The registered monthly servers (none where the database cannot be read)."""
    return without_db(registered_servers) or []


def without_db(read: Callable[[str], _T]) -> _T | None:
    """`read(db_url)`, or None with a note when the database cannot be read: planning
    needs no database (it only adds registered servers and measured throughput)."""
    try:
        return read(default_db_url())
    except Unavailable as exc:
        if str(exc) not in _NOTED:  # servers and throughput fail alike: say it once
            _NOTED.add(str(exc))
            _err(f"note: {exc}; planning without registered servers and measured throughput")
        return None


_NOTED: set[str] = set()


def runs_on(plan: Plan, who: Runners) -> str:
    """Who would run the plan here: catalog prices are estimates, not a provider."""
    if not who:
        return (f"Runs on: nothing configured here can run it ({'; '.join(who.notes)}). "
                f"{HOW_TO_CONFIGURE}.")
    o = plan.chosen.offer
    if o.provider in who.providers:
        return f"Runs on: {o.provider}"
    return (f"Runs on: {' or '.join(who.providers)}, whose live offers `orch submit` ranks "
            f"(the {o.provider} catalog's prices above are an estimate)")


def live_market(job: LoadedJob) -> Market | None:
    """The live offers of the clouds with a key that the job may use (None: no such cloud),
    asked within `market.DEADLINE_S`."""
    named = job.spec.resources.providers
    keys, _notes = cloud_keys()
    if not any(named is None or name in named for name in keys):
        return None
    # httpx and the providers' clients only for a job with a cloud key to ask.
    from orchestrator.engine.market import search

    providers, _ = clouds(named)
    reqs = requirements(constraints_from(job), DISK_GB, min_cuda(job.spec.trainer.image))
    return search(providers, reqs)


def host_memory(market: Market | None, servers: Sequence[RegisteredServer] = ()
                ) -> tuple[Market | None, list[str]]:
    """`market` with its offers as host memory ranks them (`hostmemory.screen`, as the
    engine's placement does: machines to avoid left out, slow ones priced at what they
    deliver), and one note per machine it changed, and per registered server in `servers`
    whose last host check found something (never left out: its next job checks it again
    first). Only live offers name their machines."""
    live = market is not None and bool(market.answered)
    named = {(o.provider, o.machine_id) for o in market.offers
             if o.machine_id and not o.registered} if live and market is not None else set()
    kept = {("dedicated", s.name) for s in servers}
    if not named and not kept:
        return market, []
    seen = without_db(lambda url: host_observations(url, named | kept))
    if not seen:
        return market, []
    from orchestrator.core.hostmemory import Source, screen  # only where rows were found

    now = datetime.now(UTC)
    notes = []
    for key in sorted(kept):
        checks = [o for o in seen.get(key, []) if o.source is Source.CHECK]
        if checks and checks[-1].failed:  # found something: a job there is checked first
            notes.append(f"registered server {key[1]}: its last host check "
                         f"({checks[-1].at:%Y-%m-%d %H:%M} UTC) found {checks[-1].why}; "
                         "the next job there is checked again first (`orch servers list`: "
                         "what to fix)")
    if market is None or not named:
        return market, notes
    result = screen(market.offers, seen, now)
    return replace(market, offers=tuple(result.offers)), result.notes + notes


def host_memory_line(notes: Sequence[str]) -> str:
    """The plan's one line on what host memory changed (empty: nothing)."""
    if not notes:
        return ""
    return ("Host memory: " + "; ".join(notes) + " (as the engine's placement ranks them; "
            "`orch hosts`)")


def offers_line(market: Market | None, named: Sequence[str] | None = None) -> str:
    """Which offers the plan ranked: live (from whom) or the price catalogs (and why).
    `named`: the job's `resources.providers` (None: any)."""
    if named is not None and not set(named) & CONTAINER_RENTALS:
        # No cloud market is in the job's choice: an API key would change nothing.
        return (f"Offers: those of {', '.join(named)} (resources.providers names no cloud: "
                "no API key is needed)")
    dates = ", ".join(f"{p} {d}" for p, d in sorted(snapshot.load().dates.items()))
    catalogs = (f"the price catalogs (estimates: the market snapshot of Vast.ai and RunPod "
                f"list prices, {dates}, and the seed catalogs)")
    if market is None:
        return (f"Offers: {catalogs}; no API key for a cloud this job may use: set "
                "VAST_API_KEY or RUNPOD_API_KEY for live offers")
    notes = f"; {'; '.join(market.notes)}" if market.notes else ""
    if not market.answered:
        return f"Offers: {catalogs}: no live offers{notes}"
    return (f"Offers: live, {len(market.offers)} from {', '.join(market.answered)} just now"
            + notes)


def run(file: Path, json_out: bool = False, all_rows: bool = False) -> None:
    """Show what would happen: memory breakdown, ranked placements, the chosen one."""
    job = load(file)
    servers = servers_for_plan()
    market, remembered = host_memory(live_market(job), servers)
    try:
        result = plan_job(job, servers, market)
    except SystemExit:
        if remembered:  # it may be why nothing fits
            _err(host_memory_line(remembered))
        raise
    who = runners(job.spec.resources.providers, bool(servers))
    deadline = deadlineview.estimates(result)
    if json_out:
        live = market is not None and bool(market.answered)
        extra = {"deadline": deadline.to_dict()} if deadline is not None else {}
        print(json.dumps({**result.to_dict(alternatives=10_000 if all_rows else 20), **extra,
                          "runs_on": list(who.providers), "runs_on_notes": list(who.notes),
                          "offers_source": "live" if live else "catalog",
                          "offers_from": list(market.answered) if market else [],
                          "offers_notes": list(market.notes) if market else [],
                          "host_memory": remembered},
                         indent=2, default=str))
    else:
        render_plan(result, 10_000 if all_rows else 12)
        if deadline is not None:
            print("\n".join(["", *deadline.lines()]))
        print(prose(offers_line(market, job.spec.resources.providers)))
        if remembered:
            print(prose(host_memory_line(remembered)))
        print(prose(runs_on(result, who)))
