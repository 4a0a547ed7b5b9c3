"""The `orch` command line: parse, call one core function, render (aligned tables or --json).

`orch plan` must start in a small multiple of a bare `python -c pass`: the other commands'
modules are imported only when one of their commands runs (cli/lazycommands.py), and the
heavy libraries (the database layer, SSH, HTTP) only inside the commands here that need them.
"""


import atexit
import gc
import json
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import click
import typer

from orchestrator.cli.common import EXIT_INVALID, JsonFlag, fail, money, open_db, print_json
from orchestrator.cli.helpstyle import relabel
from orchestrator.cli.lazycommands import LazyGroup, new_app
from orchestrator.core.jobstatus import JobStatus, parse_status

if TYPE_CHECKING:
    from orchestrator.records.store import Job

app = new_app(
    cls=LazyGroup,
    name="orch",
    help="Fine-tune LLMs on rented GPUs at the lowest cost that works.",
    no_args_is_help=True,
    # `orch --install-completion` / `--show-completion` (bash, zsh, fish, PowerShell).
    add_completion=True,
    # new_app: plain help and errors (rich_markup_mode=None): rich markup ate `[report]` in
    # "pip install -e '.[report]'", drew usage errors as boxes, and kept docstring line breaks
    # inside its own wrapping.
    # Subcommands inherit it: `orch jobs -h` works as `-h` does in gh and kubectl.
    context_settings={"help_option_names": ["-h", "--help"]},
)


# pyproject.toml's project name (the command is `orch`; the name `orch` on the package index
# belongs to an unrelated project).
DISTRIBUTION = "orch-finetune"


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"orch {version(DISTRIBUTION)}")
        raise typer.Exit()


@app.callback()
def _root(
    _version: Annotated[bool, typer.Option(
        "--version", callback=_print_version, is_eager=True,
        help="Print orch's version and exit.")] = False,
) -> None:
    """Fine-tune LLMs on rented GPUs at the lowest cost that works."""


@app.command()
def plan(
    file: Annotated[Path, typer.Argument(help="The job file (job.yml).")],
    json_out: JsonFlag = False,
    all_rows: Annotated[bool, typer.Option("--all", help="Show every placement.")] = False,
) -> None:
    """Show what would happen: memory breakdown, ranked placements, the chosen one."""
    # The planning modules only for the commands that plan (`orch jobs` and `--help` skip them).
    from orchestrator.cli import plan as cli_plan

    cli_plan.run(file, json_out, all_rows)


@app.command()
def offers(
    gpu: Annotated[str | None, typer.Option(
        "--gpu", help="Only this GPU model (e.g. L40S).")] = None,
    min_memory: Annotated[float, typer.Option(
        "--min-memory", help="Only GPUs with at least this many GiB each.")] = 0.0,
    provider: Annotated[str | None, typer.Option(
        "--provider", help="Only this provider (vastai, runpod, cloud, ...).")] = None,
    spot: Annotated[bool | None, typer.Option(
        "--spot/--on-demand", help="Only interruptible, or only on-demand, offers.",
        show_default=False)] = None,
    count: Annotated[int, typer.Option("--count", help="GPUs per machine: 1, 2, 4 or 8.")] = 1,
    json_out: JsonFlag = False,
) -> None:
    """The market, cheapest first: live offers with API keys, else the dated snapshot of what
    Vast.ai and RunPod list and the seed catalogs; each row says where its price comes from."""
    from orchestrator.cli import offers as cli_offers

    cli_offers.run(cli_offers.filters(gpu, min_memory, provider, spot, count), json_out)


@app.command()
def prices(
    gpu: Annotated[str, typer.Argument(help="The GPU model (e.g. L40S, \"RTX 4090\").")],
    since: Annotated[str | None, typer.Option(
        help="Seen at or after: ISO date/time (UTC) like 2026-11-01, or a span like 30d.")
    ] = None,
    json_out: JsonFlag = False,
) -> None:
    """Prices searches have seen for a GPU: median, range and latest per provider and kind."""
    from orchestrator.cli import offers as cli_offers

    cli_offers.prices_run(gpu, since, json_out)


