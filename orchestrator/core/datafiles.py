"""Training and eval JSONL files, read on the user's machine: row formats checked and the
training set's tokens counted (or estimated) before anything is rented."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.core import userfiles

# Rough characters per token for English text with 128K–152K vocabularies; used only when
# the dataset gives no `tokens:` count. docs/sizing.md explains the estimate.
CHARS_PER_TOKEN = 4.0
# Prompt-template tokens added per alpaca row / per chat message.
ALPACA_TEMPLATE_TOKENS = 24
CHAT_MESSAGE_TOKENS = 6
# With a given token count, only this many rows are read to check the format.
_SAMPLE_ROWS = 1000


class DatasetError(ValueError):
    """A data file's problems, each "path:line: what is wrong"."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class DatasetSize:
    """How many tokens one epoch has, and whether that is a count or an estimate."""

    tokens: int
    rows: int | None
    source: str  # "job file" | "estimated from N characters"


# Stop reading a bad file after this many problems: the first few say what is wrong.
MAX_ROW_PROBLEMS = 5


def _jsonl_rows(path: Path, problems: list[str]) -> Iterator[tuple[int, Any]]:
    """(line number, parsed row) for each non-blank line; bad JSON is noted and skipped."""
    lineno = 0
    try:
        for lineno, line in enumerate(userfiles.lines(path), 1):
            if len(problems) >= MAX_ROW_PROBLEMS:
                problems.append(f"{path}: stopped after {MAX_ROW_PROBLEMS} problems")
                return
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as exc:
                problems.append(f"{path}:{lineno}: not valid JSON ({exc.msg})")
            except RecursionError:
                problems.append(f"{path}:{lineno}: JSON nested too deeply")
    except userfiles.UserFileError as exc:
        problems.append(f"{path}:{lineno + 1}: {exc}" if lineno else f"{path}: {exc}")
    except OSError as exc:
        problems.append(f"{path}: cannot read ({exc.strerror or exc})")


def _row_chars(row: Any, fmt: str) -> tuple[int, int] | str:
    """(characters, template tokens) of one training row, or what is wrong with it."""
    if fmt == "alpaca":
        ok = isinstance(row, dict) and all(isinstance(row.get(k), str)
                                           for k in ("instruction", "output"))
        if not ok or not isinstance(row.get("input", ""), str | None):
            return ("an alpaca row needs string 'instruction' and 'output' (and optional "
                    "'input'); or set dataset.format: chat_template")
        chars = sum(len(row.get(k) or "") for k in ("instruction", "input", "output"))
        return chars, ALPACA_TEMPLATE_TOKENS
    msgs = row.get("messages", row.get("conversations")) if isinstance(row, dict) else None
    if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) for m in msgs):
        return ("a chat_template row needs a non-empty 'messages' list of {role, content}; "
                "or set dataset.format: alpaca")
    chars = sum(len(str(m.get("content", m.get("value", "")))) for m in msgs)
    return chars, CHAT_MESSAGE_TOKENS * len(msgs)


def count_tokens(path: Path, fmt: str, given: int | None) -> DatasetSize:
    """Validate a JSONL dataset's rows and estimate its tokens (unless `given`)."""
    chars = rows = overhead = 0
    problems: list[str] = []
    for lineno, row in _jsonl_rows(path, problems):
        got = _row_chars(row, fmt)
        if isinstance(got, str):
            problems.append(f"{path}:{lineno}: {got}")
            continue
        rows += 1
        chars += got[0]
        overhead += got[1]
        if given is not None and rows >= _SAMPLE_ROWS:
            break
    if problems:
        raise DatasetError(problems)
    if rows == 0:
        raise DatasetError([f"{path}: dataset is empty"])
    if given is not None:
        return DatasetSize(given, rows, "job file")
    tokens = max(1, round(chars / CHARS_PER_TOKEN) + overhead)
    return DatasetSize(tokens, rows, f"estimated from {chars:,} characters in {rows:,} rows")


def check_eval_set(path: Path) -> list[str]:
    """Problems with an eval set: JSONL rows of {prompt, expected} strings."""
    problems: list[str] = []
    rows = 0
    for lineno, row in _jsonl_rows(path, problems):
        rows += 1
        if not (isinstance(row, dict) and isinstance(row.get("prompt"), str)
                and isinstance(row.get("expected"), str)):
            problems.append(f"{path}:{lineno}: an eval row needs string 'prompt' and "
                            "'expected'")
    if not rows and not problems:
        problems.append(f"{path}: eval set is empty")
    return problems
