"""A job's identity: the hash a sweep records as work already paid for (`spec_hash`).

Over the spec's canonical form (orchestrator/core/canonical.py), with what does not change
what a job produces left out, so that a recorded hash stays the identity of the same job
whatever is added to the job file later.
"""

from __future__ import annotations

from pydantic import BaseModel

from orchestrator.core import canonical
from orchestrator.core.outputspec import OutputSpec

# Job-file fields added after spec hashes were first recorded, with the default that keeps
# the old behaviour: at that default they are left out of the hashed form, so every recorded
# hash (a sweep's record of work already paid for) stays the identity of the same job.
ADDED_LATER: dict[tuple[str, ...], object] = {
    ("resources", "layout"): "auto",
    ("output",): OutputSpec().model_dump(mode="python"),
    ("training", "val_set_size"): None,
    ("dataset", "fields"): None,
    ("dataset", "validation_split"): None,
    ("dataset", "path", "revision"): "main",
    ("dataset", "path", "subset"): None,
    ("datasets",): None,
}


def spec_hash(spec: BaseModel) -> str:
    """sha256 of a `JobSpec`'s canonical form (orchestrator/core/canonical.py), defaults filled,
    fields added later left out at their default (ADDED_LATER)."""
    data = canonical.without_defaults(spec.model_dump(mode="python"), ADDED_LATER)
    # How long the machine stays warm afterwards changes what the job costs, never what it
    # produces: a sweep that adds keep_warm must not run its finished runs again. Nor do
    # where the run is logged, who is told about it, or whether a diverged run is stopped
    # (a healthy run trains the same either way).
    data["resources"].pop("keep_warm", None)
    data["training"].pop("stop_on_nan", None)
    data.pop("tracking", None)
    data.pop("notify", None)
    return canonical.digest(data)
