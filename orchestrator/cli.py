"""The `orch` command line: parse, call one core function, render (aligned tables or --json).

Heavy modules (the database layer, SSH, HTTP) are imported inside the commands that need
them: `orch plan` must start in a small multiple of a bare `python -c pass`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

if TYPE_CHECKING:
    from orchestrator.planning import Plan
    from orchestrator.spec import LoadedJob

app = typer.Typer(
    name="orch",
    help="Fine-tune LLMs on rented GPUs at the lowest cost that works.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Exit codes scripts can rely on.
EXIT_INVALID = 2  # a job file or argument is wrong
EXIT_NO_FIT = 3  # nothing can run the job under its constraints
EXIT_NOT_FOUND = 4

GIB = 1024**3

JsonFlag = Annotated[bool, typer.Option("--json", help="Print one JSON object for scripts.")]


def _fail(message: str, code: int = 1) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _print_json(obj: Any) -> None:
    typer.echo(json.dumps(obj, indent=2, default=str))


def problems_exit(path: Path, problems: list[str]) -> NoReturn:
    """Print a job or sweep file's problems, one per line, and exit EXIT_INVALID."""
    for problem in problems:
        typer.echo(problem, err=True)
    n = len(problems)
    typer.echo(f"{path}: {n} problem{'s' if n != 1 else ''}; nothing was done", err=True)
    raise typer.Exit(EXIT_INVALID)


def _load(path: Path) -> LoadedJob:
    from orchestrator.spec import SpecError, load_job

    try:
        return load_job(path)
    except SpecError as exc:
        problems_exit(path, exc.problems)


def _plan(job: LoadedJob, servers: list[Any]) -> Plan:
    from orchestrator.planning import make_plan
    from orchestrator.readonly import measured_throughput
    from orchestrator.scheduler import NoFit

    try:
        return make_plan(job, servers, _without_db(measured_throughput, {}))
    except NoFit as exc:
        _fail(f"{job.path}: {exc}", EXIT_NO_FIT)


def _gib(n: int) -> str:
    return f"{n / GIB:,.2f} GiB"


def _money(value: Any) -> str:
    from orchestrator.pricing import usd

    return usd(value)


def _render_plan(plan: Plan, limit: int) -> None:
    from orchestrator.render import table

    job, w, est = plan.job, plan.workload, plan.estimate
    spec = job.spec
    epochs = spec.training.epochs
    out = [f"{spec.name}: {spec.base_model.repo} ({w.arch.params / 1e9:.2f}B params), "
           f"{spec.method}, {job.dataset.tokens:,} tokens x {epochs:g} epoch"
           f"{'s' if epochs != 1 else ''} ({job.dataset.source})", ""]
    o = plan.chosen.offer
    out.append(f"GPU memory per GPU on {o.gpu} x{o.gpu_count} ({est.strategy.value}):")
    rows: list[list[object]] = [[name, _gib(v)] for name, v in est.components.items()]
    rows.append(["peak", _gib(est.peak_bytes)])
    rows.append([f"required (+{est.headroom:.0%} headroom)", _gib(est.required_bytes)])
    if est.host_ram_bytes:
        rows.append(["host RAM (offloaded state)", _gib(est.host_ram_required)])
    out.append(table(["component", "bytes"], rows, right=[1]))
    out += [f"  note: {note}" for note in est.notes]

    n = len(plan.ranking.placements)
    out += ["", f"Placements that fit ({n}), cheapest first:"]
    rows = []
    for i, p in enumerate(plan.ranking.placements[:limit], 1):
        po = p.offer
        rate = f"${po.price_per_hour:,.3f}" if po.price_per_hour is not None else (
            f"{_money(po.monthly_price)}/mo" if po.monthly_price is not None else "-")
        cost = _money(p.est_cost)
        if p.amortised_cost is not None:
            cost += f" (+{_money(p.amortised_cost)} of rent)"
        billing = {"per_second": "per-sec", "per_minute": "per-min"}.get(po.billing.value,
                                                                          po.billing.value)
        rows.append([i, po.provider, po.gpu, po.gpu_count, billing,
                     "yes" if po.interruptible else "no", rate, p.estimate.strategy.value,
                     f"{p.est_hours:.2f}", cost])
    out.append(table(["#", "provider", "GPU", "n", "billing", "spot", "$/h", "layout",
                      "est. h", "est. cost"], rows, right=[0, 3, 6, 8, 9], mark=0))
    if n > limit:
        out.append(f"  ... {n - limit} more (--all or --json)")
    from orchestrator.runnable import CLOUDS

    # A price catalog (`cloud`) runs nothing: its offer is an estimate, not where it runs.
    chosen = (f"{o.provider} {o.gpu} x{o.gpu_count}" if o.provider in (*CLOUDS, "sim", "dedicated")
              else f"{o.gpu} x{o.gpu_count} at the {o.provider} catalog's prices (an estimate)")
    out += ["", f"Chosen: {chosen}: {plan.to_dict(0)['why']}",
            f"Throughput: {plan.chosen.duration.source}"]
    if plan.ranking.rejected:
        out.append("Left out: " + "; ".join(f"{k} {r}" for r, k in
                                           sorted(plan.ranking.rejected.items())))
    if plan.unpriced:
        names = ", ".join(f"{u.provider} {u.name}" for u in plan.unpriced)
        out.append(f"Not planned, price not published: {names} "
                   "(register one you rent with `orch servers add`)")
    typer.echo("\n".join(out))


