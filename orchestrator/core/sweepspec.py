"""Sweep files: validation, expansion into job runs, idempotency keys, best run (pure).

A sweep names a base job file and the values to try. `grid` is a cartesian product over
dotted job-file keys (keys in file order, values in list order); `random` draws `n` samples
from distributions with a seeded generator. Grid points and random samples are separate
runs: grid points first, then samples; a sample is not combined with each grid point. Each
run is the base file's YAML with its overrides applied, validated and resolved exactly as a
job file at the base file's path, so relative paths (the base's and the overrides') are
relative to the base file's directory.
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import itertools
import math
import random as random_module
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from orchestrator.core import canonical, specerrors, yamlpos
from orchestrator.core import spec as jobspec
from orchestrator.core.notifyspec import Targets
from orchestrator.core.spec import (
    JobSpec,
    LoadedJob,
    Money,
    SpecError,
    Strict,
    read_mapping,
)
from orchestrator.core.specerrors import submodel

# More runs than this is a typo in a grid, not an experiment anyone pays for.
MAX_RUNS = 1000
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
    notify: Targets = Field(
        default=[], examples=[{"url_env": "SLACK_WEBHOOK_URL", "format": "slack"}],
        description="Webhooks POSTed on its runs' events and when the sweep finishes (with "
                    "its best run): one mapping or a list, as in the job file.")


@dataclass(frozen=True)
class SweepRun:
    """One job of a sweep: its overrides, the resolved job, and its idempotency key."""

    index: int
    params: dict[str, Any]
    job: LoadedJob
    sweep_key: str


@dataclass(frozen=True)
class LoadedSweep:
    """A validated sweep file and its runs, in expansion order."""

    spec: SweepSpec
    path: Path
    base: LoadedJob
    runs: tuple[SweepRun, ...]
    duplicates: int = 0  # runs dropped because an earlier one had the same resolved spec

    @property
    def spec_json(self) -> str:
        """The sweep spec as canonical JSON (what the `sweep` table stores)."""
        # `notify` (added later) only when set: recorded sweeps keep their stored form.
        return canonical.dumps(canonical.without_defaults(
            self.spec.model_dump(mode="python", by_alias=True), {("notify",): []}))


def sweep_key(sweep_name: str, spec_hash: str) -> str:
    """Idempotency key of one run: sha256 of the canonical JSON of the sweep name and hash."""
    return hashlib.sha256(canonical.dumps({"spec_hash": spec_hash, "sweep": sweep_name})
                          .encode()).hexdigest()


# --- error translation -------------------------------------------------------------------

def _sweep_model_at(loc: tuple[str | int, ...]) -> type[BaseModel] | None:
    if loc == ():
        return SweepSpec
    if loc == ("random",):
        return RandomSpec
    if loc == ("objective",):
        return Objective
    if len(loc) == 3 and loc[:2] == ("random", "params"):
        return Distribution
    return None


def _field_names(model: type[BaseModel]) -> list[str]:
    return [f.alias or name for name, f in model.model_fields.items()]


def _describe(err: dict[str, Any]) -> str:
    kind = err["type"]
    loc = tuple(err["loc"])
    if kind == "extra_forbidden":
        model = _sweep_model_at(loc[:-1])
        choices = _field_names(model) if model else []
        if model is Distribution:
            return f"unknown distribution {loc[-1]!r}; supported: {', '.join(choices)}"
        close = difflib.get_close_matches(str(loc[-1]), choices, n=1, cutoff=0.6)
        if close:
            return f"unknown key; did you mean {close[0]!r}?"
        return f"unknown key; allowed here: {', '.join(choices)}" if choices else "unknown key"
    if kind == "missing":
        return f"required; add it (see {EXAMPLE})"
    if kind == "string_pattern_mismatch":
        return (f"must be 1-{MAX_NAME_LEN} letters, digits, '.', '_' or '-', starting with a "
                f"letter or digit (got {err.get('input')!r}); runs are named <name>-000, ...")
    if kind == "list_type" and len(loc) == 2 and loc[0] == "grid":
        return f"must be a list of values, e.g. [1.0e-4, 2.0e-4] (got {err.get('input')!r})"
    if kind == "dict_type" and loc in {("grid",), ("random", "params")}:
        return "must be a mapping of dotted job-file keys, e.g. training.learning_rate: ..."
    return specerrors.describe(err, JobSpec)


def _problem(filename: str, pos: yamlpos.Positions, loc: tuple[str | int, ...],
             msg: str) -> tuple[int, str]:
    line = pos.line(loc)
    return line, f"{filename}:{line} {yamlpos.dotted(loc) or '(top level)'}: {msg}"


# --- override keys -----------------------------------------------------------------------

# Job-file values that may be written as a string; a dotted key into them needs the mapping.
_STRING_FORMS: dict[tuple[str, ...], str] = {("base_model",): "repo", ("dataset", "path"): "local"}


def check_key(key: str) -> str | None:
    """What is wrong with a dotted override key (None when it names a job-file field)."""
    parts = key.split(".")
    if not all(parts):
        return "must be a dotted job-file key such as training.learning_rate"
    model: type[BaseModel] = JobSpec
    for i, part in enumerate(parts):
        fields = list(model.model_fields)
        if part not in fields:
            section = ".".join(parts[:i])
            close = difflib.get_close_matches(part, fields, n=1, cutoff=0.6)
            hint = f"did you mean {'.'.join([*parts[:i], close[0]])!r}? " if close else ""
            where = f"{section} has" if section else "a job file has"
            return f"not a job-file key; {hint}{where}: {', '.join(fields)}"
        if i == len(parts) - 1:
            return None
        annotation = model.model_fields[part].annotation
        sub = submodel(annotation)
        if sub is None:
            if getattr(annotation, "__origin__", None) is dict:
                return None  # free-form mapping (trainer.extra): any key below it
            return (f"{'.'.join(parts[:i + 1])} is a single value, not a section; override "
                    "it as a whole")
        model = sub
    return None


def _overlaps(keys: list[str]) -> dict[str, str]:
    """Keys that are a section of an earlier key or inside it, mapped to that earlier key."""
    out: dict[str, str] = {}
    for i, key in enumerate(keys):
        for earlier in keys[:i]:
            if key.startswith(earlier + ".") or earlier.startswith(key + "."):
                out[key] = earlier
                break
    return out


def _apply(data: dict[str, Any], key: str, value: Any) -> None:
    """Set the dotted `key` in a job file's raw data, creating sections it lacks."""
    parts = key.split(".")
    node = data
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if not isinstance(child, dict):
            wrap = _STRING_FORMS.get(tuple(parts[:i + 1]))
            # `base_model: org/name` plus an override of base_model.revision.
            child = {wrap: child} if wrap and child is not None else {}
            node[part] = child
        node = child
    node[parts[-1]] = copy.deepcopy(value)


