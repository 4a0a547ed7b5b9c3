"""`orch report`: one self-contained HTML file with loss curves, eval metrics, placements,
cost breakdowns and cost per day/month with spot savings.

Charts are drawn by plotly (the optional extra `orch-finetune[report]`), its JavaScript inlined so
the file opens with no network (`inline`, the default), or loaded from plotly's CDN for a small
file (`cdn`). plotly is imported only here, only when a report is made: no other command pays
for it. Data is gathered first (`collect`), then rendered (`render`).
"""

from __future__ import annotations

import base64
import hashlib
import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from orchestrator.cli.reportsweep import SweepCharts, objective_section
from orchestrator.cli.term import human_time
from orchestrator.core.money import usd
from orchestrator.records.history import cost_rollup
from orchestrator.records.store import from_micros, nan_if_null

if TYPE_CHECKING:
    from orchestrator.records.columns import PlacementChoice
    from orchestrator.records.historyread import Reader
    from orchestrator.records.store import Job, Store

INSTALL_HINT = ("orch report draws its charts with plotly, the report extra: in orch's "
                "checkout run .venv/bin/pip install -e '.[report]'")


# Where `--plotly cdn` loads plotly.js from: the URL plotly.py itself writes for
# `to_html(include_plotlyjs="cdn")` (plotly 7.1.0, plotly/io/_utils.py `plotly_cdn_url`), for
# the plotly.js version bundled with the installed plotly.py.
CDN_URL = "https://cdn.plot.ly/plotly-{version}.min.js"
PLOTLY_MODES = ("inline", "cdn")


class ReportError(Exception):
    """Why no report could be made (missing plotly, nothing selected)."""


@dataclass
class RunData:
    """One job as the report shows it."""

    id: str
    name: str
    status: str
    sweep: str | None
    provider: str | None
    gpu: str | None
    gpu_count: int | None
    spot: bool | None
    created_at: datetime
    cost: Decimal
    storage: Decimal
    amortised: Decimal
    est_cost: Decimal | None
    est_hours: float | None
    placement: PlacementChoice | None  # the plan's choice, recorded at submit
    loss: list[tuple[int, float]]
    metrics: dict[str, float]


@dataclass
class ReportData:
    """Everything the page shows; `title` says what was selected."""

    title: str
    generated_at: datetime
    runs: list[RunData]
    per_day: list[dict[str, Any]] = field(default_factory=list)
    per_month: list[dict[str, Any]] = field(default_factory=list)
    plotly: str = "inline"  # one of PLOTLY_MODES
    sweep: SweepCharts | None = None  # a search / early-stopping sweep's own charts


def run_data(store: Store, job: Job, sweep_name: str | None) -> RunData:
    """A job's row, metrics and placement as RunData."""
    by_step: dict[int, float] = {}
    metrics: dict[str, float] = {}
    for m in store.metrics(job.id):
        if m.step is None:
            metrics[m.name] = nan_if_null(m.value)  # NULL (not a number) charts as a gap
        elif m.name == "train.loss":
            # a resumed run reports a step again: the last counts
            by_step[m.step] = nan_if_null(m.value)
    return RunData(
        id=job.id, name=job.name, status=job.status, sweep=sweep_name, provider=job.provider,
        gpu=job.gpu, gpu_count=job.gpu_count, spot=job.interruptible,
        created_at=job.created_at, cost=from_micros(job.cost_micros),
        storage=from_micros(job.storage_micros), amortised=from_micros(job.amortised_micros),
        est_cost=None if job.est_cost_micros is None else from_micros(job.est_cost_micros),
        est_hours=job.est_hours, placement=job.placement().placement,
        loss=sorted(by_step.items()),
        metrics=metrics)


def cost_rows(reader: Reader | None, when: str, since: datetime | None, now: datetime,
              ids: Sequence[str] = ()) -> list[dict[str, Any]]:
    """`orch cost --by WHEN` rows (cost, amortised rent, spot savings) as plain dicts, of
    the jobs `ids` (none: every job since `since`)."""
    if reader is None:
        return []
    return [r.to_dict() for r in cost_rollup(reader, when=when, dim=None, since=since, now=now,
                                             ids=ids)]


# --- rendering --------------------------------------------------------------------------------


def _plotly() -> Any:
    try:
        import plotly
        import plotly.graph_objects as go
    except ImportError:
        raise ReportError(INSTALL_HINT) from None
    return plotly, go


def _figure_html(fig: Any, div_id: str) -> str:
    # The library's JS is inlined once in <head>; each figure is a div and its data.
    return str(fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id,
                           config={"displaylogo": False, "responsive": True}))


