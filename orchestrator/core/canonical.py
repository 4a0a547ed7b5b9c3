"""orch's canonical form of validated file data, and the identities hashed over it.

A job's spec hash decides what a sweep skips (a recorded hash is work already paid for),
so it must not depend on how a library happens to write its output. The canonical form is
defined here, over plain values (what `model_dump(mode="python")` returns):

- mappings: keys are strings, written sorted; lists and tuples: lists in order;
- `None`, `True`, `False`: `null`, `true`, `false`;
- integers: decimal digits; floats: Python's shortest round-trip spelling (`0.0002`,
  `1e-05`), a non-finite float (only possible in free-form values) as `null`;
- `Decimal` (money): its own string (`Decimal("12.5")` -> `"12.5"`), so no binary float
  ever rounds a price;
- dates and times: ISO 8601 strings (`2026-12-03`, `2026-12-03T07:17:44Z` for UTC), bytes:
  UTF-8 text (both only in free-form values such as `trainer.extra`);
- JSON text without spaces (`,` and `:`), ASCII only (`\\u00e9`).

These are the spellings pydantic's JSON mode gave when the hashes were first recorded, so
recorded hashes stay valid (tests/test_canonical.py pins the examples' hashes and a sweep
record's, and checks the form against pydantic's dump for generated specs), but the form no
longer follows any library: a serializer change upstream cannot change an identity.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
from collections.abc import Mapping
from decimal import Decimal
from typing import Any


def plain(value: Any) -> Any:
    """`value` as JSON-ready plain data in the canonical spellings above."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, dict):
        return {_key(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, dt.datetime):
        text = value.isoformat()
        return text[:-6] + "Z" if text.endswith("+00:00") else text
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    raise TypeError(f"no canonical form for {type(value).__name__}")


def _key(key: Any) -> str:
    # JSON keys are strings; YAML may type a free-form key as a number or boolean.
    if isinstance(key, str):
        return key
    if isinstance(key, bool) or key is None:
        return json.dumps(key)
    if isinstance(key, int | float):
        return json.dumps(plain(key))
    return str(plain(key))


def without_defaults(data: dict[str, Any],
                     defaults: Mapping[tuple[str, ...], object]) -> dict[str, Any]:
    """`data` without the fields at `defaults`' paths that hold the given default value.

    For fields added after identities were first recorded: at their default they are left
    out of the hashed form, so every recorded hash stays the identity of the same thing.
    """
    out = dict(data)
    for path, default in defaults.items():
        parent = out
        for key in path[:-1]:
            if not isinstance(parent.get(key), dict):
                break
            parent[key] = dict(parent[key])
            parent = parent[key]
        else:
            if path[-1] in parent and parent[path[-1]] == default:
                del parent[path[-1]]
    return out


def leaves(data: Any, at: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    """Nested mappings' values by their key path (a list, or anything not a mapping, is one
    value): what two versions of a file are compared over, field by field."""
    if not isinstance(data, Mapping):
        return {at: data}
    out: dict[tuple[str, ...], Any] = {}
    for key, value in data.items():
        out.update(leaves(value, (*at, key)))
    return out


def dumps(value: Any) -> str:
    """The canonical JSON text of `value`."""
    return json.dumps(plain(value), sort_keys=True, separators=(",", ":"), allow_nan=False)


def digest(value: Any) -> str:
    """sha256 (hex) of the canonical JSON text of `value`."""
    return hashlib.sha256(dumps(value).encode()).hexdigest()
