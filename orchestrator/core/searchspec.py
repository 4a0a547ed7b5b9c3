"""A sweep file's `search:` and `early_stop:` sections, and the search space they span (pure).

`search: {sampler, trials, seed}` says how a sweep picks its runs from the same dotted
parameters as `grid:` and `random.params:`:
- `grid`: every combination of `grid` (and the `random` samples), exactly as a sweep without
  `search` expands today;
- `random`: `trials` draws from the space with `random.Random(seed)`; a grid key is drawn
  uniformly from its list, a `random.params` key from its distribution (with no grid keys
  this is the `random:` section with `n: trials`, drawing the same values);
- `tpe`: `trials` runs proposed one by one by optuna's TPE sampler from the runs that ended
  (orchestrator/core/search.py); the first ones are random draws, as TPE starts.

`early_stop: {metric, goal, min_fraction, reduction_factor, pruner}` stops a run at a rung
(a share of its own steps: min_fraction, min_fraction x eta, ...) when its intermediate
metric is in the losing part of the runs that reached that rung (ASHA or Hyperband, by
optuna's pruners). Both sections are optional; a sweep file without them has the same
identity (spec_json) as before they existed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field

from orchestrator.core.strictmodel import Strict

Sampler = Literal["grid", "random", "tpe"]
Pruner = Literal["asha", "hyperband"]
# What a run reports while it trains (a metric row with a step): the training loss of each
# logged step, and the loss on the held-out split (axolotl's val_set_size) every eval_steps.
IntermediateMetric = Literal["train.loss", "train.eval_loss"]
# Past this many rungs a run is checked more often than it is worth (eta 2 from 1 %: 7).
MAX_RUNGS = 8


class SearchSpec(Strict):
    """How the sweep picks its runs from the grid keys and random parameters."""

    sampler: Sampler = Field(
        default="grid", examples=["tpe"],
        description="`grid`: every combination (as without `search`); `random`: `trials` "
                    "random draws; `tpe`: `trials` runs proposed by TPE from the ended ones.")
    trials: int | None = Field(
        default=None, ge=1, le=1000, examples=[12],
        description="How many runs in all (random and tpe; a grid runs every combination).")
    seed: int = Field(default=0, examples=[0],
                      description="Seed of the draws: the same records always give the same "
                                  "proposals.")


class EarlyStopSpec(Strict):
    """When a losing run stops before its end (successive halving over rungs)."""

    metric: IntermediateMetric = Field(
        default="train.loss", examples=["train.eval_loss"],
        description="The metric a run reports while training: `train.loss`, or "
                    "`train.eval_loss` (needs training.val_set_size and trainer.extra eval_steps).")
    goal: Literal["min", "max"] = Field(default="min", examples=["min"],
                                        description="`min` (losses) or `max`.")
    # 0.05 and eta 3 (rungs at 5, 15 and 45 % of a run): bench/search_offline.py's choice.
    min_fraction: float = Field(
        default=0.05, gt=0, lt=1, examples=[0.05],
        description="The first rung, as a share of each run's steps; the next ones are "
                    "min_fraction x reduction_factor, ... below 1.")
    reduction_factor: int = Field(
        default=3, ge=2, le=10, examples=[3],
        description="eta: at each rung the best 1/eta of the runs that reached it go on.")
    pruner: Pruner = Field(
        default="asha", examples=["asha"],
        description="`asha` (asynchronous successive halving) or `hyperband` (several "
                    "brackets of it, each starting later).")


def rung_fractions(early_stop: EarlyStopSpec) -> list[float]:
    """The rungs as shares of a run: min_fraction x eta^k below 1 (at most MAX_RUNGS)."""
    out: list[float] = []
    f = early_stop.min_fraction
    # Below 1 by more than float error: 1/9 x 3 x 3 is 0.999...9 in floats, and a rung there
    # would stop a run after it paid for all of it.
    while f < 1 - 1e-9 and len(out) < MAX_RUNGS:
        out.append(f)
        f *= early_stop.reduction_factor
    return out


# --- the search space as plain values ------------------------------------------------------


@dataclass(frozen=True)
class Param:
    """One dimension of the space: a list of values, or a range (`log`: log-uniform)."""

    key: str
    kind: Literal["choice", "float", "int"]
    choices: tuple[Any, ...] = ()
    low: float = 0.0
    high: float = 0.0
    log: bool = False

    @property
    def finite(self) -> bool:
        """Whether the dimension has finitely many values (choices or an integer range)."""
        return self.kind != "float"

    def values(self) -> tuple[Any, ...]:
        """Every value of a finite dimension, in order."""
        if self.kind == "choice":
            return self.choices
        if self.kind == "int":
            return tuple(range(int(self.low), int(self.high) + 1))
        raise ValueError(f"{self.key} is a continuous range")


def space_size(space: Sequence[Param]) -> int | None:
    """How many points the space has (None: a continuous dimension makes it infinite)."""
    if not all(p.finite for p in space):
        return None
    return math.prod(len(p.values()) for p in space)


__all__ = ["EarlyStopSpec", "IntermediateMetric", "Param", "Pruner", "Sampler", "SearchSpec",
           "rung_fractions", "space_size"]
