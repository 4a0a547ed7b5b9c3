"""Strict, frozen models for the job and sweep files, validated without pydantic.

Why not pydantic here: `orch plan` is the command people rerun while editing a job file,
and importing pydantic and building the job file's eleven models was half of its start-up
(~90 ms of ~190 on a 2-core machine; bench/startup.py, issue 11 §4). The job file needs a
small, fixed set of rules, and this module implements exactly those: strict scalars (no
coercion: `"2"` is not an integer, `1` is not true), bounds, string patterns and lengths,
literals, lists, string-keyed mappings, nested models, optional values, validators before
and after the type check, unknown keys refused, and instances that cannot be changed.

Errors are reported as pydantic reports them (the same `type`, `loc`, `msg`, `input` and
`ctx`), so the translation into `file:line key: problem` (orchestrator/core/spec.py) that
was written against pydantic's errors stays as it was, and values are written out as
pydantic wrote them, so recorded spec hashes stay valid; tests/test_schema.py declares
each rule in both libraries and requires the same values, output and errors.

Declaring a model:

    class Training(Model):
        sequence_len: int = Field(default=2048, ge=16)
        optimizer: Literal["adamw", "adamw_8bit"] = "adamw"
        image: Annotated[str, After(check_pinned)] = "axolotl:0.9"

`Before(fn)` runs on the raw value, `After(fn)` on the validated one; either raises
ValueError for a problem. A model's `_prepare` classmethod sees its raw input first (a
string standing for a mapping), and its `_check` method sees the built instance.

Not implemented, because these files need none of it: forward references in annotations
(a NameError when the class is created), coercion (lax mode), and pydantic's per-member
errors for a union that is not `X | None`: such a union reports its first member's errors,
so give it a `Before` that explains the accepted forms (as spec's `AutoBool` does).
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import math
import re
import types
import typing
from collections.abc import Callable
from decimal import Decimal
from typing import Any, ClassVar, Literal, TypeVar, Union

_MISSING: Any = type("Missing", (), {"__repr__": lambda self: "MISSING"})()
_FAIL: Any = type("Invalid", (), {})()  # a value that did not validate (its errors recorded)

Loc = tuple[str | int, ...]
M = TypeVar("M", bound="Model")


class FieldInfo:
    """A field's default and constraints; `annotation` is its type once the class exists."""

    _CONSTRAINTS = ("gt", "ge", "lt", "le", "min_length", "pattern")

    def __init__(self, default: Any = _MISSING, *,
                 default_factory: Callable[[], Any] | None = None, alias: str | None = None,
                 gt: Any = None, ge: Any = None, lt: Any = None, le: Any = None,
                 min_length: int | None = None, pattern: str | None = None) -> None:
        self.default, self.default_factory, self.alias = default, default_factory, alias
        self.gt, self.ge, self.lt, self.le = gt, ge, lt, le
        self.min_length, self.pattern = min_length, pattern
        self._regex = re.compile(_rust_dollars(pattern)) if pattern is not None else None
        # As pydantic's FieldInfo, `annotation` is the bare type (Annotated[...] unwrapped);
        # `full_type` keeps the Before/After/Field metadata that validation applies.
        self.annotation: Any = None
        self.full_type: Any = None
        self.is_float = False

    def is_required(self) -> bool:
        """True when the field has neither a default nor a default factory."""
        return self.default is _MISSING and self.default_factory is None

    @property
    def metadata(self) -> list[FieldInfo]:
        """The constraint holders, as pydantic lists them (the job-file doc reads these)."""
        return [self] if any(getattr(self, c) is not None for c in self._CONSTRAINTS) else []

    def make_default(self) -> Any:
        """The default value, not validated (as pydantic); a mutable one is a fresh copy."""
        if self.default_factory is not None:
            return self.default_factory()
        if isinstance(self.default, list | dict | set):
            return copy.deepcopy(self.default)
        return self.default


def Field(default: Any = _MISSING, *, default_factory: Callable[[], Any] | None = None,  # noqa: N802 - reads like pydantic's
          alias: str | None = None, gt: Any = None, ge: Any = None, lt: Any = None,
          le: Any = None, min_length: int | None = None, pattern: str | None = None) -> Any:
    """A field's default and constraints (typed Any so a declaration type-checks)."""
    return FieldInfo(default, default_factory=default_factory, alias=alias, gt=gt, ge=ge,
                     lt=lt, le=le, min_length=min_length, pattern=pattern)


