"""JobSpec and job-file loading with `file:line field: problem; fix` errors.

The models are orchestrator.core.schema models, not pydantic ones: `orch plan` starts in
half the time without pydantic (schema.py says why); their errors are pydantic's error
dicts, which `_describe` turns into words.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Annotated, Any, Literal

from orchestrator.core import userfiles, yamlpos
from orchestrator.core.architectures import (
    LINEAR_MODULES,
    Architecture,
    ArchitectureError,
    from_config_json,
    from_fields,
    lookup,
)
from orchestrator.core.datafiles import DatasetError, DatasetSize, check_eval_set, count_tokens
from orchestrator.core.schema import After, Before, Field, Model, ValidationError, submodel
from playbooks import images
from playbooks.hfrepo import repo_id_problem

# Pinned: CUDA/PyTorch must not drift between runs (pipeline-facts.md, "Training"); only tags
# that were published (playbooks/data/images.yaml, with its source).
DEFAULT_TRAINER_IMAGE = images.default_image("docker")

# Upper bounds on numbers, so that whatever a job file holds fits the database's 64-bit
# integers (micro-dollars, tokens) and the sizing arithmetic (docs/job-file.md). Each is far
# past any real job: a quadrillion tokens is ~30x the largest pretraining runs, and no
# model has a million-wide hidden layer.
MAX_TOKENS = 10**15
MAX_DOLLARS = 10**9
MAX_HOURS = 1_000_000
MAX_DIM = 1_048_576  # hidden, intermediate and head sizes
MAX_LAYERS = 10_000
MAX_HEADS = 65_536
MAX_VOCAB = 16_777_216
MAX_STEPS = 1_000_000  # gradient accumulation steps
# trainer.extra is passed to axolotl as YAML; its configs nest 2-3 levels.
MAX_EXTRA_DEPTH = 8


def to_decimal(value: Any) -> Any:
    # YAML floats become Decimal through their shortest repr, so 0.074 stays 0.074 exactly.
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float, str)):
        try:
            d = Decimal(str(value))
        except InvalidOperation:
            raise ValueError(f"must be a number of dollars (got {value!r})") from None
        if not d.is_finite():
            raise ValueError(f"must be a finite number of dollars (got {value!r})")
        return d
    return value


def _any_or_list(value: Any) -> Any:
    # `gpus: 4090` and `gpus: [3090, 4090]` are names too; YAML just typed them as numbers.
    if value == "any":
        return None
    if isinstance(value, str | int) and not isinstance(value, bool):
        return [str(value)]
    if isinstance(value, list):
        if not value:
            raise ValueError("must name at least one, or be any")
        return [str(v) if isinstance(v, int) and not isinstance(v, bool) else v for v in value]
    return value


Money = Annotated[Decimal, Before(to_decimal), Field(gt=0, le=MAX_DOLLARS)]
AnyOrList = Annotated[list[str] | None, Before(_any_or_list)]


class ArchitectureFields(Model):
    """A model shape given inline, as config.json names the fields."""

    hidden_size: int = Field(gt=0, le=MAX_DIM)
    num_hidden_layers: int = Field(gt=0, le=MAX_LAYERS)
    num_attention_heads: int = Field(gt=0, le=MAX_HEADS)
    num_key_value_heads: int | None = Field(default=None, gt=0, le=MAX_HEADS)
    intermediate_size: int = Field(gt=0, le=MAX_DIM)
    vocab_size: int = Field(gt=0, le=MAX_VOCAB)
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    head_dim: int | None = Field(default=None, gt=0, le=MAX_DIM)


class BaseModelRef(Model):
    """Which base model: a repo id, optionally with a revision and its shape."""

    repo: str = Field(min_length=1)
    revision: str = "main"
    config: str | None = None
    architecture: ArchitectureFields | None = None

    @classmethod
    def _prepare(cls, value: Any) -> Any:
        return {"repo": value} if isinstance(value, str) else value

    def _check(self) -> None:
        if self.config and self.architecture:
            raise ValueError("give either config or architecture, not both")


def _known_modules(value: list[str] | None) -> list[str] | None:
    if value is None:
        return None
    if not value:
        raise ValueError("must name at least one module, or be all-linear")
    for name in value:
        if name not in LINEAR_MODULES:
            close = _closest(name, LINEAR_MODULES, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(
                f"unknown module {name!r}{hint} (known: {', '.join(LINEAR_MODULES)}, "
                "or all-linear)"
            )
    return value


class LoraSpec(Model):
    r: int = Field(default=16, gt=0, le=1024)
    alpha: int = Field(default=32, gt=0, le=1_000_000)  # axolotl types lora_alpha as int
    dropout: float = Field(default=0.05, ge=0, lt=1)
    target: Annotated[list[str] | None, Before(lambda v: None if v == "all-linear" else v),
                      After(_known_modules)] = None

    @property
    def modules(self) -> tuple[str, ...]:
        """The adapted linear layers."""
        return LINEAR_MODULES if self.target is None else tuple(self.target)


Optimizer = Literal["auto", "adamw", "adamw_8bit", "paged_adamw_8bit"]


# "auto": the planner turns a memory saver on only when it reaches a cheaper placement
# (orchestrator/core/savers.py; docs/sizing.md "Memory savers").
def _auto_bool(value: Any) -> Any:
    # One clear message instead of pydantic's one per union member.
    if value == "auto" or isinstance(value, bool):
        return value
    raise ValueError(f"must be auto, true or false (got {value!r})")


AutoBool = Annotated[Literal["auto"] | bool, Before(_auto_bool)]


class TrainingSpec(Model):
    sequence_len: int = Field(default=2048, ge=16, le=1_048_576)
    micro_batch_size: int = Field(default=2, gt=0, le=4096)
    gradient_accumulation_steps: int = Field(default=4, gt=0, le=MAX_STEPS)
    epochs: float = Field(default=1, gt=0, le=1000)
    learning_rate: float = Field(default=2.0e-4, gt=0, lt=1)
    optimizer: Optimizer = "auto"
    gradient_checkpointing: AutoBool = "auto"
    packing: bool = True
    cross_entropy: Literal["auto", "plain", "cut", "liger"] = "auto"
    activation_offloading: AutoBool = "auto"


def _dataset_path(value: Any) -> Any:
    if isinstance(value, str):
        return {"local": value}
    return value


class DatasetPath(Model):
    """A local file (uploaded to the host) or a Hugging Face dataset."""

    local: str | None = None
    hf: str | None = None
    split: str = "train"

    def _check(self) -> None:
        if (self.local is None) == (self.hf is None):
            raise ValueError("must be a local file path or {hf: org/name}")


class DatasetSpec(Model):
    path: Annotated[DatasetPath, Before(_dataset_path)]
    format: Literal["alpaca", "chat_template"] = "alpaca"
    tokens: int | None = Field(default=None, gt=0, le=MAX_TOKENS)


class EvalSpec(Model):
    eval_set: str | None = None
    tasks: list[str] = Field(default_factory=list)


class ResourcesSpec(Model):
    spot: Literal["allowed", "required", "never"] = "allowed"
    gpus: AnyOrList = None
    max_gpus: int = Field(default=8, ge=1, le=8)
    gpu_count: int | None = Field(default=None, ge=1, le=8)  # exactly N GPUs per machine
    providers: AnyOrList = None
    # Registered monthly servers (`orch servers add`) the job may run on; naming any limits
    # the job to those servers.
    servers: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]] | None = (
        Field(default=None, min_length=1))
    max_price_per_hour: Money | None = None
    max_cost: Money | None = None
    deadline_hours: float | None = Field(default=None, gt=0, le=MAX_HOURS)
    headroom: float = Field(default=0.2, ge=0, le=1)

    def _check(self) -> None:
        if self.gpu_count is not None and self.gpu_count > self.max_gpus:
            raise ValueError(f"gpu_count {self.gpu_count} is above max_gpus {self.max_gpus}; "
                             "raise max_gpus or lower gpu_count")


def _pinned(value: str) -> str:
    tag = value.rsplit("/", 1)[-1].partition(":")[2]
    if not tag or tag in {"latest", "main-latest"}:
        raise ValueError(
            f"pin an image tag (got {value!r}); e.g. {DEFAULT_TRAINER_IMAGE!r}"
        )
    # A tag that was never published fails only on the rented machine, at `docker pull`
    # or at create: refuse it here, before anything is paid for.
    problem = images.problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


def _shallow(value: dict[str, Any]) -> dict[str, Any]:
    # The YAML reader bounds all nesting; this bounds specs built from JSON too (a
    # recorded spec), which the database and axolotl's YAML must serialize.
    if _depth(value) > MAX_EXTRA_DEPTH:
        raise ValueError(f"nested deeper than {MAX_EXTRA_DEPTH} levels; axolotl's "
                         "settings nest 2-3")
    return value


class TrainerSpec(Model):
    image: Annotated[str, After(_pinned)] = DEFAULT_TRAINER_IMAGE
    extra: Annotated[dict[str, Any], After(_shallow)] = Field(default_factory=dict)


def _depth(value: Any, limit: int = MAX_EXTRA_DEPTH + 1) -> int:
    """Nesting depth of lists and mappings, counted no further than `limit`."""
    if limit <= 0 or not isinstance(value, dict | list):
        return 0
    items = value.values() if isinstance(value, dict) else value
    return 1 + max((_depth(v, limit - 1) for v in items), default=0)


class JobSpec(Model):
    """A job file, validated. Only name, base_model, method and dataset are required."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    base_model: BaseModelRef
    method: Literal["qlora", "lora", "full"]
    lora: LoraSpec = Field(default_factory=LoraSpec)
    training: TrainingSpec = Field(default_factory=TrainingSpec)
    dataset: DatasetSpec
    eval: EvalSpec = Field(default_factory=EvalSpec)
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    trainer: TrainerSpec = Field(default_factory=TrainerSpec)


