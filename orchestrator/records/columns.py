"""The JSON columns, read in one place: a pydantic model of the fields orch reads from each.

The database keeps some values as JSON text (docs/schema.md): a job's resolved spec
(`job.spec_json`) and its plan (`job.placement_json`), an event's data (`event.data_json`), a
sweep's file (`sweep.spec_json`). Every reader goes through the accessor here (the store's rows
have methods that call them: `Job.placement()`, `Event.data()`, ...), never `json.loads` and
dict digging of its own, so what orch expects of a column is written down once.

The models are tolerant, as rows written by any earlier orch must still read: fields orch
does not read are ignored (kept, where a reader shows the value whole), every field is
optional, a value of the wrong shape reads as absent, and text that is not a JSON object
reads as an empty record. Money stays Decimal text until a model parses it.

No SQLModel here: the read-only sqlite3 views (`sweep.view`, `history`) use these too.
"""

from __future__ import annotations

import json
import math
from decimal import Decimal
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictStr, ValidationError

# A field read as None when its stored value does not fit the type (the provider answers'
# rule for fields they carry only as a hint: the same validator).
from orchestrator.core.searchspec import EarlyStopSpec, SearchSpec
from providers.answers import Lenient


class _Record(BaseModel):
    """A column's fields that orch reads; the others are ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True)


class _Kept(BaseModel):
    """A record shown whole somewhere (`orch show --json`): fields orch does not read are
    kept, and `as_stored` gives the object back as it was written."""

    model_config = ConfigDict(extra="allow", frozen=True)

    def as_stored(self) -> dict[str, Any]:
        """The object as written (the keys it had, sorted as orch writes JSON)."""
        return dict(sorted(self.model_dump(mode="json", exclude_unset=True).items()))


_M = TypeVar("_M", bound=BaseModel)


def _read(model: type[_M], text: str | None) -> _M:
    """`text` as `model`; an empty record when it is missing or not a JSON object."""
    try:
        return model.model_validate_json(text or "{}")
    except ValidationError:
        return model.model_validate({})


def document(text: str | None) -> Any:
    """A JSON column as stored, for output that shows it whole (`orch logs --json`) and for
    diffs over all its keys; None when it is missing or not JSON."""
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def document_object(text: str | None) -> dict[str, Any]:
    """`document` when it is a JSON object, else an empty one."""
    found = document(text)
    return found if isinstance(found, dict) else {}


# --- job.placement_json: the plan recorded at submit ------------------------------------------


class PlacementChoice(_Kept):
    """One ranked placement of the plan (`scheduler.Placement.to_dict`)."""

    provider: Lenient[str] = None
    offer_id: Lenient[str] = None
    gpu: Lenient[str] = None
    gpu_count: Lenient[int] = None
    billing: Lenient[str] = None
    strategy: Lenient[str] = None
    est_cost: Lenient[Decimal] = None
    est_training_hours: Lenient[float] = None
    throughput_source: Lenient[str] = None


class ResumeRecord(_Record):
    """`placement_json.resume_from`: the checkpoint an earlier job kept that this job starts
    from (`orch submit --resume-from`, engine/resumefrom.py)."""

    job: Lenient[str] = None  # the job that kept it
    dir: Lenient[str] = None  # the local directory holding checkpoint-<step>
    step: Lenient[int] = None
    max_steps: Lenient[int] = None
    # The spec fields it was submitted held to (`ResumePoint.pins`): GPU count, layout,
    # optimizer, as the checkpoint was written.
    pins: Lenient[dict[str, dict[str, Any]]] = None


class PlacementRecord(_Record):
    """`job.placement_json`: the chosen placement, the ranked alternatives, the job file."""

    placement: Lenient[PlacementChoice] = None
    alternatives: Lenient[list[PlacementChoice]] = None
    job_file: Lenient[str] = None
    # Hub datasets' published sizes used at submit (`engine/submission.hub_size_record`).
    hub_sizes: Lenient[list[dict[str, Any]]] = None
    resume_from: Lenient[ResumeRecord] = None

    def ranked(self) -> list[PlacementChoice]:
        """The chosen placement, then the alternatives, in the plan's order."""
        return [p for p in (self.placement, *(self.alternatives or ())) if p is not None]


def placement_record(text: str | None) -> PlacementRecord:
    """`job.placement_json` read."""
    return _read(PlacementRecord, text)


# --- job.spec_json: the resolved job file ---------------------------------------------------


class ResourcesRecord(_Record):
    """The spec's `resources` fields orch reads back from a row."""

    deadline_hours: Lenient[float] = None
    providers: Lenient[list[str]] = None