class Before:
    """Annotated metadata: `fn(raw) -> value` runs before the type check."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn


class After:
    """Annotated metadata: `fn(value) -> value` runs after the type check and bounds."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn


class ValidationError(ValueError):
    """Every problem found in one input, as pydantic's error dicts (`errors()`)."""

    def __init__(self, title: str, errors: list[dict[str, Any]]) -> None:
        self.title, self._errors = title, errors
        lines = [f"{len(errors)} validation error{'s' if len(errors) != 1 else ''} for {title}"]
        for e in errors:
            lines += [".".join(str(p) for p in e["loc"]) or "(top level)", f"  {e['msg']}"]
        super().__init__("\n".join(lines))

    def errors(self) -> list[dict[str, Any]]:
        """The problems, each {type, loc, msg, input[, ctx]}."""
        return [dict(e) for e in self._errors]

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.title, self._errors))


class _Errors:
    """Errors collected while validating one input."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []

    def add(self, kind: str, loc: Loc, msg: str, value: Any, **ctx: Any) -> Any:
        err = {"type": kind, "loc": loc, "msg": msg, "input": value}
        if ctx:
            err["ctx"] = ctx
        self.items.append(err)
        return _FAIL

    def value_error(self, loc: Loc, exc: ValueError, value: Any) -> Any:
        return self.add("value_error", loc, f"Value error, {exc}", value, error=exc)


@typing.dataclass_transform(kw_only_default=True, frozen_default=True,
                            field_specifiers=(Field, FieldInfo))
class Model:
    """A strict, frozen model: unknown keys refused, values never coerced."""

    model_fields: ClassVar[dict[str, FieldInfo]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Each class's annotations are read in its own module (get_type_hints' default).
        hints = typing.get_type_hints(cls, include_extras=True)
        fields: dict[str, FieldInfo] = {}
        for name, hint in hints.items():
            if name.startswith("_") or name in Model.__annotations__:
                continue
            own = name in cls.__dict__.get("__annotations__", {})
            if not own and name in cls.model_fields:
                fields[name] = cls.model_fields[name]  # inherited as it was declared
                continue
            value = cls.__dict__.get(name, _MISSING)
            info = value if isinstance(value, FieldInfo) else FieldInfo(value)
            info.full_type = hint
            annotated = typing.get_origin(hint) is typing.Annotated
            info.annotation = hint.__origin__ if annotated else hint
            info.is_float = info.annotation in (float, float | None)
            fields[name] = info
            if name in cls.__dict__:
                delattr(cls, name)  # instances hold the values (as pydantic: not the class)
        cls.model_fields = fields

    @property
    def model_fields_set(self) -> set[str]:
        """The fields the input gave (the others took their defaults)."""
        return typing.cast(set[str], self.__dict__["_fields_set"])

    def __init__(self, **data: Any) -> None:
        built = type(self).model_validate(data)
        self.__dict__.update(built.__dict__)

    @classmethod
    def _prepare(cls, value: Any) -> Any:
        """The raw input, before it must be a mapping (override to accept a shorthand)."""
        return value

    def _check(self) -> None:
        """Cross-field rules on the built instance (override; raise ValueError)."""

    @classmethod
    def model_validate(cls: type[M], data: Any) -> M:
        """A validated instance of `data` (a mapping or an instance); ValidationError if not."""
        errs = _Errors()
        out = _model(cls, data, (), errs)
        if errs.items:
            raise ValidationError(cls.__name__, errs.items)
        return typing.cast(M, out)

    def model_dump(self, *, mode: Literal["python", "json"] = "python",
                   exclude_none: bool = False, by_alias: bool = False) -> dict[str, Any]:
        """The values as plain data (nested models as dicts; Decimal as str in JSON mode)."""
        out = {}
        for name, info in self.model_fields.items():
            value = self.__dict__[name]
            if exclude_none and value is None:
                continue
            if mode == "json" and info.is_float and type(value) is int:
                value = float(value)  # pydantic writes a float field's int default as 1.0
            out[(info.alias or name) if by_alias else name] = _dump(
                value, mode == "json", exclude_none, by_alias)
        return out

    def model_dump_json(self) -> str:
        """Compact JSON of `model_dump(mode="json")`."""
        return json.dumps(self.model_dump(mode="json"), separators=(",", ":"),
                          ensure_ascii=False)

    def __setattr__(self, name: str, value: Any) -> None:
        errs = _Errors()
        errs.add("frozen_instance", (name,), "Instance is frozen", value)
        raise ValidationError(type(self).__name__, errs.items)

    def __delattr__(self, name: str) -> None:
        self.__setattr__(name, None)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(self.__dict__[n] == other.__dict__[n] for n in self.model_fields)

    def __hash__(self) -> int:
        # As pydantic's frozen models: by value, so one holding a list is unhashable.
        return hash((type(self), *(self.__dict__[n] for n in self.model_fields)))

    def __repr__(self) -> str:
        values = ", ".join(f"{n}={self.__dict__[n]!r}" for n in self.model_fields)
        return f"{type(self).__name__}({values})"


def submodel(annotation: Any) -> type[Model] | None:
    """The model class in a field's type (`X`, `X | None`, `Annotated[X, ...]`), if any."""
    if isinstance(annotation, type) and issubclass(annotation, Model):
        return annotation
    for arg in typing.get_args(annotation):  # Annotated's metadata are never models
        found = submodel(arg)
        if found is not None:
            return found
    return None


