"""Sweep files: validation, expansion into job runs, idempotency keys, best run (pure).

A sweep names a base job file and the values to try. `grid` is a cartesian product over
dotted job-file keys (keys in file order, values in list order); `random` draws `n` samples
from distributions with a seeded generator. Grid points and random samples are separate
runs: grid points first, then samples; a sample is not combined with each grid point. Each
run is the base file's YAML with its overrides applied, validated and resolved exactly as a
job file at the base file's path, so relative paths (the base's and the overrides') are
relative to the base file's directory.

`search:` and `early_stop:` (orchestrator/core/searchspec.py) choose how runs are drawn
(sweepdraws.py) and when a losing run stops; left out, they are not in the sweep's canonical
form, so a file without them keeps the identity it had before they existed.
"""

from __future__ import annotations

import copy
import difflib
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ValidationError,
)

from orchestrator.core import canonical, specerrors, yamlpos
from orchestrator.core import spec as jobspec
from orchestrator.core.hubsize import HubSizer
from orchestrator.core.searchspec import EarlyStopSpec, Param, SearchSpec
from orchestrator.core.spec import (
    JobSpec,
    LoadedJob,
    SpecError,
    read_mapping,
)
from orchestrator.core.specerrors import submodel
from orchestrator.core.specidentity import spec_hash
from orchestrator.core.sweepdraws import (
    Origin,
    candidates,
    early_stop_problems,
    points,
    sampler_of,
    search_problems,
    space_of,
)
from orchestrator.core.sweepmodel import (
    EXAMPLE,
    MAX_NAME_LEN,
    NAME_PATTERN,
    SIGNIFICANT_DIGITS,
    Distribution,
    Goal,
    Objective,
    RandomSpec,
    SweepSpec,
)
from orchestrator.core.sweepproblems import RunProblems, ordered, problem

# More runs than this is a typo in a grid, not an experiment anyone pays for.
MAX_RUNS = 1000
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
    pos: yamlpos.Positions | None = None  # the sweep file's lines (for `run_for`'s errors)

    @property
    def sampler(self) -> str:
        """grid, random or tpe (tpe: `runs` is empty; runs come from `search.propose`)."""
        return sampler_of(self.spec)

    @property
    def space(self) -> tuple[Param, ...]:
        """The search space over the grid keys and random parameters."""
        return space_of(self.spec)

    @property
    def spec_json(self) -> str:
        """The sweep spec as canonical JSON (what the `sweep` table stores)."""
        # Sections added later are dumped only when set (SweepSpec's serializer): recorded
        # sweeps keep their stored form.
        return canonical.dumps(self.spec.model_dump(mode="python", by_alias=True))


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
    if loc == ("search",):
        return SearchSpec
    if loc == ("early_stop",):
        return EarlyStopSpec
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


def load_sweep(path: str | Path, hub_size: HubSizer | None = None) -> LoadedSweep:
    """Read, validate and expand a sweep file; raise SpecError listing every problem.
    `hub_size`: as for `spec.load_job` (a Hub dataset's published size)."""
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
                problems.append(problem(name, pos, (*section, key), why))
    spec: SweepSpec | None = None
    try:
        spec = SweepSpec.model_validate(raw)
    except ValidationError as exc:
        for err in exc.errors():
            problems.append(problem(name, pos, tuple(err["loc"]), _describe(dict(err))))

    base_problems: list[str] = []
    base_job: LoadedJob | None = None
    base_path: Path | None = None
    if isinstance(raw.get("base"), str) and raw["base"]:
        base_path = path.parent / raw["base"]
        if not base_path.is_file():
            what = "is a directory, not a file" if base_path.is_dir() else "file not found"
            problems.append(problem(name, pos, ("base",), f"{what}: {base_path}; give the "
                                     "job file's path (relative to the sweep file)"))
            base_path = None
        else:
            try:
                base_job = jobspec.load_job(base_path, hub_size)
            except SpecError as exc:
                base_problems = exc.problems

    if spec is not None and not problems:
        problems.extend(problem(name, pos, loc, msg) for loc, msg in search_problems(spec))
    if spec is not None and not problems:
        problems.extend(_count_problems(spec, name, pos))
    if spec is not None and base_job is not None:
        problems.extend(problem(name, pos, loc, msg) for loc, msg
                        in early_stop_problems(spec, base_job.spec))
    if problems or base_problems or spec is None or base_job is None or base_path is None:
        raise SpecError(ordered(problems) + base_problems)
    return _expand(spec, path, pos, base_job, base_path, candidates(spec),
                   keep_runs=sampler_of(spec) != "tpe")


