"""Generate docs/job-file.md from the file models, so the reference cannot drift.

Keys, types, defaults, limits and the words (each field's `description` and `examples`) are
read from JobSpec/SweepSpec; a test fails when a field has no description or the committed
file differs from what this prints:

    python -m orchestrator.cli.jobdoc > docs/job-file.md
"""

from __future__ import annotations

import types
import typing
from decimal import Decimal
from typing import Any, Literal, Union

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from orchestrator.core.architectures import known_models
from orchestrator.core.spec import ArchitectureFields, JobSpec
from orchestrator.core.specerrors import SHAPES, submodel
from orchestrator.core.sweepspec import Distribution, SweepSpec


def example_text(value: Any) -> str:
    """An example value as a job file writes it (YAML flow style)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, list):
        return "[" + ", ".join(example_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {example_text(v)}" for k, v in value.items()) + "}"
    return str(value)


def about(field: FieldInfo) -> tuple[str, str]:
    """(what a key means, an example as YAML) from the field's description and examples."""
    example = example_text(field.examples[0]) if field.examples else ""
    return field.description or "", example


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
        value = field.get_default(call_default_factory=True)
        return "see below" if isinstance(value, BaseModel) else f"`{value!r}`"
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


def walk(model: type[BaseModel], prefix: str) -> list[tuple[str, FieldInfo]]:
    """(dotted key, field) for every field, depth first."""
    rows = []
    for name, field in model.model_fields.items():
        key = field.alias or name
        dotted = f"{prefix}.{key}"
        rows.append((dotted, field))
        sub = submodel(field.annotation)
        if sub is not None and sub is not Distribution:
            rows += walk(sub, dotted)
    return rows


def missing_descriptions() -> list[str]:
    """Fields with no description or example (the test asserts this is empty)."""
    rows = walk(JobSpec, "job") + walk(SweepSpec, "sweep")
    rows += [(f"dist.{f.alias or n}", f) for n, f in Distribution.model_fields.items()]
    return [k for k, f in rows if not f.description or not f.examples]


def _section(model: type[BaseModel], prefix: str, title: str) -> list[str]:
    out = [f"### {title}", "", "| Key | Type | Default | Limits | Meaning | Example |",
           "|---|---|---|---|---|---|"]
    for name, field in model.model_fields.items():
        key = field.alias or name
        meaning, example = about(field)
        # Keys whose validators accept more than the model's type say so in specerrors.SHAPES.
        shape = SHAPES.get(tuple(f"{prefix}.{key}".split(".")[1:])) if prefix.startswith(
            "job") else None
        out.append(f"| `{key}` | {shape or type_text(field.annotation)} | "
                   f"{_defaults_word(prefix, key, field)} | {_limits(field)} | {meaning} | "
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
        "     models in orchestrator/core/spec.py and orchestrator/core/sweepspec.py;",
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
        "### Checking a job file in your editor",
        "",
        "`orch schema job` (and `orch schema sweep`) prints the file's JSON Schema, generated",
        "from the same models, with every key's meaning and an example. Editors with the YAML",
        "language server (VS Code's YAML extension, Neovim, Helix, ...) validate and complete",
        "a file that names the schema in its first line:",
        "",
        "```bash",
        "orch schema job > orch-job.schema.json",
        "orch schema sweep > orch-sweep.schema.json",
        "```",
        "",
        "```yaml",
        "# yaml-language-server: $schema=./orch-job.schema.json",
        "name: llama31-8b-alpaca-qlora",
        "```",
        "",
        "The schema checks keys, types, choices and bounds; `orch plan` also checks what a",
        "schema cannot (files, model shapes, GPU and provider names, trainer image tags).",
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
        "on the simulated cloud ask no real Hub unless `HF_ENDPOINT` is set (their hosts",
        "download from a stand-in): the simulated cloud's Hub gates what huggingface.co gates",
        "(Meta's Llama and Mistral's 7B v0.3 repos: `providers/sim/hub.yaml`), so such a",
        "model needs `HF_TOKEN` there too (any token: `sim` has no accounts). With",
        "`output.push_to_hub`, the token must also be allowed to write there (a Write token,",
        "or a fine-grained one with `repo.write` on the namespace): checked before renting.",
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
        *(f"| `{f.alias or n}` | {type_text(f.annotation)} | {about(f)[0]} | `{about(f)[1]}` |"
          for n, f in Distribution.model_fields.items()),
        "",
    ]


if __name__ == "__main__":
    print(render(), end="")
