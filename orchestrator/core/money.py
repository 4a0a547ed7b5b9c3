"""Money in one place (pure): micro-dollars, billing, instance cost, offer prices.

Money is integer micro-dollars in the database and Decimal dollars in computations; floats
never carry money. Billing math follows each provider's granularity: per-second and
per-minute metered billing round the used time up to the unit; a monthly rental commits whole
24/7 months of HOURS_PER_MONTH hours. The catalog look-ups at the end are the one edge here:
they read the offer catalog (YAML) lazily so importing this module stays cheap.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import datetime
from decimal import ROUND_HALF_EVEN, ROUND_HALF_UP, Decimal
from typing import Protocol

from providers.base import Billing, Offer

# 8,760 hours a year / 12: the "24/7" month the seed's $3.00/h figure uses.
HOURS_PER_MONTH = Decimal(730)
MICRO = Decimal("0.000001")
MICROS_PER_DOLLAR = 1_000_000
_MICROS = Decimal(MICROS_PER_DOLLAR)
METERED: tuple[str, ...] = ("per_second", "per_minute")


class MoneyError(ValueError):
    """An amount that cannot be stored as micro-dollars (not finite, or finer than one)."""


# --- micro-dollars ---------------------------------------------------------------------------


def to_micros(amount: Decimal | int, *, rounding: str | None = None) -> int:
    """Convert dollars to integer micro-dollars, exactly unless `rounding` is given.

    Floats are refused (TypeError): a float has already lost the cents. Without
    `rounding`, an amount finer than a micro-dollar is an error rather than silently
    rounded; pass e.g. `decimal.ROUND_HALF_EVEN` for computed estimates.
    """
    if isinstance(amount, bool) or not isinstance(amount, (Decimal, int)):
        raise TypeError(f"money must be a Decimal or int, not {type(amount).__name__}")
    value = Decimal(amount) * _MICROS
    if not value.is_finite():
        raise MoneyError(f"money must be a finite amount (got {amount})")
    integral = value.to_integral_value(rounding=rounding or ROUND_HALF_EVEN)
    if rounding is None and integral != value:
        raise MoneyError(
            f"{amount} dollars is finer than one micro-dollar; round it to 6 decimal places first"
        )
    return int(integral)


def from_micros(micros: int) -> Decimal:
    """Convert integer micro-dollars to exact Decimal dollars (6 decimal places)."""
    if isinstance(micros, bool) or not isinstance(micros, int):
        raise TypeError(f"micro-dollars must be an int, not {type(micros).__name__}")
    return Decimal(micros).scaleb(-6)


def dollars(micros: int) -> Decimal:
    """A micro-dollar column value (int, or what a driver hands back) as Decimal dollars."""
    return from_micros(int(micros))


def dollars_text(micros: int | None) -> str | None:
    """Micro-dollars as the exact dollar text of JSON outputs (`"1.500000"`); None stays None."""
    return None if micros is None else str(dollars(micros))


def dollars_trimmed(micros: int) -> Decimal:
    """Micro-dollars as Decimal dollars without trailing zeros (`1500`, `1.5`).

    The form `orch plan` has always shown for servers read with sqlite3 (it reaches plan
    JSON through `str(monthly_price)`), kept so that output does not change.
    """
    return Decimal(int(micros)) / MICROS_PER_DOLLAR


def hourly_cost_micros(price_per_hour: Decimal, seconds: int) -> int:
    """`seconds` at `price_per_hour` dollars, rounded once to a micro-dollar (half even)."""
    return int((price_per_hour * _MICROS * seconds / 3600).to_integral_value(ROUND_HALF_EVEN))


def accrued_micros(price_micros_seconds: int) -> int:
    """Σ price_per_hour_micros × seconds (summed in SQL) as micro-dollars, rounded once."""
    return int((Decimal(int(price_micros_seconds)) / 3600).to_integral_value(ROUND_HALF_EVEN))


def hours_between(start: datetime, end: datetime) -> Decimal:
    """Hours from `start` to `end` as an exact Decimal, never negative."""
    return max(Decimal(0), Decimal(str((end - start).total_seconds())) / 3600)


# --- billing ---------------------------------------------------------------------------------


def money(value: Decimal) -> Decimal:
    """Round to micro-dollars, the unit the database stores."""
    return value.quantize(MICRO, rounding=ROUND_HALF_UP)


def _hours(hours: float | Decimal) -> Decimal:
    if isinstance(hours, float):
        if not math.isfinite(hours) or hours < 0:
            raise ValueError(f"hours must be finite and >= 0 (got {hours})")
        return Decimal(repr(hours))
    if hours < 0:
        raise ValueError(f"hours must be >= 0 (got {hours})")
    return hours


def metered_cost(price_per_hour: Decimal, hours: float | Decimal, billing: Billing) -> Decimal:
    """What a metered provider charges for `hours` of use at `price_per_hour`."""
    h = _hours(hours)
    if billing is Billing.PER_SECOND:
        units, per_hour = (h * 3600).to_integral_value(rounding="ROUND_CEILING"), 3600
    elif billing is Billing.PER_MINUTE:
        units, per_hour = (h * 60).to_integral_value(rounding="ROUND_CEILING"), 60
    else:
        raise ValueError(f"{billing} is not metered")
    return money(price_per_hour * units / per_hour)


def months_committed(hours: float | Decimal) -> int:
    """Whole months a new monthly rental must cover for a job of `hours`."""
    return max(1, math.ceil(_hours(hours) / HOURS_PER_MONTH))


def amortised_share(monthly_price: Decimal, hours: float | Decimal) -> Decimal:
    """The share of a month's rent that `hours` of use represent (24/7 basis)."""
    return money(monthly_price * _hours(hours) / HOURS_PER_MONTH)


