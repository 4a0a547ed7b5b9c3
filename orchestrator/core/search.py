"""A sweep's search and early stopping as pure functions over plain trial records.

orch's records are the source of truth (the job rows, their metrics and the rung checks
recorded once), so optuna keeps no state of its own: each decision rebuilds an in-memory
study from `TrialRecord`s (optuna.trial.create_trial + study.add_trial, trials in number
order so that optuna's trial numbers are orch's), asks it, and drops it. The same records
therefore always give the same answer, after a kill -9 too.

- `propose`: the next runs of a `tpe` sweep, one at a time, each proposal a function of the
  records before it, the sweep's seed and its trial number (TPESampler with `constant_liar`:
  proposed and running trials count as pending, so a batch spreads out); a proposal equal to
  a recorded run is asked again (another derived seed), then replaced by a seeded draw of a
  point no trial has, so a tick never proposes a run twice.
- `decide`: whether a running trial goes on at the rungs its curve has passed. The rung
  check is optuna's pruner (SuccessiveHalvingPruner: ASHA; HyperbandPruner, whose bracket is
  crc32 of study name and trial number: deterministic), over the rung values recorded for
  every trial; what the pruner records (the trial's value at the rung) comes back as
  `RungRecord`s for orch to persist with the decision.

Why not optuna's own storage (RDBStorage) in orch's database: it creates its tables in the
same database and keeps its schema version in Alembic's default `alembic_version` table
(optuna/storages/_rdb/storage.py, _VersionManager), which orch's migrations own; on orch's
database it finds orch's revision there and refuses to start (tests/test_search.py shows it),
and on an empty one it would stamp its own revision where orch expects its own. A second
store would also be a second truth about what ran. Optuna is imported inside the functions
that decide: `orch plan` and the read-only commands never load it.
"""

from __future__ import annotations

import binascii
import itertools
import math
import random
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from orchestrator.core.searchspec import EarlyStopSpec, Param, rung_fractions, space_size

if TYPE_CHECKING:
    import optuna

# A rung's resource is counted in thousandths of a run: the rungs of min_fraction 0.1 and
# eta 3 are 100, 300 and 900, whatever a run's length in steps.
RESOURCE = 1000
# TPE's proposals that equal a recorded run are asked again this many times (other seeds).
ASK_AGAIN = 8
# Finite spaces up to this many points are enumerated to draw an unused one.
ENUMERABLE = 100_000
# The rung value is the mean of the metric over the last tenth of the steps up to the rung
# (a training loss is noisy from step to step; an eval loss reported every eval_steps is
# usually one value there).
SMOOTHING = 0.1
# Floats proposed keep this many significant digits, as the random draws do (sweepmodel).
SIGNIFICANT_DIGITS = 6
# optuna's successive halving records a trial's value at rung k under this system
# attribute (optuna/pruners/_successive_halving.py, _completed_rung_key): rebuilding a study
# puts orch's recorded rung values back under it.
_RUNG_KEY = "completed_rung_{}"


class TrialState(StrEnum):
    """Where a trial stands, as the search sees it (the engine maps job states to these)."""

    PENDING = "pending"  # proposed or queued: its params are taken
    RUNNING = "running"
    COMPLETE = "complete"  # ended with its objective value
    PRUNED = "pruned"  # stopped at a rung
    FAILED = "failed"  # ended without a value (failed, cancelled): not a result


@dataclass(frozen=True)
class RungRecord:
    """A trial's metric at a rung, as the pruner recorded it (`rung`: the index optuna
    counts in the trial's bracket; `resource`: thousandths of the run)."""

    rung: int
    resource: int
    value: float


@dataclass(frozen=True)
class TrialRecord:
    """One trial of a sweep as orch recorded it."""

    number: int
    params: Mapping[str, Any]
    state: TrialState
    value: float | None = None  # the objective, for COMPLETE
    rungs: tuple[RungRecord, ...] = ()


@dataclass(frozen=True)
class Continue:
    """The trial goes on; `recorded`: rung values to persist (checked once, never again)."""

    recorded: tuple[RungRecord, ...] = ()


@dataclass(frozen=True)
class Prune:
    """The trial stops at `rung`: its `value` of `metric` did not reach `cutoff`."""

    rung: int
    resource: int
    step: int
    metric: str
    value: float
    cutoff: float
    recorded: tuple[RungRecord, ...] = field(default=())


Decision = Continue | Prune


# --- the space in optuna's terms -----------------------------------------------------------


