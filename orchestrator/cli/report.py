"""`orch report [ID | --sweep NAME | --since 30d] -o report.html`: the history as pictures.

Registered on the main Typer app by `register(app)`. plotly (the `orch-finetune[report]` extra) is
imported only when the command runs, so no other command loads it.
"""


from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from orchestrator.cli.common import EXIT_INVALID, EXIT_NOT_FOUND, fail, open_db
from orchestrator.cli.reportpage import ReportData, ReportError, cost_rows, render, run_data
from orchestrator.core.paths import default_db_url
from orchestrator.records.history import HistoryError, open_reader, parse_when
from orchestrator.records.store import Job, NotFoundError, Sweep

if TYPE_CHECKING:
    from orchestrator.records.store import Job, Store


class PlotlyFrom(StrEnum):
    """Where the page gets plotly.js (reportpage.PLOTLY_MODES)."""

    inline = "inline"
    cdn = "cdn"


# How far back the cost per day/month reaches when a report is for one job or one sweep.
CONTEXT_DAYS = "30d"


def _select(store: "Store", job_id: str | None, sweep: str | None, since: datetime | None
            ) -> tuple[str, list["Job"], dict[str, str]]:
    """(title, jobs oldest first, sweep id → name) for what the arguments name."""
    from sqlmodel import col, select

    with store.session() as session:
        sweeps = {s.id: s.name for s in session.exec(select(Sweep))}
        if job_id is not None:
            try:
                job = store.get_job(job_id)
            except NotFoundError as exc:
                fail(str(exc), EXIT_NOT_FOUND)
            return f"orch report: {job.name} ({job.id})", [job], sweeps
        if sweep is not None:
            found = [sid for sid, name in sweeps.items() if sweep in (sid, name)]
            if not found:
                known = ", ".join(sorted(sweeps.values())) or "none yet"
                fail(f"--sweep {sweep}: no such sweep (sweeps: {known})", EXIT_NOT_FOUND)
            query = select(Job).where(Job.sweep_id == found[0])
            title = f"orch report: sweep {sweeps[found[0]]}"
        else:
            query = select(Job).where(col(Job.created_at) >= since)
            title = f"orch report: jobs since {since:%Y-%m-%d %H:%M} UTC"
        jobs = list(session.exec(query.order_by(col(Job.created_at), col(Job.id))))
    return title, jobs, sweeps


def _report_cmd(
    job_id: Annotated[str | None, typer.Argument(help="One job (j-...); or use --sweep or "
                                                      "--since.", show_default=False)] = None,
    sweep: Annotated[str | None, typer.Option(help="All runs of this sweep (name or id), "
                                                   "their loss curves overlaid.")] = None,
    since: Annotated[str | None, typer.Option(
        help="Jobs created at or after: ISO date/time (UTC) or a span like 30d (the default "
             "without ID or --sweep).")] = None,
    output: Annotated[Path, typer.Option("--output", "-o", help="The HTML file to write.")
                      ] = Path("report.html"),
    plotly_from: Annotated[PlotlyFrom, typer.Option(
        "--plotly", help="inline: the chart library inside the file (~5 MB, opens "
                         "offline); cdn: a small file that loads it from cdn.plot.ly (needs "
                         "the network to draw).")
                      ] = PlotlyFrom.inline,
) -> None:
    """One self-contained HTML file: loss curves, eval metrics, placements, costs.

    It opens in any browser with no network (the chart library is inside the file; --plotly
    cdn writes a small file that loads it from plotly's CDN instead).
    Needs the report extra (in orch's checkout: .venv/bin/pip install -e '.[report]').
    """
    if sum(x is not None for x in (job_id, sweep, since)) > 1:
        fail("give one of ID, --sweep NAME or --since SPAN", EXIT_INVALID)
    now = datetime.now(UTC)
    try:
        start = parse_when(since or CONTEXT_DAYS, "--since", now)
    except HistoryError as exc:
        fail(str(exc), EXIT_INVALID)
    try:
        # Fail before reading anything when the chart library is missing.
        import plotly  # noqa: F401
    except ImportError:
        from orchestrator.cli.reportpage import INSTALL_HINT

        fail(INSTALL_HINT)
    store = open_db()
    try:
        title, jobs, sweeps = _select(store, job_id, sweep, start)
        if not jobs:
            fail(f"no jobs since {start:%Y-%m-%d %H:%M} UTC; widen --since (e.g. 365d) or "
                 "name a job", EXIT_NOT_FOUND)
        runs = [run_data(store, j, sweeps.get(j.sweep_id or "")) for j in jobs]
        charts = None
        if sweep is not None and jobs[0].sweep_id is not None:
            from orchestrator.cli.reportsweep import sweep_charts

            charts = sweep_charts(store, jobs[0].sweep_id)
    finally:
        store.close()
    # Costs per day/month of the selection: for one job or one sweep, of its jobs only (the
    # header's total and the charts must add up to the same money).
    first = min(j.created_at for j in jobs)
    period = min(start, first if first.tzinfo else first.replace(tzinfo=UTC))
    only = [j.id for j in jobs] if job_id is not None or sweep is not None else []
    reader = open_reader(default_db_url())
    try:
        data = ReportData(title=title, generated_at=now, runs=runs,
                          per_day=cost_rows(reader, "day", period, now, only),
                          per_month=cost_rows(reader, "month", period, now, only),
                          plotly=plotly_from.value, sweep=charts)
    except HistoryError as exc:
        fail(str(exc))
    finally:
        if reader is not None:
            reader.close()
    try:
        page = render(data)
    except ReportError as exc:
        fail(str(exc))
    try:
        output.write_text(page, encoding="utf-8")
    except OSError as exc:
        fail(f"cannot write {output}: {exc.strerror}; choose another path with -o")
    size = len(page.encode("utf-8"))
    shown = f"{size / 1e6:.1f} MB" if size >= 1e6 else f"{size / 1e3:.0f} kB"
    where = ("opens offline" if plotly_from is PlotlyFrom.inline
             else "loads plotly.js from cdn.plot.ly: needs the network")
    typer.echo(f"wrote {output} ({shown}, {len(runs)} run{'s' if len(runs) != 1 else ''}; "
               f"{where}); open it in a browser")


def register(app: typer.Typer) -> None:
    """Add `report` to `app`."""
    app.command("report")(_report_cmd)
