"""The data a job file names (its training sets, the eval set), checked on this machine
before anything is rented: each local file exists, is a file, and has rows of the right
shape; each Hugging Face dataset has a valid id and a size in tokens (given, or from the
Hub's published information through the engine's `HubSizer`).

On a validated spec (`spec.resolve`) and on the raw file when the schema refused it
(`raw_file_problems`), so that one run reports every problem of a file (README: all at once):
a missing dataset was reported only once another key had been fixed. A path orch cannot
read (an `s3://` URL) is said to be one, with what orch takes instead.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from orchestrator.core.datafiles import (
    DatasetError,
    DatasetSize,
    RowShape,
    check_eval_set,
    count_tokens,
)
from orchestrator.core.datasetspec import (
    FIELD_DEFAULTS,
    FORMATS,
    DatasetSpec,
    looks_like_hub_id,
)
from orchestrator.core.hubsize import HubDatasetRef, HubSizeError, HubSizer
from orchestrator.core.specerrors import Problems
from playbooks.hfrepo import repo_id_problem

Loc = tuple[str | int, ...]
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
DATASET_FIX = ("give the JSONL file's path (relative to the job file) or a Hugging Face "
               "dataset id (ORG/NAME)")
EVAL_FIX = "give a JSONL file of {prompt, expected} rows (relative to the job file)"


def hf_download_fix(repo: str) -> str:
    """The `hf download` line that fetches dataset `repo` next to the job file."""
    name = repo.rsplit("/", 1)[-1]
    return f"`hf download --repo-type dataset {repo} --local-dir data/{name}`"


def unreadable(value: str, path: Path, fix: str) -> str:
    """Why `value` (resolved to `path`) is not a file orch can read, with what to give."""
    url = _URL.match(value)
    if url is not None:
        return (f"{value!r} is a URL ({url.group(1)}://); orch reads a local JSONL file or a "
                "Hugging Face dataset (it fetches no s3://, gs:// or https:// URL): copy the "
                f"file to this machine and {fix}")
    if path.is_dir():
        return f"is a directory, not a file: {path}; {fix}"
    if looks_like_hub_id(value):  # an eval set: read here, so a Hub id must be downloaded
        return (f"file not found: {path}; the eval set is a local JSONL file: if {value!r} is "
                f"a Hugging Face dataset id, download it first with {hf_download_fix(value)}, "
                f"then {fix}")
    return f"file not found: {path}; {fix}"


def row_shape(ds: DatasetSpec) -> RowShape:
    """The columns `ds`'s rows are checked for (the file's own names or the defaults)."""
    if ds.format == "completion":
        return RowShape(ds.format, text=ds.field("text"))
    if ds.format == "chat_template":
        return RowShape(ds.format, messages=ds.field("messages"), role=ds.field("role"),
                        content=ds.field("content"))
    return RowShape(ds.format)


def check_local(loc: Loc, value: str, shape: RowShape | None, tokens: int | None, base: Path,
                found: Problems) -> DatasetSize | None:
    """A local training file's size after checking its rows (`shape` None: the rows are not
    checked, the format being wrong itself). `loc` is the dataset's place in the file."""
    data_file = base / value
    if _URL.match(value) or data_file.is_dir() or not data_file.exists():
        found.add((*loc, "path"), unreadable(value, data_file, DATASET_FIX))
        return None
    if shape is None:
        return None
    try:
        return count_tokens(data_file, shape, tokens)
    except DatasetError as exc:
        found.extend((*loc, "path"), exc.problems)
    return None


def _plain_string(found: Problems, loc: Loc) -> bool:
    """Whether the file wrote the dataset's path as a plain string (no `hf:` key)."""
    return (*loc, "path", "hf") not in found.pos.keys


