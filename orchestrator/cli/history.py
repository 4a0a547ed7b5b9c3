"""`orch history`, `orch cost`, `orch sql` and `orch advise`: reading the history.

Registered on the main Typer app by `register(app)`. On SQLite these commands never import
SQLModel/SQLAlchemy (orchestrator.records.history reads with the standard library), so they start
about as fast as `orch --help`; heavier modules are imported inside the commands.
"""


import json
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Any

import typer

from orchestrator.cli import advise as adv
from orchestrator.cli.advise import render_lines
from orchestrator.cli.common import (
    EXIT_ERROR,
    EXIT_INVALID,
    fail,
    history_reader,
    one_format,
    print_csv,
    print_json,
)
from orchestrator.cli.exits import exit_code
from orchestrator.cli.tables import table
from orchestrator.cli.term import human_duration, human_time
from orchestrator.core.money import usd
from orchestrator.core.paths import default_db_url
from orchestrator.records import warmidle
from orchestrator.records.history import (
    Filters,
    HistoryError,
    cost_rollup,
    dollars,
    history,
    metered_usage,
    parse_when,
    server_usage,
    split_by,
    to_text,
    total,
)
from providers import catalog

if TYPE_CHECKING:
    from orchestrator.records.history import CostRow, HistoryRow, Reader

JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
CsvFlag = Annotated[bool, typer.Option("--csv", help="Print CSV (header row first).")]
SinceOpt = Annotated[str | None, typer.Option(
    help="Jobs created at or after: ISO date/time (UTC) like 2026-11-01, or a span like 30d, "
         "12h, 2w.")]
UntilOpt = Annotated[str | None, typer.Option(
    help="Jobs created before: ISO date/time (UTC) or a span back from now.")]


def _when(value: str | None, flag: str, now: datetime) -> datetime | None:
    if value is None:
        return None
    try:
        return parse_when(value, flag, now)
    except HistoryError as exc:
        fail(str(exc), EXIT_INVALID)


def _money(micros: int | None) -> str:
    return "-" if micros is None else usd(dollars(micros))


def _spot(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "no")


def _history_cmd(
    status: Annotated[list[str] | None, typer.Option(
        help="Only jobs in this state (repeat for several).")] = None,
    method: Annotated[list[str] | None, typer.Option(
        help="Only this training method: qlora, lora, full (repeatable).")] = None,
    model: Annotated[list[str] | None, typer.Option(
        help="Only this base model: the repo id or its name after the org (repeatable).")
    ] = None,
    provider: Annotated[list[str] | None, typer.Option(help="Only this provider (repeatable).")
                        ] = None,
    gpu: Annotated[list[str] | None, typer.Option(
        help="Only this GPU; H100 matches both H100 variants (repeatable).")] = None,
    sweep: Annotated[str | None, typer.Option(help="Only jobs of this sweep (name or id).")
                     ] = None,
    layout: Annotated[list[str] | None, typer.Option(
        help="Only jobs planned with this GPU layout: single, ddp, zero3, zero3_offload, "
             "fsdp2, fsdp2_offload (repeatable; the old fsdp names still work).")] = None,
    since: SinceOpt = None,
    until: UntilOpt = None,
    sort: Annotated[str, typer.Option(help="Sort by created, cost, duration or status.")
                    ] = "created",
    desc: Annotated[bool, typer.Option("--desc/--asc", help="Largest/newest first, or not.")
                    ] = True,
    limit: Annotated[int, typer.Option(help="At most this many jobs (0 = all).")] = 50,
    json_out: JsonFlag = False,
    csv_out: CsvFlag = False,
) -> None:
    """List past and current jobs, filtered and sorted."""
    one_format(json_out, csv_out)
    now = datetime.now(UTC)
    filters = Filters(
        statuses=tuple(status or ()), methods=tuple(method or ()), models=tuple(model or ()),
        providers=tuple(provider or ()), gpus=tuple(gpu or ()), sweep=sweep,
        layouts=tuple(layout or ()),
        since=_when(since, "--since", now), until=_when(until, "--until", now))
    with history_reader() as reader:
        rows = history(reader, filters, sort=sort.lower(), descending=desc,
                       limit=limit or None, now=now)
    _render_history(rows, json_out, csv_out)