def _job_dict(j: "Job", now: datetime) -> dict[str, Any]:
    from orchestrator.cli.term import iso_utc
    from orchestrator.core.jobstatus import lease_state
    from orchestrator.core.money import from_micros

    return {
        # `job_id`, as submit, show, cancel and the sweep commands say (one key per concept).
        "job_id": j.id, "name": j.name, "status": j.status, "method": j.method,
        "base_model": j.base_model, "provider": j.provider, "gpu": j.gpu,
        "gpu_count": j.gpu_count, "interruptible": j.interruptible,
        "est_hours": j.est_hours, "est_cost": str(from_micros(j.est_cost_micros or 0)),
        "cost": str(from_micros(j.cost_micros or 0)),
        "created_at": iso_utc(j.created_at),
        # Which worker drives it and until when; `lapsed`: that worker stopped renewing.
        "owner": j.lease_owner, "lease_expires_at": iso_utc(j.lease_expires_at),
        "lease": lease_state(j.lease_owner, j.lease_expires_at, now),
    }


def _listed(limit: int, status: JobStatus | Literal["running"] | None) -> list[Any]:
    """The newest jobs: read-only without SQLAlchemy where that is all the store would do
    (records/jobsread.py), else through the store (which creates, upgrades or repairs)."""
    from orchestrator.core.jobstatus import RUNNING_STATUSES, in_order
    from orchestrator.records.jobsread import recent_jobs

    rows = recent_jobs(limit, tuple(in_order(RUNNING_STATUSES)) if status == "running" else
                       None if status is None else (status,))
    if rows is not None:
        return list(rows)
    return list(open_db().list_jobs(limit=limit, status=status))


@app.command()
def jobs(
    json_out: JsonFlag = False,
    status: Annotated[str | None, typer.Option(
        help="Only jobs in this state; `running`: every state a worker drives.")] = None,
    limit: Annotated[int, typer.Option(help="How many, newest first.")] = 50,
) -> None:
    """List jobs, newest first."""


    if not 1 <= limit <= 100_000:
        fail(f"--limit must be 1..100000 (got {limit})", EXIT_INVALID)
    wanted: JobStatus | Literal["running"] | None = None
    try:
        wanted = "running" if status == "running" else (
            None if status is None else parse_status(status))
    except ValueError as exc:
        fail(f"--status {status}: {exc}; or running (every state a worker drives)",
             EXIT_INVALID)
    found = _listed(limit, wanted)
    now = datetime.now(UTC)
    rows = [_job_dict(j, now) for j in found]
    if json_out:
        print_json(rows)
        return
    if not rows and status is not None:
        typer.echo(f"no jobs match --status {status}; `orch jobs` lists them all")
        return
    if not rows:
        typer.echo("no jobs yet; try `orch submit examples/quickstart.yml` (simulated cloud)")
        return
    from orchestrator.cli.jobview import lease_cell
    from orchestrator.cli.tables import table
    from orchestrator.cli.term import human_time

    # On a narrow terminal: estimates, method, the creation time and the worker go first.
    typer.echo(table(
        ["id", "name", "status", "method", "placement", "est. h", "est. cost", "cost",
         "created", "worker", "lease"],
        [[r["job_id"], r["name"], r["status"], r["method"],
          f"{r['provider']} {r['gpu']} x{r['gpu_count']}", f"{r['est_hours']:.2f}",
          money(r["est_cost"]), money(r["cost"]), human_time(j.created_at),
          r["owner"] or "-", lease_cell(j, now)]
         for r, j in zip(rows, found, strict=True)],
        right=[5, 6, 7], drop=[5, 6, 3, 8, 9], states=[2, 10]))


@app.command()
def reconcile(
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would be done; change "
                                          "nothing.")] = False,
    json_out: JsonFlag = False,
) -> None:
    """Terminate instances tagged as orch's whose job is finished or unknown; requeue jobs
    whose worker died; close stale instance rows."""
    from orchestrator.engine.reconcile import reconcile as run_reconcile
    from orchestrator.engine.recovery import idle_grace_s
    from orchestrator.engine.wiring import configured_providers

    store = open_db(repair=False)
    try:
        grace = idle_grace_s()
    except ValueError as exc:
        fail(str(exc), 2)
    providers, notes = configured_providers(store, quick=True)
    from orchestrator.cli import servers as cli_servers

    report = run_reconcile(store, providers, dry_run=dry_run, idle_grace_s=grace,
                           scrub=cli_servers.scrubber())
    from orchestrator.core.paths import describe_db

    if json_out:
        # One object on one line, so `orch reconcile --json >> log.jsonl` from cron is JSONL.
        typer.echo(json.dumps({"database": describe_db(), "dry_run": dry_run,
                               "providers": sorted(providers), "notes": notes,
                               "actions": [a.__dict__ for a in report.actions]}, default=str))
        return
    for note in notes:
        typer.echo(f"note: {note}", err=True)
    acted = [a for a in report.actions if a.kind != "keep"]
    if not acted:
        kept = len(report.actions)
        typer.echo(f"nothing to do ({kept} instance{'s' if kept != 1 else ''} in use; "
                   f"checked {', '.join(sorted(providers))})\ndatabase: {describe_db()}")
        return
    from orchestrator.cli.tables import table

    verb = {"terminate": "would terminate" if dry_run else "terminated",
            "mark-terminated": "would close" if dry_run else "closed",
            "requeue": "would requeue" if dry_run else "requeued", "error": "error",
            "scrub-secrets": "would scrub" if dry_run else "scrubbed"}
    typer.echo(table(["action", "provider", "instance", "job", "why"],
                     [[verb.get(a.kind, a.kind), a.provider, a.instance_id or "-",
                       a.job_id or "-", a.reason] for a in acted]))
    typer.echo(f"database: {describe_db()}")
    if any(a.kind == "error" for a in acted):
        raise typer.Exit(1)


