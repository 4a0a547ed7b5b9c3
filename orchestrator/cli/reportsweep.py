"""`orch report --sweep NAME` for a sweep with search or early stopping: its trials' loss
curves with the rungs and the pruned runs marked, and the objective against each parameter.

What the sweep recorded (`records.sweep.trials`: params, rung checks, the objective) is read
here into `SweepTrial`s; `reportpage.render` draws them with plotly (imported there only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from orchestrator.core.jobstatus import JobStatus
from orchestrator.records.store import Store, Sweep, nan_if_null


@dataclass
class SweepTrial:
    """One trial of a sweep as the report draws it."""

    job_id: str
    number: int
    params: dict[str, Any]
    status: str
    objective: float | None  # the final objective metric, when it ended with one
    rung_steps: list[int] = field(default_factory=list)  # where it was checked
    pruned_at: tuple[int, float] | None = None  # (step, value) of the rung that pruned it


@dataclass
class SweepCharts:
    """A sweep's trials and its objective, for the sweep's own charts."""

    name: str
    objective: str | None
    goal: str | None
    trials: list[SweepTrial]


def sweep_charts(store: Store, sweep_id: str) -> SweepCharts | None:
    """The sweep's trials when it has a `search:` or `early_stop:` (else None)."""
    from orchestrator.records.sweep.trials import trials_of

    with store.session() as session:
        sweep = session.get(Sweep, sweep_id)
    if sweep is None:
        return None
    spec = sweep.spec()
    if spec.search is None and spec.early_stop is None:
        return None
    objective = spec.objective
    out: list[SweepTrial] = []
    for t in trials_of(store, sweep_id, objective):
        prune = next((r for r in t.rungs if r.decision == "prune"), None)
        out.append(SweepTrial(
            t.job.id, t.record.number, dict(t.record.params), JobStatus(t.job.status),
            t.objective if t.objective is not None and math.isfinite(t.objective) else None,
            [r.step for r in t.rungs],
            None if prune is None else (prune.step, nan_if_null(prune.value))))
    return SweepCharts(sweep.name, None if objective is None else objective.metric,
                       None if objective is None else objective.goal, out)


def objective_section(go: Any, charts: SweepCharts | None, figure_html: Any,
                      layout: Any) -> list[str]:
    """One scatter per swept parameter: each ended trial's objective (a pruned one at the
    value that pruned it, greyed: a different metric, on its own axis)."""
    if charts is None or charts.objective is None:
        return []
    keys = list(dict.fromkeys(k for t in charts.trials for k in t.params))
    out = [f"<h2>Objective by parameter</h2><p class=\"note\">{charts.objective} "
           f"({charts.goal}) of each trial that ended; pruned trials at the value that "
           "stopped them (right axis).</p>"]
    for i, key in enumerate(keys):
        fig = go.Figure(layout=layout(key, key, charts.objective))
        done = [t for t in charts.trials if t.objective is not None and key in t.params]
        fig.add_trace(go.Scatter(x=[_axis(t.params[key]) for t in done],
                                 y=[t.objective for t in done], mode="markers",
                                 name="ended", text=[f"trial {t.number}" for t in done]))
        cut = [t for t in charts.trials if t.pruned_at is not None and key in t.params]
        fig.add_trace(go.Scatter(x=[_axis(t.params[key]) for t in cut],
                                 y=[t.pruned_at[1] for t in cut if t.pruned_at is not None],
                                 mode="markers", name="pruned (rung value)", yaxis="y2",
                                 marker={"color": "#bbbbbb", "symbol": "x"},
                                 text=[f"trial {t.number}" for t in cut]))
        fig.update_layout(yaxis2={"overlaying": "y", "side": "right", "showgrid": False})
        if all(isinstance(t.params[key], int | float) for t in charts.trials
               if key in t.params) and key.endswith("learning_rate"):
            fig.update_xaxes(type="log")
        out.append(figure_html(fig, f"objective-chart-{i}"))
    return out


def _axis(value: Any) -> Any:
    """A parameter value as plotly can place it (a list or mapping as its text)."""
    return value if isinstance(value, int | float | str) else repr(value)


__all__ = ["SweepCharts", "SweepTrial", "objective_section", "sweep_charts"]