def job_cost(offer: Offer, hours: float | Decimal) -> Decimal:
    """Marginal cost of running `hours` on `offer`.

    A server the user already rents costs nothing more; renting a new monthly server
    commits whole months; metered offers bill what is used at their granularity.
    """
    if offer.billing is Billing.MONTHLY:
        if offer.registered:
            return Decimal("0.000000")
        assert offer.monthly_price is not None
        return money(offer.monthly_price * months_committed(hours))
    assert offer.price_per_hour is not None
    return metered_cost(offer.price_per_hour, hours, offer.billing)


def breakeven_hours(monthly_price: Decimal, hourly_price: Decimal) -> Decimal:
    """Hours of use a month above which renting monthly beats paying by the hour."""
    if hourly_price <= 0:
        raise ValueError("hourly_price must be > 0")
    return (monthly_price / hourly_price).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)


class CostedInstance(Protocol):
    """The instance-row columns its cost depends on (a `store.Instance`)."""

    created_at: datetime
    terminated_at: datetime | None
    price_per_hour_micros: int
    billing: str


def instance_cost(row: CostedInstance, until: datetime) -> tuple[Decimal, Decimal]:
    """(charged, amortised) for an instance row from create to terminate (or `until`)."""
    end = row.terminated_at or until
    hours = hours_between(row.created_at, end)
    price = from_micros(row.price_per_hour_micros)
    billing = Billing(row.billing)
    if billing is Billing.MONTHLY:
        # price_per_hour of a monthly server row holds its monthly rent / 730.
        return Decimal(0), money(price * hours)
    return metered_cost(price, hours, billing), Decimal(0)


def idle_micros(price_per_hour_micros: int, billing: str, since: datetime,
                until: datetime) -> int:
    """What a machine kept warm cost while idle from `since` to `until`, billed as the
    provider meters it (per second or per started minute), in micro-dollars: one rule for
    the store's record (`warm_instance.idle_micros`) and `orch cost`/`orch warm`'s reading
    of a window still open."""
    hours = hours_between(since, max(until, since))
    return to_micros(metered_cost(from_micros(price_per_hour_micros), hours, Billing(billing)))


# --- display ---------------------------------------------------------------------------------


def usd(value: Decimal | str | None) -> str:
    """Dollars for people: cents from $1 up, four decimals below (spot rates are $0.074/h),
    rounded half up (away from zero: $1.005 is $1.01), the rule of the SQL in
    docs/schema.md (SQLite's printf and round, PostgreSQL's round and to_char)."""
    if value is None:
        return "-"
    d = Decimal(str(value))
    places = Decimal("0.01") if abs(d) >= 1 else Decimal("0.0001")
    d = d.quantize(places, rounding=ROUND_HALF_UP)
    return f"${d:,.2f}" if abs(d) >= 1 else f"${d:.4f}"


# --- prices of offers ---------------------------------------------------------------------


def cheapest_hourly(offers: Iterable[Offer]) -> dict[str, Offer]:
    """Per GPU class, the metered offer with the lowest price per GPU-hour, on-demand first.

    Spot offers win only for a GPU class no on-demand offer prices; ties keep the first.
    """
    best: dict[str, tuple[bool, Decimal, Offer]] = {}
    for o in offers:
        if o.billing.value not in METERED or o.price_per_hour is None:
            continue
        key = (o.interruptible, o.price_per_hour / o.gpu_count)
        if o.gpu not in best or key < best[o.gpu][:2]:
            best[o.gpu] = (*key, o)
    return {gpu: o for gpu, (_, _, o) in best.items()}


def per_gpu_hour(offer: Offer) -> Decimal:
    """A metered offer's price per GPU-hour."""
    assert offer.price_per_hour is not None
    return offer.price_per_hour / offer.gpu_count