def _servers_for_plan() -> list[Any]:
    from orchestrator.readonly import registered_servers

    return _without_db(registered_servers, [])


def _without_db(read: Any, empty: Any) -> Any:
    """`read(db_url)`, or `empty` with a note when the database cannot be read: planning
    needs no database (it only adds registered servers and measured throughput)."""
    from orchestrator.paths import default_db_url
    from orchestrator.readonly import Unavailable

    try:
        return read(default_db_url())
    except Unavailable as exc:
        if str(exc) not in _NOTED:  # servers and throughput fail alike: say it once
            _NOTED.add(str(exc))
            typer.echo(f"note: {exc}; planning without registered servers and measured "
                       "throughput", err=True)
        return empty


_NOTED: set[str] = set()


@app.command()
def plan(
    file: Annotated[Path, typer.Argument(help="The job file (job.yml).")],
    json_out: JsonFlag = False,
    all_rows: Annotated[bool, typer.Option("--all", help="Show every placement.")] = False,
) -> None:
    """Show what would happen: memory breakdown, ranked placements, the chosen one."""
    from orchestrator.runnable import runners

    job = _load(file)
    servers = _servers_for_plan()
    result = _plan(job, servers)
    who = runners(job.spec.resources.providers, bool(servers))
    if json_out:
        _print_json({**result.to_dict(alternatives=10_000 if all_rows else 20),
                     "runs_on": list(who.providers), "runs_on_notes": list(who.notes)})
    else:
        _render_plan(result, 10_000 if all_rows else 12)
        typer.echo(_runs_on(result, who))


def _runs_on(plan: Plan, who: Any) -> str:
    """Who would run the plan here: catalog prices are estimates, not a provider."""
    from orchestrator.runnable import HOW_TO_CONFIGURE

    if not who:
        return (f"Runs on: nothing configured here can run it ({'; '.join(who.notes)}). "
                f"{HOW_TO_CONFIGURE}.")
    o = plan.chosen.offer
    if o.provider in who.providers:
        return f"Runs on: {o.provider}"
    return (f"Runs on: {' or '.join(who.providers)}, whose live offers `orch submit` ranks "
            f"(the {o.provider} catalog's prices above are an estimate)")


def _store() -> Any:
    from orchestrator.exits import exit_code
    from orchestrator.store import StoreError, open_store

    try:
        return open_store()
    except StoreError as exc:
        _fail(str(exc), exit_code(exc))


def _job_dict(j: Any) -> dict[str, Any]:
    from orchestrator.store import from_micros

    return {
        "id": j.id, "name": j.name, "status": j.status, "method": j.method,
        "base_model": j.base_model, "provider": j.provider, "gpu": j.gpu,
        "gpu_count": j.gpu_count, "interruptible": j.interruptible,
        "est_hours": j.est_hours, "est_cost": str(from_micros(j.est_cost_micros or 0)),
        "cost": str(from_micros(j.cost_micros or 0)),
        "created_at": j.created_at.isoformat().replace("+00:00", "Z"),
    }


