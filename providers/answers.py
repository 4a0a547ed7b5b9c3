"""What every provider adapter checks at its edge: a provider's answer is input, not truth.

Each adapter parses its API's JSON with pydantic models of the fields orch reads
(`providers/<name>/answers.py`), built from the types here:

- numbers are finite and bounded: `Price` is $0 to `MAX_PRICE_PER_HOUR` an hour, so NaN,
  Infinity, `1e999999`, a negative price or a string that is not a number is refused;
- anything a provider names (a GPU, a region, a label, a status message, an error text) is
  `Text` or `Name`: control characters are removed (C0 and C1 controls, DEL, and Unicode
  format characters such as bidi overrides), so no escape sequence of a provider's reaches
  the user's terminal, and it is cut to a bounded length;
- what orch hands to ssh is checked against what a host name or a login can be (`Host`,
  `Login`): never an option such as `-oProxyCommand=…`.

`parse` turns a whole answer into its model or raises `BadAnswer` naming the field that broke
(JSON nested deeper than pydantic's parser allows is refused there too); `rows` validates a
list row by row, keeping the good rows and counting the bad ones by field and problem, so
one bad offer never hides the others. Fields an instance only carries for display or as a
hint are `lenient`: a bad value reads as absent, so one odd field never makes a machine orch
pays for invisible (its id stays strict). How much of an answer is read at all is capped
where it is read (`providers.http.MAX_ANSWER_BYTES`).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable
from decimal import Decimal
from typing import Annotated, Any, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
)

from providers.base import BadAnswer

# No rental sells for more than this per machine-hour (the dearest 8-GPU machines list
# around $50/h): a larger figure is a broken answer, never a price to plan or bill with.
MAX_PRICE_PER_HOUR = Decimal(1000)
MAX_GPUS = 64  # GPUs in one machine (the largest sold have 8 or 16)
TEXT_LIMIT = 300  # characters kept of a provider's message
NAME_LIMIT = 100  # characters kept of a provider's name for something

# Unicode categories never shown: controls, format characters (bidi overrides, zero-width),
# surrogates, private use, unassigned, line and paragraph separators.
_HIDDEN = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
_SPACES = frozenset("\t\n\r\v\f")


def clean(text: str, limit: int = TEXT_LIMIT) -> str:
    """`text` without control or format characters (whitespace controls become spaces),
    at most `limit` characters: safe to print on a terminal."""
    out = []
    for ch in text[:limit * 4]:
        if ch in _SPACES:
            out.append(" ")
        elif unicodedata.category(ch) not in _HIDDEN:
            out.append(ch)
    return "".join(out).strip()[:limit]


def _name(text: str) -> str:
    return clean(text, NAME_LIMIT)


def _not_option(text: str) -> str:
    if text.startswith("-"):
        raise ValueError("must not start with '-'")
    return text


def _strip(value: Any) -> Any:
    return value.strip() if isinstance(value, str) else value


def _as_text(value: Any) -> Any:
    """An id a provider may send as a number or a string, as a string."""
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


def _none_on_error(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    try:
        return handler(value)
    except ValidationError:
        return None


Text = Annotated[str, AfterValidator(clean)]
Name = Annotated[str, AfterValidator(_name)]
Price = Annotated[Decimal, Field(ge=0, le=MAX_PRICE_PER_HOUR, allow_inf_nan=False)]
GpuCount = Annotated[int, Field(ge=0, le=MAX_GPUS)]
Port = Annotated[int, Field(ge=1, le=65535)]
# A host name, IPv4 or IPv6 address: what ssh may be pointed at.
Host = Annotated[str, BeforeValidator(_strip),
                 Field(pattern=r"^[A-Za-z0-9_.:%\[\]-]{1,253}$"), AfterValidator(_not_option)]
Login = Annotated[str, Field(pattern=r"^[a-z_][a-z0-9_.-]{0,31}$")]
# An instance id (Vast sends integers, RunPod strings): one URL path segment.
InstanceId = Annotated[str, BeforeValidator(_as_text), Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]

# An opaque token a provider may send as a number or a string (a page cursor), as text.
Token = Annotated[str, BeforeValidator(_as_text), AfterValidator(_name)]

T = TypeVar("T")
# `Lenient[int]`: an int, or None where the value is absent or not a valid int.
Lenient = Annotated[T | None, WrapValidator(_none_on_error)]


class Answer(BaseModel):
    """A provider's JSON object: the fields orch reads, checked; every other field ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)


M = TypeVar("M", bound=BaseModel)


def problems(exc: ValidationError, most: int = 3, count_rest: bool = True) -> str:
    """`field: problem` for the first `most` errors of `exc`, without the offending input
    (a provider's text never reaches a message unchecked); `count_rest`: say how many more."""
    parts = []
    for err in exc.errors(include_input=False, include_url=False)[:most]:
        where = ".".join(str(p) for p in err["loc"]) or "the answer"
        parts.append(f"{where}: {err['msg']}")
    more = exc.error_count() - most if count_rest else 0
    return clean("; ".join(parts) + (f"; and {more} more" if more > 0 else ""), 2 * TEXT_LIMIT)


def parse(model: type[M], body: bytes | str, what: str) -> M:
    """The answer `body` (JSON text) as `model`; BadAnswer naming the field otherwise."""
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise BadAnswer(f"{what}: the answer is not what the API documents "
                        f"({problems(exc)})") from None


def check(model: type[M], value: Any, what: str) -> M:
    """An already parsed part of an answer as `model`; BadAnswer naming the field otherwise."""
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        raise BadAnswer(f"{what}: the answer is not what the API documents "
                        f"({problems(exc)})") from None


def rows(model: type[M], items: Iterable[Any]) -> tuple[list[M], dict[str, int]]:
    """The items that are valid `model`s, and the others counted by `field: problem`."""
    good: list[M] = []
    bad: dict[str, int] = {}
    for item in items:
        try:
            good.append(model.model_validate(item))
        except ValidationError as exc:
            reason = problems(exc, most=1, count_rest=False)
            bad[reason] = bad.get(reason, 0) + 1
    return good, bad


def merge(into: dict[str, int], more: dict[str, int]) -> None:
    """Add the counts of `more` to `into`."""
    for key, n in more.items():
        into[key] = into.get(key, 0) + n
