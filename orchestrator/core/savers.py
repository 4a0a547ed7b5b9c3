"""Memory savers the planner turns on to reach a cheaper GPU (pure).

A job file may leave `cross_entropy`, `gradient_checkpointing`, `optimizer` and
`activation_offloading` to the planner ("auto"). For one GPU model and count, `fit` tries
every combination the job allows together with every layout (strategy), fastest first, and
returns the first that fits: on one offer the fastest fitting combination is also the
cheapest, so across offers the scheduler's cheapest placement turns a saver on only when
it reaches a cheaper tier. The slowdown of each saver and its source are in docs/sizing.md.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from functools import lru_cache
from typing import NamedTuple

from orchestrator.core import sizing
from orchestrator.core.sizing import MemoryEstimate, Strategy, Workload
from orchestrator.core.throughput import (  # noqa: F401 - ACTIVATION_OFFLOAD_SLOWDOWN: tests read it here
    ACTIVATION_OFFLOAD_SLOWDOWN,
    extra_slowdown,
    flops_per_token,
    scaling_kinds,
)
from providers.base import GpuSpec

# What "auto" may choose, least intrusive first.
# - Cross-entropy: the loss kernels cost no speed, so auto always uses one where the GPU and
#   model family support it (`cross_entropy: plain` opts out). CCE needs less memory than
#   Liger's at the same speed, so Liger never gives a cheaper placement: a job file can
#   still ask for it. Both need an Ampere or newer GPU (every GPU in the catalog is), both
#   patch the Llama/Qwen2/Mistral families orch sizes, and the axolotl image ships both
#   (docker/Dockerfile-uv installs CCE; liger-kernel is an axolotl dependency).
# - Paged 8-bit AdamW needs the same steady memory as 8-bit AdamW: auto uses the latter.
AUTO_CHOICES: dict[str, tuple[object, ...]] = {
    "cross_entropy": ("cut",),
    "optimizer": ("adamw", "adamw_8bit"),
    "gradient_checkpointing": (False, True),
    "activation_offloading": (False, True),
}
# Each setting with no saver on: what a saver's effect is measured against.
BASELINE: dict[str, object] = {
    "cross_entropy": "plain",
    "optimizer": "adamw",
    "gradient_checkpointing": False,
    "activation_offloading": False,
}
# How `orch plan` names each saver.
LABELS = {
    "cross_entropy": "cross-entropy",
    "optimizer": "optimizer",
    "gradient_checkpointing": "gradient checkpointing",
    "activation_offloading": "activation offloading",
}


def variants(w: Workload) -> tuple[Workload, ...]:
    """Every fully resolved workload `w` allows (one when nothing is "auto")."""
    options = [AUTO_CHOICES[name] if getattr(w, name) == "auto" else (getattr(w, name),)
               for name in AUTO_CHOICES]
    out = []
    for combo in itertools.product(*options):
        v = replace(w, **dict(zip(AUTO_CHOICES, combo, strict=True)))
        # axolotl: activation offloading needs gradient checkpointing (real-hosts.md §3).
        if v.activation_offloading is True and v.gradient_checkpointing is not True:
            continue
        out.append(v)
    return tuple(out)


def slowdown(w: Workload) -> float:
    """Training-time factor of `w`'s savers over the same job with none."""
    recompute = flops_per_token(w) / flops_per_token(replace(w, gradient_checkpointing=False))
    return recompute * extra_slowdown(w)


def _strategy_slowdown(strategy: Strategy, gpu_count: int, scaling: dict[str, float]) -> float:
    factor = 1.0
    for kind in scaling_kinds(strategy, gpu_count):
        factor /= scaling.get(kind, 1.0)
    return factor


class Layout(NamedTuple):
    """One strategy and set of savers: its time factor, tie-break order and estimate."""

    time: float
    order: int
    estimate: MemoryEstimate


@lru_cache(maxsize=1024)
def _estimates(w: Workload, gpu_count: int) -> tuple[tuple[float, MemoryEstimate], ...]:
    """(settings' slowdown, estimate) for every strategy x settings on `gpu_count` GPUs.

    Strategy order of `sizing.candidate_strategies` first, then the least intrusive
    settings (fewest savers): the tie-break `layouts` keeps.
    """
    ordered = sorted(((slowdown(v), v) for v in variants(w)),
                     key=lambda sv: len(sizing.savers_on(sv[1])))
    return tuple((factor, sizing.estimate(v, gpu_count, strategy))
                 for strategy in sizing.candidate_strategies(gpu_count, w)
                 for factor, v in ordered
                 if sizing.layout_problem(strategy, gpu_count, str(v.optimizer)) is None)


