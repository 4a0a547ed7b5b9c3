"""Which runs a sweep file's sampler draws, and what is wrong with its `search:` (pure).

Each run is a list of `Origin`s (a dotted key, its value, and where in the sweep file the
value came from, for file:line errors). `candidates` lists the runs known when the file is
loaded: grid points, random samples, `search.sampler: random` draws; with `tpe` the runs are
proposed later (orchestrator/core/search.py), so it lists probes instead: each value of each
key (the ends of a range) once, with the other keys at their first value, so that a value
the base job refuses is reported when the file is loaded, not when TPE first proposes it.
"""

from __future__ import annotations

import itertools
import math
import random as random_module
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from orchestrator.core.searchspec import Param, space_size

if TYPE_CHECKING:
    from orchestrator.core.spec import JobSpec
    from orchestrator.core.sweepmodel import Distribution, SweepSpec

Loc = tuple[str | int, ...]


@dataclass
class Origin:
    """Where in the sweep file one override of a run came from."""

    key: str
    loc: Loc  # ("grid", key, i) or ("random", "params", key)
    sample: int | None = None  # for draws: which one, counted from 1
    value: Any = None


def sampler_of(spec: SweepSpec) -> str:
    """The sweep's sampler (`grid` when the file has no `search:`)."""
    return spec.search.sampler if spec.search is not None else "grid"


def draws_of(spec: SweepSpec) -> int:
    """How many random draws the file asks for (random.n, or search.trials for random)."""
    if sampler_of(spec) == "random" and spec.search is not None:
        return spec.search.trials or 0
    return spec.random.n


def _param(key: str, dist: Distribution) -> Param:
    if dist.choice is not None:
        return Param(key, "choice", choices=tuple(dist.choice))
    if dist.int_ is not None:
        return Param(key, "int", low=dist.int_[0], high=dist.int_[1])
    if dist.loguniform is not None:
        return Param(key, "float", low=dist.loguniform[0], high=dist.loguniform[1], log=True)
    assert dist.uniform is not None
    return Param(key, "float", low=dist.uniform[0], high=dist.uniform[1])


def space_of(spec: SweepSpec) -> tuple[Param, ...]:
    """The search space: grid keys as lists of values, then random.params, in file order."""
    grid = [Param(k, "choice", choices=tuple(v)) for k, v in spec.grid.items()]
    return (*grid, *(_param(k, d) for k, d in spec.random.params.items()))


def _grid_points(spec: SweepSpec) -> list[list[Origin]]:
    keys = list(spec.grid)
    # Odometer order: the last key varies fastest, like nested loops in file order.
    return [[Origin(k, ("grid", k, i), value=spec.grid[k][i])
             for k, i in zip(keys, combo, strict=True)]
            for combo in itertools.product(*(range(len(spec.grid[k])) for k in keys))]


def _draws(spec: SweepSpec, seed: int, n: int, with_grid: bool) -> list[list[Origin]]:
    rng = random_module.Random(seed)
    out: list[list[Origin]] = []
    for sample in range(1, n + 1):
        run: list[Origin] = []
        if with_grid:
            for k, values in spec.grid.items():
                i = rng.randrange(len(values))
                run.append(Origin(k, ("grid", k, i), sample, values[i]))
        run += [Origin(k, ("random", "params", k), sample, d.sample(rng))
                for k, d in spec.random.params.items()]
        out.append(run)
    return out


def _probes(spec: SweepSpec) -> list[list[Origin]]:
    firsts: dict[str, Origin] = {}
    each: list[Origin] = []
    for k, values in spec.grid.items():
        each += [Origin(k, ("grid", k, i), value=v) for i, v in enumerate(values)]
    for k, d in spec.random.params.items():
        p = _param(k, d)
        ends = p.choices if p.kind == "choice" else (
            (int(p.low), int(p.high)) if p.kind == "int" else (p.low, p.high))
        each += [Origin(k, ("random", "params", k), value=v) for v in ends]
    for o in each:
        firsts.setdefault(o.key, o)
    out = [[o if k == o.key else first for k, first in firsts.items()] for o in each]
    return out


def candidates(spec: SweepSpec) -> list[list[Origin]]:
    """Each run's overrides known at load (tpe: the probes; see the module docstring)."""
    sampler = sampler_of(spec)
    if sampler == "tpe":
        return _probes(spec)
    if sampler == "random":
        assert spec.search is not None
        return _draws(spec, spec.search.seed, spec.search.trials or 0, with_grid=True)
    out = _grid_points(spec) if spec.grid else []
    return out + _draws(spec, spec.random.seed, spec.random.n, with_grid=False)


def search_problems(spec: SweepSpec) -> list[tuple[Loc, str]]:
    """What is wrong with `search:` given the rest of the file (location, message)."""
    search = spec.search
    if search is None:
        return []
    out: list[tuple[Loc, str]] = []
    sampler = search.sampler
    space = space_of(spec)
    if sampler == "grid":
        if search.trials is not None:
            out.append((("search", "trials"), "a grid runs every combination of grid; remove "
                        "trials, or use sampler: random or tpe to run only that many"))
        return out
    if search.trials is None:
        out.append((("search", "sampler"), f"sampler {sampler} needs search.trials: how many "
                    "runs in all, e.g. trials: 12"))
    if spec.random.n:
        out.append((("random", "n"), f"with search.sampler {sampler} the number of runs is "
                    "search.trials; remove random.n (random.params stay the space)"))
    if not space:
        out.append((("search", "sampler"), f"sampler {sampler} has nothing to choose: give "
                    "grid values or random.params"))
    elif (size := space_size(space)) is not None and search.trials and search.trials > size:
        out.append((("search", "trials"), f"the space has {size:,} points (grid and random "
                    f"choices); trials: {search.trials} would repeat runs; at most {size:,}"))
    if sampler == "tpe" and spec.objective is None:
        out.append((("search", "sampler"), "tpe proposes runs from the ended runs' objective: "
                    "add objective: {metric: ..., goal: min or max}"))
    return out


def early_stop_problems(spec: SweepSpec, base: JobSpec) -> list[tuple[Loc, str]]:
    """What is wrong with `early_stop:` given the base job (an eval loss needs an eval split:
    `training.val_set_size` or a dataset's `validation_split`, and `trainer.extra.eval_steps`)."""
    stop = spec.early_stop
    if stop is None or stop.metric != "train.eval_loss":
        return []
    held_out = bool(base.training.val_set_size) or any(
        d.validation_split for d in base.all_datasets)
    every = base.trainer.extra.get("eval_steps")
    if held_out and isinstance(every, int | float) and every > 0:
        return []
    return [(("early_stop", "metric"), "train.eval_loss is reported only when the base job "
             "holds out an eval split: add training: {val_set_size: 0.05} and trainer: "
             "{extra: {eval_steps: 10}} to the base job file, or use metric: train.loss")]


def samples_word(n: int) -> str:
    """`1 sample` / `N samples`."""
    return f"{n} sample{'s' if n != 1 else ''}"


def points(spec: SweepSpec) -> int:
    """How many grid points `grid:` spans (0 without one)."""
    return math.prod(len(v) for v in spec.grid.values()) if spec.grid else 0