@dataclass(frozen=True)
class LoadedJob:
    """A validated job file with everything resolved that sizing needs."""

    spec: JobSpec
    path: Path
    architecture: Architecture
    dataset: DatasetSize

    @property
    def spec_hash(self) -> str:
        """Identity of the resolved job: sha256 of its canonical JSON."""
        return spec_hash(self.spec)


def _closest(word: str, choices: Any, n: int = 1, cutoff: float = 0.6) -> list[str]:
    """The `n` choices closest to a misspelt `word` (difflib's ratio of at least `cutoff`)."""
    import difflib  # only a typo needs it: kept off `orch plan`'s start-up path

    return difflib.get_close_matches(word, list(choices), n=n, cutoff=cutoff)


class SpecError(ValueError):
    """One or more problems in a job file, each as `file:line field: problem`."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def spec_hash(spec: JobSpec) -> str:
    """sha256 of the spec's canonical JSON (sorted keys, defaults filled in)."""
    canonical = json.dumps(spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


# --- error translation ---------------------------------------------------------------------

_TYPE_WORDS = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "float_type": "a number",
    "bool_type": "true or false",
    "string_type": "a string",
    "list_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "decimal_type": "a number",
}


def _model_at(loc: tuple[str | int, ...]) -> type[Model] | None:
    """The model class that validates the mapping at `loc`."""
    model: type[Model] = JobSpec
    for part in loc:
        if isinstance(part, int):
            return None
        field = model.model_fields.get(part)
        if field is None:
            return None
        sub = submodel(field.annotation)
        if sub is None:
            return None
        model = sub
    return model


