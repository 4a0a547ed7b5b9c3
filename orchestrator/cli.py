"""The `orch` command line: parse, call one core function, render (aligned tables or --json).

Heavy modules (the database layer, SSH, HTTP) are imported inside the commands that need
them: `orch plan` must start in a small multiple of a bare `python -c pass`.
"""

from __future__ import annotations

import json
import sys
from decimal import Decimal
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
    # `orch --install-completion` / `--show-completion` (bash, zsh, fish, PowerShell).
    add_completion=True,
    pretty_exceptions_enable=False,
    # Subcommands inherit it: `orch jobs -h` works as `-h` does in gh and kubectl.
    context_settings={"help_option_names": ["-h", "--help"]},
)
servers_app = typer.Typer(help="The monthly dedicated servers you rent.", no_args_is_help=True)
app.add_typer(servers_app, name="servers")

# Exit codes scripts can rely on.
EXIT_INVALID = 2  # a job file or argument is wrong
EXIT_NO_FIT = 3  # nothing can run the job under its constraints
EXIT_NOT_FOUND = 4

# No server rents for a billion dollars a month; beyond this a typo is likelier.
MAX_MONTHLY = Decimal(10) ** 9

GIB = 1024**3

JsonFlag = Annotated[bool, typer.Option("--json", help="Print one JSON object for scripts.")]


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"orch {version('orch')}")
        raise typer.Exit()


@app.callback()
def _root(
    _version: Annotated[bool, typer.Option(
        "--version", callback=_print_version, is_eager=True,
        help="Print orch's version and exit.")] = False,
) -> None:
    """Fine-tune LLMs on rented GPUs at the lowest cost that works."""


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
    from orchestrator.paths import default_db_url
    from orchestrator.planning import make_plan
    from orchestrator.readonly import measured_throughput
    from orchestrator.scheduler import NoFit

    try:
        return make_plan(job, servers, measured_throughput(default_db_url()))
    except NoFit as exc:
        _fail(f"{job.path}: {exc}", EXIT_NO_FIT)


def _gib(n: int) -> str:
    return f"{n / GIB:,.2f} GiB"


def _money(value: Any) -> str:
    from orchestrator.pricing import usd

    return usd(value)


def _render_plan(plan: Plan, limit: int) -> None:
    from orchestrator.render import table
    from orchestrator.term import prose

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
                      "est. h", "est. cost"], rows, right=[0, 3, 6, 8, 9], mark=0,
                     drop=[4, 7, 8, 5]))
    if n > limit:
        out.append(f"  ... {n - limit} more (--all or --json)")
    out += ["", prose(f"Chosen: {o.provider} {o.gpu} x{o.gpu_count}: "
                      f"{plan.to_dict(0)['why']}"),
            prose(f"Throughput: {plan.chosen.duration.source}")]
    if plan.ranking.rejected:
        out.append(prose("Left out: " + "; ".join(f"{k} {r}" for r, k in
                                                 sorted(plan.ranking.rejected.items()))))
    if plan.unpriced:
        names = ", ".join(f"{u.provider} {u.name}" for u in plan.unpriced)
        out.append(prose(f"Not planned, price not published: {names} "
                         "(register one you rent with `orch servers add`)"))
    typer.echo("\n".join(out))


def _servers_for_plan() -> list[Any]:
    from orchestrator.paths import default_db_url
    from orchestrator.readonly import registered_servers

    return registered_servers(default_db_url())


@app.command()
def plan(
    file: Annotated[Path, typer.Argument(help="The job file (job.yml).")],
    json_out: JsonFlag = False,
    all_rows: Annotated[bool, typer.Option("--all", help="Show every placement.")] = False,
) -> None:
    """Show what would happen: memory breakdown, ranked placements, the chosen one."""
    job = _load(file)
    result = _plan(job, _servers_for_plan())
    if json_out:
        _print_json(result.to_dict(alternatives=10_000 if all_rows else 20))
    else:
        _render_plan(result, 10_000 if all_rows else 12)


