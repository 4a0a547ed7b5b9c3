"""The job file's training data: `dataset:` (one) or `datasets:` (several), each a local file
or a Hugging Face dataset, in one of the row formats axolotl takes for instruction tuning.

Formats and their axolotl 0.18.0 dataset keys (src/axolotl/utils/schemas/datasets.py,
docs/dataset-formats/):

- `alpaca`: rows `{instruction, input?, output}` -> `type: alpaca`
  (docs/dataset-formats/inst_tune.qmd "alpaca"; index.qmd:386-414);
- `chat_template`: rows with a list of messages -> `type: chat_template`, `field_messages`
  (datasets.py:109-114, default "messages") and `message_property_mappings` (datasets.py:
  137-142, default `{role: role, content: content}`; the legacy `message_field_role` /
  `message_field_content` are folded into it by utils.py `handle_legacy_message_fields_logic`);
  ShareGPT rows (`conversations` of `{from, value}`) are the same with other field names
  (index.qmd:217-231), their `human`/`gpt` roles mapped by axolotl's default `roles`
  (prompt_strategies/chat_template.py:72-78);
- `completion`: raw text in one column -> `type: completion`, `field` (datasets.py:101-106,
  default "text"; prompt_strategies/completion.py:16,88);
- `input_output`: template-free rows `{segments: [{label, text}]}` -> `type: input_output`
  (index.qmd:118-153, prompt_strategies/input_output.py:21,45).

A Hub dataset is `{hf: ORG/NAME, split, revision, subset}` (`subset` is the datasets
library's config name, axolotl's `name`: datasets.py:93-96). A plain string is a Hub id when
it has the Hub's shape (ORG/NAME, no data file suffix, not starting with `.` or `/`), else a
local path; `spec.resolve` refuses a string that is both (a file of that name exists).
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, model_validator

from orchestrator.core.strictmodel import Strict
from playbooks.hfrepo import repo_id_problem

MAX_TOKENS = 10**15  # spec.MAX_TOKENS (imported there from here)

Format = Literal["alpaca", "chat_template", "completion", "input_output"]
FORMATS: tuple[str, ...] = ("alpaca", "chat_template", "completion", "input_output")

# Suffixes of data files: a path with one of them is a file, not a Hub id.
DATA_SUFFIXES = frozenset({".jsonl", ".json", ".txt", ".csv", ".parquet", ".arrow", ".gz",
                           ".zst"})


def looks_like_hub_id(value: str) -> bool:
    """ORG/NAME without a data file's suffix: what a Hugging Face dataset id looks like."""
    return (value.count("/") == 1 and not value.startswith((".", "/"))
            and repo_id_problem(value) is None
            and PurePosixPath(value).suffix.lower() not in DATA_SUFFIXES)


def _dataset_path(value: Any) -> Any:
    if isinstance(value, str):
        return {"hf": value} if looks_like_hub_id(value) else {"local": value}
    return value


class DatasetPath(Strict):
    """A local file (uploaded to the host) or a Hugging Face dataset (downloaded on the
    host, never through this machine)."""

    local: str | None = Field(default=None, examples=["data/train.jsonl"],
                              description="A JSONL file, relative to the job file (what a "
                                          "plain path string means).")
    hf: str | None = Field(default=None, examples=["tatsu-lab/alpaca"],
                           description="A Hugging Face dataset id (what a plain ORG/NAME "
                                       "string means): downloaded on the GPU host with `hf "
                                       "download --repo-type dataset`; a gated or private "
                                       "one needs `HF_TOKEN`.")
    split: str = Field(default="train", min_length=1, examples=["train"],
                       description="The split to train on (`hf` only: a local file has one "
                                   "split, train).")
    revision: str = Field(default="main", min_length=1, examples=["main"],
                          description="Branch, tag or commit of the Hub dataset (`hf` only).")
    subset: str | None = Field(default=None, min_length=1, examples=["en"],
                               description="The Hub dataset's subset (its config name), "
                                           "for datasets that have several (`hf` only).")

    @model_validator(mode="after")
    def _exactly_one(self) -> DatasetPath:
        if (self.local is None) == (self.hf is None):
            raise ValueError("must be a local file path or {hf: org/name}")
        if self.local is not None:
            # By value, not by what was written: a recorded spec spells out the defaults.
            hub_only = [k for k, v, default in (("split", self.split, "train"),
                                                ("revision", self.revision, "main"),
                                                ("subset", self.subset, None)) if v != default]
            if hub_only:
                raise ValueError(f"{', '.join(hub_only)}: only for a Hugging Face dataset "
                                 "(hf:); a local file has one split, train")
        return self


