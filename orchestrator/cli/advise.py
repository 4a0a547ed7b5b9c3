"""Rent monthly or pay per second? Advice from the history's usage (pure, Decimal money).

`advise()` takes plain values: metered GPU-hours per GPU class with what they were charged,
the registered monthly servers with the hours jobs used them, and monthly / hourly prices.
It says, per GPU class, whether a monthly server would have been cheaper (with the
break-even utilisation and the projected monthly saving) and, the other way round, which
registered servers sit idle below break-even and what giving them up would save. Usage in
the window is projected to a 730-hour month (pricing.HOURS_PER_MONTH).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from orchestrator.cli.tables import table
from orchestrator.core.money import (
    HOURS_PER_MONTH,
    breakeven_hours,
    cheapest_hourly,
    dollars,
    money,
    per_gpu_hour,
    usd,
)
from providers import catalog

_HOURS = Decimal("0.01")
_RATIO = Decimal("0.0001")


def hours(seconds: int) -> Decimal:
    """Seconds as hours, exact to the second's fraction (no float)."""
    return Decimal(int(seconds)) / 3600


@dataclass(frozen=True)
class MeteredUsage:
    """Per-second/per-minute GPU-hours of one GPU class in the window and their charge."""

    gpu: str
    gpu_hours: Decimal
    charged: Decimal


@dataclass(frozen=True)
class ServerUsage:
    """A registered monthly server and how long jobs held it in the window."""

    name: str
    gpu: str
    gpu_count: int
    monthly_price: Decimal
    used_hours: Decimal
    # Hours of the window it was registered for (the window, or less for a new server).
    available_hours: Decimal


@dataclass(frozen=True)
class MonthlyOption:
    """A monthly server one could rent for a GPU class."""

    gpu: str
    gpu_count: int
    monthly_price: Decimal
    source: str  # "registered server NAME" or "catalog dedicated-host 1xH100"


@dataclass(frozen=True)
class HourlyPrice:
    """What a GPU-hour of a class costs per second/minute instead (per GPU)."""

    per_gpu_hour: Decimal
    source: str


@dataclass(frozen=True)
class GpuAdvice:
    """Verdict for one GPU class that ran on metered instances."""

    gpu: str
    gpu_hours: Decimal
    projected_gpu_hours: Decimal  # per 730-hour month
    rate: Decimal  # average charged $ per GPU-hour
    metered_per_month: Decimal
    option: MonthlyOption | None
    breakeven_gpu_hours: Decimal | None  # GPU-hours a month at which one server pays off
    breakeven_utilisation: Decimal | None  # of the server's GPUs, 24/7 = 1
    servers_needed: int | None
    monthly_per_month: Decimal | None
    saving_per_month: Decimal | None  # > 0: renting monthly would have saved this
    verdict: str  # "rent monthly" | "stay per-second" | "no monthly price"


@dataclass(frozen=True)
class ServerAdvice:
    """Verdict for one registered monthly server."""

    name: str
    gpu: str
    gpu_count: int
    monthly_price: Decimal
    used_hours: Decimal
    utilisation: Decimal
    hourly: HourlyPrice | None
    breakeven_hours: Decimal | None
    breakeven_utilisation: Decimal | None
    metered_per_month: Decimal | None  # the month's projected use at the hourly price
    saving_per_month: Decimal | None  # > 0: giving it up would have saved this
    verdict: str  # "keep" | "give up" | "no hourly price" | "unused"


