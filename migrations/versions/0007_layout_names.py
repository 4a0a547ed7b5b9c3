"""Honest layout names in recorded plans: the DeepSpeed ZeRO-3 layouts were called FSDP.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03

Every plan orch records (`job.placement_json`, the `orch plan --json` object) names its
layout in `strategy` keys: `$.placement.strategy`, `$.estimate.strategy` and each
`$.alternatives[*].strategy`. Up to 0006 the layouts rendered as DeepSpeed ZeRO-3 were
stored as `fsdp` and `fsdp+offload`, and the one-GPU ZeRO-3 offload as `offload`; now that
orch also renders real FSDP2 (`fsdp2`, `fsdp2_offload`) those names would lie. This rewrites
them to `zero3` and `zero3_offload`, so a query filtering on the layout finds old and new
jobs under one name. The JSON is rewritten in Python, the same way on SQLite and
PostgreSQL, in the canonical form orch writes (sorted keys, no spaces).

Downgrade writes the old names back (`zero3_offload` on one GPU is `offload` again); the
FSDP2 layouts had no old name and stay as they are.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen here (not imported from orchestrator.core.sizing): a migration must keep meaning
# what it meant when it was written.
NEW_NAMES = {"fsdp": "zero3", "fsdp+offload": "zero3_offload", "offload": "zero3_offload"}


def _old_name(entry: dict[str, Any]) -> str | None:
    """The pre-0007 name of `entry`'s strategy, or None when it has none."""
    name = entry.get("strategy")
    if name == "zero3":
        return "fsdp"
    if name == "zero3_offload":
        return "offload" if entry.get("gpu_count") == 1 else "fsdp+offload"
    return None


def _rename(value: Any, rename: Callable[[dict[str, Any]], str | None]) -> Any:
    """`value` with every dict's `strategy` replaced where `rename` gives a new one."""
    if isinstance(value, list):
        return [_rename(item, rename) for item in value]
    if not isinstance(value, dict):
        return value
    out = {key: _rename(item, rename) for key, item in value.items()}
    new = rename(out)
    if new is not None:
        out["strategy"] = new
    return out


def _rewrite(rename: Callable[[dict[str, Any]], str | None], pattern: str) -> None:
    """Apply `rename` to every job whose placement_json mentions `pattern`."""
    conn = op.get_bind()
    rows = conn.execute(sa.text("SELECT id, placement_json FROM job "
                                "WHERE placement_json LIKE :p"), {"p": f"%{pattern}%"}).all()
    for job_id, text in rows:
        try:
            data = json.loads(text)
        except ValueError:
            continue  # not orch's JSON: leave it for a person to look at
        new = json.dumps(_rename(data, rename), sort_keys=True, separators=(",", ":"),
                         allow_nan=False)
        if new != text:
            conn.execute(sa.text("UPDATE job SET placement_json = :t WHERE id = :i"),
                         {"t": new, "i": job_id})


def upgrade() -> None:
    """fsdp -> zero3, fsdp+offload and offload -> zero3_offload in every recorded plan."""
    # Both old spellings that need a change contain "fsdp" or "offload".
    for pattern in ("fsdp", "offload"):
        _rewrite(lambda entry: NEW_NAMES.get(str(entry.get("strategy"))), pattern)


def downgrade() -> None:
    """zero3 -> fsdp, zero3_offload -> fsdp+offload (offload on one GPU)."""
    _rewrite(_old_name, "zero3")
