"""Where a sweep stands (`orch sweep show`, `orch sweeps`), with the standard library only.

The status of a sweep is built here from plain job rows, whatever read them: on SQLite the
commands read through `orchestrator.records.historyread`'s read-only sqlite3 reader (no SQLModel or
SQLAlchemy import, ~0.5 s saved per call, and no file or schema is ever created); other
databases go through the store (`sweep.store.sweep_status`), which hands its ORM rows to the
same `build_status`. The run states and the budget/max_parallel gate are `sweep.rules`', shared
with the claim path (`store.jobs.claim_next_gated`), so the status and the claim agree.

Money is integer micro-dollars until display.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from orchestrator.core.jobstatus import ACTIVE_STATUSES, JobStatus
from orchestrator.core.money import dollars_text
from orchestrator.core.states import SWEEP_COUNTED, EventKind, SweepRunState
from orchestrator.core.utc import iso_z
from orchestrator.records.columns import EventData, event_data, sweep_spec_record
from orchestrator.records.historyread import Reader, parse_stored
from orchestrator.records.sweep.rules import (
    RUNNING_STATUSES,
    JobLike,
    JobRow,
    best_of,
    gate,
    is_running,
    live_lease,
    run_state,
    usage_of,
)


class SweepNotFound(LookupError):
    """No sweep has that name; the message lists some that exist."""


# --- the status --------------------------------------------------------------------------------


def first_event_data(rows: Iterable[tuple[str, str | None]]) -> dict[str, EventData]:
    """Per job, the data of its first `queued` event that holds a JSON object.

    `rows` are (job_id, data_json) of `queued` events in id order.
    """
    out: dict[str, EventData] = {}
    for job_id, data_json in rows:
        if job_id in out or not data_json:
            continue
        data = event_data(data_json)
        if data.model_fields_set:  # else not a JSON object (or an empty one)
            out[job_id] = data
    return out


def build_status(*, sweep_id: str, sweep_name: str, created_at: datetime, spec_json: str,
                 budget_micros: int | None, jobs: Sequence[JobLike],
                 first: Mapping[str, EventData], metrics: Mapping[str, float],
                 now: datetime,
                 rungs: Mapping[str, Sequence[RungRow]] | None = None) -> dict[str, Any]:
    """The status dict of `orch sweep show --json` (and each item of `orch sweeps --json`).

    `jobs` in (created_at, id) order; `first`: `first_event_data`; `metrics`: each job's
    newest final (step NULL) value of the objective's metric; `rungs`: each job's
    `sweep_rung` rows (early stopping), by resource.
    """
    rungs = rungs or {}
    spec = sweep_spec_record(spec_json)
    objective = spec.objective
    usage = usage_of(spec, budget_micros, jobs, now)
    runs: list[dict[str, Any]] = []
    for job in jobs:
        data = first.get(job.id, EventData())
        state = run_state(job, now)
        runs.append({
            "index": data.index, "job_id": job.id, "name": job.name,
            "params": data.ordered_params(), "state": state, "status": job.status,
            "waiting": gate(usage, job) if state == SweepRunState.QUEUED else None,
            "metric": _number(metrics.get(job.id)),
            # Reported, but not a number (a diverged run's `nan`): `metric` is null then, as
            # for a run that reported nothing; the views tell the two apart with this.
            "metric_nan": job.id in metrics and _number(metrics[job.id]) is None,
            "cost": dollars_text(job.cost_micros),
            "est_cost": dollars_text(job.est_cost_micros), "failure_reason": job.failure_reason,
            "provider": job.provider, "gpu": job.gpu, "gpu_count": job.gpu_count,
            "rungs": [r.to_dict() for r in rungs.get(job.id, ())],
            "last_rung": last_rung(rungs.get(job.id, ())),
        })
    runs.sort(key=lambda r: (r["index"] is None, r["index"] or 0))
    best: dict[str, Any] | None = None
    if objective is not None:
        # Ties go to the run that finished first, then the smaller id: the rule of
        # v_best_run_per_sweep and of the best-run queries in docs/schema.md.
        finished = {j.id: j.finished_at for j in jobs}
        done = sorted(((r["job_id"], r["metric"]) for r in runs
                       if r["state"] == SweepRunState.SUCCEEDED),
                      key=lambda d: (finished[d[0]] is None, finished[d[0]] or now, d[0]))
        best_id = best_of(done, objective.goal)
        if best_id is not None:
            b = next(r for r in runs if r["job_id"] == best_id)
            best = {"job_id": b["job_id"], "name": b["name"], "index": b["index"],
                    "params": b["params"], "metric": b["metric"]}
    counts: dict[str, int] = dict.fromkeys(SWEEP_COUNTED, 0)
    for r in runs:
        counts[r["state"]] = counts.get(r["state"], 0) + 1
    spent = sum(j.cost_micros or 0 for j in jobs)
    estimated = sum(j.est_cost_micros or 0 for j in jobs)
    pruned = sum(j.cost_micros or 0 for j in jobs if j.status == JobStatus.PRUNED)
    search = spec.search
    return {
        "search": None if search is None else {"sampler": search.sampler,
                                               "trials": search.trials, "seed": search.seed},
        "early_stop": None if spec.early_stop is None else spec.early_stop.model_dump(),
        "pruned_spent": dollars_text(pruned),
        "sweep": sweep_name, "sweep_id": sweep_id,
        "created_at": iso_z(created_at),
        "base": spec.base, "max_parallel": usage.max_parallel,
        "budget": dollars_text(budget_micros), "spent": dollars_text(spent),
        "estimated": dollars_text(estimated),
        "objective": None if objective is None else objective.model_dump(),
        "counts": counts, "runs": runs, "best": best,
    }


@dataclass(frozen=True)
class RungRow:
    """One `sweep_rung` row as the status views show it."""

    resource: int
    rung: int
    step: int
    metric: str
    value: float | None  # None: the metric was not a number (`nan`) at the rung
    decision: str
    cutoff: float | None

    def to_dict(self) -> dict[str, Any]:
        return {"resource": self.resource, "fraction": self.resource / 1000, "rung": self.rung,
                "step": self.step, "metric": self.metric, "value": self.value,
                "decision": self.decision, "cutoff": self.cutoff}


def last_rung(rows: Sequence[RungRow]) -> float | None:
    """The share of its steps at which a run's last rung was checked (None: no rung yet)."""
    top = max((r.resource for r in rows), default=None)
    return None if top is None else top / 1000