@dataclass(frozen=True)
class Advice:
    """Everything `orch advise` says."""

    days: int
    gpus: tuple[GpuAdvice, ...]
    servers: tuple[ServerAdvice, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: Decimals become exact strings."""
        def plain(v: Any) -> Any:
            if isinstance(v, Decimal):
                return str(v)
            if isinstance(v, dict):
                return {k: plain(x) for k, x in v.items()}
            return v

        return {"days": self.days, "hours_per_month": str(HOURS_PER_MONTH),
                "gpus": [plain(asdict(g)) for g in self.gpus],
                "servers": [plain(asdict(s)) for s in self.servers]}


def _q(value: Decimal, step: Decimal = _HOURS) -> Decimal:
    return value.quantize(step, rounding=ROUND_HALF_UP)


def advise(metered: Sequence[MeteredUsage], servers: Sequence[ServerUsage],
           monthly: Mapping[str, MonthlyOption], hourly: Mapping[str, HourlyPrice],
           days: int) -> Advice:
    """Per GPU class: would monthly have been cheaper; per server: is it worth its rent.

    `monthly` is the catalog's monthly option per GPU class; a registered server of the
    class takes precedence (its price is what the user actually pays). `hourly` is the
    catalog's per-second price a server's hours would cost instead; the window's own
    charged rate for the class takes precedence over it.
    """
    if days < 1:
        raise ValueError(f"days must be >= 1 (got {days})")
    per_month = HOURS_PER_MONTH / (Decimal(days) * 24)
    options = dict(monthly)
    for s in sorted(servers, key=lambda s: s.monthly_price / s.gpu_count, reverse=True):
        # Cheapest registered server per GPU wins (sorted so it is written last).
        options[s.gpu] = MonthlyOption(s.gpu, s.gpu_count, s.monthly_price,
                                       f"registered server {s.name}")
    gpus = tuple(_gpu_advice(u, options.get(u.gpu), per_month)
                 for u in sorted(metered, key=lambda u: u.charged, reverse=True)
                 if u.gpu_hours > 0)
    # A server's hours are priced at what the same GPU class was charged per second in the
    # window when it ran there (the user's real price), else at the catalog's.
    prices = dict(hourly)
    for u in metered:
        if u.gpu_hours > 0 and u.charged > 0:
            prices[u.gpu] = HourlyPrice(money(u.charged / u.gpu_hours),
                                        f"charged per second in the last {days} days")
    return Advice(days, gpus, tuple(_server_advice(s, prices.get(s.gpu), per_month)
                                    for s in servers))


def _gpu_advice(u: MeteredUsage, option: MonthlyOption | None,
                per_month: Decimal) -> GpuAdvice:
    projected = u.gpu_hours * per_month
    rate = u.charged / u.gpu_hours
    metered_month = money(u.charged * per_month)
    if option is None or rate <= 0:
        return GpuAdvice(u.gpu, _q(u.gpu_hours), _q(projected), money(rate), metered_month,
                         option, None, None, None, None, None, "no monthly price")
    # A server of n GPUs offers n × 730 GPU-hours a month; whole servers only.
    capacity = HOURS_PER_MONTH * option.gpu_count
    needed = max(1, math.ceil(projected / capacity))
    monthly_month = money(option.monthly_price * needed)
    saving = metered_month - monthly_month
    be = breakeven_hours(option.monthly_price, rate)  # GPU-hours for one server
    return GpuAdvice(
        u.gpu, _q(u.gpu_hours), _q(projected), money(rate), metered_month, option, be,
        _q(be / capacity, _RATIO), needed, monthly_month, money(saving),
        "rent monthly" if saving > 0 else "stay per-second")


def _server_advice(s: ServerUsage, price: HourlyPrice | None,
                   per_month: Decimal) -> ServerAdvice:
    window = s.available_hours
    util = _q(s.used_hours / window, _RATIO) if window > 0 else Decimal(0)
    if price is None:
        return ServerAdvice(s.name, s.gpu, s.gpu_count, s.monthly_price, _q(s.used_hours),
                            util, None, None, None, None, None, "no hourly price")
    machine_rate = price.per_gpu_hour * s.gpu_count
    # Projected over the part of the window it was registered for.
    projected = s.used_hours * HOURS_PER_MONTH / window if window > 0 else Decimal(0)
    metered_month = money(projected * machine_rate)
    saving = money(s.monthly_price - metered_month)
    be = breakeven_hours(s.monthly_price, machine_rate)
    be_util = _q(be / HOURS_PER_MONTH, _RATIO)
    if s.used_hours == 0:
        verdict = "unused"
    else:
        verdict = "give up" if saving > 0 else "keep"
    return ServerAdvice(s.name, s.gpu, s.gpu_count, s.monthly_price, _q(s.used_hours), util,
                        price, be, be_util, metered_month, saving, verdict)


# --- prices from the catalog (the edge; advise() itself takes plain values) -----------------


def catalog_monthly() -> dict[str, MonthlyOption]:
    """Cheapest priced monthly catalog tier per GPU class (by price per GPU)."""
    best: dict[str, MonthlyOption] = {}
    for o in catalog.load().offers:
        if o.billing.value != "monthly" or o.monthly_price is None or o.registered:
            continue
        cand = MonthlyOption(o.gpu, o.gpu_count, o.monthly_price,
                             f"catalog {o.provider} {o.offer_id}")
        cur = best.get(o.gpu)
        if cur is None or cand.monthly_price / cand.gpu_count < cur.monthly_price / cur.gpu_count:
            best[o.gpu] = cand
    return best


def catalog_hourly() -> dict[str, HourlyPrice]:
    """Cheapest per-second price per GPU-hour by class: on-demand, else spot (said so)."""
    # On-demand first: a dedicated server is not interruptible, so spot is a fallback.
    return {gpu: HourlyPrice(per_gpu_hour(o), f"catalog {o.provider} "
                             f"{'spot' if o.interruptible else 'on-demand'}")
            for gpu, o in cheapest_hourly(catalog.load().offers).items()}


# --- text --------------------------------------------------------------------------------


def _pct(ratio: Decimal | None) -> str:
    return "-" if ratio is None else f"{ratio * 100:.1f}%"


def render_lines(a: Advice) -> list[str]:
    """The advice as lines for the terminal."""
    out = [f"Last {a.days} days, projected to a {HOURS_PER_MONTH}-hour month.", ""]
    if a.gpus:
        out.append("Per-second GPU use: would a monthly server have been cheaper?")
        out.append(table(
            ["GPU", "GPU-h", "GPU-h/month", "$/GPU-h", "per-second/month", "monthly option",
             "break-even", "verdict", "saving/month"],
            [[g.gpu, g.gpu_hours, g.projected_gpu_hours, usd(g.rate), usd(g.metered_per_month),
              "-" if g.option is None else
              f"{g.servers_needed} x {usd(g.option.monthly_price)} ({g.option.source})",
              "-" if g.breakeven_gpu_hours is None else
              f"{g.breakeven_gpu_hours} GPU-h ({_pct(g.breakeven_utilisation)})",
              g.verdict, "-" if g.saving_per_month is None or g.saving_per_month <= 0
              else usd(g.saving_per_month)] for g in a.gpus],
            right=[1, 2, 3, 4, 8]))
        missing = sorted(g.gpu for g in a.gpus if g.option is None)
        if missing:
            out.append(f"  no monthly price for {', '.join(missing)}: register a server you "
                       "could rent with `orch servers add ... --monthly PRICE` to compare")
        out.append("  (spot hours compare an interruptible price with a dedicated server's)")
    else:
        out.append("No per-second GPU use in the window.")
    out.append("")
    if a.servers:
        out.append("Registered monthly servers: worth their rent?")
        out.append(table(
            ["server", "GPU", "monthly", "used h", "utilisation", "break-even", "verdict",
             "saving/month if given up"],
            [[s.name, f"{s.gpu} x{s.gpu_count}", usd(s.monthly_price), s.used_hours,
              _pct(s.utilisation),
              "-" if s.breakeven_hours is None else
              f"{s.breakeven_hours} h ({_pct(s.breakeven_utilisation)})", s.verdict,
              "-" if s.saving_per_month is None or s.saving_per_month <= 0
              else usd(s.saving_per_month)] for s in a.servers],
            right=[2, 3, 4, 7]))
        for s in a.servers:
            if s.hourly is not None and s.verdict in ("give up", "unused"):
                out.append(f"  {s.name}: below break-even; the same hours at "
                           f"{usd(s.hourly.per_gpu_hour)}/GPU-h ({s.hourly.source}) would "
                           f"cost {usd(s.metered_per_month)} a month instead of "
                           f"{usd(s.monthly_price)}")
            elif s.hourly is None:
                out.append(f"  {s.name}: no per-second price for {s.gpu} in the catalog; "
                           "cannot compare")
    else:
        out.append("No registered monthly servers.")
    return out


# Re-exported for `cli_history` (which reads them through this module): `money` holds them.
__all__ = [
    "Advice", "GpuAdvice", "HourlyPrice", "MeteredUsage", "MonthlyOption", "ServerAdvice",
    "ServerUsage", "advise", "catalog_hourly", "catalog_monthly", "dollars",
    "hours", "render_lines",
]
