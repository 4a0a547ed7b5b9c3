"""The files a job file names (the training set, the eval set), checked on this machine before
anything is rented: each exists, is a file, and has rows of the right shape.

On a validated spec (`spec.resolve`) and on the raw file when the schema refused it
(`raw_file_problems`), so that one run reports every problem of a file (README: all at once):
a missing dataset was reported only once another key had been fixed. A path orch cannot
read (an `s3://` URL, a Hub dataset id) is said to be one, with what orch takes instead.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath
from typing import Any

from orchestrator.core.datafiles import DatasetError, DatasetSize, check_eval_set, count_tokens
from orchestrator.core.specerrors import Problems
from playbooks.hfrepo import repo_id_problem

FORMATS = ("alpaca", "chat_template")
# Suffixes of data files: a missing path with one of them is a file, not a Hub id.
_DATA_SUFFIXES = {".jsonl", ".json", ".txt", ".csv", ".parquet", ".arrow", ".gz", ".zst"}
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
DATASET_FIX = "give the JSONL file's path (relative to the job file)"
EVAL_FIX = "give a JSONL file of {prompt, expected} rows (relative to the job file)"


def hf_download_fix(repo: str) -> str:
    """The `hf download` line that fetches dataset `repo` next to the job file."""
    name = repo.rsplit("/", 1)[-1]
    return f"`hf download --repo-type dataset {repo} --local-dir data/{name}`"


def _looks_like_hub_id(value: str) -> bool:
    """ORG/NAME without a data file's suffix: what a Hugging Face dataset id looks like."""
    return (value.count("/") == 1 and repo_id_problem(value) is None
            and PurePosixPath(value).suffix.lower() not in _DATA_SUFFIXES)


def unreadable(value: str, path: Path, fix: str) -> str:
    """Why `value` (resolved to `path`) is not a file orch can read, with what to give."""
    url = _URL.match(value)
    if url is not None:
        return (f"{value!r} is a URL ({url.group(1)}://); orch reads a local JSONL file only (it "
                "uploads it to the host; it fetches no s3://, gs:// or https:// URL): copy the "
                f"file to this machine and {fix}")
    if path.is_dir():
        return f"is a directory, not a file: {path}; {fix}"
    if _looks_like_hub_id(value):
        return (f"file not found: {path}; orch reads a local JSONL file only: if {value!r} is "
                f"a Hugging Face dataset id, download it first with {hf_download_fix(value)}, "
                f"then {fix}")
    return f"file not found: {path}; {fix}"


def hub_dataset_problem(repo: str) -> str:
    """`dataset.path: {hf: ...}` refused, with the download that replaces it."""
    bad = repo_id_problem(repo)
    return ((f"{bad}; " if bad else "") + "Hugging Face datasets are not downloaded by orch: "
            f"download it with {hf_download_fix('ORG/NAME' if bad else repo)}, then give the "
            "JSONL file's path in dataset.path (relative to the job file)")


def check_dataset(value: str, fmt: str | None, tokens: int | None, base: Path,
                  found: Problems) -> DatasetSize | None:
    """The training file's size after checking its rows (`fmt` None: the rows are not
    checked, the format being wrong itself)."""
    data_file = base / value
    if _URL.match(value) or data_file.is_dir() or not data_file.exists():
        found.add(("dataset", "path"), unreadable(value, data_file, DATASET_FIX))
        return None
    if fmt is None:
        return None
    try:
        return count_tokens(data_file, fmt, tokens)
    except DatasetError as exc:
        found.extend(("dataset", "path"), exc.problems)
    return None


def check_eval(value: str, base: Path, found: Problems) -> None:
    """The eval set's problems: missing, or rows that are not {prompt, expected}."""
    eval_file = base / value
    if _URL.match(value) or eval_file.is_dir() or not eval_file.exists():
        found.add(("eval", "eval_set"), unreadable(value, eval_file, EVAL_FIX))
    else:
        found.extend(("eval", "eval_set"), check_eval_set(eval_file))


def raw_file_problems(raw: dict[str, Any], base: Path, found: Problems) -> None:
    """`check_dataset` and `check_eval` on a file the schema refused, where its values are
    of the right type (a wrong one is the schema's to report)."""
    dataset = raw.get("dataset")
    if isinstance(dataset, dict):
        path, fmt, tokens = dataset.get("path"), dataset.get("format", "alpaca"), \
            dataset.get("tokens")
        if isinstance(path, str):
            valid = type(tokens) is int and tokens > 0
            check_dataset(path, fmt if fmt in FORMATS else None, tokens if valid else None,
                          base, found)
        elif isinstance(path, dict) and isinstance(path.get("hf"), str) and "local" not in path:
            found.add(("dataset", "path", "hf"), hub_dataset_problem(path["hf"]))
    evaluation = raw.get("eval")
    if isinstance(evaluation, dict) and isinstance(evaluation.get("eval_set"), str):
        check_eval(evaluation["eval_set"], base, found)