def _layout(title: str, x: str, y: str) -> dict[str, Any]:
    yaxis: dict[str, Any] = {"title": {"text": y}}
    if y == "USD":  # not plotly's SI prefixes: $0.0003, not 300µ
        yaxis.update(tickprefix="$", tickformat=",.6~f")
    return {"title": {"text": title}, "xaxis": {"title": {"text": x}},
            "yaxis": yaxis, "template": "plotly_white", "height": 420,
            "margin": {"l": 60, "r": 20, "t": 50, "b": 50}, "legend": {"orientation": "h"}}


def _usd(value: Decimal | str | None) -> str:
    return "-" if value is None else html.escape(usd(Decimal(str(value))))


def _table(headers: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return (f'<div class="wide"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody>'
            "</table></div>")


def _label(run: RunData) -> str:
    return f"{run.name} ({run.id})"


def plotly_script(mode: str) -> str:
    """The <script> that loads plotly.js: inlined (offline), or from the CDN (small file).

    The CDN tag carries the SHA-256 of the bundled plotly.js as its `integrity`, as plotly's
    own `to_html(include_plotlyjs="cdn")` does (plotly 7.1.0, plotly/io/_html.py): a browser
    runs the CDN's file only if it is byte for byte the version this report was made with.
    """
    from plotly.offline import get_plotlyjs, get_plotlyjs_version

    js = get_plotlyjs()
    if mode == "inline":
        return f'<script type="text/javascript">{js}</script>'
    digest = base64.b64encode(hashlib.sha256(js.encode("utf-8")).digest()).decode("ascii")
    url = CDN_URL.format(version=get_plotlyjs_version())
    return (f'<script charset="utf-8" src="{html.escape(url)}" integrity="sha256-{digest}" '
            'crossorigin="anonymous"></script>')


def render(data: ReportData) -> str:
    """The whole page as one HTML string (plotly's JS included, or loaded from its CDN)."""
    plotly, go = _plotly()

    e = html.escape
    sections = [*_loss_section(go, data.runs, data.sweep),
                *objective_section(go, data.sweep, _figure_html, _layout),
                *_metrics_section(go, data.runs), *_cost_section(go, data.runs)]
    for title, when, rollup, div in (("Cost per day", "day", data.per_day, "day-chart"),
                                     ("Cost per month", "month", data.per_month,
                                      "month-chart")):
        sections += _rollup_section(go, title, when, rollup, div)

    total = sum((r.cost for r in data.runs), Decimal(0))
    summary = (f"{len(data.runs)} run{'s' if len(data.runs) != 1 else ''}, "
               f"{_usd(total)} billed; generated {e(human_time(data.generated_at))} by "
               f"orch (plotly {e(plotly.__version__)})")
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{e(data.title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 1100px;
       color: #222; padding: 0 1rem; }}
table {{ border-collapse: collapse; margin: 1rem 0; font-size: 0.9rem; }}
th, td {{ border-bottom: 1px solid #ddd; padding: 0.3rem 0.6rem; text-align: left;
          white-space: nowrap; }}
.wide {{ overflow-x: auto; }}
th {{ background: #f4f4f4; }}
.note {{ color: #666; }}
</style>
{plotly_script(data.plotly)}
</head>
<body>
<h1>{e(data.title)}</h1>
<p class="note">{summary}. Cost is what providers billed (volume storage included); the rent
share of monthly servers is already paid and not in it; spot savings price spot GPU-hours
at the cheapest on-demand catalog price.</p>
{"".join(sections)}
</body>
</html>
"""


def _loss_section(go: Any, runs: list[RunData], sweep: SweepCharts | None) -> list[str]:
    """The training loss of every run that recorded one, on one chart; in a sweep with
    early stopping the rungs are dotted lines and a pruned run is dashed, with an x where it
    stopped."""
    curves = [r for r in runs if r.loss]
    if not curves:
        return ["<h2>Training loss</h2><p>No training loss recorded for these runs.</p>"]
    fig = go.Figure(layout=_layout("Training loss", "step", "loss"))
    trials = {t.job_id: t for t in sweep.trials} if sweep is not None else {}
    for r in curves:
        trial = trials.get(r.id)
        pruned = trial is not None and trial.pruned_at is not None
        fig.add_trace(go.Scatter(x=[s for s, _ in r.loss], y=[v for _, v in r.loss],
                                 mode="lines+markers", name=_label(r) + (" (pruned)" if pruned
                                                                         else ""),
                                 line={"dash": "dash"} if pruned else {}))
        if trial is not None and trial.pruned_at is not None:
            step = trial.pruned_at[0]
            at = dict(r.loss).get(step)
            fig.add_trace(go.Scatter(x=[step], y=[at if at is not None else r.loss[-1][1]],
                                     mode="markers", showlegend=False, name="pruned here",
                                     marker={"symbol": "x", "size": 12, "color": "#d62728"}))
    for step in sorted({s for t in trials.values() for s in t.rung_steps}):
        fig.add_vline(x=step, line_dash="dot", line_color="#999999")
    return ["<h2>Training loss</h2>" + _figure_html(fig, "loss-chart")]


def _metrics_section(go: Any, runs: list[RunData]) -> list[str]:
    """The eval metrics per run: a grouped bar chart and a table."""
    e = html.escape
    names = sorted({k for r in runs for k in r.metrics})
    scored = [r for r in runs if r.metrics]
    sections = ["<h2>Eval metrics per run</h2>"]
    if not scored:
        return [*sections, "<p>No eval metrics recorded for these runs.</p>"]
    fig = go.Figure(layout={**_layout("Eval metrics", "run", "value"), "barmode": "group"})
    # Counts (rows scored) would dwarf the scores on one axis; they stay in the table.
    for name in [n for n in names if not n.endswith(".count")] or names:
        fig.add_trace(go.Bar(x=[_label(r) for r in scored],
                             y=[r.metrics.get(name) for r in scored], name=name))
    sections.append(_figure_html(fig, "metrics-chart"))
    sections.append(_table(["run", *names], [
        [e(_label(r)), *(e(f"{r.metrics[n]:g}") if n in r.metrics else "-" for n in names)]
        for r in scored]))
    return sections


def _field(placement: PlacementChoice | None, name: str) -> str:
    """A field of the recorded placement as the table shows it (`-`: not recorded)."""
    if placement is None or name not in placement.model_fields_set:
        return "-"
    return str(getattr(placement, name))


def _cost_section(go: Any, runs: list[RunData]) -> list[str]:
    """Each run's placement and cost: a stacked bar chart and a table."""
    e = html.escape
    sections = ["<h2>Placement and cost per run</h2>"]
    fig = go.Figure(layout={**_layout("Cost per run", "run", "USD"), "barmode": "stack"})
    labels = [_label(r) for r in runs]
    fig.add_trace(go.Bar(x=labels, y=[float(r.cost - r.storage) for r in runs],
                         name="compute (billed)"))
    fig.add_trace(go.Bar(x=labels, y=[float(r.storage) for r in runs],
                         name="volume storage (billed)"))
    fig.add_trace(go.Bar(x=labels, y=[float(r.amortised) for r in runs],
                         name="monthly rent share (already paid)"))
    sections.append(_figure_html(fig, "cost-chart"))
    rows = []
    for r in runs:
        p = r.placement
        where = (f"{r.provider} {r.gpu} x{r.gpu_count}" if r.gpu else "not placed")
        kind = "-" if r.spot is None else ("spot" if r.spot else "on-demand")
        rows.append([e(r.id), e(r.name), e(r.status), e(where), e(kind),
                     e(_field(p, "strategy")), e(_field(p, "billing")),
                     "-" if r.est_hours is None else e(f"{r.est_hours:.2f}"),
                     _usd(r.est_cost), _usd(r.cost), _usd(r.storage), _usd(r.amortised),
                     e(human_time(r.created_at))])
    sections.append(_table(["job", "name", "status", "placement", "kind", "layout",
                            "billing", "est. h", "est. cost", "cost", "of it storage",
                            "rent share", "created"], rows))
    return sections


def _rollup_section(go: Any, title: str, when: str, rollup: list[dict[str, Any]], div: str
                    ) -> list[str]:
    """Cost, rent share and spot savings per day or month: a bar chart and a table."""
    e = html.escape
    sections = [f"<h2>{title}</h2>"]
    if not rollup:
        return [*sections, "<p>No jobs in the period.</p>"]
    fig = go.Figure(layout={**_layout(title, when, "USD"), "barmode": "group"})
    buckets = [row["bucket"] for row in rollup]
    fig.add_trace(go.Bar(x=buckets, y=[float(row["cost"]) for row in rollup],
                         name="cost (billed)"))
    fig.add_trace(go.Bar(x=buckets, y=[float(row["amortised"]) for row in rollup],
                         name="rent share (already paid)"))
    fig.add_trace(go.Bar(x=buckets, y=[float(row["spot_savings"] or 0) for row in rollup],
                         name="spot savings vs on-demand"))
    sections.append(_figure_html(fig, div))
    sections.append(_table([when, "jobs", "GPU-h", "cost", "rent share", "spot savings"], [
        [e(row["bucket"]), e(str(row["jobs"])), e(row["gpu_hours"]), _usd(row["cost"]),
         _usd(row["amortised"]), _usd(row["spot_savings"])] for row in rollup]))
    return sections