def _number(value: float | None) -> float | None:
    """A final metric as the views show it: None when missing or not a number (NULL/NaN:
    JSON has no NaN, and `--json` output must parse)."""
    return None if value is None or not math.isfinite(value) else value


_RUNG_COLUMNS = "r.job_id, r.resource, r.rung, r.step, r.metric, r.value, r.decision, r.cutoff"


def rung_rows(rows: Iterable[Sequence[Any]]) -> dict[str, list[RungRow]]:
    """(job_id, resource, rung, step, metric, value, decision, cutoff) rows, by job."""
    out: dict[str, list[RungRow]] = {}
    for job_id, resource, rung, step, metric, value, decision, cutoff in rows:
        out.setdefault(job_id, []).append(RungRow(int(resource), int(rung), int(step), metric,
                                                  None if value is None else float(value),
                                                  decision,
                                                  None if cutoff is None else float(cutoff)))
    return out


def not_found(name: str, known: Sequence[str]) -> SweepNotFound:
    """The error for an unknown sweep name (`known`: every name, sorted)."""
    hint = f"known: {', '.join(known[:10])}" if known else "none recorded yet"
    return SweepNotFound(f"sweep {name!r} not found ({hint}); list them with `orch sweeps`")


# --- reading with sqlite3 ----------------------------------------------------------------------

_JOB_COLUMNS = ("id, name, status, lease_owner, lease_expires_at, cost_micros, "
                "est_cost_micros, failure_reason, provider, gpu, gpu_count, finished_at")


def sweep_status(reader: Reader | None, name: str,
                 now: datetime | None = None) -> dict[str, Any]:
    """A sweep's status read through `reader`; SweepNotFound when no sweep has that name."""
    now = now or datetime.now(UTC)
    if reader is None:
        raise not_found(name, [])
    found = reader.rows("SELECT id, name, spec_json, budget_micros, created_at FROM sweep "
                        "WHERE name = :name LIMIT 1", {"name": name})
    if not found:
        known = [r[0] for r in reader.rows("SELECT name FROM sweep ORDER BY name")]
        raise not_found(name, known)
    sweep_id, sweep_name, spec_json, budget, created = found[0]
    params = {"sid": sweep_id}
    jobs = [JobRow(r[0], r[1], JobStatus(r[2]), r[3], parse_stored(r[4]), int(r[5] or 0),
                   None if r[6] is None else int(r[6]), r[7], r[8], r[9],
                   None if r[10] is None else int(r[10]),
                   None if r[11] is None else parse_stored(r[11]))
            for r in reader.rows(f"SELECT {_JOB_COLUMNS} FROM job WHERE sweep_id = :sid "
                                 "ORDER BY created_at, id", params)]
    first = first_event_data(reader.rows(
        "SELECT e.job_id, e.data_json FROM event e JOIN job j ON j.id = e.job_id "
        "WHERE j.sweep_id = :sid AND e.kind = :kind ORDER BY e.id",
        {**params, "kind": EventKind.QUEUED.value}))
    metrics: dict[str, float] = {}
    objective = sweep_spec_record(spec_json).objective
    if objective is not None:
        for job_id, value in reader.rows(
                "SELECT m.job_id, m.value FROM metric m JOIN job j ON j.id = m.job_id "
                "WHERE j.sweep_id = :sid AND m.name = :metric AND m.step IS NULL "
                "ORDER BY m.id", {**params, "metric": objective.metric}):
            metrics[job_id] = value  # the newest one recorded wins
    rungs = rung_rows(reader.rows(
        f"SELECT {_RUNG_COLUMNS} FROM sweep_rung r JOIN job j ON j.id = r.job_id "
        "WHERE j.sweep_id = :sid ORDER BY r.job_id, r.resource", params))
    created_at = parse_stored(created)
    assert created_at is not None  # NOT NULL column
    return build_status(sweep_id=sweep_id, sweep_name=sweep_name, created_at=created_at,
                        spec_json=spec_json, budget_micros=None if budget is None
                        else int(budget), jobs=jobs, first=first, metrics=metrics, now=now,
                        rungs=rungs)


def list_sweeps(reader: Reader | None) -> list[dict[str, Any]]:
    """Every sweep's status (as `sweep_status`), by name."""
    if reader is None:
        return []
    names = [r[0] for r in reader.rows("SELECT name FROM sweep ORDER BY name")]
    return [sweep_status(reader, n) for n in names]


# Re-exported: the sweep CLI and tests import the shared rules from here.
__all__ = [
    "ACTIVE_STATUSES", "RUNNING_STATUSES", "JobLike", "JobRow", "RungRow", "SweepNotFound",
    "best_of", "rung_rows",
    "build_status", "first_event_data", "gate", "is_running", "list_sweeps", "live_lease",
    "not_found", "run_state", "sweep_status",
]