def _check_settings() -> None:
    """Exit 2 with one `error:` line for each ORCH_* variable orch cannot use."""
    from orchestrator.core.settings import SettingsError, settings

    try:
        settings()
    except SettingsError as exc:
        for line in str(exc).splitlines():
            typer.echo(f"error: {line}", err=True)
        sys.exit(2)


def _debug() -> bool:
    """ORCH_DEBUG: show an internal error's traceback (off where the settings are bad)."""
    from orchestrator.core.settings import SettingsError, settings

    try:
        return settings().debug
    except SettingsError:
        return False


def main() -> None:
    """Console-script entry point."""
    # At exit the interpreter runs full garbage collections over every object the imports
    # made (pydantic's and typer's schemas, SQLAlchemy's registries) only to return memory
    # the OS takes back anyway: 40 ms of `orch plan`'s ~250, 200 ms of `orch jobs`'. Frozen
    # objects are skipped there. What frees by reference count still does (files, database
    # connections); Python never promised finalizers for what is left at exit.
    atexit.unregister(gc.freeze)  # once, where a test calls main() many times
    atexit.register(gc.freeze)
    # Pydantic looks for plugins (logfire and the like: none is part of orch) by reading the
    # entry points of every installed distribution when it builds its first model: ~2 % of
    # `orch plan`'s start-up, and more the more packages share the environment. Off unless
    # the user has set PYDANTIC_DISABLE_PLUGINS themselves (to "" to load plugins): pydantic
    # 2.14 `plugin/_loader.py` `get_plugins`, docs.pydantic.dev "Plugins". Set before any
    # model is built, and inherited by the orch processes this one starts.
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    # Every command checks orch's settings (the ORCH_* variables) first: a bad one exits 2
    # with one line each, before anything is read or written. Help needs none of them.
    if sys.argv[1:] and not {"--help", "-h", "--version"} & set(sys.argv[1:]):
        _check_settings()

    try:
        root = typer.main.get_command(app)
        relabel(root)  # its commands are relabelled as they are loaded (LazyGroup)
        code = root(prog_name="orch", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as exc:
        exc.show()  # `orch` alone: the help
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        # A usage error as every other error: one `error:` line, and where the usage is.
        ctx = getattr(exc, "ctx", None)
        where = f"; see `{ctx.command_path} -h`" if ctx is not None else ""
        typer.echo(f"error: {exc.format_message().rstrip('.')}{where}", err=True)
        sys.exit(exc.exit_code)
    except click.Abort:
        typer.echo("aborted", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)
    except Exception as exc:  # a defect: one line for the user, the traceback on request
        # A locked, full or read-only database is no defect: its own line. (The store's module is
        # loaded whenever one was raised; looked up here to keep `orch --help` light.)
        tables = sys.modules.get("orchestrator.records.store.tables")
        if tables is not None and isinstance(
                exc, tables.DatabaseBusy | tables.DatabaseFull | tables.DatabaseReadOnly):
            typer.echo(f"error: {exc}", err=True)
            sys.exit(1)

        if _debug():
            raise
        typer.echo(f"error: internal error ({type(exc).__name__}: {exc}); please report it "
                   "with the command that caused it (ORCH_DEBUG=1 shows the traceback)",
                   err=True)
        sys.exit(1)
    # standalone_mode=False returns the exit code of `typer.Exit`/`ctx.exit` (None: 0).
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
