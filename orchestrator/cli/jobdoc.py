"""Generate docs/job-file.md from the file models, so the reference cannot drift.

Keys, types, defaults and limits are read from JobSpec/SweepSpec; the words (what a key
means, an example) live in ABOUT below, keyed by the dotted key, and a test fails when a
model key has no entry or the committed file differs from what this prints:

    python -m orchestrator.cli.jobdoc > docs/job-file.md
"""

from __future__ import annotations

import types
import typing
from decimal import Decimal
from typing import Any, Literal, Union

from orchestrator.core.architectures import LINEAR_MODULES, known_models
from orchestrator.core.schema import FieldInfo, Model, submodel
from orchestrator.core.spec import _SHAPES, DEFAULT_TRAINER_IMAGE, ArchitectureFields, JobSpec
from orchestrator.records.sweeps import Distribution, SweepSpec

# dotted key -> (what it means, example value as YAML). "job." keys are the job file's,
# "sweep." the sweep file's, "dist." a random distribution's.
ABOUT: dict[str, tuple[str, str]] = {
    "job.name": ("The job's name: letters, digits, `.`, `_`, `-`; shown by `orch jobs`.",
                 "llama31-8b-alpaca-qlora"),
    "job.base_model": ("The model to fine-tune: a known repo id (`orch models`), or a mapping "
                       "with its shape for any other model.", "meta-llama/Llama-3.1-8B"),
    "job.method": ("`qlora` (4-bit base + adapters), `lora` (16-bit base + adapters) or "
                   "`full` (every weight trained).", "qlora"),
    "job.lora": ("The adapters (ignored by `full`).", "{r: 16, alpha: 32}"),
    "job.training": ("Trainer settings (passed to axolotl).", "{epochs: 2}"),
    "job.dataset": ("The training data.", "{path: data/train.jsonl}"),
    "job.eval": ("What to score after training (optional).",
                 "{eval_set: data/eval.jsonl}"),
    "job.resources": ("Where it may run and what it may cost.", "{spot: allowed}"),
    "job.trainer": ("The training container.", f"{{image: {DEFAULT_TRAINER_IMAGE}}}"),
    "job.base_model.repo": ("Hugging Face repo id. Gated repos (Llama) need `HF_TOKEN` in the "
                            "environment of the orch process that runs the job.",
                            "meta-llama/Llama-3.1-8B"),
    "job.base_model.revision": ("Branch, tag or commit to download.", "main"),
    "job.base_model.config": ("A local copy of the model's `config.json` (relative to the job "
                              "file), read for its shape; not with `architecture`.",
                              "models/my-model/config.json"),
    "job.base_model.architecture": ("The model's shape, as its `config.json` names the fields; "
                                    "not with `config`.", "{hidden_size: 4096, ...}"),
    "job.base_model.architecture.hidden_size": ("Width of the residual stream.", "4096"),
    "job.base_model.architecture.num_hidden_layers": ("Transformer blocks.", "32"),
    "job.base_model.architecture.num_attention_heads": ("Query heads.", "32"),
    "job.base_model.architecture.num_key_value_heads": (
        "Key/value heads (grouped-query attention); null means as many as query heads.", "8"),
    "job.base_model.architecture.intermediate_size": ("MLP width.", "14336"),
    "job.base_model.architecture.vocab_size": ("Tokenizer vocabulary.", "128256"),
    "job.base_model.architecture.tie_word_embeddings": (
        "Input and output embeddings share one matrix.", "false"),
    "job.base_model.architecture.qkv_bias": ("Biases on q/k/v projections (Qwen2).", "false"),
    "job.base_model.architecture.head_dim": (
        "Per-head width when it is not hidden_size / num_attention_heads.", "128"),
    "job.lora.r": ("Adapter rank.", "16"),
    "job.lora.alpha": ("Adapter scaling (alpha / r multiplies the update).", "32"),
    "job.lora.dropout": ("Dropout on the adapter input.", "0.05"),
    "job.lora.target": ("Which linear layers get adapters: `all-linear` or a list of "
                        f"{', '.join(LINEAR_MODULES)}.", "[q_proj, v_proj]"),
    "job.training.sequence_len": ("Tokens per training sequence.", "2048"),
    "job.training.micro_batch_size": ("Sequences per GPU per step.", "2"),
    "job.training.gradient_accumulation_steps": ("Micro-batches per optimizer step.", "4"),
    "job.training.epochs": ("Passes over the dataset (fractions allowed).", "1"),
    "job.training.learning_rate": ("Peak learning rate.", "2.0e-4"),
    "job.training.optimizer": ("Optimizer; the 8-bit ones keep less state in GPU memory. "
                               "`auto`: the planner picks the one that reaches the cheapest "
                               "placement.", "adamw_8bit"),
    "job.training.gradient_checkpointing": ("Recompute activations to save memory (`auto`: "
                                            "on only when it reaches a cheaper placement; "
                                            "its slowdown is counted).", "true"),
    "job.training.cross_entropy": ("The loss kernel: `plain` materialises fp32 logits; `cut` "
                                   "(axolotl's Cut Cross Entropy plugin) and `liger` (Liger's "
                                   "fused linear cross-entropy) never do. `auto`: the planner "
                                   "picks; docs/sizing.md has the sizes.", "auto"),
    "job.training.activation_offloading": ("Offload activations to host RAM (needs gradient "
                                           "checkpointing; slower). `auto`: on only when it "
                                           "reaches a cheaper placement.", "auto"),
    "job.training.packing": ("Pack short samples into full sequences.", "true"),
    "job.dataset.path": ("A local JSONL file (relative to the job file; uploaded to the host). "
                         "A Hugging Face dataset is not downloaded by orch: fetch it with "
                         "`hf download --repo-type dataset ORG/NAME --local-dir data/NAME` "
                         "and give the file.", "data/train.jsonl"),
    "job.dataset.path.local": ("The JSONL file (what a plain string path means).",
                               "data/train.jsonl"),
    "job.dataset.path.hf": ("Refused (see `path`): a Hugging Face dataset id is named in the "
                            "error's fix.", "tatsu-lab/alpaca"),
    "job.dataset.path.split": ("Only with `hf` (refused).", "train"),
    "job.dataset.format": ("`alpaca` rows (instruction/input/output) or `chat_template` rows "
                           "(messages).", "alpaca"),
    "job.dataset.tokens": ("Tokens in one epoch. Optional: estimated from the file's "
                           "characters when not given.", "6000000"),
    "job.eval.eval_set": ("A JSONL file of `{prompt, expected}` rows scored after training "
                          "(exact match, contains).", "data/eval.jsonl"),
    "job.eval.tasks": ("lm-eval task names to run after training.", "[hellaswag]"),
    "job.resources.spot": ("Interruptible (spot) machines: `allowed`, `required` or "
                           "`never`.", "allowed"),
    "job.resources.gpus": ("`any`, or the GPU models allowed (`orch servers add --gpu` "
                           "spellings, e.g. RTX 4090, A100, H100).", "[RTX 4090, A100]"),
    "job.resources.max_gpus": ("Most GPUs on one machine.", "8"),
    "job.resources.gpu_count": ("Exactly this many GPUs on one machine (a layout you need); "
                                "at most `max_gpus`.", "2"),
    "job.resources.servers": ("Only these registered servers (`orch servers list`) may run "
                              "it.", "[box1]"),
    "job.resources.providers": ("`any`, or the providers allowed: vastai, runpod, dedicated, "
                                "sim (and the price catalogs cloud, dedicated-host for "
                                "planning).", "[vastai, runpod]"),
    "job.resources.max_price_per_hour": ("Most USD per machine-hour.", "2.50"),
    "job.resources.max_cost": ("Most USD for the whole job.", "20"),
    "job.resources.deadline_hours": ("Finish within this many hours (estimated).", "12"),
    "job.resources.headroom": ("Fraction added to the peak memory estimate.", "0.2"),
    "job.trainer.image": ("The axolotl image; pin a tag (`latest` is refused).",
                          DEFAULT_TRAINER_IMAGE),
    "job.trainer.extra": ("Raw axolotl config keys merged into the generated config.",
                          "{warmup_steps: 10}"),
    "sweep.name": ("The sweep's name; runs are named NAME-000, NAME-001, ...", "lr-sweep-8b"),
    "sweep.base": ("The job file every run starts from, relative to the sweep file.",
                   "qlora-8b.yml"),
    "sweep.grid": ("Dotted job-file keys and their values; every combination runs.",
                   "{training.learning_rate: [1.0e-4, 2.0e-4], lora.r: [8, 16]}"),
    "sweep.random": ("Random samples on top of the grid.",
                     "{n: 4, seed: 0, params: {training.learning_rate: "
                     "{loguniform: [1.0e-5, 1.0e-3]}}}"),
    "sweep.random.n": ("How many random runs.", "4"),
    "sweep.random.seed": ("Seed: the same file always draws the same runs.", "0"),
    "sweep.random.params": ("Dotted job-file keys and the distribution each is drawn from.",
                            "{lora.r: {choice: [8, 16, 32]}}"),
    "sweep.max_parallel": ("Runs of this sweep running at once.", "2"),
    "sweep.budget": ("USD for the whole sweep; runs that would pass it are held back.", "25"),
    "sweep.objective": ("The metric that picks the best run.",
                        "{metric: eval.exact_match, goal: max}"),
    "sweep.objective.metric": ("A metric a run reports (`orch show ID` lists them).",
                               "eval.exact_match"),
    "sweep.objective.goal": ("`max` or `min`.", "max"),
    "dist.loguniform": ("`[lo, hi]`, log-uniform (lo > 0): learning rates.", "[1.0e-5, 1.0e-3]"),
    "dist.uniform": ("`[lo, hi]`, uniform.", "[0.0, 0.1]"),
    "dist.choice": ("A list of values, one picked.", "[8, 16, 32]"),
    "dist.int": ("`[lo, hi]`, an integer, both ends included.", "[1, 3]"),
}


