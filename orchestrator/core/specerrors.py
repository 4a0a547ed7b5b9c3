"""Pydantic's validation errors of the job and sweep files, as `file:line key: problem; fix`."""

from __future__ import annotations

import typing
from typing import Any

from pydantic import BaseModel, ValidationError

from orchestrator.core import yamlpos


def closest(word: str, choices: Any, n: int = 1, cutoff: float = 0.6) -> list[str]:
    """The `n` choices closest to a misspelt `word` (difflib's ratio of at least `cutoff`)."""
    import difflib  # only a typo needs it: kept off `orch plan`'s start-up path

    return difflib.get_close_matches(word, list(choices), n=n, cutoff=cutoff)


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


def submodel(annotation: Any) -> type[BaseModel] | None:
    """The model class inside a field's type (`X`, `X | None`, `Annotated[X, ...]`), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = submodel(arg)
        if found is not None:
            return found
    return None


def _model_at(root: type[BaseModel], loc: tuple[str | int, ...]) -> type[BaseModel] | None:
    """The model class that validates the mapping at `loc` under `root`."""
    model: type[BaseModel] = root
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


def user_loc(loc: tuple[str | int, ...]) -> tuple[str | int, ...]:
    # DatasetPath wraps a plain path string as {local: ...} (or {hf: ...}); report it as
    # `dataset.path` (`datasets.N.path`).
    if loc[:3] == ("dataset", "path", "local"):
        return loc[:2]
    if loc[:1] == ("datasets",) and loc[2:4] == ("path", "local"):
        return loc[:3]
    return loc

# What a field accepts, for type errors on fields that take more than one shape.


SHAPES: dict[tuple[str | int, ...], str] = {
    ("base_model",): "a repo id such as meta-llama/Llama-3.1-8B, or {repo: ORG/NAME, "
                     "config: path/to/config.json} or {repo: ..., architecture: {...}}",
    ("dataset",): "a JSONL file path, a Hugging Face dataset id, or {path: ..., format: ...}",
    ("dataset", "path"): "a JSONL file path (relative to the job file), a Hugging Face "
                         "dataset id (ORG/NAME) or {hf: ORG/NAME, split, revision, subset}",
    ("notify",): "a mapping {url or url_env, format, secret_env, events} or a list of them",
    ("lora", "target"): "all-linear or a list of module names such as [q_proj, v_proj]",
    ("resources", "gpus"): "any or a list of GPU models such as [RTX 4090, A100]",
    ("resources", "providers"): "any or a list of provider names",
    ("resources", "keep_warm"): "a duration: seconds, or text such as 90s, 15m or 1h",
}


def describe(err: dict[str, Any], root: type[BaseModel]) -> str:
    """One pydantic error of a file modelled by `root`, in words with the fix."""
    kind = err["type"]
    ctx = err.get("ctx") or {}
    got = err.get("input")
    loc = user_loc(tuple(err["loc"]))
    if kind in _TYPE_WORDS and loc in SHAPES:
        return f"must be {SHAPES[loc]} (got {got!r})"
    if kind == "finite_number":
        return f"must be a finite number (got {got!r})"
    if kind == "extra_forbidden":
        model = _model_at(root, loc[:-1])
        choices = list(model.model_fields) if model else []
        close = closest(str(loc[-1]), choices, n=1, cutoff=0.6)
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
        close = closest(str(got), [e.strip() for e in expected.split(",")], n=1)
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


def with_missing(exc: ValidationError | None, data: Any, key: str) -> ValidationError:
    """`exc`'s errors (or none) plus `key: required`, for a key a validator requires."""
    kept: list[Any] = [] if exc is None else [
        {k: v for k, v in e.items() if k in ("type", "loc", "input", "ctx")}
        for e in exc.errors()]
    title = "orch file" if exc is None else exc.title
    return ValidationError.from_exception_data(
        title, [*kept, {"type": "missing", "loc": (key,), "input": data}])


def translate(exc: ValidationError, root: type[BaseModel], filename: str,
              pos: yamlpos.Positions) -> list[str]:
    """Every error of `exc` as `file:line key: problem`, sorted by line."""
    out: list[tuple[int, str]] = []
    for err in exc.errors():
        loc = user_loc(tuple(err["loc"]))
        line = pos.line(loc)
        where = yamlpos.dotted(loc) or "(top level)"
        out.append((line, f"{filename}:{line} {where}: {describe(dict(err), root)}"))
    return [msg for _, msg in sorted(set(out))]


class Problems:
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