def _distributions(space: Sequence[Param]) -> dict[str, Any]:
    from optuna.distributions import (
        CategoricalDistribution,
        FloatDistribution,
        IntDistribution,
    )

    out: dict[str, Any] = {}
    for p in space:
        if p.kind == "choice":
            # Indices, not the values: a choice may be a list or mapping, which optuna's
            # categorical values cannot be; TPE treats categories as unordered either way.
            out[p.key] = CategoricalDistribution(list(range(len(p.choices))))
        elif p.kind == "int":
            out[p.key] = IntDistribution(int(p.low), int(p.high))
        else:
            out[p.key] = FloatDistribution(p.low, p.high, log=p.log)
    return out


def _encode(space: Sequence[Param], params: Mapping[str, Any]) -> dict[str, Any] | None:
    """`params` as optuna values (choice indices); None if a value is outside the space."""
    out: dict[str, Any] = {}
    for p in space:
        if p.key not in params:
            return None
        value = params[p.key]
        if p.kind == "choice":
            hits = [i for i, c in enumerate(p.choices) if c == value and type(c) is type(value)]
            if not hits:
                return None
            out[p.key] = hits[0]
        elif isinstance(value, bool) or not isinstance(value, int | float):
            return None
        elif not p.low <= value <= p.high:
            return None
        else:
            out[p.key] = int(value) if p.kind == "int" else float(value)
    return out