_SCALARS = {int: "integer", float: "number", bool: "true/false", str: "string",
            Decimal: "number (USD)"}


def type_text(annotation: Any) -> str:
    """A field's type in words: `integer`, `one of a, b`, `list of string`, `... or null`."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return type_text(args[0])
    if origin in (Union, types.UnionType):
        parts = [type_text(a) for a in args if a is not type(None)]
        text = " or ".join(parts)
        return f"{text} or null" if type(None) in args else text
    if origin is Literal:
        return "one of " + ", ".join(f"`{a}`" for a in args)
    if origin is list:
        return f"list of {type_text(args[0])}" if args else "list"
    if origin is dict:
        return "mapping"
    if submodel(annotation) is annotation:
        return "mapping"
    if annotation is Any:
        return "any value"
    return _SCALARS.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _limits(field: FieldInfo) -> str:
    words = []
    metadata = list(field.metadata)
    for arg in typing.get_args(field.annotation):  # Optional[Annotated[..., Field(gt=0)]]
        for inner in typing.get_args(arg)[1:]:
            metadata += getattr(inner, "metadata", [])
    for m in metadata:
        for attr, sign in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="),
                           ("min_length", "length >="), ("pattern", "matches")):
            value = getattr(m, attr, None)
            if value is not None:
                words.append(f"{sign} `{value}`" if attr == "pattern" else f"{sign} {value}")
    return ", ".join(words)


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "**required**"
    if field.default_factory is not None:
        value = field.default_factory()
        return "see below" if isinstance(value, Model) else f"`{value!r}`"
    value = field.default
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value}`"


def _defaults_word(prefix: str, name: str, field: FieldInfo) -> str:
    # `gpus`/`providers`: null is written `any` in a job file.
    if name in ("gpus", "providers") and prefix == "job.resources":
        return "`any`"
    if prefix == "job.lora" and name == "target":
        return "`all-linear`"
    return _default(field)


def walk(model: type[Model], prefix: str) -> list[tuple[str, str, FieldInfo]]:
    """(dotted key, ABOUT key, field) for every field, depth first."""
    rows = []
    for name, field in model.model_fields.items():
        key = field.alias or name
        dotted = f"{prefix}.{key}"
        rows.append((dotted, dotted, field))
        sub = submodel(field.annotation)
        if sub is not None and sub is not Distribution:
            rows += walk(sub, dotted)
    return rows


def missing_descriptions() -> list[str]:
    """Model keys with no entry in ABOUT (the test asserts this is empty)."""
    keys = [k for k, _, _ in walk(JobSpec, "job") + walk(SweepSpec, "sweep")]
    keys += [f"dist.{f.alias or n}" for n, f in Distribution.model_fields.items()]
    return [k for k in keys if k not in ABOUT]


def _section(model: type[Model], prefix: str, title: str) -> list[str]:
    out = [f"### {title}", "", "| Key | Type | Default | Limits | Meaning | Example |",
           "|---|---|---|---|---|---|"]
    for name, field in model.model_fields.items():
        key = field.alias or name
        about, example = ABOUT.get(f"{prefix}.{key}", ("", ""))
        # Keys whose validators accept more than the model's type say so in spec._SHAPES.
        shape = _SHAPES.get(tuple(f"{prefix}.{key}".split(".")[1:])) if prefix.startswith(
            "job") else None
        out.append(f"| `{key}` | {shape or type_text(field.annotation)} | "
                   f"{_defaults_word(prefix, key, field)} | {_limits(field)} | {about} | "
                   f"`{example}` |")
    out.append("")
    for name, field in model.model_fields.items():
        sub = submodel(field.annotation)
        if sub is not None and sub is not Distribution:
            key = field.alias or name
            dotted = f"{prefix}.{key}"
            out += _section(sub, dotted, f"`{dotted.split('.', 1)[1]}`")
    return out


def render() -> str:
    """The whole of docs/job-file.md."""
    return "\n".join([*_job_part(), *_models_part(), *_sweep_part()])


def _job_part() -> list[str]:
    """The introduction and the job file's keys."""
    return [
        "# The job file and the sweep file",
        "",
        "<!-- Generated by `python -m orchestrator.cli.jobdoc > docs/job-file.md` from the",
        "     models in orchestrator/core/spec.py and orchestrator/records/sweeps.py;",
        "     do not edit by hand",
        "     (tests/test_jobdoc.py fails when this file is stale). -->",
        "",
        "A job file is YAML. Only `name`, `base_model`, `method` and `dataset` are required;",
        "every other key has the default below. Unknown keys are errors (with a suggestion),",
        "and every problem is reported at once as `file:line key: problem`, before anything",
        "is recorded. `orch plan job.yml` checks a file without a database or credentials.",
        "",
        "```yaml",
        "name: llama31-8b-alpaca-qlora",
        "base_model: meta-llama/Llama-3.1-8B",
        "method: qlora",
        "dataset: {path: data/train.jsonl}",
        "```",
        "",
        "## Job file keys",
        "",
        *_section(JobSpec, "job", "Top level"),
    ]


