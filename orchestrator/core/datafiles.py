"""Training and eval JSONL files, read on the user's machine: row formats checked and the
training set's tokens counted (or estimated) before anything is rented."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

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


class DatasetSize(NamedTuple):
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


class RowShape(NamedTuple):
    """What a training row must hold: the format and the columns it reads (the file's own
    names, `datasetspec.DatasetSpec.field`)."""

    format: str = "alpaca"
    text: str = "text"  # completion
    messages: str = "messages"  # chat_template
    role: str = "role"
    content: str = "content"


_ALPACA_FIX = "an alpaca row is {instruction, input (optional), output}, all strings"


def _missing(row: dict[str, Any], key: str, label: str = "") -> str | None:
    """Why `row[key]` (called `label`) is not a string, or None when it is."""
    label = label or f"field '{key}'"
    if key not in row:
        return f"{label} is missing"
    if not isinstance(row[key], str):
        return f"{label} must be a string (got {type(row[key]).__name__})"
    return None


def _alpaca(row: dict[str, Any]) -> tuple[int, int] | str:
    for key in ("instruction", "output"):
        if (why := _missing(row, key)) is not None:
            return f"{why}; {_ALPACA_FIX} (or set dataset.format)"
    if not isinstance(row.get("input", ""), str | None):
        return f"field 'input' must be a string or null; {_ALPACA_FIX}"
    chars = sum(len(row.get(k) or "") for k in ("instruction", "input", "output"))
    return chars, ALPACA_TEMPLATE_TOKENS


def _chat(row: dict[str, Any], shape: RowShape) -> tuple[int, int] | str:
    msgs = row.get(shape.messages)
    if not isinstance(msgs, list) or not msgs:
        if shape.messages in row:
            return (f"field '{shape.messages}' must be a non-empty list of "
                    f"{{{shape.role}, {shape.content}}} messages")
        hint = ("ShareGPT rows: set dataset.fields: {messages: conversations, role: from, "
                "content: value}" if "conversations" in row
                else "set dataset.fields.messages to the column that holds the messages")
        return f"field '{shape.messages}' is missing; {hint}"
    chars = 0
    for i, msg in enumerate(msgs):
        where = f"'{shape.messages}'[{i}]"
        if not isinstance(msg, dict):
            return f"{where} must be a mapping of {shape.role}, {shape.content}"
        for name, key in (("role", shape.role), ("content", shape.content)):
            if (why := _missing(msg, key, f"{where}.{key}")) is not None:
                return f"{why}; set dataset.fields.{name} to the messages' own key"
        chars += len(msg[shape.content])
    return chars, CHAT_MESSAGE_TOKENS * len(msgs)


def _completion(row: dict[str, Any], shape: RowShape) -> tuple[int, int] | str:
    if (why := _missing(row, shape.text)) is not None:
        return f"{why} (completion rows hold raw text); set dataset.fields.text to its column"
    return len(row[shape.text]), 0


def _segments(row: dict[str, Any]) -> tuple[int, int] | str:
    segments = row.get("segments")
    if not isinstance(segments, list) or not segments:
        got = "is missing" if "segments" not in row else "must be a non-empty list"
        return f"field 'segments' {got} (input_output rows are {{segments: [{{label, text}}]}})"
    chars = 0
    for i, seg in enumerate(segments):
        if not isinstance(seg, dict) or not isinstance(seg.get("text"), str) \
                or not isinstance(seg.get("label"), bool):
            return (f"field 'segments'[{i}] must be {{label: true|false, text: string}} "
                    "(label false: not trained on)")
        chars += len(seg["text"])
    return chars, 0


def _row_chars(row: Any, shape: RowShape) -> tuple[int, int] | str:
    """(characters, template tokens) of one training row, or what is wrong with it."""
    if not isinstance(row, dict):
        return f"a row must be a JSON object (got {type(row).__name__})"
    if shape.format == "alpaca":
        return _alpaca(row)
    if shape.format == "chat_template":
        return _chat(row, shape)
    if shape.format == "completion":
        return _completion(row, shape)
    return _segments(row)


def count_tokens(path: Path, shape: RowShape | str, given: int | None) -> DatasetSize:
    """Validate a JSONL dataset's rows and estimate its tokens (unless `given`)."""
    if isinstance(shape, str):
        shape = RowShape(shape)
    chars = rows = overhead = 0
    problems: list[str] = []
    for lineno, row in _jsonl_rows(path, problems):
        got = _row_chars(row, shape)
        if isinstance(got, str):
            problems.append(f"{path}:{lineno}: {shape.format} row: {got}")
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
