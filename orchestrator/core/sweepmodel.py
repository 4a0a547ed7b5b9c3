"""The sweep file's schema (pydantic): what `sweepspec.load_sweep` validates a file with.

Its own module so that the expansion helpers (sweepdraws, sweepproblems) can read the models
without importing the loader. Names are re-exported by orchestrator.core.sweepspec.
"""

from __future__ import annotations

import copy
import math
import random as random_module
from typing import Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

from orchestrator.core.notifyspec import Targets
from orchestrator.core.searchspec import EarlyStopSpec, SearchSpec
from orchestrator.core.spec import Money
from orchestrator.core.strictmodel import Strict

# A sweep's jobs are named `<sweep>-<index:03d>`; job names are at most 64 characters.
MAX_NAME_LEN = 64 - len("-000")
NAME_PATTERN = rf"^[A-Za-z0-9][A-Za-z0-9._-]{{0,{MAX_NAME_LEN - 1}}}$"
# Floats drawn at random keep this many significant digits, so the YAML a user reads back
# and the spec hash agree on the value.
SIGNIFICANT_DIGITS = 6
# A sweep's jobs are named `<sweep>-<index:03d>`; job names are at most 64 characters.
MAX_NAME_LEN = 64 - len("-000")
NAME_PATTERN = rf"^[A-Za-z0-9][A-Za-z0-9._-]{{0,{MAX_NAME_LEN - 1}}}$"
EXAMPLE = "examples/sweep-lr.yml"

Goal = Literal["max", "min"]


# --- schema -------------------------------------------------------------------------------


class Distribution(Strict):
    """One random parameter: exactly one of loguniform, uniform, choice or int."""

    loguniform: list[float] | None = Field(
        default=None, examples=[[1.0e-5, 1.0e-3]],
        description="`[lo, hi]`, log-uniform (lo > 0): learning rates.")
    uniform: list[float] | None = Field(default=None, description="`[lo, hi]`, uniform.",
                                        examples=[[0.0, 0.1]])
    choice: list[Any] | None = Field(default=None, description="A list of values, one picked.",
                                     examples=[[8, 16, 32]])
    int_: list[int] | None = Field(default=None, alias="int", examples=[[1, 3]],
                                   description="`[lo, hi]`, an integer, both ends included.")

    @model_validator(mode="after")
    def _bounds(self) -> Distribution:
        given = {k: v for k, v in (("loguniform", self.loguniform), ("uniform", self.uniform),
                                   ("choice", self.choice), ("int", self.int_)) if v is not None}
        if len(given) != 1:
            raise ValueError("give exactly one of loguniform: [lo, hi], uniform: [lo, hi], "
                             "choice: [values], int: [lo, hi]")
        kind, values = next(iter(given.items()))
        if kind == "choice":
            if not values:
                raise ValueError("choice must list at least one value")
            return self
        if len(values) != 2:
            raise ValueError(f"{kind} takes [lo, hi] (got {values!r})")
        lo, hi = values
        if not all(math.isfinite(v) for v in values):
            raise ValueError(f"{kind} bounds must be finite (got {values!r})")
        if kind == "int" and lo > hi:
            raise ValueError(f"int needs lo <= hi (got {values!r})")
        if kind != "int" and lo >= hi:
            raise ValueError(f"{kind} needs lo < hi (got {values!r})")
        if kind == "loguniform" and lo <= 0:
            raise ValueError(f"loguniform needs lo > 0 (got {values!r})")
        return self

    def sample(self, rng: random_module.Random) -> Any:
        """One value drawn with `rng`."""
        if self.choice is not None:
            return copy.deepcopy(rng.choice(self.choice))
        if self.int_ is not None:
            return rng.randint(self.int_[0], self.int_[1])
        if self.loguniform is not None:
            lo, hi = self.loguniform
            return _round(math.exp(rng.uniform(math.log(lo), math.log(hi))))
        assert self.uniform is not None
        return _round(rng.uniform(*self.uniform))


def _round(x: float) -> float:
    return float(f"{x:.{SIGNIFICANT_DIGITS}g}")


class RandomSpec(Strict):
    """`n` samples drawn from `params` with `random.Random(seed)`."""

    n: int = Field(default=0, ge=0, description="How many random runs.", examples=[4])
    seed: int = Field(default=0, description="Seed: the same file always draws the same runs.",
                      examples=[0])
    params: dict[str, Distribution] = Field(
        default_factory=dict, examples=[{"lora.r": {"choice": [8, 16, 32]}}],
        description="Dotted job-file keys and the distribution each is drawn from.")


class Objective(Strict):
    """Which metric ranks a sweep's runs, and whether higher or lower is better."""

    metric: str = Field(min_length=1, examples=["eval.exact_match"],
                        description="A metric a run reports (`orch show ID` lists them).")
    goal: Goal = Field(default="max", description="`max` or `min`.", examples=["max"])


class SweepSpec(Strict):
    """A sweep file, validated (keys and values of the runs are checked by load_sweep)."""

    model_config = ConfigDict(title="orch sweep file")

    name: str = Field(pattern=NAME_PATTERN, examples=["lr-sweep-8b"],
                      description="The sweep's name; runs are named NAME-000, NAME-001, ...")
    base: str = Field(min_length=1, examples=["qlora-8b.yml"],
                      description="The job file every run starts from, relative to the sweep "
                                  "file.")
    grid: dict[str, list[Any]] = Field(
        default_factory=dict,
        examples=[{"training.learning_rate": [1.0e-4, 2.0e-4], "lora.r": [8, 16]}],
        description="Dotted job-file keys and their values; every combination runs.")
    random: RandomSpec = Field(
        default_factory=RandomSpec,
        examples=[{"n": 4, "seed": 0,
                   "params": {"training.learning_rate": {"loguniform": [1.0e-5, 1.0e-3]}}}],
        description="Random samples on top of the grid.")
    max_parallel: int = Field(default=4, ge=1, description="Runs of this sweep running at once.",
                              examples=[2])
    budget: Money | None = Field(
        default=None, examples=[25],
        description="USD for the whole sweep; runs that would pass it are held back.")
    objective: Objective | None = Field(
        default=None, examples=[{"metric": "eval.exact_match", "goal": "max"}],
        description="The metric that picks the best run.")
    search: SearchSpec | None = Field(
        default=None, examples=[{"sampler": "tpe", "trials": 12, "seed": 0}],
        description="How runs are picked from grid and random.params: grid (all), random or "
                    "tpe (`trials` runs); see docs/sweeps-search.md.")
    early_stop: EarlyStopSpec | None = Field(
        default=None, examples=[{"metric": "train.loss", "min_fraction": 0.05,
                                 "reduction_factor": 3}],
        description="Stop losing runs at rungs (ASHA or Hyperband); see docs/sweeps-search.md.")
    notify: Targets = Field(
        default=[], examples=[{"url_env": "SLACK_WEBHOOK_URL", "format": "slack"}],
        description="Webhooks POSTed on its runs' events and when the sweep finishes (with "
                    "its best run): one mapping or a list, as in the job file.")

    @model_serializer(mode="wrap")
    def _without_unset_sections(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Sections added after sweep identities were first recorded enter the dump (and so
        # spec_json) only when given: a file without them keeps its recorded identity.
        data: dict[str, Any] = handler(self)
        for key in ("search", "early_stop"):
            if data.get(key, 0) is None:
                del data[key]
        if data.get("notify") == []:
            del data["notify"]
        return data