def _models_part() -> list[str]:
    """Known base models, how to size any other, gated models."""
    models = sorted({m.repo: m for m in known_models().values()}.values(), key=lambda m: m.repo)
    required = [n for n, f in ArchitectureFields.model_fields.items() if f.is_required()]
    return [
        "## Base models",
        "",
        "`orch models` lists the models orch knows the shape of (their aliases too, e.g. the",
        "Instruct variants). Any other model works when you give its shape, in one of two ways:",
        "",
        "```yaml",
        "base_model: {repo: my-org/my-model, config: models/my-model/config.json}",
        "# or",
        "base_model:",
        "  repo: my-org/my-model",
        "  architecture: {" + ", ".join(f"{k}: .." for k in required) + "}",
        "```",
        "",
        f"`architecture` requires {', '.join(f'`{k}`' for k in required)}; the other fields",
        "default as in the table above.",
        "",
        "| Known model | Parameters |",
        "|---|---|",
        *(f"| `{m.repo}` | {m.published_params / 1e9:.2f}B |" for m in models),
        "",
        "### Gated models and `HF_TOKEN`",
        "",
        "Gated repos (all of `meta-llama/*`, for example) need a Hugging Face token of an",
        "account that accepted the model's licence. Set `HF_TOKEN` in the environment of the",
        "orch process that runs the job (`orch submit`, or each `orch worker`). It is passed to",
        "the GPU host for the download only; it is never written to the job file, the",
        "database, events or logs. A missing or rejected token fails the job with a message",
        "saying which.",
        "",
        "Before renting anything, the engine asks the Hub (`HF_ENDPOINT`, else",
        "huggingface.co) with that token whether the base model can be downloaded: a gated",
        "model whose licence the account has not accepted, a private or missing repo, an",
        "unknown revision or a rejected token fail the job at once, with `hf`'s own words",
        "and what to do (orchestrator/engine/hubaccess.py). A Hub that does not answer is",
        "no verdict: the job goes on and the host's download decides. Jobs that may run only",
        "on the simulated cloud ask no Hub unless `HF_ENDPOINT` is set (their hosts download",
        "from a stand-in).",
        "",
    ]