# --- loading -------------------------------------------------------------------------------


@dataclass
class _Origin:
    """Where in the sweep file one override of a run came from."""

    key: str
    loc: tuple[str | int, ...]  # ("grid", key, i) or ("random", "params", key)
    sample: int | None = None  # for random: which sample, counted from 1
    value: Any = None


def load_sweep(path: str | Path) -> LoadedSweep:
    """Read, validate and expand a sweep file; raise SpecError listing every problem."""
    path = Path(path)
    name = str(path)
    raw, pos = read_mapping(path, f"name, base, grid (see {EXAMPLE})")

    problems: list[tuple[int, str]] = []
    # Keys are checked on the raw data so that a schema error elsewhere does not hide them.
    for section in (("grid",), ("random", "params")):
        mapping = raw.get(section[0])
        if len(section) == 2 and isinstance(mapping, dict):
            mapping = mapping.get(section[1])
        if not isinstance(mapping, dict):
            continue
        keys = list(mapping)
        overlaps = _overlaps(keys)
        for key in keys:
            why = check_key(key) if isinstance(key, str) else "must be a dotted job-file key"
            if why is None and key in overlaps:
                why = (f"overlaps {yamlpos.dotted((*section, overlaps[key]))}; override "
                       "either the section or the keys inside it")
            if why is None and section == ("grid",) and mapping[key] == []:
                why = "must list at least one value"
            if why:
                problems.append(_problem(name, pos, (*section, key), why))
    spec: SweepSpec | None = None
    try:
        spec = SweepSpec.model_validate(raw)
    except ValidationError as exc:
        for err in exc.errors():
            problems.append(_problem(name, pos, tuple(err["loc"]), _describe(dict(err))))

    base_problems: list[str] = []
    base_job: LoadedJob | None = None
    base_path: Path | None = None
    if isinstance(raw.get("base"), str) and raw["base"]:
        base_path = path.parent / raw["base"]
        if not base_path.is_file():
            what = "is a directory, not a file" if base_path.is_dir() else "file not found"
            problems.append(_problem(name, pos, ("base",), f"{what}: {base_path}; give the "
                                     "job file's path (relative to the sweep file)"))
            base_path = None
        else:
            try:
                base_job = jobspec.load_job(base_path)
            except SpecError as exc:
                base_problems = exc.problems

    if spec is not None and not problems:
        problems.extend(_count_problems(spec, name, pos))
    if problems or base_problems or spec is None or base_job is None or base_path is None:
        raise SpecError(_ordered(problems) + base_problems)
    return _expand(spec, path, pos, base_job, base_path)