def _decode(space: Sequence[Param], values: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for p in space:
        v = values[p.key]
        if p.kind == "choice":
            out[p.key] = p.choices[int(v)]
        elif p.kind == "int":
            out[p.key] = int(v)
        else:
            rounded = float(f"{float(v):.{SIGNIFICANT_DIGITS}g}")
            out[p.key] = min(max(rounded, p.low), p.high)
    return out


def _identity(params: Mapping[str, Any]) -> str:
    return repr(sorted((k, repr(v)) for k, v in params.items()))


def _quiet() -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


def _seed(*parts: int) -> int:
    """A 32-bit seed from the sweep's seed and counters (crc32: stable across processes)."""
    return binascii.crc32(":".join(str(p) for p in parts).encode())


# --- propose ---------------------------------------------------------------------------------


def n_startup(trials: int) -> int:
    """TPE's random start for a sweep of `trials` runs: a quarter of them, 3 to 10."""
    return max(3, min(10, trials // 4))


def _tpe_study(space: Sequence[Param], known: Sequence[TrialRecord], goal: str,
               prune_goal: str | None, seed: int, startup: int) -> optuna.Study:
    import optuna
    from optuna.trial import TrialState as OptunaState

    dists = _distributions(space)
    sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup,
                                         multivariate=True, constant_liar=True)
    study = optuna.create_study(direction="minimize" if goal == "min" else "maximize",
                                sampler=sampler)
    # A pruned trial is ranked by its last rung value in the study's direction; when the
    # early-stop metric runs the other way (loss down, exact match up) its sign is flipped.
    sign = -1.0 if prune_goal is not None and prune_goal != goal else 1.0
    for t in sorted(known, key=lambda t: t.number):
        encoded = _encode(space, t.params)
        if encoded is None:
            continue  # outside the current space (the sweep file changed): not evidence
        if t.state == TrialState.COMPLETE and t.value is not None and math.isfinite(t.value):
            study.add_trial(optuna.trial.create_trial(
                params=encoded, distributions=dists, value=t.value))
        elif t.state == TrialState.PRUNED:
            # A diverged trial (a NaN rung) is given no values: optuna's TPE ranks a pruned
            # trial by its furthest step first, so a NaN there after a good rung value would
            # still count it among the good; with none it ranks below every other trial.
            diverged = any(math.isnan(r.value) for r in t.rungs)
            study.add_trial(optuna.trial.create_trial(
                params=encoded, distributions=dists, state=OptunaState.PRUNED,
                intermediate_values={} if diverged else {r.resource: sign * r.value
                                                         for r in t.rungs}))
        elif t.state in (TrialState.PENDING, TrialState.RUNNING):
            study.add_trial(optuna.trial.create_trial(
                params=encoded, distributions=dists, state=OptunaState.RUNNING))
    return study


def _unused_point(space: Sequence[Param], taken: set[str], seed: int) -> dict[str, Any] | None:
    size = space_size(space)
    if size is None:
        return None
    if size > ENUMERABLE:
        rng = random.Random(seed)
        for _ in range(1000):
            params = {p.key: rng.choice(p.values()) for p in space}
            if _identity(params) not in taken:
                return params
        return None
    free = [params for combo in itertools.product(*(p.values() for p in space))
            if _identity(params := dict(zip((p.key for p in space), combo, strict=True)))
            not in taken]
    return random.Random(seed).choice(free) if free else None


def propose(space: Sequence[Param], trials: Sequence[TrialRecord], *, seed: int, n: int,
            goal: str, total: int, prune_goal: str | None = None) -> list[dict[str, Any]]:
    """The params of the next `n` trials of a tpe sweep of `total` trials (fewer when the
    space has no unused point left); numbered after the highest recorded trial."""
    if n <= 0 or not space:
        return []
    _quiet()
    known = list(trials)
    taken = {_identity(t.params) for t in known}
    out: list[dict[str, Any]] = []
    startup = n_startup(total)
    for _ in range(n):
        number = max((t.number for t in known), default=-1) + 1
        params: dict[str, Any] | None = None
        for attempt in range(ASK_AGAIN):
            study = _tpe_study(space, known, goal, prune_goal, _seed(seed, number, attempt),
                               startup)
            asked = study.ask(_distributions(space))
            params = _decode(space, asked.params)
            if _identity(params) not in taken:
                break
            params = None
        if params is None:
            params = _unused_point(space, taken, _seed(seed, number, ASK_AGAIN))
        if params is None:
            break  # every point of the space is taken
        out.append(params)
        taken.add(_identity(params))
        known.append(TrialRecord(number, params, TrialState.PENDING))
    return out


# --- decide ----------------------------------------------------------------------------------


def rung_resources(early_stop: EarlyStopSpec) -> list[int]:
    """Every rung's resource (thousandths of a run): r0 x eta^k, one per rung of
    `rung_fractions` (min_fraction x eta^k below 1), r0 being min_fraction in thousandths.

    The rungs are counted on the exact fractions: counted on the rounded r0 instead, 0.0625
    (62) x 4 x 4 gave a third rung at 992, 99.2 % of a run, where 0.0625 x 16 is the end.
    The resources are r0 x eta^k as optuna's pruner computes them from min_resource r0.
    """
    r0 = max(1, round(early_stop.min_fraction * RESOURCE))
    return [r for k in range(len(rung_fractions(early_stop)))
            if (r := r0 * early_stop.reduction_factor ** k) < RESOURCE]


def rung_step(resource: int, total_steps: int) -> int:
    """The training step at which a run of `total_steps` reaches `resource`."""
    return max(1, math.ceil(resource * total_steps / RESOURCE))


def rung_value(curve: Sequence[tuple[int, float]], step: int) -> tuple[int, float] | None:
    """(the first reported step at or past `step`, the smoothed metric there), or None
    while no report has reached `step`. NaN when the report there is not a number: a run
    that has diverged is judged by that, not by its losses from before (NaN weights do not
    come back)."""
    reached = [s for s, _ in curve if s >= step]
    if not reached:
        return None
    at = min(reached)
    if not all(math.isfinite(v) for s, v in curve if s == at):
        return at, float("nan")
    low = step - max(1, math.ceil(SMOOTHING * step))
    window = [v for s, v in curve if low < s <= at and math.isfinite(v)]
    if not window:
        return at, float("nan")
    return at, sum(window) / len(window)


def _pruner(early_stop: EarlyStopSpec) -> Any:
    import optuna

    r0 = rung_resources(early_stop)[0]
    if early_stop.pruner == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=r0, max_resource=RESOURCE,
                                              reduction_factor=early_stop.reduction_factor)
    return optuna.pruners.SuccessiveHalvingPruner(
        min_resource=r0, reduction_factor=early_stop.reduction_factor)


def _rung_study(early_stop: EarlyStopSpec, study_name: str, trials: Sequence[TrialRecord],
                number: int, values: Mapping[int, float]) -> optuna.Study:
    import optuna
    from optuna.trial import TrialState as OptunaState

    study = optuna.create_study(
        study_name=study_name, pruner=_pruner(early_stop),
        direction="minimize" if early_stop.goal == "min" else "maximize")
    by_number = {t.number: t for t in trials}
    for i in range(max([number, *by_number]) + 1):
        t = by_number.get(i)
        # A diverged trial's NaN rung is not a competing value: optuna never records one (it
        # prunes a NaN before it would), and a NaN among them prunes every later trial.
        attrs = {} if t is None else {_RUNG_KEY.format(r.rung): r.value for r in t.rungs
                                      if math.isfinite(r.value)}
        inter = {} if t is None else {r.resource: r.value for r in t.rungs}
        if i == number:
            state, inter = OptunaState.RUNNING, {**inter, **values}
        elif t is None or t.state == TrialState.FAILED:
            state = OptunaState.FAIL  # keeps the numbers (Hyperband's brackets hash them)
        elif t.state == TrialState.PRUNED:
            state = OptunaState.PRUNED
        elif t.state == TrialState.COMPLETE and t.value is not None:
            state = OptunaState.COMPLETE
        else:
            state = OptunaState.RUNNING
        study.add_trial(optuna.trial.create_trial(
            state=state, value=(0.0 if state == OptunaState.COMPLETE else None),
            intermediate_values=inter, system_attrs=attrs))
    return study


def _cutoff(early_stop: EarlyStopSpec, trials: Sequence[TrialRecord], number: int,
            rung: RungRecord) -> float:
    """The value a trial needed at `rung` to go on (optuna's rule: the best
    max(1, n // eta) of the n values recorded at that rung of the bracket)."""
    values = [r.value for t in trials if t.number != number for r in t.rungs
              if r.rung == rung.rung and r.resource == rung.resource and math.isfinite(r.value)]
    n = len(values) + 1  # this trial's own value counts, last when it is not a number
    values = sorted([*values, *([rung.value] if math.isfinite(rung.value) else [])],
                    reverse=early_stop.goal == "max")
    if not values:
        return math.nan  # a NaN, and no other trial at the rung yet: nothing to reach
    keep = max(1, n // early_stop.reduction_factor)
    return values[min(keep, len(values)) - 1]


def decide(early_stop: EarlyStopSpec, trials: Sequence[TrialRecord], number: int,
           curve: Sequence[tuple[int, float]], total_steps: int, *, study_name: str,
           finished: bool = False) -> Decision:
    """Whether trial `number` (running, its metric `curve` of (step, value) so far, out of
    `total_steps`) goes on at the rungs it has passed since its recorded ones.

    `trials` are the sweep's records, the running trial's own included (its recorded rungs
    are not checked again). With `finished` (the run ended before it was checked) every rung
    passed is recorded and the answer is Continue: a finished run competes at its rungs.
    """
    _quiet()
    me = next((t for t in trials if t.number == number), None)
    done = {r.resource for r in me.rungs} if me is not None else set()
    last_done = max(done, default=0)
    recorded: list[RungRecord] = []
    values: dict[int, float] = {}
    for resource in rung_resources(early_stop):
        if resource <= last_done:
            continue
        found = rung_value(curve, rung_step(resource, total_steps))
        if found is None:
            break
        step, value = found
        values[resource] = value
        mine = TrialRecord(number, me.params if me else {}, TrialState.RUNNING, None,
                           (*(me.rungs if me else ()), *recorded))
        others = [t for t in trials if t.number != number]
        study = _rung_study(early_stop, study_name, [*others, mine], number, values)
        frozen = study.get_trials(deepcopy=False)[number]
        # The rung this check is at, in optuna's count: the trial's rungs completed so far
        # (a NaN is pruned before optuna records its rung, so `new` is empty then).
        at_rung = sum(1 for k in frozen.system_attrs if k.startswith("completed_rung_"))
        stop = study.pruner.prune(study, frozen)
        attrs = study.get_trials(deepcopy=False)[number].system_attrs
        new = [RungRecord(int(k.rsplit("_", 1)[1]), resource, float(v)) for k, v in attrs.items()
               if k.startswith("completed_rung_") and int(k.rsplit("_", 1)[1])
               not in {r.rung for r in mine.rungs}]
        recorded += new
        if stop and not finished:
            rung = new[-1] if new else RungRecord(at_rung, resource, value)
            return Prune(rung.rung, resource, step, early_stop.metric, value,
                         _cutoff(early_stop, others, number, rung), tuple(recorded))
    return Continue(tuple(recorded))


def best(trials: Sequence[TrialRecord], goal: str) -> TrialRecord | None:
    """The complete trial with the best value (ties: the lowest number); None if none."""
    done = [(t.value, t) for t in trials if t.state == TrialState.COMPLETE
            and t.value is not None and math.isfinite(t.value)]
    if not done:
        return None
    return min(done, key=lambda vt: ((vt[0] if goal == "min" else -vt[0]), vt[1].number))[1]


__all__ = ["Continue", "Decision", "Prune", "RungRecord", "TrialRecord", "TrialState", "best",
           "decide", "n_startup", "propose", "rung_resources", "rung_step", "rung_value"]