def check_hub(loc: Loc, ds: DatasetSpec, base: Path, found: Problems,
              hub_size: HubSizer | None) -> DatasetSize | None:
    """A Hub dataset's size: the job file's `tokens`, else the Hub's published size."""
    repo = ds.path.hf or ""
    where = (*loc, "path") if _plain_string(found, loc) else (*loc, "path", "hf")
    bad = repo_id_problem(repo)
    if bad is not None:
        found.add(where, f"{bad} (a Hugging Face dataset id, e.g. tatsu-lab/alpaca)")
        return None
    if _plain_string(found, loc) and (base / repo).exists():
        found.add(where, f"{repo!r} is both a file here ({base / repo}) and a Hugging Face "
                         f"dataset id: write ./{repo} for the file or {{hf: {repo}}} for the "
                         "Hub dataset")
        return None
    if ds.tokens is not None:
        return DatasetSize(ds.tokens, None, "job file")
    ref = HubDatasetRef(repo, ds.path.revision, ds.path.subset, ds.path.split, ds.format)
    try:
        size = None if hub_size is None else hub_size(ref)
    except HubSizeError as exc:
        found.add((*loc, "path", exc.key), str(exc))
        return None
    if size is None:
        found.add((*loc, "tokens"),
                  f"{repo} ({ds.path.split}): no size known here (the Hub's dataset "
                  "information was not asked or lists no rows and bytes for that split): "
                  "give tokens, the number of tokens in one epoch")
    return size


def check_dataset(loc: Loc, ds: DatasetSpec, base: Path, found: Problems,
                  hub_size: HubSizer | None = None) -> DatasetSize | None:
    """One training dataset's size in tokens, its problems added to `found`."""
    if ds.path.local is not None:
        return check_local(loc, ds.path.local, row_shape(ds), ds.tokens, base, found)
    return check_hub(loc, ds, base, found, hub_size)


def datasets_size(datasets: list[tuple[Loc, DatasetSpec]], held_out: float | None, base: Path,
                  found: Problems, hub_size: HubSizer | None) -> DatasetSize | None:
    """The training data's size in tokens: every dataset (`(place in the file, spec)`),
    less the fraction `held_out` for evaluation; None when one of them has problems."""
    sizes = [check_dataset(loc, ds, base, found, hub_size) for loc, ds in datasets]
    known = [s for s in sizes if s is not None]
    if len(known) < len(sizes):
        return None
    size = total(known)
    if held_out:
        size = DatasetSize(max(1, round(size.tokens * (1 - held_out))), size.rows,
                           f"{size.source}, less {held_out:g} held out (val_set_size)")
    return size


def total(sizes: list[DatasetSize]) -> DatasetSize:
    """Several datasets' sizes as one (a job trains on all of them each epoch)."""
    if len(sizes) == 1:
        return sizes[0]
    rows = None if any(s.rows is None for s in sizes) else sum(s.rows or 0 for s in sizes)
    return DatasetSize(sum(s.tokens for s in sizes), rows,
                       "; ".join(f"{s.tokens:,} tokens ({s.source})" for s in sizes))


def check_eval(value: str, base: Path, found: Problems) -> None:
    """The eval set's problems: missing, or rows that are not {prompt, expected}."""
    eval_file = base / value
    if _URL.match(value) or eval_file.is_dir() or not eval_file.exists():
        found.add(("eval", "eval_set"), unreadable(value, eval_file, EVAL_FIX))
    else:
        found.extend(("eval", "eval_set"), check_eval_set(eval_file))


def _raw_dataset(loc: Loc, dataset: Any, base: Path, found: Problems) -> None:
    """`check_local` on one raw dataset mapping whose path is a local-looking string."""
    if not isinstance(dataset, dict):
        return
    path, fmt, tokens = dataset.get("path"), dataset.get("format", "alpaca"), \
        dataset.get("tokens")
    if not isinstance(path, str) or looks_like_hub_id(path):
        return
    fields = dataset.get("fields") or {}
    shape: RowShape | None = None
    # Rows are checked only where the format and its fields are valid (else the schema's
    # error says what is wrong, and rows checked in another shape would only add noise).
    if fmt in FORMATS and isinstance(fields, dict) and set(fields) <= set(FIELD_DEFAULTS[fmt]):
        names = {k: v for k, v in fields.items() if isinstance(v, str) and v}
        shape = RowShape(fmt, **names)
    valid = type(tokens) is int and tokens > 0
    check_local(loc, path, shape, tokens if valid else None, base, found)


def raw_file_problems(raw: dict[str, Any], base: Path, found: Problems) -> None:
    """`check_local` and `check_eval` on a file the schema refused, where its values are
    of the right type (a wrong one is the schema's to report)."""
    _raw_dataset(("dataset",), raw.get("dataset"), base, found)
    datasets = raw.get("datasets")
    for i, dataset in enumerate(datasets if isinstance(datasets, list) else []):
        _raw_dataset(("datasets", i), dataset, base, found)
    evaluation = raw.get("eval")
    if isinstance(evaluation, dict) and isinstance(evaluation.get("eval_set"), str):
        check_eval(evaluation["eval_set"], base, found)