def _render_history(rows: "list[HistoryRow]", json_out: bool, csv_out: bool) -> None:
    if json_out:
        print_json([r.to_dict() for r in rows])
        return
    if csv_out:
        dicts = [r.to_dict() for r in rows]
        headers = ["job_id", "name", "status", "method", "model", "provider", "gpu", "gpu_count",
                   "spot", "cost", "amortised", "duration_s", "created_at", "started_at",
                   "finished_at"]
        print_csv(headers, [[d[h] for h in headers] for d in dicts])
        return
    if not rows:
        typer.echo("no jobs match; widen the filters (e.g. drop --since) or see `orch jobs`")
        return
    typer.echo(table(
        ["id", "name", "status", "method", "model", "provider", "GPU", "spot", "cost",
         "duration", "created"],
        [[r.id, r.name, r.status, r.method, r.model, r.provider or "-",
          f"{r.gpu} x{r.gpu_count}" if r.gpu else "-", _spot(r.spot), _money(r.cost_micros),
          human_duration(r.duration_s), human_time(r.created_at)] for r in rows],
        right=[8, 9], drop=[7, 3, 5, 9, 10, 4], states=[2]))


def _cost_cmd(
    by: Annotated[list[str] | None, typer.Option(
        help="Group by day, week (ISO) or month, and/or provider, gpu, sweep or method; "
             "repeat to combine one of each, e.g. --by month --by provider.")] = None,
    since: SinceOpt = None,
    until: UntilOpt = None,
    json_out: JsonFlag = False,
    csv_out: CsvFlag = False,
) -> None:
    """Spending rollups: jobs, GPU-hours, cost, amortised rent and spot savings."""
    one_format(json_out, csv_out)
    now = datetime.now(UTC)
    start, end = _when(since, "--since", now), _when(until, "--until", now)
    with history_reader() as reader:
        when, dim = split_by(by or ["month"])
        rows = cost_rollup(reader, when=when, dim=dim, since=start, until=end, now=now)
        warm = [] if reader is None else warmidle.windows(
            reader, start or datetime(1970, 1, 1, tzinfo=UTC), end or now, now)
    t = total(rows)
    unpriced = sorted(t.unpriced_gpus)
    idle, windows, parked = warmidle.idle_total(warm)
    if json_out:
        print_json({"by": [b for b in (when, dim) if b],
                   "since": None if start is None else to_text(start),
                   "until": None if end is None else to_text(end),
                   "rows": [r.to_dict() for r in rows], "total": t.to_dict(),
                   "idle_warm": {"cost": str(idle), "windows": windows, "parked_now": parked},
                   "notes": _cost_notes(unpriced)})
        return
    headers = [*(b for b in (when, dim) if b), "jobs", "gpu_hours", "cost", "amortised",
               "spot_savings"]

    def cells(r: "CostRow", money: Any) -> list[object]:
        first = [r.bucket] if when else []
        return [*first, *([r.key if r.key is not None else "-"] if dim else []), r.jobs,
                r.gpu_hours, money(r.cost_micros), money(r.amortised_micros),
                money(r.savings_micros)]

    if csv_out:
        def exact(m: int | None) -> object:
            return None if m is None else dollars(m)

        print_csv(headers, [cells(r, exact) for r in rows])
        return
    if not rows:
        typer.echo("no jobs in that range; widen --since/--until or see `orch history`")
        return
    shown = [cells(r, _money) for r in rows]
    last = cells(t, _money)
    if not when:
        last[0] = "total"
    elif dim:
        last[1] = ""
    shown.append(last)
    n = len(headers)
    typer.echo(table(["GPU-h" if h == "gpu_hours" else h.replace("_", " ") for h in headers],
                     shown, right=list(range(n - 5, n))))
    typer.echo("  cost = billed (metered and volume); amortised = share of monthly rents "
               "already paid, not in cost; spot savings = spot GPU-hours at the on-demand "
               "catalog price minus what was charged"
               + ("; days, weeks and months are UTC (a job counts on the UTC day it was "
                  "created)" if when else ""))
    if windows:
        from orchestrator.core.money import usd

        typer.echo(f"  idle (warm): {usd(idle)} over {windows} window"
                   f"{'s' if windows != 1 else ''} of machines kept warm between jobs, billed "
                   "to no job (not in cost)"
                   + (f"; {parked} parked now (`orch warm`)" if parked else ""))
    for note in _cost_notes(unpriced):
        typer.echo(f"  note: {note}")