@lru_cache(maxsize=4096)
def layouts(w: Workload, gpu_count: int, scaling: tuple[tuple[str, float], ...],
            ) -> tuple[Layout, ...]:
    """Every (strategy, settings) estimate on `gpu_count` GPUs, fastest first.

    Ties keep the order of `_estimates`, so a saver is never on without a reason.
    """
    factors = dict(scaling)
    out = [Layout(_strategy_slowdown(est.strategy, gpu_count, factors) * factor, i, est)
           for i, (factor, est) in enumerate(_estimates(w, gpu_count))]
    return tuple(sorted(out, key=lambda lay: (lay.time, lay.order)))


def fit(w: Workload, gpu_count: int, gpu_memory_bytes: int, host_ram_bytes: int | None,
        gpu: GpuSpec) -> MemoryEstimate | None:
    """The fastest layout and settings under which `w` fits `gpu_count` × `gpu`, or None.

    The GPU's interconnect scaling decides between, say, sharding without checkpointing
    and DDP with it.
    """
    return first_fit(layouts(w, gpu_count, gpu.scaling), gpu_memory_bytes, host_ram_bytes)


def first_fit(candidates: tuple[Layout, ...], gpu_memory_bytes: int,
              host_ram_bytes: int | None) -> MemoryEstimate | None:
    """The first of `layouts(...)` that fits this GPU memory and host RAM."""
    for layout in candidates:
        if layout.estimate.fits(gpu_memory_bytes, host_ram_bytes):
            return layout.estimate
    return None


class Choice(NamedTuple):
    """A setting the planner decided, and what it bought."""

    name: str  # the training.* field
    value: object
    saved_bytes: int  # per GPU, against the least intrusive alternative

    def describe(self) -> str:
        what = f"{LABELS[self.name]} {_value(self.value)}"
        if self.saved_bytes <= 0:
            return what
        return f"{what}: -{self.saved_bytes / sizing.GIB:.1f} GiB per GPU"


def _value(value: object) -> str:
    if value is True:
        return "on"
    if value is False:
        return "off"
    return str(value)


def _with(w: Workload, name: str, value: object) -> Workload:
    """`w` with one saver setting changed (names are the fields of AUTO_CHOICES)."""
    return replace(w, **{name: value})  # type: ignore[arg-type]


# For a GPU orch has no figures for: the settings orch used before it decided them (8-bit
# AdamW, checkpointing on), with the loss kernel, which costs nothing.
FALLBACK: dict[str, object] = {
    "cross_entropy": "cut",
    "optimizer": "adamw_8bit",
    "gradient_checkpointing": True,
    "activation_offloading": False,
}


def fallback(w: Workload) -> Workload:
    """`w` with each "auto" setting resolved to FALLBACK (no GPU figures to decide by)."""
    for name, value in FALLBACK.items():
        if getattr(w, name) == "auto":
            w = _with(w, name, value)
    return w


def without(w: Workload, name: str) -> Workload:
    """`w` with the saver `name` fixed off (checkpointing off also turns offloading off)."""
    off = _with(w, name, BASELINE[name])
    if name == "gradient_checkpointing" and off.activation_offloading == "auto":
        off = replace(off, activation_offloading=False)
    return off


def choices(requested: Workload, est: MemoryEstimate) -> tuple[Choice, ...]:
    """What the planner chose for each "auto" setting of `requested` in `est`."""
    chosen = est.workload
    if chosen is None:
        return ()
    out = []
    for name, off in BASELINE.items():
        if getattr(requested, name) != "auto":
            continue
        value = getattr(chosen, name)
        saved = 0
        if value != off:
            alt = _with(chosen, name, off)
            if name == "gradient_checkpointing":
                alt = replace(alt, activation_offloading=False)
            base = sizing.estimate(alt, est.gpu_count, est.strategy)
            saved = base.peak_bytes - est.peak_bytes
        out.append(Choice(name, value, saved))
    return tuple(out)