class DatasetFields(Strict):
    """Which columns hold what, for rows whose names differ from the format's defaults."""

    text: str | None = Field(default=None, min_length=1, examples=["content"],
                             description="`completion`: the column with the raw text "
                                         "(default `text`; axolotl's `field`).")
    messages: str | None = Field(
        default=None, min_length=1, examples=["conversations"],
        description="`chat_template`: the column with the list of messages (default "
                    "`messages`; axolotl's `field_messages`).")
    role: str | None = Field(default=None, min_length=1, examples=["from"],
                             description="`chat_template`: each message's role key (default "
                                         "`role`).")
    content: str | None = Field(default=None, min_length=1, examples=["value"],
                                description="`chat_template`: each message's text key "
                                            "(default `content`).")


# The columns each format reads, with their defaults: fields of another format are refused.
FIELD_DEFAULTS: dict[str, dict[str, str]] = {
    "alpaca": {},
    "chat_template": {"messages": "messages", "role": "role", "content": "content"},
    "completion": {"text": "text"},
    "input_output": {},
}


class DatasetSpec(Strict):
    """One training dataset: where it is, its row format and (optionally) its size."""

    path: Annotated[DatasetPath, BeforeValidator(
        _dataset_path, json_schema_input_type=str | DatasetPath)] = Field(
        examples=["data/train.jsonl"],
        description="A local JSONL file (relative to the job file; uploaded to the host), a "
                    "Hugging Face dataset id (`tatsu-lab/alpaca`), or `{hf: ORG/NAME, split, "
                    "revision, subset}`.")
    format: Format = Field(
        default="alpaca", examples=["alpaca"],
        description="The rows: `alpaca` (instruction/input/output), `chat_template` (a list "
                    "of messages: OpenAI `messages` or ShareGPT `conversations` with "
                    "`fields`), `completion` (raw text) or `input_output` (template-free "
                    "`segments` of {label, text}).")
    fields: DatasetFields | None = Field(
        default=None, examples=[{"messages": "conversations", "role": "from",
                                 "content": "value"}],
        description="Column names when they differ from the format's defaults.")
    tokens: int | None = Field(
        default=None, gt=0, le=MAX_TOKENS, examples=[6000000],
        description="Tokens in one epoch. Optional: estimated from a local file's "
                    "characters, or from a Hub dataset's published size (rows and bytes per "
                    "split).")
    validation_split: str | None = Field(
        default=None, min_length=1, examples=["test"],
        description="A split of the same Hub dataset to evaluate on during training "
                    "(axolotl's `test_datasets`); not with `training.val_set_size`.")

    @model_validator(mode="after")
    def _fields_fit_format(self) -> DatasetSpec:
        if self.fields is not None:
            allowed = FIELD_DEFAULTS[self.format]
            given = [k for k in DatasetFields.model_fields if getattr(self.fields, k)]
            wrong = [k for k in given if k not in allowed]
            if wrong:
                which = ", ".join(allowed) or "none"
                raise ValueError(f"fields.{wrong[0]} is not read by format {self.format} "
                                 f"(its fields: {which})")
        if self.validation_split is not None and self.path.hf is None:
            raise ValueError("validation_split: only for a Hugging Face dataset (hf:); for a "
                             "local file set training.val_set_size")
        if self.validation_split is not None and self.validation_split == self.path.split:
            raise ValueError(f"validation_split {self.validation_split!r} is the training "
                             "split: pick another (e.g. test or validation)")
        return self

    def field(self, name: str) -> str:
        """The column the format reads for `name` (the file's own or the default)."""
        given = getattr(self.fields, name) if self.fields is not None else None
        return given or FIELD_DEFAULTS[self.format][name]


def _spec_string(value: Any) -> Any:
    # `dataset: data/train.jsonl` and `datasets: [tatsu-lab/alpaca, ...]` name the path alone.
    return {"path": value} if isinstance(value, str) else value


# A dataset as the job file may write it: a mapping, or just its path (a file or a Hub id).
DatasetArg = Annotated[DatasetSpec, BeforeValidator(
    _spec_string, json_schema_input_type=str | DatasetSpec)]