def _cost_notes(unpriced: list[str]) -> list[str]:
    if not unpriced:
        return []
    return [f"no on-demand catalog price for {', '.join(unpriced)}: their spot hours have "
            "no savings figure (left out of spot savings)"]


def _sql_cmd(
    query: Annotated[str, typer.Argument(help='One read-only query, e.g. "SELECT count(*) '
                                              'FROM job".')],
    json_out: JsonFlag = False,
    csv_out: CsvFlag = False,
) -> None:
    """Run one read-only SQL query on the history (writes are refused).

    Tables: job, instance, event, metric, sweep, server, price_observation,
    throughput_observation, warm_instance, sweep_rung, host_observation. Views:
    v_cost_per_month_provider, v_best_run_per_sweep, v_gpu_hours_per_model,
    v_interruptions_per_provider. Columns: docs/schema.md.

    Built-in functions only; at most ORCH_SQL_TIMEOUT_S s (30) and ORCH_SQL_MAX_ROWS rows.
    """
    from orchestrator.records.history import HistoryError, run_sql

    one_format(json_out, csv_out)
    try:
        result = run_sql(default_db_url(), query)
    except HistoryError as exc:  # a refused or wrong query is invalid input (exit 2)
        fail(str(exc), exit_code(exc))

    def plain(v: object) -> object:
        if isinstance(v, (dict, list)):  # PostgreSQL's json columns arrive parsed
            return json.dumps(v, sort_keys=True)
        return v.hex() if isinstance(v, bytes) else v

    if json_out:
        print_json({"columns": list(result.columns),
                   "rows": [[v if isinstance(v, (dict, list)) else plain(v) for v in row]
                            for row in result.rows]})
        return
    if csv_out:
        print_csv(result.columns, [[plain(v) for v in row] for row in result.rows])
        return
    numeric = [i for i in range(len(result.columns))
               if result.rows and all(isinstance(r[i], (int, float)) or r[i] is None
                                      for r in result.rows)]
    typer.echo(table(result.columns, [["NULL" if v is None else plain(v) for v in row]
                                      for row in result.rows], right=numeric))
    n = len(result.rows)
    typer.echo(f"({n} row{'s' if n != 1 else ''})", err=True)


def _advise_cmd(
    days: Annotated[int, typer.Option(help="Look back this many days.")] = 30,
    json_out: JsonFlag = False,
) -> None:
    """Would monthly servers have been cheaper? Which rented servers sit idle?"""
    if not 1 <= days <= 3650:
        fail(f"--days {days}: give 1..3650", EXIT_INVALID)
    with history_reader(EXIT_ERROR) as reader:
        advice = advise_from_history(reader, days, datetime.now(UTC))
    if json_out:
        print_json(advice.to_dict())
        return
    typer.echo("\n".join(render_lines(advice)))


def advise_from_history(reader: "Reader | None", days: int, now: datetime) -> Any:
    """Load the window's usage and prices at the edge, then call the pure advise()."""
    since = now - timedelta(days=days)
    metered = metered_usage(reader, since, now) if reader else []
    servers = server_usage(reader, since, now) if reader else []
    # Instances may carry a provider's spelling (`H100-SXM`): merge by the catalog's name.
    merged: dict[str, tuple[int, int]] = {}
    for gpu, secs, micros in metered:
        name = catalog.canonical_name(gpu)
        s0, m0 = merged.get(name, (0, 0))
        merged[name] = (s0 + secs, m0 + micros)
    return adv.advise(
        [adv.MeteredUsage(gpu, adv.hours(secs), adv.dollars(micros))
         for gpu, (secs, micros) in merged.items()],
        [adv.ServerUsage(name, gpu, count, adv.dollars(monthly), adv.hours(used),
                         adv.hours(available))
         for name, gpu, count, monthly, used, available in servers],
        adv.catalog_monthly(), adv.catalog_hourly(), days)


def register(app: typer.Typer) -> None:
    """Add history, cost, sql and advise to `app`."""
    app.command("history")(_history_cmd)
    app.command("cost")(_cost_cmd)
    app.command("sql")(_sql_cmd)
    app.command("advise")(_advise_cmd)
