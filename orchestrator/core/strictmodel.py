"""The base of the job and sweep files' pydantic models (its own module so that the file
models can live in several modules: `spec.py`, `outputspec.py`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    """Base of the file models: unknown keys refused, no coercion, immutable."""

    # inf and nan are never a meaningful setting; refused like any other bad number.
    # validate_default: a default is stored as its field's type (`epochs` 1 as 1.0), so a
    # key spelled out with its default value has the same canonical form, and spec hash.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False,
                              validate_default=True)
