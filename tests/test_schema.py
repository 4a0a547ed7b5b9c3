"""orchestrator.core.schema against pydantic, rule by rule, and the files' recorded hashes.

The job and sweep files' models left pydantic for `orch plan`'s start-up (issue 11 §4);
their errors must still read as pydantic's (spec._describe translates pydantic's error types)
and their output must hash as before, or every recorded sweep would run again.
Each rule the job file uses is declared twice below, once per library, and both must give
the same values, the same dumps and the same errors for every value in VALUES.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import pickle
from decimal import Decimal
from enum import IntEnum, StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

import pydantic
import pytest
import yaml

from orchestrator.core import schema
from orchestrator.core.spec import JobSpec, spec_hash, to_decimal
from orchestrator.records.sweeps import SweepSpec, load_sweep

ROOT = Path(__file__).resolve().parent.parent


def _not_x(value: str) -> str:
    if value == "x":
        raise ValueError("x is refused")
    return value


def _auto_bool(value: Any) -> Any:
    if value == "auto" or isinstance(value, bool):
        return value
    raise ValueError(f"must be auto, true or false (got {value!r})")


def _wrap(value: Any) -> Any:
    return [str(value)] if isinstance(value, str | int) and not isinstance(value, bool) else value


NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


class _Kind(StrEnum):
    A = "a"


class _Num(IntEnum):
    FIVE = 5


class _Text(str):
    pass

# --- the same rules in both libraries ----------------------------------------------------


class PInner(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", strict=True, frozen=True,
                                       allow_inf_nan=False)
    size: int = pydantic.Field(gt=0, le=100)
    label: str = "a"

    @pydantic.model_validator(mode="before")
    @classmethod
    def _from_int(cls, value: Any) -> Any:
        return {"size": value} if isinstance(value, int) and not isinstance(value, bool) \
            else value

    @pydantic.model_validator(mode="after")
    def _not_both(self) -> PInner:
        if self.size == 13 and self.label == "a":
            raise ValueError("13 needs a label")
        return self


class PAll(pydantic.BaseModel):
    model_config = PInner.model_config
    count: int = pydantic.Field(default=4, gt=0, le=1000)
    maybe: int | None = pydantic.Field(default=None, ge=1, le=8)
    rate: float = pydantic.Field(default=1, gt=0, lt=1)
    share: float = pydantic.Field(default=0.2, ge=0, le=1)
    flag: bool = True
    name: str = pydantic.Field(default="n", pattern=NAME)
    text: str = pydantic.Field(default="t", min_length=1)
    kind: Literal["a", "b", "c"] = "a"
    auto: Annotated[Literal["auto"] | bool, pydantic.BeforeValidator(_auto_bool)] = "auto"
    names: Annotated[list[str] | None, pydantic.BeforeValidator(_wrap)] = None
    tags: list[Annotated[str, pydantic.Field(pattern=NAME)]] | None = pydantic.Field(
        default=None, min_length=1)
    extra: dict[str, Any] = pydantic.Field(default_factory=dict)
    money: Annotated[Decimal, pydantic.BeforeValidator(to_decimal),
                     pydantic.Field(gt=0, le=10**9)] | None = None
    inner: PInner | None = None
    checked: str = "ok"

    @pydantic.field_validator("checked")
    @classmethod
    def _checked(cls, value: str) -> str:
        return _not_x(value)


class SInner(schema.Model):
    size: int = schema.Field(gt=0, le=100)
    label: str = "a"

    @classmethod
    def _prepare(cls, value: Any) -> Any:
        return {"size": value} if isinstance(value, int) and not isinstance(value, bool) \
            else value

    def _check(self) -> None:
        if self.size == 13 and self.label == "a":
            raise ValueError("13 needs a label")


class SAll(schema.Model):
    count: int = schema.Field(default=4, gt=0, le=1000)
    maybe: int | None = schema.Field(default=None, ge=1, le=8)
    rate: float = schema.Field(default=1, gt=0, lt=1)
    share: float = schema.Field(default=0.2, ge=0, le=1)
    flag: bool = True
    name: str = schema.Field(default="n", pattern=NAME)
    text: str = schema.Field(default="t", min_length=1)
    kind: Literal["a", "b", "c"] = "a"
    auto: Annotated[Literal["auto"] | bool, schema.Before(_auto_bool)] = "auto"
    names: Annotated[list[str] | None, schema.Before(_wrap)] = None
    tags: list[Annotated[str, schema.Field(pattern=NAME)]] | None = schema.Field(
        default=None, min_length=1)
    extra: dict[str, Any] = schema.Field(default_factory=dict)
    money: Annotated[Decimal, schema.Before(to_decimal),
                     schema.Field(gt=0, le=10**9)] | None = None
    inner: SInner | None = None
    checked: Annotated[str, schema.After(_not_x)] = "ok"


VALUES: list[Any] = [
    None, True, False, 0, 1, 7, 13, 101, 1000, 1001, -1, 2**63, 10**400, 0.0, 0.5, 1.0, 2.0,
    -0.5, 1e300, float("nan"), float("inf"), Decimal("0.5"), "", "x", "a", "b", "auto", "n",
    "0.074", "-1", "1e-3", "abc\n", "a b", "ok", "9" * 70, [], ["x"], ["a", "b"], [1], [None],
    ["a b"], ("a",), {}, {"size": 5}, {"size": 13}, {"size": 13, "label": "z"},
    {"size": "5"}, {"size": 5, "zzz": 1}, {1: 2}, {1: {"size": 0}}, {"a": {"b": [1, 2]}},
    {"a": float("inf")}, Decimal("12.50"), Decimal("NaN"), Decimal("Infinity"),
    Decimal("sNaN"), _Kind.A, _Num.FIVE, _Text("a"),
    # YAML gives dates, timestamps and !!binary in free-form values (trainer.extra, grids).
    dt.date(2024, 1, 1), dt.datetime(2024, 1, 1, 10, 0), b"hi",
    dt.datetime(2024, 1, 1, 10, 0, tzinfo=dt.UTC), {"a": dt.date(2024, 1, 1)},
    {"a": (1, 2)}, {"a": {1: 2, "b": 3}}, {"a": {None: 1, True: 2, 1.5: 3}}, {"a": b"x"},
]


def _outcome(model: Any, errors: type[Exception], data: dict[str, Any]) -> Any:
    try:
        built = model.model_validate(data)
    except errors as exc:
        # The twins' names differ by their first letter (PInner, SInner); messages name them.
        return "invalid", [(e["type"], tuple(e["loc"]), e["msg"].replace("PInner", "SInner"),
                            repr(e["input"]), repr(e.get("ctx")).replace("PInner", "SInner"))
                           for e in exc.errors()]  # type: ignore[attr-defined]
    return ("valid", built.model_dump(), built.model_dump(mode="json"),
            json.loads(built.model_dump_json()), sorted(built.model_fields_set))


@pytest.mark.parametrize("key", list(PAll.model_fields))
def test_every_rule_validates_and_fails_as_pydantic_does(key: str) -> None:
    differ = []
    for value in VALUES:
        data = {key: value}
        want = _outcome(PAll, pydantic.ValidationError, data)
        got = _outcome(SAll, schema.ValidationError, data)
        if want != got:
            differ.append((value, want, got))
    assert not differ, differ[:3]


@pytest.mark.parametrize("data", [
    {}, {"zzz": 1, "count": "x"}, {1: 1}, {"inner": {}}, {"inner": {"label": 3}},
    {"count": 0, "rate": 2, "tags": [], "inner": 500},
])
def test_missing_unknown_and_several_problems_at_once(data: dict[Any, Any]) -> None:
    assert _outcome(SAll, schema.ValidationError, data) == \
        _outcome(PAll, pydantic.ValidationError, data)


def test_models_are_frozen_compared_by_value_and_built_by_keyword() -> None:
    one = SAll.model_validate({"count": 5, "inner": 7})
    assert one == SAll(count=5, inner=SInner(size=7)) and one != SAll(count=6)
    assert one.model_fields_set == {"count", "inner"}
    with pytest.raises(schema.ValidationError, match="Instance is frozen"):
        one.count = 6  # type: ignore[misc]
    assert hash(SInner(size=3)) == hash(SInner(size=3))  # hashable by value, as pydantic's
    with pytest.raises(schema.ValidationError, match="count"):
        SAll(count="5")  # type: ignore[arg-type]


def test_an_unknown_field_type_is_refused_when_the_model_is_used() -> None:
    class Odd(schema.Model):
        when: complex = 1j

    with pytest.raises(TypeError, match="no rule"):
        Odd.model_validate({"when": 2j})


# Recorded with the pydantic models these replaced (orchestrator/core/spec.py as of f30cbd6):
# sweeps skip a run whose spec hash is recorded, so a changed hash would run paid work again.
PYDANTIC_HASHES = {
    "full-32b": "f0997eac70f370454c966c4c9f21ea2ea7303aabe3d43e376e41e332eae376ed",
    "lora-14b": "34d332fd089db3d40d709664542f69ac4234f2074d1bd52c6c812f73e2ef7112",
    "qlora-70b": "c865b1c6b1de69c49a63b9bb8bfe2ac58849334c70dd0cb3de4e327582c2ecf8",
    "qlora-8b": "ba33d65279bf41b13be06a1372f1bbc1688493c95f0a4ae59885291b03aca199",
    "quickstart": "8c47225aabe6673e371119ae467754cf0bb54bc161efff3eb4f42a1d46a3abec",
}


@pytest.mark.parametrize("example", sorted(PYDANTIC_HASHES))
def test_spec_hashes_are_those_the_pydantic_models_gave(example: str) -> None:
    raw = yaml.safe_load((ROOT / "examples" / f"{example}.yml").read_text())
    spec = JobSpec.model_validate(raw)
    assert spec_hash(spec) == PYDANTIC_HASHES[example]
    again = JobSpec.model_validate(json.loads(spec.model_dump_json()))  # as the engine reloads it
    assert again == spec and spec_hash(again) == PYDANTIC_HASHES[example]


def test_the_sweep_file_is_recorded_as_the_pydantic_models_recorded_it() -> None:
    # The `sweep` table's spec_json of examples/sweep-lr.yml as the pydantic SweepSpec wrote
    # it (sha256), and a random section's, which nests a model in a mapping and aliases `int`.
    loaded = load_sweep(ROOT / "examples" / "sweep-lr.yml")
    digest = hashlib.sha256(loaded.spec_json.encode()).hexdigest()
    assert digest == "38f718470ade8881d63571d2a81aab017065db0486610575dd54228a7401f982"
    spec = SweepSpec.model_validate({
        "name": "s", "base": "b.yml", "budget": "12.5", "random": {"n": 3, "seed": 7, "params": {
            "training.learning_rate": {"loguniform": [1e-5, 1e-3]}, "lora.r": {"int": [8, 64]},
            "training.epochs": {"choice": [1, 2.5]}}}})
    assert json.dumps(spec.model_dump(mode="json", by_alias=True), sort_keys=True,
                      separators=(",", ":")) == (
        '{"base":"b.yml","budget":"12.5","grid":{},"max_parallel":4,"name":"s","objective":null,'
        '"random":{"n":3,"params":{"lora.r":{"choice":null,"int":[8,64],"loguniform":null,'
        '"uniform":null},"training.epochs":{"choice":[1,2.5],"int":null,"loguniform":null,'
        '"uniform":null},"training.learning_rate":{"choice":null,"int":null,'
        '"loguniform":[1e-05,0.001],"uniform":null}},"seed":7}}')


def test_defaults_are_fresh_and_subclasses_may_retype_a_field() -> None:
    class Base(schema.Model):
        xs: list[int] = []
        x: int = 1

    class Retyped(Base):
        x: str = "a"  # type: ignore[assignment]  # mypy refuses it; the class allows it

    first = Base()
    first.xs.append(1)
    assert Base().xs == [] and Retyped(x="b").x == "b"
    with pytest.raises(schema.ValidationError, match="valid string"):
        Retyped(x=2)  # type: ignore[arg-type]


def test_validation_errors_pickle() -> None:
    with pytest.raises(schema.ValidationError) as info:
        SAll.model_validate({"count": "x"})
    again = pickle.loads(pickle.dumps(info.value))
    assert again.errors() == info.value.errors() and str(again) == str(info.value)


@pytest.mark.parametrize(("pattern", "text"), [
    (r"^b|^a$", "b\n"), (r"cost\$", "cost$ x"), (r"^[]$]x$", "$x"), (r"^[]$]x$", "$x\n"),
    (NAME, "name\n"), (NAME, "name"),
])
def test_patterns_anchor_as_rust_regex_does(pattern: str, text: str) -> None:
    class P(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(strict=True)
        s: str = pydantic.Field(pattern=pattern)

    class S(schema.Model):
        s: str = schema.Field(pattern=pattern)

    assert _outcome(S, schema.ValidationError, {"s": text}) == \
        _outcome(P, pydantic.ValidationError, {"s": text})