# Problems in the base file (caused by a run's combination) sort after the sweep file's own.
AFTER_SWEEP_LINES = 10**9


def _ordered(problems: list[tuple[int, str]]) -> list[str]:
    return [m for _, m in sorted(dict.fromkeys(problems), key=lambda p: p[0])]


def _count_problems(spec: SweepSpec, name: str,
                    pos: yamlpos.Positions) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    if spec.random.n and not spec.random.params:
        out.append(_problem(name, pos, ("random", "n"), f"draws {spec.random.n} samples but "
                            "random.params is empty; add a distribution or set n: 0"))
    if out:
        return out
    points = math.prod(len(v) for v in spec.grid.values()) if spec.grid else 0
    total = points + spec.random.n
    loc: tuple[str | int, ...] = ("grid",) if spec.grid else ("random", "n")
    if total == 0:
        out.append(_problem(name, pos, ("grid",) if "grid" in spec.model_fields_set else (),
                            "the sweep expands to no runs; give grid values or random.n > 0"))
    elif total > MAX_RUNS:
        out.append(_problem(name, pos, loc, f"the sweep expands to {total:,} runs ({points:,} "
                            f"grid points + {spec.random.n:,} samples); at most {MAX_RUNS:,}: "
                            "trim the grid, split it into several sweeps, or sample randomly"))
    return out


def _candidates(spec: SweepSpec) -> list[list[_Origin]]:
    """Each run's overrides: grid points in order, then random samples."""
    out: list[list[_Origin]] = []
    if spec.grid:
        keys = list(spec.grid)
        # Odometer order: the last key varies fastest, like nested loops in file order.
        for combo in itertools.product(*(range(len(spec.grid[k])) for k in keys)):
            out.append([_Origin(k, ("grid", k, i), value=spec.grid[k][i])
                        for k, i in zip(keys, combo, strict=True)])
    rng = random_module.Random(spec.random.seed)
    for n in range(1, spec.random.n + 1):
        out.append([_Origin(k, ("random", "params", k), n, d.sample(rng))
                    for k, d in spec.random.params.items()])
    return out


def _resolve_key(job: JobSpec) -> str:
    # resolve() reads these parts only (model shape, dataset and eval files, GPU and provider
    # names, lora with method full); runs that differ elsewhere share one resolution, so a
    # large dataset is counted once per sweep rather than once per run.
    return canonical.dumps({
        "base_model": job.base_model.model_dump(mode="python"),
        "method": job.method,
        "lora_given": "lora" in job.model_fields_set,
        "dataset": job.dataset.model_dump(mode="python"),
        "datasets": [d.model_dump(mode="python") for d in job.datasets or []],
        "val_set_size": job.training.val_set_size,
        "eval": job.eval.model_dump(mode="python"),
        "gpus": job.resources.gpus,
        "providers": job.resources.providers,
    })


@dataclass
class _Problems:
    """A sweep's problems, each pointing at the override (or the base file line) at fault."""

    spec: SweepSpec
    name: str  # the sweep file
    pos: yamlpos.Positions
    base_name: str
    base_pos: yamlpos.Positions
    found: list[tuple[int, str]] = field(default_factory=list)
    # Random problems are reported once per parameter: n samples would repeat them n times.
    random_seen: set[str] = field(default_factory=set)

    def report(self, origins: list[_Origin], msg_loc: tuple[str | int, ...] | None,
               msg: str, line_in_base: int | None) -> None:
        """Record one problem of the run made of `origins`."""
        dotted = yamlpos.dotted(msg_loc) if msg_loc else ""
        # A problem elsewhere (a dataset row, say) has no location to match an override by.
        for o in origins if msg_loc else []:
            if not _related(dotted, o.key):
                continue
            inner = "" if dotted == o.key else f"{dotted}: "
            if o.sample is not None:
                if o.key in self.random_seen:
                    return
                self.random_seen.add(o.key)
                inner = f"sample {o.sample} of {self.spec.random.n}: {inner}"
            self.found.append(_problem(self.name, self.pos, o.loc, inner + msg))
            return
        # Not caused by one override alone: the combination with the base file is at fault.
        given = ", ".join(f"{o.key}={o.value!r}" for o in origins)
        given += f" from {self.name}:{self.pos.line(origins[0].loc)}" if origins else ""
        if msg_loc is None:
            self.found.append((AFTER_SWEEP_LINES, f"{msg} (in the run with {given})"))
            return
        line = line_in_base or self.base_pos.line(msg_loc)
        self.found.append((AFTER_SWEEP_LINES, f"{self.base_name}:{line} "
                           f"{dotted or '(top level)'}: {msg} (in the run with {given})"))

    def resolve(self, job: JobSpec, base_path: Path, origins: list[_Origin]) -> LoadedJob | None:
        """`jobspec.resolve` of the run's spec; None (its problems recorded) if it fails."""
        try:
            return jobspec.resolve(job, base_path, self.base_pos)
        except SpecError as exc:
            for p in exc.problems:
                line, loc_text, msg = _split_problem(p, self.base_name)
                if loc_text is None:
                    self.report(origins, None, p, None)
                else:
                    self.report(origins, _parse_dotted(loc_text), msg, line)
            return None


