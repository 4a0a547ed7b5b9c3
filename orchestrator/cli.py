"""The `orch` command line: parse, call one core function, render (aligned tables or --json).

Heavy modules (the database layer, SSH, HTTP) are imported inside the commands that need
them: `orch plan` must start in a small multiple of a bare `python -c pass`.
"""

from __future__ import annotations

import json
import sys
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from orchestrator import cli_plan

# `orch plan` runs without typer (orchestrator.entry); these live in cli_plan for that and
# are re-exported here for the other commands (cli_jobs, cli_sweeps).
from orchestrator.cli_plan import EXIT_INVALID, EXIT_NO_FIT, problems_exit  # noqa: F401
from orchestrator.cli_plan import load as _load  # noqa: F401
from orchestrator.cli_plan import money as _money

app = typer.Typer(
    name="orch",
    help="Fine-tune LLMs on rented GPUs at the lowest cost that works.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
servers_app = typer.Typer(help="The monthly dedicated servers you rent.", no_args_is_help=True)
app.add_typer(servers_app, name="servers")

EXIT_NOT_FOUND = 4

# No server rents for a billion dollars a month; beyond this a typo is likelier.
MAX_MONTHLY = Decimal(10) ** 9

JsonFlag = Annotated[bool, typer.Option("--json", help="Print one JSON object for scripts.")]


def _fail(message: str, code: int = 1) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _print_json(obj: Any) -> None:
    typer.echo(json.dumps(obj, indent=2, default=str))


@app.command()
def plan(
    file: Annotated[Path, typer.Argument(help="The job file (job.yml).")],
    json_out: JsonFlag = False,
    all_rows: Annotated[bool, typer.Option("--all", help="Show every placement.")] = False,
) -> None:
    """Show what would happen: memory breakdown, ranked placements, the chosen one."""
    cli_plan.run(file, json_out, all_rows)


def _store() -> Any:
    from orchestrator.store import StoreError, open_store

    try:
        return open_store()
    except StoreError as exc:
        _fail(str(exc))


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
    rows = [_job_dict(j) for j in _store().list_jobs(limit=limit, status=status)]
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
        right=[2, 4]))


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
    from orchestrator import cli_history, cli_sweeps

    cli_history.register(app)
    cli_sweeps.register(app)
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


if __name__ == "__main__":
    main()