def run_for(loaded: LoadedSweep, params: dict[str, Any], index: int) -> SweepRun:
    """The run of `loaded` with `params` (one value per space key), numbered `index`.

    For runs proposed after loading (tpe): validated and resolved as an expanded run is;
    SpecError when the base job refuses the combination.
    """
    sources = {p.key: p for p in loaded.space}
    unknown = sorted(set(params) ^ set(sources))
    if unknown:
        raise ValueError(f"params must name exactly the space's keys; differ: {unknown}")
    origins = [Origin(k, ("grid", k) if k in loaded.spec.grid else ("random", "params", k),
                      value=params[k]) for k in sources]
    pos = loaded.pos or yamlpos.Positions()
    again = _expand(loaded.spec, loaded.path, pos, loaded.base, loaded.base.path, [origins],
                    first_index=index, keep_runs=True)
    if not again.runs:  # a duplicate of itself cannot happen: one candidate
        raise SpecError([f"{loaded.path}: run {index} with {params!r} resolves to nothing"])
    return again.runs[0]


def _count_problems(spec: SweepSpec, name: str,
                    pos: yamlpos.Positions) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    if spec.random.n and not spec.random.params:
        out.append(problem(name, pos, ("random", "n"), f"draws {spec.random.n} samples but "
                            "random.params is empty; add a distribution or set n: 0"))
    if out or sampler_of(spec) != "grid":
        return out  # random and tpe run search.trials (checked by search_problems)
    grid = points(spec)
    total = grid + spec.random.n
    loc: tuple[str | int, ...] = ("grid",) if spec.grid else ("random", "n")
    if total == 0:
        out.append(problem(name, pos, ("grid",) if "grid" in spec.model_fields_set else (),
                            "the sweep expands to no runs; give grid values or random.n > 0"))
    elif total > MAX_RUNS:
        out.append(problem(name, pos, loc, f"the sweep expands to {total:,} runs ({grid:,} "
                            f"grid points + {spec.random.n:,} samples); at most {MAX_RUNS:,}: "
                            "trim the grid, split it into several sweeps, or sample randomly"))
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


def _expand(spec: SweepSpec, path: Path, pos: yamlpos.Positions, base_job: LoadedJob,
            base_path: Path, origins_list: list[list[Origin]],
            first_index: int = 0, keep_runs: bool = True) -> LoadedSweep:
    base_raw, base_pos = read_mapping(base_path, "name, base_model, method, dataset")
    problems = RunProblems(spec, str(path), pos, str(base_path), base_pos,
                           hub_size=dict(base_job.hub_sizes).get if base_job.hub_sizes
                           else None)
    runs: list[SweepRun] = []
    seen: set[str] = set()
    resolved: dict[str, LoadedJob | None] = {}  # None: resolving failed (reported once)
    duplicates = 0
    for origins in origins_list:
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
        identity = spec_hash(job)
        if identity in seen:
            duplicates += 1
            continue
        seen.add(identity)
        index = first_index + len(runs)
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
                           dataset=done.dataset, hub_sizes=done.hub_sizes)
        params = {o.key: o.value for o in origins}
        runs.append(SweepRun(index, params, loaded, sweep_key(spec.name, identity)))
    if problems.found:
        raise SpecError(ordered(problems.found))
    if not keep_runs:
        runs, duplicates = [], 0  # tpe's probes only checked the values; tpe proposes later
    return LoadedSweep(spec=spec, path=path, base=base_job, runs=tuple(runs),
                       duplicates=duplicates, pos=pos)


__all__ = [
    "MAX_NAME_LEN", "MAX_RUNS", "NAME_PATTERN", "SIGNIFICANT_DIGITS", "EarlyStopSpec", "Goal",
    "SearchSpec", "Distribution", "LoadedSweep", "Objective", "RandomSpec",
    "SweepRun", "SweepSpec", "check_key", "load_sweep", "run_for", "sweep_key",
]
