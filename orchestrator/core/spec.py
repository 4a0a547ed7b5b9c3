"""JobSpec (pydantic v2) and job-file loading with `file:line field: problem; fix` errors.

What each key means lives on its field (`Field(description=..., examples=[...])`):
docs/job-file.md and `orch schema job` (JSON Schema, for editors) are generated from it.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    model_validator,
)

from orchestrator.core import userfiles, yamlpos
from orchestrator.core.architectures import (
    LINEAR_MODULES,
    Architecture,
    ArchitectureError,
    from_config_json,
    from_fields,
    lookup,
)
from orchestrator.core.datafiles import DatasetSize
from orchestrator.core.datasetspec import MAX_TOKENS, DatasetArg, DatasetSpec
from orchestrator.core.durations import WarmWindow
from orchestrator.core.hubsize import HubDatasetRef, HubSizer, Recording
from orchestrator.core.notifyspec import Targets
from orchestrator.core.outputspec import OutputSpec, output_problems
from orchestrator.core.sizing import LayoutName, pin_problem
from orchestrator.core.specerrors import Problems, closest, translate, with_missing
from orchestrator.core.specfiles import check_eval, datasets_size, raw_file_problems
from orchestrator.core.specidentity import spec_hash
from orchestrator.core.specnames import check_names, with_name_problems
from orchestrator.core.strictmodel import Strict
from orchestrator.core.trackingspec import TrackingSpec
from playbooks import images
from playbooks.hfrepo import repo_id_problem

# Pinned: CUDA/PyTorch must not drift between runs (pipeline-facts.md, "Training"); only tags
# that were published (playbooks/data/images.yaml, with its source).
DEFAULT_TRAINER_IMAGE = images.default_image("docker")

# Upper bounds on numbers, so that whatever a job file holds fits the database's 64-bit
# integers (micro-dollars, tokens) and the sizing arithmetic (docs/job-file.md). Each is far
# past any real job: a quadrillion tokens (MAX_TOKENS, datasetspec.py) is ~30x the largest
# pretraining runs, and no model has a million-wide hidden layer.
MAX_DOLLARS = 10**9
MAX_HOURS = 1_000_000
MAX_DIM = 1_048_576  # hidden, intermediate and head sizes
MAX_LAYERS = 10_000
MAX_HEADS = 65_536
MAX_VOCAB = 16_777_216
MAX_STEPS = 1_000_000  # gradient accumulation steps
# trainer.extra is passed to axolotl as YAML; its configs nest 2-3 levels.
MAX_EXTRA_DEPTH = 8
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


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


# json_schema_input_type: what a file may write (editors validate against the JSON Schema),
# where a validator accepts more than the stored type.
Money = Annotated[Decimal, BeforeValidator(to_decimal, json_schema_input_type=float | str),
                  Field(gt=0, le=MAX_DOLLARS)]
AnyOrList = Annotated[list[str] | None, BeforeValidator(
    _any_or_list, json_schema_input_type=Literal["any"] | str | int | list[str | int])]


class ArchitectureFields(Strict):
    """A model shape given inline, as config.json names the fields."""

    hidden_size: int = Field(gt=0, le=MAX_DIM, description="Width of the residual stream.",
                             examples=[4096])
    num_hidden_layers: int = Field(gt=0, le=MAX_LAYERS, description="Transformer blocks.",
                                   examples=[32])
    num_attention_heads: int = Field(gt=0, le=MAX_HEADS, description="Query heads.",
                                     examples=[32])
    num_key_value_heads: int | None = Field(
        default=None, gt=0, le=MAX_HEADS, examples=[8],
        description="Key/value heads (grouped-query attention); null means as many as query "
                    "heads.")
    intermediate_size: int = Field(gt=0, le=MAX_DIM, description="MLP width.",
                                   examples=[14336])
    vocab_size: int = Field(gt=0, le=MAX_VOCAB, description="Tokenizer vocabulary.",
                            examples=[128256])
    tie_word_embeddings: bool = Field(
        default=False, description="Input and output embeddings share one matrix.",
        examples=[False])
    qkv_bias: bool = Field(default=False, description="Biases on q/k/v projections (Qwen2).",
                           examples=[False])
    head_dim: int | None = Field(
        default=None, gt=0, le=MAX_DIM, examples=[128],
        description="Per-head width when it is not hidden_size / num_attention_heads.")


class BaseModelRef(Strict):
    """Which base model: a repo id, optionally with a revision and its shape."""

    repo: str = Field(min_length=1, examples=["meta-llama/Llama-3.1-8B"],
                      description="Hugging Face repo id. Gated repos (Llama) need `HF_TOKEN` "
                                  "in the environment of the orch process that runs the job.")
    revision: str = Field(default="main", description="Branch, tag or commit to download.",
                          examples=["main"])
    config: str | None = Field(
        default=None, examples=["models/my-model/config.json"],
        description="A local copy of the model's `config.json` (relative to the job file), "
                    "read for its shape; not with `architecture`.")
    architecture: ArchitectureFields | None = Field(
        default=None, examples=[{"hidden_size": 4096}],
        description="The model's shape, as its `config.json` names the fields; not with "
                    "`config`.")

    @model_validator(mode="after")
    def _one_shape(self) -> BaseModelRef:
        if self.config and self.architecture:
            raise ValueError("give either config or architecture, not both")
        return self


def _repo_string(value: Any) -> Any:
    return {"repo": value} if isinstance(value, str) else value


def _known_modules(value: list[str] | None) -> list[str] | None:
    if value is None:
        return None
    if not value:
        raise ValueError("must name at least one module, or be all-linear")
    for name in value:
        if name not in LINEAR_MODULES:
            close = closest(name, LINEAR_MODULES, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(
                f"unknown module {name!r}{hint} (known: {', '.join(LINEAR_MODULES)}, "
                "or all-linear)"
            )
    return value


class LoraSpec(Strict):
    r: int = Field(default=16, gt=0, le=1024, description="Adapter rank.", examples=[16])
    # axolotl types lora_alpha as int
    alpha: int = Field(default=32, gt=0, le=1_000_000, examples=[32],
                       description="Adapter scaling (alpha / r multiplies the update).")
    dropout: float = Field(default=0.05, ge=0, lt=1, description="Dropout on the adapter input.",
                           examples=[0.05])
    target: Annotated[list[str] | None, BeforeValidator(
        lambda v: None if v == "all-linear" else v,
        json_schema_input_type=Literal["all-linear"] | list[str]),
        AfterValidator(_known_modules)] = Field(
        default=None, examples=[["q_proj", "v_proj"]],
        description="Which linear layers get adapters: `all-linear` or a list of "
                    f"{', '.join(LINEAR_MODULES)}.")

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


AutoBool = Annotated[Literal["auto"] | bool, BeforeValidator(_auto_bool)]


class TrainingSpec(Strict):
    sequence_len: int = Field(default=2048, ge=16, le=1_048_576, examples=[2048],
                              description="Tokens per training sequence.")
    micro_batch_size: int = Field(default=2, gt=0, le=4096, examples=[2],
                                  description="Sequences per GPU per step.")
    gradient_accumulation_steps: int = Field(default=4, gt=0, le=MAX_STEPS, examples=[4],
                                             description="Micro-batches per optimizer step.")
    epochs: float = Field(default=1, gt=0, le=1000, examples=[1],
                          description="Passes over the dataset (fractions allowed).")
    learning_rate: float = Field(default=2.0e-4, gt=0, lt=1, description="Peak learning rate.",
                                 examples=[2.0e-4])
    optimizer: Optimizer = Field(
        default="auto", examples=["adamw_8bit"],
        description="Optimizer; the 8-bit ones keep less state in GPU memory. `auto`: the "
                    "planner picks the one that reaches the cheapest placement.")
    gradient_checkpointing: AutoBool = Field(
        default="auto", examples=[True],
        description="Recompute activations to save memory (`auto`: on only when it reaches a "
                    "cheaper placement; its slowdown is counted).")
    packing: bool = Field(default=True, description="Pack short samples into full sequences.",
                          examples=[True])
    cross_entropy: Literal["auto", "plain", "cut", "liger"] = Field(
        default="auto", examples=["auto"],
        description="The loss kernel: `plain` materialises fp32 logits; `cut` (axolotl's Cut "
                    "Cross Entropy plugin) and `liger` (Liger's fused linear cross-entropy) "
                    "never do. `auto`: the planner picks; docs/sizing.md has the sizes.")
    activation_offloading: AutoBool = Field(
        default="auto", examples=["auto"],
        description="Offload activations to host RAM (needs gradient checkpointing; slower). "
                    "`auto`: on only when it reaches a cheaper placement.")
    val_set_size: float | None = Field(
        default=None, gt=0, lt=1, examples=[0.05],
        description="Hold out this fraction of the training data and report its loss during "
                    "training (axolotl's `val_set_size`); not with a dataset's "
                    "`validation_split`.")
    stop_on_nan: bool = Field(
        default=True, examples=[True],
        description="Stop the job, as failed with nothing delivered (a trial of a sweep "
                    "with `early_stop`: pruned), once the training loss was `nan` at 3 logged "
                    "steps in a row: a diverged run's weights are NaN and every further step "
                    "is paid for nothing (docs/schema.md, `train.not_finite`). `false`: train "
                    "on, only saying so.")


class EvalSpec(Strict):
    eval_set: str | None = Field(
        default=None, examples=["data/eval.jsonl"],
        description="A JSONL file of `{prompt, expected}` rows scored after training (exact "
                    "match, contains).")
    # A plain default (pydantic copies it for each model): `default_factory=list` had pydantic
    # inspect the builtin's signature, which compiles tokenize's regex (~1% of `orch plan`).
    tasks: list[str] = Field(default=[], examples=[["hellaswag"]],
                             description="lm-eval task names to run after training.")


ServerName = Annotated[str, Field(pattern=NAME_PATTERN)]


class ResourcesSpec(Strict):
    spot: Literal["allowed", "required", "never"] = Field(
        default="allowed", examples=["allowed"],
        description="Interruptible (spot) machines: `allowed`, `required` or `never`.")
    gpus: AnyOrList = Field(
        default=None, examples=[["RTX 4090", "A100"]],
        description="`any`, or the GPU models allowed: the catalog's names or a family "
                    "(RTX 4090, A100; H100 = H100 SXM and H100 PCIe). `orch servers add "
                    "--gpu` takes one exact model.")
    max_gpus: int = Field(default=8, ge=1, le=8, description="Most GPUs on one machine.",
                          examples=[8])
    gpu_count: int | None = Field(
        default=None, ge=1, le=8, examples=[2],
        description="Exactly this many GPUs on one machine (a layout you need); at most "
                    "`max_gpus`.")
    providers: AnyOrList = Field(
        default=None, examples=[["vastai", "runpod"]],
        description="`any`, or the providers allowed: vastai, runpod, dedicated, sim (and the "
                    "price catalogs cloud, dedicated-host for planning).")
    # Registered monthly servers (`orch servers add`) the job may run on; naming any limits
    # the job to those servers.
    servers: list[ServerName] | None = Field(
        default=None, min_length=1, examples=[["box1"]],
        description="Only these registered servers (`orch servers list`) may run it.")
    max_price_per_hour: Money | None = Field(default=None, examples=[2.50],
                                             description="Most USD per machine-hour.")
    max_cost: Money | None = Field(default=None, description=(
        "Most USD for the whole job: the plan's placement must be estimated under it, and "
        "when the job's machines together have billed it (a preemption's second included), "
        "the one running is stopped and released, the job fails and nothing more is rented "
        "(a hard cap: leave headroom over `orch plan`'s estimate; `notify` gets "
        "`job.budget_reached`); it keeps what is home: the trained model when the cap stops "
        "its evaluation, else the newest checkpoint orch had copied off the machine (those "
        "up to 2 GiB: LoRA and QLoRA adapters), in the job's artifacts directory, from which "
        "`orch submit job.yml --resume-from JOB` continues with a higher max_cost, planning "
        "and paying for the rest only. A registered server's rent does not count."),
                                   examples=[20])
    deadline_hours: float | None = Field(
        default=None, gt=0, le=MAX_HOURS, examples=[12],
        description="Finish within this many hours (estimated).")
    headroom: float = Field(default=0.2, ge=0, le=1, examples=[0.2],
                            description="Fraction added to the peak memory estimate.")
    layout: LayoutName = Field(default="auto", examples=["fsdp2"], description=(
        "How the GPUs are used: `auto` (the planner picks), or pin `single`, `ddp`, `zero3`, "
        "`zero3_offload` (DeepSpeed ZeRO-3), `fsdp2`, `fsdp2_offload` (PyTorch FSDP2)."))
    keep_warm: WarmWindow = Field(default=0, examples=["15m"], description=(
        "After the job succeeds on a per-second rental, keep the machine idle this long "
        "(`90s`, `15m`, `1h`; at most `24h`) so the next queued job that fits it runs there "
        "with the image and base model already on it, when that is cheaper than a fresh "
        "machine. The idle time is billed to no job but recorded (`orch cost`); 0 (the "
        "default) terminates at once. See docs/warm.md."))

    @model_validator(mode="after")
    def _count_within_max(self) -> ResourcesSpec:
        if self.gpu_count is not None and self.gpu_count > self.max_gpus:
            raise ValueError(f"gpu_count {self.gpu_count} is above max_gpus {self.max_gpus}; "
                             "raise max_gpus or lower gpu_count")
        if problem := pin_problem(self.layout, self.gpu_count, self.max_gpus, "auto"):
            raise ValueError(problem)
        return self


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


class TrainerSpec(Strict):
    image: Annotated[str, AfterValidator(_pinned)] = Field(
        default=DEFAULT_TRAINER_IMAGE, examples=[DEFAULT_TRAINER_IMAGE],
        description="The axolotl image; pin a tag (`latest` is refused).")
    extra: Annotated[dict[str, Any], AfterValidator(_shallow)] = Field(
        default_factory=dict, examples=[{"warmup_steps": 10}],
        description="Raw axolotl config keys merged into the generated config.")


def _depth(value: Any, limit: int = MAX_EXTRA_DEPTH + 1) -> int:
    """Nesting depth of lists and mappings, counted no further than `limit`."""
    if limit <= 0 or not isinstance(value, dict | list):
        return 0
    items = value.values() if isinstance(value, dict) else value
    return 1 + max((_depth(v, limit - 1) for v in items), default=0)


class JobSpec(Strict):
    """A job file, validated. Only name, base_model, method and dataset are required."""

    model_config = ConfigDict(title="orch job file")

    name: str = Field(pattern=NAME_PATTERN, examples=["llama31-8b-alpaca-qlora"],
                      description="The job's name: letters, digits, `.`, `_`, `-`; shown by "
                                  "`orch jobs`.")
    base_model: Annotated[BaseModelRef, BeforeValidator(
        _repo_string, json_schema_input_type=str | BaseModelRef)] = Field(
        examples=["meta-llama/Llama-3.1-8B"],
        description="The model to fine-tune: a known repo id (`orch models`), or a mapping "
                    "with its shape for any other model.")
    method: Literal["qlora", "lora", "full"] = Field(
        examples=["qlora"],
        description="`qlora` (4-bit base + adapters), `lora` (16-bit base + adapters) or "
                    "`full` (every weight trained).")
    lora: LoraSpec = Field(default_factory=LoraSpec, examples=[{"r": 16, "alpha": 32}],
                           description="The adapters (ignored by `full`).")
    training: TrainingSpec = Field(default_factory=TrainingSpec, examples=[{"epochs": 2}],
                                   description="Trainer settings (passed to axolotl).")
    # Required unless `datasets` is given: then it is the first of them (`_one_dataset_form`),
    # so code that knows one dataset still reads `spec.dataset`.
    dataset: DatasetArg = Field(  # type: ignore[assignment]
        default=None, validate_default=False, examples=[{"path": "data/train.jsonl"}],
        description="The training data (required, unless `datasets` lists several).")
    datasets: list[DatasetArg] | None = Field(
        default=None, min_length=1,
        examples=[[{"path": "tatsu-lab/alpaca"}, {"path": "data/mine.jsonl"}]],
        description="Several training datasets, mixed (each as `dataset`); instead of "
                    "`dataset`.")
    eval: EvalSpec = Field(default_factory=EvalSpec, examples=[{"eval_set": "data/eval.jsonl"}],
                           description="What to score after training (optional).")
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec,
                                     examples=[{"spot": "allowed"}],
                                     description="Where it may run and what it may cost.")
    trainer: TrainerSpec = Field(default_factory=TrainerSpec,
                                 examples=[{"image": DEFAULT_TRAINER_IMAGE}],
                                 description="The training container.")
    output: OutputSpec = Field(default_factory=OutputSpec,
                               examples=[{"merged": True, "push_to_hub": "my-org/my-model"}],
                               description="What the job delivers and where: the adapter "
                                           "(always), the merged model, this machine, a "
                                           "Hugging Face repo.")
    tracking: TrackingSpec | None = Field(
        default=None, examples=[{"wandb": {"project": "llama-finetunes"}}],
        description="Where the training run is logged: W&B and/or MLflow (the run is named "
                    "after the job).")
    notify: Targets = Field(
        default=[], examples=[{"url_env": "SLACK_WEBHOOK_URL", "format": "slack"}],
        description="Webhooks POSTed when the job succeeds, fails, is preempted and "
                    "re-placed, or reaches its budget: one mapping or a list.")

    @model_validator(mode="wrap")
    @classmethod
    def _one_dataset_form(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> JobSpec:
        # `dataset` is required unless `datasets` is given: reported with the file's other
        # problems (an after-validator would run only once everything else is valid).
        missing = isinstance(data, dict) and "dataset" not in data and "datasets" not in data
        try:
            spec: JobSpec = handler(data)
        except ValidationError as exc:
            if not missing:
                raise
            raise with_missing(exc, data, "dataset") from None
        if missing:
            raise with_missing(None, data, "dataset")
        if spec.datasets is not None:
            if spec.dataset is None:
                object.__setattr__(spec, "dataset", spec.datasets[0])
            elif spec.dataset != spec.datasets[0]:
                raise ValueError("give dataset (one) or datasets (several), not both")
        if spec.training.val_set_size and any(d.validation_split for d in spec.all_datasets):
            raise ValueError("training.val_set_size and a dataset's validation_split both "
                             "pick an eval set (axolotl takes one): remove one")
        return spec

    @property
    def all_datasets(self) -> list[DatasetSpec]:
        """The training datasets: `datasets`, or the one `dataset`."""
        return list(self.datasets) if self.datasets is not None else [self.dataset]


class LoadedJob(NamedTuple):
    """A validated job file with everything resolved that sizing needs."""

    spec: JobSpec
    path: Path
    architecture: Architecture
    dataset: DatasetSize
    # The Hub's published sizes the estimate used (recorded at submit, so a worker sizes the
    # job again without asking the Hub: `engine/jobinputs.load_inputs`).
    hub_sizes: tuple[tuple[HubDatasetRef, DatasetSize], ...] = ()
    # The share of training a checkpoint it resumes from has done already (`orch submit
    # --resume-from`): sizing plans the rest only (`planning.total_tokens`).
    done: float = 0.0

    @property
    def spec_hash(self) -> str:
        """Identity of the resolved job: sha256 of its canonical JSON."""
        return spec_hash(self.spec)


class SpecError(ValueError):
    """One or more problems in a job file, each as `file:line field: problem`."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


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