def _user_loc(loc: tuple[str | int, ...]) -> tuple[str | int, ...]:
    # DatasetPath wraps a plain path string as {local: ...}; report it as `dataset.path`.
    if loc[:3] == ("dataset", "path", "local"):
        return loc[:2]
    return loc


# What a field accepts, for type errors on fields that take more than one shape.
_SHAPES: dict[tuple[str | int, ...], str] = {
    ("base_model",): "a repo id such as meta-llama/Llama-3.1-8B, or {repo: ORG/NAME, "
                     "config: path/to/config.json} or {repo: ..., architecture: {...}}",
    ("dataset", "path"): "a JSONL file path (relative to the job file)",
    ("lora", "target"): "all-linear or a list of module names such as [q_proj, v_proj]",
    ("resources", "gpus"): "any or a list of GPU models such as [RTX 4090, A100]",
    ("resources", "providers"): "any or a list of provider names",
}


def _describe(err: dict[str, Any]) -> str:
    kind = err["type"]
    ctx = err.get("ctx") or {}
    got = err.get("input")
    loc = _user_loc(tuple(err["loc"]))
    if kind in _TYPE_WORDS and loc in _SHAPES:
        return f"must be {_SHAPES[loc]} (got {got!r})"
    if kind == "finite_number":
        return f"must be a finite number (got {got!r})"
    if kind == "extra_forbidden":
        model = _model_at(loc[:-1])
        choices = list(model.model_fields) if model else []
        close = _closest(str(loc[-1]), choices, n=1, cutoff=0.6)
        if close:
            return f"unknown key; did you mean {close[0]!r}?"
        return f"unknown key; allowed here: {', '.join(choices)}" if choices else "unknown key"
    if kind == "missing":
        return "required; add it (see examples/ for a complete job file)"
    if kind in {"greater_than", "greater_than_equal", "less_than", "less_than_equal"}:
        op = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<",
              "less_than_equal": "<="}[kind]
        bound = next(iter(ctx.values()))
        if isinstance(bound, float) and bound.is_integer():
            bound = int(bound)
        return f"must be {op} {bound} (got {got!r})"
    if kind == "literal_error":
        expected = str(ctx.get("expected", "")).replace("'", "").replace(" or ", ", ")
        close = _closest(str(got), [e.strip() for e in expected.split(",")], n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return f"must be one of {expected} (got {got!r}){hint}"
    if kind == "string_pattern_mismatch":
        return (f"must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or "
                f"digit (got {got!r})")
    if kind == "string_too_short":
        return "must not be empty"
    if kind in _TYPE_WORDS:
        return f"must be {_TYPE_WORDS[kind]} (got {got!r})"
    if kind == "value_error":
        return str(ctx.get("error", err["msg"]))
    return str(err["msg"])


def _translate(exc: ValidationError, filename: str, pos: yamlpos.Positions) -> list[str]:
    out: list[tuple[int, str]] = []
    for err in exc.errors():
        loc = _user_loc(tuple(err["loc"]))
        line = pos.line(loc)
        where = yamlpos.dotted(loc) or "(top level)"
        out.append((line, f"{filename}:{line} {where}: {_describe(dict(err))}"))
    return [msg for _, msg in sorted(set(out))]


# --- loading --------------------------------------------------------------------------------


def read_mapping(path: Path, keys_hint: str) -> tuple[dict[str, Any], yamlpos.Positions]:
    """A YAML file's top-level mapping and its line positions; SpecError when it is not one.

    `keys_hint` completes "must be a mapping of keys such as ..." for the file's kind.
    """
    name = str(path)
    try:
        text = userfiles.read_text(path, userfiles.MAX_SPEC_BYTES, "job or sweep file")
    except FileNotFoundError:
        raise SpecError([f"{name}: file not found"]) from None
    except userfiles.UserFileError as exc:
        raise SpecError([f"{name}: {exc}"]) from None
    except OSError as exc:
        raise SpecError([f"{name}: cannot read ({exc.strerror or exc})"]) from None
    try:
        raw, pos = yamlpos.load(text, name)
    except yamlpos.YamlError as exc:
        raise SpecError([str(exc)]) from None
    if not isinstance(raw, dict):
        raise SpecError([f"{name}:1 (top level): must be a mapping of keys such as "
                         f"{keys_hint}"])
    return raw, pos


def load_job(path: str | Path) -> LoadedJob:
    """Read, validate and resolve a job file; raise SpecError listing every problem."""
    path = Path(path)
    name = str(path)
    raw, pos = read_mapping(path, "name, base_model, method, dataset")
    try:
        spec = JobSpec.model_validate(raw)
    except ValidationError as exc:
        raise SpecError(_translate(exc, name, pos)) from None
    return resolve(spec, path, pos)


def resolve(spec: JobSpec, path: Path, pos: yamlpos.Positions | None = None) -> LoadedJob:
    """Check what the schema cannot (files, model shape, GPU and provider names)."""
    found = _Problems(str(path), pos or yamlpos.Positions())
    arch = _architecture(spec, path.parent, found)
    if spec.method == "full" and "lora" in spec.model_fields_set:
        found.add(("lora",), "only used by method qlora or lora; remove it for a full fine-tune")
    dataset = _dataset(spec, path.parent, found)
    if dataset is not None and dataset.tokens * spec.training.epochs > MAX_TOKENS:
        found.add(("training", "epochs"), f"{dataset.tokens:,} tokens x "
                  f"{spec.training.epochs:g} epochs is more than {MAX_TOKENS:,} tokens; "
                  "train fewer epochs or tokens")
    if spec.eval.eval_set is not None:
        eval_file = path.parent / spec.eval.eval_set
        if not eval_file.exists():
            found.add(("eval", "eval_set"), f"file not found: {eval_file}; give a JSONL file "
                      "of {prompt, expected} rows (relative to the job file)")
        else:
            found.extend(("eval", "eval_set"), check_eval_set(eval_file))
    _names(spec, found)
    if found.items or arch is None or dataset is None:
        # By line, keeping the file's own order within a line (dataset rows, say).
        ordered = sorted(dict.fromkeys(found.items), key=lambda p: p[0])
        raise SpecError([m for _, m in ordered])
    return LoadedJob(spec=spec, path=path, architecture=arch, dataset=dataset)


class _Problems:
    """Problems found in one job file, each with the line of the field it is about."""

    def __init__(self, name: str, pos: yamlpos.Positions) -> None:
        self.name, self.pos = name, pos
        self.items: list[tuple[int, str]] = []

    def add(self, loc: tuple[str | int, ...], msg: str) -> None:
        line = self.pos.line(loc)
        self.items.append((line, f"{self.name}:{line} {yamlpos.dotted(loc)}: {msg}"))

    def extend(self, loc: tuple[str | int, ...], messages: list[str]) -> None:
        """Messages that already name their file and line (a data file's rows)."""
        self.items.extend((self.pos.line(loc), m) for m in messages)


def _architecture(spec: JobSpec, base: Path, found: _Problems) -> Architecture | None:
    """The base model's shape: given, from a config.json, or from the known models."""
    ref = spec.base_model
    loc: tuple[str | int, ...] = ("base_model",)
    # Every repo id the job names reaches `hf download` on a rented host: check it by the
    # Hub's own rules here, before anything is paid for.
    bad_repo = repo_id_problem(ref.repo)
    try:
        if bad_repo is not None:
            found.add(("base_model", "repo"), bad_repo + " (e.g. meta-llama/Llama-3.1-8B)")
        elif ref.architecture is not None:
            loc = ("base_model", "architecture")
            return from_fields(ref.architecture.model_dump(exclude_none=True))
        elif ref.config is not None:
            loc = ("base_model", "config")
            return from_config_json(base / ref.config)
        else:
            return lookup(ref.repo).architecture
    except ArchitectureError as exc:
        found.add(loc, str(exc))
    return None


def _dataset(spec: JobSpec, base: Path, found: _Problems) -> DatasetSize | None:
    """The training file's size, after checking its rows; Hub datasets are refused."""
    if spec.dataset.path.local is None:
        # Refused before renting: the host pipeline uploads a local JSONL file only, and
        # a dataset repo's files, gate and format cannot be checked from here.
        hf = spec.dataset.path.hf or ""
        bad = repo_id_problem(hf)
        found.add(("dataset", "path", "hf"), (f"{bad}; " if bad else "") + "Hugging Face "
                  "datasets are not downloaded by orch: download it with `hf download "
                  f"--repo-type dataset {'ORG/NAME' if bad else hf} "
                  "--local-dir data/NAME`, then give the JSONL file's path in dataset.path "
                  "(relative to the job file)")
        return None
    data_file = base / spec.dataset.path.local
    if data_file.is_dir() or not data_file.exists():
        what = "is a directory, not a file" if data_file.is_dir() else "file not found"
        found.add(("dataset", "path"), f"{what}: {data_file}; give the JSONL file's path "
                  "(relative to the job file)")
        return None
    try:
        return count_tokens(data_file, spec.dataset.format, spec.dataset.tokens)
    except DatasetError as exc:
        found.extend(("dataset", "path"), exc.problems)
    return None


def _names(spec: JobSpec, found: _Problems) -> None:
    """trainer.extra keys orch sets itself, and unknown GPU and provider names."""
    from playbooks.axolotl import extra_clash
    from providers import catalog  # data only; kept here so the schema stays import-light

    for key in spec.trainer.extra:
        why = extra_clash(key)
        if why:
            found.add(("trainer", "extra", key), why)
    for i, gpu in enumerate(spec.resources.gpus or []):
        if not catalog.resolve_gpu(gpu):
            known = list(catalog.gpus())
            close = _closest(gpu, known, n=1, cutoff=0.5)
            hint = f"did you mean {close[0]!r}? " if close else ""
            found.add(("resources", "gpus", i), f"unknown GPU {gpu!r}; {hint}known: "
                      f"{', '.join(known)}")
    providers = catalog.provider_names()
    for i, prov in enumerate(spec.resources.providers or []):
        if prov not in providers:
            close = _closest(prov, providers, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            found.add(("resources", "providers", i), f"unknown provider {prov!r}; {hint}"
                      f"known: {', '.join(providers)}")