def _store() -> Any:
    from orchestrator.store import StoreError, open_store

    try:
        return open_store()
    except StoreError as exc:
        _fail(str(exc))


def _job_dict(j: Any) -> dict[str, Any]:
    from orchestrator.store import from_micros
    from orchestrator.term import iso_utc

    return {
        "id": j.id, "name": j.name, "status": j.status, "method": j.method,
        "base_model": j.base_model, "provider": j.provider, "gpu": j.gpu,
        "gpu_count": j.gpu_count, "interruptible": j.interruptible,
        "est_hours": j.est_hours, "est_cost": str(from_micros(j.est_cost_micros or 0)),
        "cost": str(from_micros(j.cost_micros or 0)),
        "created_at": iso_utc(j.created_at),
    }


@app.command()
def jobs(
    json_out: JsonFlag = False,
    status: Annotated[str | None, typer.Option(help="Only jobs in this state.")] = None,
    limit: Annotated[int, typer.Option(help="How many, newest first.")] = 50,
) -> None:
    """List jobs, newest first."""
    found = _store().list_jobs(limit=limit, status=status)
    rows = [_job_dict(j) for j in found]
    if json_out:
        _print_json(rows)
        return
    if not rows:
        typer.echo("no jobs yet; try `orch submit examples/quickstart.yml` (simulated cloud)")
        return
    from orchestrator.render import table
    from orchestrator.term import human_time

    # On a narrow terminal: estimates, method and the creation time go first.
    typer.echo(table(
        ["id", "name", "status", "method", "placement", "est. h", "est. cost", "cost",
         "created"],
        [[r["id"], r["name"], r["status"], r["method"],
          f"{r['provider']} {r['gpu']} x{r['gpu_count']}", f"{r['est_hours']:.2f}",
          _money(r["est_cost"]), _money(r["cost"]), human_time(j.created_at)]
         for r, j in zip(rows, found, strict=True)],
        right=[5, 6, 7], drop=[5, 6, 3, 8], states=[2]))


@app.command()
def reconcile(
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would be done; change "
                                          "nothing.")] = False,
    json_out: JsonFlag = False,
) -> None:
    """Terminate instances tagged as orch's whose job is finished or unknown; requeue jobs
    whose worker died; close stale instance rows."""
    from orchestrator.reconcile import reconcile as run_reconcile
    from orchestrator.wiring import configured_providers

    store = _store()
    providers, notes = configured_providers(store)
    report = run_reconcile(store, providers, dry_run=dry_run)
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
            "requeue": "would requeue" if dry_run else "requeued", "error": "error"}
    typer.echo(table(["action", "provider", "instance", "job", "why"],
                     [[verb.get(a.kind, a.kind), a.provider, a.instance_id or "-",
                       a.job_id or "-", a.reason] for a in acted]))
    if any(a.kind == "error" for a in acted):
        raise typer.Exit(1)