def load_job(path: str | Path, hub_size: HubSizer | None = None) -> LoadedJob:
    """Read, validate and resolve a job file; raise SpecError listing every problem.

    `hub_size` looks up a Hub dataset's published size (the engine's); without it a Hub
    dataset needs `tokens:`."""
    path = Path(path)
    name = str(path)
    raw, pos = read_mapping(path, "name, base_model, method, dataset")
    try:
        spec = JobSpec.model_validate(raw)
    except ValidationError as exc:
        # With the schema's errors, the name and file checks that need no valid spec, so
        # that a file with problems in several places hears of all of them at once (README).
        files = Problems(name, pos)
        raw_file_problems(raw, path.parent, files)
        raise SpecError(with_name_problems(translate(exc, JobSpec, name, pos), raw, name,
                                            pos, files.items)) from None
    return resolve(spec, path, pos, hub_size)


def resolve(spec: JobSpec, path: Path, pos: yamlpos.Positions | None = None,
            hub_size: HubSizer | None = None) -> LoadedJob:
    """Check what the schema cannot (files, model shape, GPU and provider names)."""
    found = Problems(str(path), pos or yamlpos.Positions())
    arch = _architecture(spec, path.parent, found)
    if spec.method == "full" and "lora" in spec.model_fields_set:
        found.add(("lora",), "only used by method qlora or lora; remove it for a full fine-tune")
    for loc, msg in output_problems(spec.output, spec.method,
                                    None if arch is None else arch.params):
        found.add(loc, msg)
    recording = None if hub_size is None else Recording(hub_size)
    dataset = _dataset(spec, path.parent, found, recording)
    if dataset is not None and dataset.tokens * spec.training.epochs > MAX_TOKENS:
        found.add(("training", "epochs"), f"{dataset.tokens:,} tokens x "
                  f"{spec.training.epochs:g} epochs is more than {MAX_TOKENS:,} tokens; "
                  "train fewer epochs or tokens")
    if spec.eval.eval_set is not None:
        check_eval(spec.eval.eval_set, path.parent, found)
    check_names(spec.trainer.extra, list(spec.resources.gpus or []),
                list(spec.resources.providers or []), found)
    if found.items or arch is None or dataset is None:
        # By line, keeping the file's own order within a line (dataset rows, say).
        ordered = sorted(dict.fromkeys(found.items), key=lambda p: p[0])
        raise SpecError([m for _, m in ordered])
    return LoadedJob(spec=spec, path=path, architecture=arch, dataset=dataset,
                     hub_sizes=() if recording is None else tuple(recording.sized.items()))


def _architecture(spec: JobSpec, base: Path, found: Problems) -> Architecture | None:
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


def _dataset(spec: JobSpec, base: Path, found: Problems,
             hub_size: HubSizer | None) -> DatasetSize | None:
    """The training data's size in tokens (all datasets, less the held-out fraction)."""
    places: list[tuple[str | int, ...]] = [("dataset",)] if spec.datasets is None else [
        ("datasets", i) for i in range(len(spec.datasets))]
    return datasets_size(list(zip(places, spec.all_datasets, strict=True)),
                         spec.training.val_set_size, base, found, hub_size)
