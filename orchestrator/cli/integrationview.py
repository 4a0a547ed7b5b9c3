"""What `orch show` says about a job's trackers and webhooks (issue 39): the run's page where
the tracker has one, and each webhook that did not get through (`notify.failed` events)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from orchestrator.core import trackingspec
from orchestrator.core.states import EventKind
from orchestrator.records.columns import document_object

if TYPE_CHECKING:
    from orchestrator.records.store import Event, Job


def trackers(job: Job) -> list[dict[str, Any]]:
    """Where the job's run is logged: W&B's run page (the run id is the job id), MLflow's
    server and experiment (its run id is MLflow's own: found there by the run's name)."""
    tracking = document_object(job.spec_json).get("tracking")
    if not isinstance(tracking, dict):
        return []
    try:
        spec = trackingspec.TrackingSpec.model_validate(tracking)
    except ValueError:
        return []
    found: list[dict[str, Any]] = []
    if (w := spec.wandb) is not None:
        run = trackingspec.run_id(job.id)
        url = trackingspec.wandb_run_url(w.project, run, w.entity,
                                         os.environ.get("WANDB_BASE_URL"))
        found.append({"tracker": "wandb", "run": run, "project": w.project, "url": url,
                      "note": None if url else "the run page is under the API key's default "
                                               "entity (set tracking.wandb.entity to show it)"})
    if (m := spec.mlflow) is not None:
        found.append({"tracker": "mlflow", "run": m.run_name or job.name,
                      "experiment": m.experiment, "url": m.tracking_uri, "note": None})
    return found


def notify_failures(events: list[Event]) -> list[dict[str, Any]]:
    """The webhooks that were not delivered, oldest first."""
    return [{"at": e.at.isoformat(), "message": e.message, **_data(e)} for e in events
            if e.kind == EventKind.NOTIFY_FAILED]


def _data(event: Event) -> dict[str, Any]:
    data = document_object(event.data_json)
    return {k: data.get(k) for k in ("type", "endpoint", "attempts", "reason", "webhook_id")}


def lines(trackers_found: list[dict[str, Any]], failures: list[dict[str, Any]]) -> list[str]:
    """`orch show`'s lines for them."""
    out = []
    for t in trackers_found:
        if t["tracker"] == "wandb":
            out.append(f"  W&B run: {t['url'] or t['run']}"
                       + (f" ({t['note']})" if t["note"] else ""))
        else:
            exp = f", experiment {t['experiment']}" if t["experiment"] else ""
            out.append(f"  MLflow: {t['url']}{exp}, run {t['run']}")
    out += [f"  webhook not delivered: {f['type']} to {f['endpoint']} ({f['reason']}"
            + (f", {f['attempts']} attempt(s))" if f["attempts"] else ")") for f in failures]
    return out