def _dump(value: Any, as_json: bool, exclude_none: bool, by_alias: bool) -> Any:
    if isinstance(value, Model):
        return value.model_dump(mode="json" if as_json else "python",
                                exclude_none=exclude_none, by_alias=by_alias)
    if isinstance(value, list) or (as_json and isinstance(value, tuple | set | frozenset)):
        return [_dump(v, as_json, exclude_none, by_alias) for v in value]
    if isinstance(value, dict):
        return {(_json_key(k) if as_json else k): _dump(v, as_json, exclude_none, by_alias)
                for k, v in value.items()}
    return _json_scalar(value) if as_json else value


def _json_scalar(value: Any) -> Any:
    """A free-form value (trainer.extra, sweep values) as pydantic's JSON mode writes it.

    YAML gives dates, timestamps and !!binary too: pydantic wrote them as ISO text and
    UTF-8 text, and the spec hash and the stored JSON are taken over this output.
    """
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dt.datetime | dt.date | dt.time):
        text = value.isoformat()
        return text[:-6] + "Z" if text.endswith("+00:00") else text
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value


def _json_key(key: Any) -> Any:
    # pydantic's JSON keys: None -> "None", booleans as JSON writes them, numbers as text.
    if isinstance(key, bool):
        return "true" if key else "false"
    return key if isinstance(key, str) else str(_json_scalar(key))


# --- validation ------------------------------------------------------------------------------


def _model(cls: type[Model], value: Any, loc: Loc, errs: _Errors) -> Any:
    """`value` as an instance of `cls`, or _FAIL with its errors recorded."""
    if isinstance(value, cls):
        return value
    raw = value
    try:
        value = cls._prepare(value)
    except ValueError as exc:
        return errs.value_error(loc, exc, value)
    if not isinstance(value, dict):
        return errs.add("model_type", loc, f"Input should be a valid dictionary or instance "
                        f"of {cls.__name__}", value, class_name=cls.__name__)
    before = len(errs.items)
    values: dict[str, Any] = {}
    given: set[str] = set()
    for name, info in cls.model_fields.items():
        key = info.alias or name
        if key in value:
            given.add(name)
            values[name] = _typed(info.full_type, value[key], (*loc, key), errs, info)
        elif info.is_required():
            errs.add("missing", (*loc, key), "Field required", value)
        else:
            values[name] = info.make_default()
    known = {info.alias or name for name, info in cls.model_fields.items()}
    for key in value:
        if not isinstance(key, str):
            errs.add("invalid_key", (*loc, key), "Keys should be strings", key)
        elif key not in known:
            errs.add("extra_forbidden", (*loc, key), "Extra inputs are not permitted",
                     value[key])
    if len(errs.items) > before:
        return _FAIL
    out = object.__new__(cls)
    out.__dict__.update(values)
    out.__dict__["_fields_set"] = given
    try:
        out._check()
    except ValueError as exc:
        return errs.value_error(loc, exc, raw)
    return out


