"""Old home of the billing math, now in `orchestrator.money`; re-exported for callers not yet moved.

Kept only until the remaining `from orchestrator.pricing import ...` / `pricing.X` call sites
(engine, scheduler, offerbook, planning, the CLI modules) import `orchestrator.money`.
"""

from __future__ import annotations

from orchestrator.money import (
    HOURS_PER_MONTH,
    MICRO,
    amortised_share,
    breakeven_hours,
    effective_hourly,
    job_cost,
    metered_cost,
    money,
    monthly_beats_hourly,
    months_committed,
    usd,
)

__all__ = [
    "HOURS_PER_MONTH", "MICRO", "amortised_share", "breakeven_hours", "effective_hourly",
    "job_cost", "metered_cost", "money", "monthly_beats_hourly", "months_committed", "usd",
]