def _expand(spec: SweepSpec, path: Path, pos: yamlpos.Positions, base_job: LoadedJob,
            base_path: Path) -> LoadedSweep:
    base_raw, base_pos = read_mapping(base_path, "name, base_model, method, dataset")
    problems = _Problems(spec, str(path), pos, str(base_path), base_pos)
    runs: list[SweepRun] = []
    seen: set[str] = set()
    resolved: dict[str, LoadedJob | None] = {}  # None: resolving failed (reported once)
    duplicates = 0
    for origins in _candidates(spec):
        data = copy.deepcopy(base_raw)
        for o in origins:
            _apply(data, o.key, o.value)
        named = any(o.key == "name" for o in origins)
        if not named:
            data["name"] = spec.name  # the same for every run until duplicates are dropped
        try:
            job = JobSpec.model_validate(data)
        except ValidationError as exc:
            for err in exc.errors():
                loc = specerrors.user_loc(tuple(err["loc"]))
                problems.report(origins, loc, specerrors.describe(dict(err), JobSpec), None)
            continue
        identity = jobspec.spec_hash(job)
        if identity in seen:
            duplicates += 1
            continue
        seen.add(identity)
        index = len(runs)
        if not named:
            data["name"] = f"{spec.name}-{index:03d}"
            job = JobSpec.model_validate(data)
        rkey = _resolve_key(job)
        if rkey not in resolved:
            resolved[rkey] = problems.resolve(job, base_path, origins)
        done = resolved[rkey]
        if done is None:
            continue
        loaded = LoadedJob(spec=job, path=base_path, architecture=done.architecture,
                           dataset=done.dataset)
        params = {o.key: o.value for o in origins}
        runs.append(SweepRun(index, params, loaded, sweep_key(spec.name, identity)))
    if problems.found:
        raise SpecError(_ordered(problems.found))
    return LoadedSweep(spec=spec, path=path, base=base_job, runs=tuple(runs),
                       duplicates=duplicates)


def _related(dotted: str, key: str) -> bool:
    """Whether an error at `dotted` is inside the override `key`, or `key` is inside it."""
    def inside(a: str, b: str) -> bool:
        return a == b or a.startswith(b + ".") or a.startswith(b + "[")
    return inside(dotted, key) or inside(key, dotted)


def _split_problem(problem: str, base_name: str) -> tuple[int | None, str | None, str]:
    """(line, dotted location, message) of a resolve() problem in the base file's format."""
    prefix = base_name + ":"
    if not problem.startswith(prefix):
        return None, None, problem  # about another file (a dataset row, say)
    line_text, _, rest = problem[len(prefix):].partition(" ")
    loc_text, sep, msg = rest.partition(": ")
    if not line_text.isdigit() or not sep:
        return None, None, problem
    return int(line_text), loc_text, msg


def _parse_dotted(text: str) -> tuple[str | int, ...]:
    out: list[str | int] = []
    for part in text.split("."):
        head, *indices = part.split("[")
        out.append(head)
        out.extend(int(i.rstrip("]")) for i in indices if i.rstrip("]").isdigit())
    return tuple(out)


__all__ = [
    "MAX_RUNS", "Distribution", "LoadedSweep", "Objective", "RandomSpec",
    "SweepRun", "SweepSpec", "check_key", "load_sweep", "sweep_key",
]
