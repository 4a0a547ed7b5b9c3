"""Billing math in Decimal: per-second, per-minute, monthly amortisation, break-even (pure)."""

from __future__ import annotations

import math
from decimal import ROUND_HALF_UP, Decimal

from providers.base import Billing, Offer

# 8,760 hours a year / 12: the "24/7" month the seed's $3.00/h figure uses.
HOURS_PER_MONTH = Decimal(730)
MICRO = Decimal("0.000001")


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


def effective_hourly(monthly_price: Decimal, hours_used: float | Decimal) -> Decimal:
    """$/h a monthly rent works out to when used `hours_used` hours in the month."""
    h = _hours(hours_used)
    if h == 0:
        raise ValueError("hours_used must be > 0")
    return money(monthly_price / h)


def breakeven_hours(monthly_price: Decimal, hourly_price: Decimal) -> Decimal:
    """Hours of use a month above which renting monthly beats paying by the hour."""
    if hourly_price <= 0:
        raise ValueError("hourly_price must be > 0")
    return (monthly_price / hourly_price).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)


def monthly_beats_hourly(
    monthly_price: Decimal, hourly_price: Decimal, hours_per_month: float | Decimal
) -> bool:
    """True when `hours_per_month` of use cost more by the hour than the monthly rent."""
    return hourly_price * _hours(hours_per_month) > monthly_price


def usd(value: Decimal | str | None) -> str:
    """Dollars for people: cents from $1 up, four decimals below (spot rates are $0.074/h)."""
    if value is None:
        return "-"
    d = Decimal(str(value))
    return f"${d:,.2f}" if abs(d) >= 1 else f"${d:.4f}"