def _typed(hint: Any, value: Any, loc: Loc, errs: _Errors, bounds: FieldInfo | None) -> Any:
    """`value` checked against the type `hint` and the `bounds` of its field."""
    origin = typing.get_origin(hint)
    if origin is typing.Annotated:
        return _annotated(hint, value, loc, errs, bounds)
    if origin in (Union, types.UnionType):
        members = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None and len(members) < len(typing.get_args(hint)):
            return None
        return _union(members, value, loc, errs, bounds)
    if origin is Literal:
        return _literal(typing.get_args(hint), value, loc, errs)
    if origin is list:
        return _bounded(_list(typing.get_args(hint)[0], value, loc, errs), value, loc, errs,
                        bounds)
    if origin is dict:
        return _dict(typing.get_args(hint)[1], value, loc, errs)
    if isinstance(hint, type) and issubclass(hint, Model):
        return _model(hint, value, loc, errs)
    if hint is Any:
        return value
    return _bounded(_scalar(hint, value, loc, errs), value, loc, errs, bounds)


def _annotated(hint: Any, value: Any, loc: Loc, errs: _Errors,
               bounds: FieldInfo | None) -> Any:
    meta = hint.__metadata__
    raw = value
    for m in reversed(meta):  # as pydantic: the innermost Before runs first
        if isinstance(m, Before):
            try:
                value = m.fn(value)
            except ValueError as exc:
                return errs.value_error(loc, exc, raw)
    inner = [m for m in meta if isinstance(m, FieldInfo)]
    before = len(errs.items)
    out = _typed(hint.__origin__, value, loc, errs, inner[0] if inner else bounds)
    for err in errs.items[before:]:
        if err["loc"] == loc:
            err["input"] = raw  # as pydantic: the value as given, before the Before ran
    if out is _FAIL:
        return _FAIL
    for m in meta:
        if isinstance(m, After):
            try:
                out = m.fn(out)
            except ValueError as exc:
                return errs.value_error(loc, exc, raw)
    return out


def _union(members: list[Any], value: Any, loc: Loc, errs: _Errors,
           bounds: FieldInfo | None) -> Any:
    if len(members) == 1:
        return _typed(members[0], value, loc, errs, bounds)
    first: list[dict[str, Any]] | None = None
    for member in members:
        trial = _Errors()
        out = _typed(member, value, loc, trial, bounds)
        if out is not _FAIL:
            return out
        first = first if first is not None else trial.items
    errs.items.extend(first or [])
    return _FAIL


def _literal(choices: tuple[Any, ...], value: Any, loc: Loc, errs: _Errors) -> Any:
    for choice in choices:
        # A str subclass (a str enum) matches its text, as in pydantic; True is never 1.
        same_kind = isinstance(value, str) if isinstance(choice, str) else \
            type(value) is type(choice)
        if same_kind and value == choice:
            return choice
    words = [repr(c) for c in choices]
    expected = words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"
    return errs.add("literal_error", loc, f"Input should be {expected}", value,
                    expected=expected)


def _list(item: Any, value: Any, loc: Loc, errs: _Errors) -> Any:
    if not isinstance(value, list):
        return errs.add("list_type", loc, "Input should be a valid list", value)
    out = [_typed(item, v, (*loc, i), errs, None) for i, v in enumerate(value)]
    return _FAIL if any(v is _FAIL for v in out) else out


def _dict(item: Any, value: Any, loc: Loc, errs: _Errors) -> Any:
    if not isinstance(value, dict):
        return errs.add("dict_type", loc, "Input should be a valid dictionary", value)
    out = {}
    for key, v in value.items():
        if not isinstance(key, str):  # reported, and its value still checked (as pydantic)
            out[key] = errs.add("string_type", (*loc, key, "[key]"),
                                "Input should be a valid string", key)
        checked = _typed(item, v, (*loc, key), errs, None)
        out[key] = _FAIL if out.get(key) is _FAIL else checked
    return _FAIL if any(v is _FAIL for v in out.values()) else out


