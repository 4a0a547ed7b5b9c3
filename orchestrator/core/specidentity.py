"""A job's identity: the hash a sweep records as work already paid for (`spec_hash`).

Over the spec's canonical form (orchestrator/core/canonical.py), with what does not change
what a job produces left out, so that a recorded hash stays the identity of the same job
whatever is added to the job file later.
"""

from __future__ import annotations

from collections.abc import Sequence

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


# What a job file may change and still resume from a checkpoint another job of it kept
# (`orch submit --resume-from`): where the job runs (the GPU models and providers it may
# take) and what it may cost, how it is named, watched, evaluated and delivered, and the
# memory savers (recomputed or offloaded activations, the loss kernel: the same maths in
# other memory). None of these changes what a training step computes. What the planner
# resolves per machine and a checkpoint depends on (the GPU count, layout and optimizer) is
# held to the checkpoint's (engine/resumefrom.py); the model, the data and the
# hyperparameters must be as they were.
RESUMABLE_ACROSS: tuple[tuple[str, ...], ...] = (
    ("name",), ("eval",), ("output",), ("tracking",), ("notify",),
    ("training", "stop_on_nan"), ("training", "gradient_checkpointing"),
    ("training", "activation_offloading"), ("training", "cross_entropy"),
    ("resources", "headroom"),
    ("resources", "max_cost"), ("resources", "deadline_hours"),
    ("resources", "max_price_per_hour"), ("resources", "spot"), ("resources", "providers"),
    ("resources", "servers"), ("resources", "keep_warm"), ("resources", "gpus"),
    ("resources", "max_gpus"),
)


def training_differences(before: BaseModel, after: BaseModel,
                         ignore: Sequence[tuple[str, ...]] = ()) -> list[str]:
    """The fields outside RESUMABLE_ACROSS (and `ignore`) in which two job specs differ,
    each as `field: <before> -> <after>` (values in the canonical form), in field order."""
    old = canonical.leaves(canonical.plain(before.model_dump(mode="python")))
    new = canonical.leaves(canonical.plain(after.model_dump(mode="python")))
    out = []
    for path in dict.fromkeys([*old, *new]):
        if any(path[:len(p)] == p for p in (*RESUMABLE_ACROSS, *ignore)):
            continue
        a, b = old.get(path, "(unset)"), new.get(path, "(unset)")
        if a != b:
            out.append(f"{'.'.join(path)}: {canonical.dumps(a)} -> {canonical.dumps(b)}")
    return out