class SpecRecord(_Record):
    """`job.spec_json` as the engine and CLI read it back without validating the whole job
    (`orchestrator.core.spec.JobSpec` validates it whole: `engine.jobinputs`)."""

    method: Lenient[str] = None
    resources: ResourcesRecord = Field(default_factory=ResourcesRecord)


def spec_record(text: str | None) -> SpecRecord:
    """`job.spec_json` read."""
    return _read(SpecRecord, text)


# --- event.data_json ------------------------------------------------------------------------


class Place(_Kept):
    """Where one artifact went (a `delivered` event): what, where (local, volume, server,
    hub) and the location."""

    what: Lenient[str] = None
    where: Lenient[str] = None
    location: Lenient[str] = None


class PruneRecord(BaseModel):
    """Why early stopping stopped a sweep trial: the rung (optuna's index and thousandths of
    the run), the step whose report decided it, the metric, its value and the cutoff."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    rung: int
    resource: int
    step: int
    metric: str
    # An event's JSON holds a `nan` as null (store.event_json): read back as NaN.
    value: Annotated[float, BeforeValidator(lambda v: math.nan if v is None else v)]
    cutoff: float | None = None


class FindingRecord(_Kept):
    """One finding of a registered server's host check (`server.slow`,
    `server.check_failed`): the check that found it, and what it said."""

    check: Lenient[str] = None


class EventData(_Kept):
    """`event.data_json`: one model for every kind, with the fields readers use (each kind
    writes some of them; the others stay as written)."""

    status: Lenient[str] = None  # `state`: the status entered
    places: Lenient[list[Place]] = None  # `delivered`
    index: Lenient[int] = None  # a sweep run's `queued`: its index, params in file order
    params: Lenient[dict[str, Any]] = None
    param_order: Lenient[list[str]] = None
    pruned: Lenient[PruneRecord] = None  # a `state` event entering `pruned`: what decided it
    instance: Lenient[str] = None  # the provider's instance id (`host.checked`, ...)
    step: Lenient[int] = None  # `train.progress`, `checkpoint.mirrored`: the step
    # `checkpoint.mirrored`: the GPU count, layout and optimizer it was written with.
    pins: Lenient[dict[str, dict[str, Any]]] = None
    metric: Lenient[str] = None  # `train.not_finite`: which loss was not a number
    total: Lenient[int] = None  # `train.progress`: the steps of the whole training
    findings: Lenient[list[FindingRecord]] = None  # a registered server's check (issue 40)
    # `checkpoint.interval`: what the trainer on `instance` was given (engine/hostsession)
    save_steps: Lenient[int] = None
    keep: Lenient[int] = None  # save_total_limit
    seconds: Lenient[float] = None  # the interval in training seconds
    write_s: Lenient[float] = None  # the checkpoint's estimated write
    young_s: Lenient[float] = None  # Young's optimum, unbounded (None: infinite)
    # `deadline.decision` / `deadline.move`: the policy's choice and rule (core/deadline.py);
    # `deadline.will_miss`: by how much the fastest choice misses
    choice: Lenient[str] = None
    rule: Lenient[str] = None
    miss_by_s: Lenient[float] = None

    def ordered_params(self) -> dict[str, Any]:
        """A sweep run's params in the sweep file's key order."""
        params = self.params or {}
        order = [k for k in self.param_order or () if k in params]
        return {**{k: params[k] for k in order}, **params}


def event_data(text: str | None) -> EventData:
    """`event.data_json` read."""
    return _read(EventData, text)


# --- sweep.spec_json: the sweep file ----------------------------------------------------------


class ObjectiveRecord(BaseModel):
    """A sweep's objective, accepted as `core.sweepspec.Objective` accepts it: strict, no
    other keys, a non-empty metric, goal max (the default) or min."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    metric: Annotated[StrictStr, Field(min_length=1)]
    goal: Literal["max", "min"] = "max"


class SweepSpecRecord(_Record):
    """`sweep.spec_json` as the claim path and the status views read it."""

    max_parallel: Lenient[int] = None
    objective: Lenient[ObjectiveRecord] = None
    base: Lenient[str] = None
    search: Lenient[SearchSpec] = None
    early_stop: Lenient[EarlyStopSpec] = None


def sweep_spec_record(text: str | None) -> SweepSpecRecord:
    """`sweep.spec_json` read."""
    return _read(SweepSpecRecord, text)


__all__ = [
    "EventData", "FindingRecord", "ObjectiveRecord", "Place", "PlacementChoice",
    "PlacementRecord", "PruneRecord", "ResourcesRecord", "SpecRecord", "SweepSpecRecord",
    "document", "document_object", "event_data", "placement_record", "spec_record",
    "sweep_spec_record",
]
