"""Durations a job file writes as text (`resources.keep_warm: 15m`), as whole seconds."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator, Field

# The longest `resources.keep_warm` window: a machine kept longer than a day waiting for a
# job is a server, and a monthly one (`orch servers add`) costs less than a day-long idle
# rental.
MAX_WARM_S = 24 * 3600
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(s|m|h)?")
_UNIT_S = {"s": 1, "m": 60, "h": 3600}


def to_seconds(value: Any) -> Any:
    """`90`, `90s`, `15m`, `1.5h` -> whole seconds; anything else is left to the type check."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        match = _DURATION.fullmatch(value.strip())
        if match is None:
            raise ValueError(f"must be a duration such as 90s, 15m or 1h (got {value!r})")
        value = float(match.group(1)) * _UNIT_S[match.group(2) or "s"]
    if isinstance(value, int | float):
        if value > MAX_WARM_S:
            raise ValueError(f"is at most 24h ({MAX_WARM_S} s; got {value:g} s): a machine "
                             "kept longer is cheaper as a monthly server (`orch servers add`)")
        if value == value:  # not NaN: the range check below reports negatives
            return int(round(value))
    return value


WarmWindow = Annotated[int, BeforeValidator(to_seconds, json_schema_input_type=int | str),
                       Field(ge=0, le=MAX_WARM_S)]