@app.command()
def jobs(
    json_out: JsonFlag = False,
    status: Annotated[str | None, typer.Option(help="Only jobs in this state.")] = None,
    limit: Annotated[int, typer.Option(help="How many, newest first.")] = 50,
) -> None:
    """List jobs, newest first."""
    from orchestrator.store import InvalidValueError

    if not 1 <= limit <= 100_000:
        _fail(f"--limit must be 1..100000 (got {limit})", EXIT_INVALID)
    try:
        found = _store().list_jobs(limit=limit, status=status)
    except InvalidValueError as exc:
        _fail(f"--status {status}: {exc}", EXIT_INVALID)
    rows = [_job_dict(j) for j in found]
    if json_out:
        _print_json(rows)
        return
    if not rows:
        typer.echo("no jobs yet; try `orch submit examples/quickstart.yml` (simulated cloud)")
        return
    from orchestrator.render import table

    typer.echo(table(
        ["id", "name", "status", "method", "placement", "est. h", "est. cost", "cost",
         "created (UTC)"],
        [[r["id"], r["name"], r["status"], r["method"],
          f"{r['provider']} {r['gpu']} x{r['gpu_count']}", f"{r['est_hours']:.2f}",
          _money(r["est_cost"]), _money(r["cost"]), r["created_at"][:19]] for r in rows],
        right=[5, 6, 7]))


@app.command()
def reconcile(
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would be done; change "
                                          "nothing.")] = False,
    json_out: JsonFlag = False,
) -> None:
    """Terminate instances tagged as orch's whose job is finished or unknown; requeue jobs
    whose worker died; close stale instance rows."""
    from orchestrator.reconcile import reconcile as run_reconcile
    from orchestrator.recovery import idle_grace_s
    from orchestrator.wiring import configured_providers

    store = _store()
    try:
        grace = idle_grace_s()
    except ValueError as exc:
        _fail(str(exc), 2)
    providers, notes = configured_providers(store, quick=True)
    from orchestrator.cli_servers import scrubber

    report = run_reconcile(store, providers, dry_run=dry_run, idle_grace_s=grace,
                           scrub=scrubber())
    if json_out:
        _print_json({"dry_run": dry_run, "providers": sorted(providers), "notes": notes,
                     "actions": [a.__dict__ for a in report.actions]})
        return
    for note in notes:
        typer.echo(f"note: {note}", err=True)
    acted = [a for a in report.actions if a.kind != "keep"]
    if not acted:
        kept = len(report.actions)
        typer.echo(f"nothing to do ({kept} instance{'s' if kept != 1 else ''} in use; "
                   f"checked {', '.join(sorted(providers))})")
        return
    from orchestrator.render import table

    verb = {"terminate": "would terminate" if dry_run else "terminated",
            "mark-terminated": "would close" if dry_run else "closed",
            "requeue": "would requeue" if dry_run else "requeued", "error": "error",
            "scrub-secrets": "would scrub" if dry_run else "scrubbed"}
    typer.echo(table(["action", "provider", "instance", "job", "why"],
                     [[verb.get(a.kind, a.kind), a.provider, a.instance_id or "-",
                       a.job_id or "-", a.reason] for a in acted]))
    if any(a.kind == "error" for a in acted):
        raise typer.Exit(1)


def _register() -> None:
    from orchestrator import cli_jobs

    cli_jobs.register(app)
    from orchestrator import cli_history, cli_sweeps

    cli_history.register(app)
    cli_sweeps.register(app)
    from orchestrator import cli_servers

    cli_servers.register(app)
    from orchestrator import cli_render

    cli_render.register(app)


_register()


def main() -> None:
    """Console-script entry point."""
    import logging

    # paramiko logs refused tunnel channels (vLLM not listening yet, which the readiness
    # probe expects) at ERROR; the engine reports what matters as job events.
    logging.getLogger("paramiko").setLevel(logging.CRITICAL)
    try:
        app()
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)
    except Exception as exc:  # a defect: one line for the user, the traceback on request
        import os

        if os.environ.get("ORCH_DEBUG"):
            raise
        typer.echo(f"error: internal error ({type(exc).__name__}: {exc}); please report it "
                   "with the command that caused it (ORCH_DEBUG=1 shows the traceback)",
                   err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