def _scalar(kind: Any, value: Any, loc: Loc, errs: _Errors) -> Any:
    """Strict scalars: an exact type, except that a number field takes an integer."""
    is_bool = isinstance(value, bool)
    if kind is int:
        if isinstance(value, int) and not is_bool:
            return int(value)  # an IntEnum member becomes its number, as in pydantic
        return errs.add("int_type", loc, "Input should be a valid integer", value)
    if kind is float:
        # pydantic's strict float also takes a Decimal (no YAML or JSON value is one).
        if isinstance(value, int | float | Decimal) and not is_bool:
            try:
                number = float(value)
            except (OverflowError, ValueError):  # past float's range, a signalling NaN
                return errs.add("float_type", loc, "Input should be a valid number", value)
            if not math.isfinite(number):
                return errs.add("finite_number", loc, "Input should be a finite number", value)
            return number
        return errs.add("float_type", loc, "Input should be a valid number", value)
    if kind is bool:
        return value if is_bool else errs.add("bool_type", loc,
                                              "Input should be a valid boolean", value)
    if kind is str:
        if not isinstance(value, str):
            return errs.add("string_type", loc, "Input should be a valid string", value)
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:  # a lone surrogate, possible only from JSON
                return errs.add("string_unicode", loc, "Input should be a valid string, unable "
                                "to parse raw data as a unicode string", value)
        return value
    if kind is Decimal:
        if not isinstance(value, Decimal):
            return errs.add("is_instance_of", loc, "Input should be an instance of Decimal",
                            value, **{"class": "Decimal"})
        if not value.is_finite():
            return errs.add("finite_number", loc, "Input should be a finite number", value)
        return value
    raise TypeError(f"schema: no rule for fields of type {kind!r}")


_BOUNDS = (("gt", "greater_than", "greater than", lambda v, b: v > b),
           ("ge", "greater_than_equal", "greater than or equal to", lambda v, b: v >= b),
           ("lt", "less_than", "less than", lambda v, b: v < b),
           ("le", "less_than_equal", "less than or equal to", lambda v, b: v <= b))


def _bounded(out: Any, value: Any, loc: Loc, errs: _Errors, bounds: FieldInfo | None) -> Any:
    """`out` (already type-checked) within the field's bounds, length and pattern."""
    if out is _FAIL or bounds is None:
        return out
    if isinstance(out, list):
        n = bounds.min_length
        if n is not None and len(out) < n:
            return errs.add("too_short", loc, f"List should have at least {n} item"
                            f"{'s' if n != 1 else ''} after validation, not {len(out)}",
                            value, field_type="List", min_length=n, actual_length=len(out))
        return out
    if isinstance(out, str):
        n = bounds.min_length
        if n is not None and len(out) < n:
            return errs.add("string_too_short", loc, f"String should have at least {n} "
                            f"character{'s' if n != 1 else ''}", value, min_length=n)
        if bounds._regex is not None and bounds._regex.search(out) is None:
            return errs.add("string_pattern_mismatch", loc, f"String should match pattern "
                            f"'{bounds.pattern}'", value, pattern=bounds.pattern)
        return out
    for attr, kind, words, ok in _BOUNDS:
        bound = getattr(bounds, attr)
        if bound is not None and not ok(out, bound):
            shown = int(bound) if isinstance(bound, float) and bound.is_integer() else bound
            if isinstance(out, float):
                bound = float(bound)  # pydantic's errors carry a float field's bounds as floats
            return errs.add(kind, loc, f"Input should be {words} {shown}", value,
                            **{attr: bound})
    return out


def _rust_dollars(pattern: str) -> str:
    """`pattern` with each `$` anchor made `\\Z`: the end of the text only.

    pydantic matches with Rust's regex, where `$` is the end of the text; Python's `$`
    also matches before a final newline, which would let "name\\n" through. Escaped
    dollars and those in a character class are literal in both and left alone.
    """
    out, i, in_class = [], 0, False
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if in_class:
            in_class = ch != "]" or out[-1] == "["
        elif ch == "[":
            in_class = True
        elif ch == "$":
            ch = "\\Z"
        out.append(ch)
        i += 1
    return "".join(out)