@servers_app.command("add")
def servers_add(
    name: Annotated[str, typer.Argument(help="A short name for the server.")],
    host: Annotated[str, typer.Option(help="IP address or DNS name for SSH.")],
    gpu: Annotated[str, typer.Option(help="GPU model, e.g. H100 SXM, H200, B200.")],
    monthly: Annotated[str, typer.Option(help="Monthly rent in USD, e.g. 2190.")],
    port: Annotated[int, typer.Option(help="SSH port.")] = 22,
    user: Annotated[str, typer.Option(help="SSH login.")] = "root",
    gpus: Annotated[int, typer.Option(help="Number of GPUs.")] = 1,
    json_out: JsonFlag = False,
) -> None:
    """Register a monthly server you rent (its idle time then costs jobs nothing)."""
    import re

    from providers import catalog

    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", name):
        _fail(f"NAME {name!r}: use 1-64 letters, digits, '.', '_' or '-'", EXIT_INVALID)
    matches = catalog.resolve_gpu(gpu)
    if len(matches) != 1:
        known = ", ".join(catalog.gpus())
        what = "is ambiguous" if matches else "is not a known GPU"
        _fail(f"--gpu {gpu!r} {what}; use one of: {known}", EXIT_INVALID)
    if not 1 <= gpus <= 8:
        _fail(f"--gpus must be 1..8 (got {gpus})", EXIT_INVALID)
    if not 1 <= port <= 65535:
        _fail(f"--port must be 1..65535 (got {port})", EXIT_INVALID)
    if not host or any(c.isspace() for c in host):
        _fail(f"--host {host!r}: give an IP address or DNS name", EXIT_INVALID)
    try:
        price = Decimal(monthly.replace(",", "").lstrip("$"))
    except ArithmeticError:
        _fail(f"--monthly {monthly!r}: give the monthly rent in USD, e.g. 2190", EXIT_INVALID)
    if not price.is_finite() or price <= 0 or price >= MAX_MONTHLY:
        _fail(f"--monthly must be > 0 and < {MAX_MONTHLY:,} (got {monthly})", EXIT_INVALID)
    if price != price.quantize(Decimal("0.000001")):
        _fail(f"--monthly {monthly}: at most 6 decimal places", EXIT_INVALID)
    from orchestrator.store import StoreError

    try:
        s = _store().add_server(name=name, host=host, port=port, user=user, gpu=matches[0],
                                gpu_count=gpus, monthly_price=price)
    except StoreError as exc:
        _fail(str(exc), EXIT_INVALID)
    if json_out:
        _print_json(_server_dict(s))
    else:
        typer.echo(f"added {s.name}: {s.gpu} x{s.gpu_count} at {s.user}@{s.host}:{s.port}, "
                   f"{_money(price)}/month")


def _server_dict(s: Any) -> dict[str, Any]:
    from orchestrator.store import from_micros

    return {"name": s.name, "host": s.host, "port": s.port, "user": s.user, "gpu": s.gpu,
            "gpu_count": s.gpu_count, "monthly_price": str(from_micros(s.monthly_price_micros)),
            "status": s.status}


@servers_app.command("list")
def servers_list(json_out: JsonFlag = False) -> None:
    """List registered servers."""
    rows = [_server_dict(s) for s in _store().list_servers()]
    if json_out:
        _print_json(rows)
        return
    if not rows:
        typer.echo("no servers registered; add one with `orch servers add NAME --host H "
                   "--gpu H100 SXM --monthly 2190`")
        return
    from orchestrator.render import table

    typer.echo(table(
        ["name", "GPU", "n", "ssh", "monthly", "status"],
        [[r["name"], r["gpu"], r["gpu_count"], f"{r['user']}@{r['host']}:{r['port']}",
          _money(r["monthly_price"]), r["status"]] for r in rows],
        right=[2, 4], drop=[4, 2], states=[5]))


@servers_app.command("remove")
def servers_remove(name: Annotated[str, typer.Argument(help="The server's name.")]) -> None:
    """Forget a registered server (nothing on the server is touched)."""
    from orchestrator.store import NotFoundError, StoreError

    try:
        _store().remove_server(name)
    except NotFoundError as exc:
        _fail(str(exc), EXIT_NOT_FOUND)
    except StoreError as exc:
        _fail(str(exc), EXIT_INVALID)
    typer.echo(f"removed {name}")


def _register() -> None:
    from orchestrator import cli_jobs

    cli_jobs.register(app)
    from orchestrator import cli_history, cli_models, cli_report, cli_sweeps

    cli_history.register(app)
    cli_sweeps.register(app)
    cli_report.register(app)
    cli_models.register(app)
    from orchestrator import cli_render

    cli_render.register(app)


_register()


def main() -> None:
    """Console-script entry point."""
    import logging

    # paramiko logs refused tunnel channels (vLLM not listening yet, which the readiness
    # probe expects) at ERROR; the engine reports what matters as job events.
    logging.getLogger("paramiko").setLevel(logging.CRITICAL)
    from orchestrator.helpstyle import gh_style

    try:
        gh_style(typer.main.get_command(app))(prog_name="orch")
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