def _sweep_part() -> list[str]:
    """The sweep file's keys and random distributions."""
    return [
        "## The sweep file",
        "",
        "`orch sweep sweep.yml` expands a sweep into runs of one base job file and queues them",
        "(once each, however often it is run: safe from cron); `orch sweep show NAME` and",
        "`orch sweeps` show them. Grid keys and random parameters are dotted keys into the job",
        "file (`training.learning_rate`, `lora.r`), checked like the job file's own.",
        "",
        "```yaml",
        "name: lr-sweep-8b",
        "base: qlora-8b.yml",
        "grid:",
        "  training.learning_rate: [1.0e-4, 2.0e-4, 5.0e-4]",
        "  lora.r: [8, 16]",
        "max_parallel: 2",
        "budget: 25",
        "objective: {metric: eval.exact_match, goal: max}",
        "```",
        "",
        *_section(SweepSpec, "sweep", "Sweep keys"),
        "### Random distributions (`random.params.KEY`)",
        "",
        "Exactly one of:",
        "",
        "| Key | Type | Meaning | Example |",
        "|---|---|---|---|",
        *(f"| `{f.alias or n}` | {type_text(f.annotation)} | "
          f"{ABOUT[f'dist.{f.alias or n}'][0]} | `{ABOUT[f'dist.{f.alias or n}'][1]}` |"
          for n, f in Distribution.model_fields.items()),
        "",
    ]


if __name__ == "__main__":
    print(render(), end="")
