"""Live offers for what the CLI shows (`orch offers`, `orch plan`), asked within a time bound.

The engine asks providers itself (`placement`, with its outage bookkeeping); a command that
only shows the market must answer promptly even when a provider does not: each configured
cloud is asked in its own thread, with the adapters' short HTTP settings
(`runnable.QUICK_HTTP`), and whatever has not answered by the deadline is left out with a
note saying so. Offers of GPUs orch does not plan are counted and named, never dropped
silently (`providers.base.ReportsSkipped`); so are the rows an adapter refused as invalid
(`providers.base.ReportsRejected`: a NaN or negative price, a string for a number). A
provider whose answer is unusable (`BadAnswer`: not JSON, too large, nested too deep, the
wrong shape) is left out with a note like one that did not answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from orchestrator.core.settings import settings
from orchestrator.engine.runnable import QUICK_HTTP, cloud_keys
from providers import catalog
from providers.answers import clean
from providers.base import (
    Offer,
    Provider,
    ProviderError,
    ReportsRejected,
    ReportsSkipped,
    Requirements,
)

DEADLINE_S = 15.0  # the whole search; a provider slower than this is left out


@dataclass(frozen=True)
class Market:
    """What a search saw: offers, the providers that answered, notes on the others."""

    offers: tuple[Offer, ...] = ()
    answered: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    # provider -> its GPU name -> offers skipped (a GPU orch does not plan)
    skipped: Mapping[str, Mapping[str, int]] = field(default_factory=dict)


def cloud(name: str, key: str, quick: bool = False) -> Provider:
    """The adapter of cloud `name` with API key `key`; its base URL from `ORCH_<NAME>_URL`
    when set (emulators); `quick`: short HTTP timeouts and few retries."""
    url = settings().api_url(name)
    kwargs: dict[str, Any] = {"base_url": url} if url else {}
    if quick:
        kwargs.update(QUICK_HTTP)
    if name == "vastai":
        from providers.vastai.compute import VastAI

        return VastAI(key, **kwargs)
    from providers.runpod.compute import RunPod

    return RunPod(key, **kwargs)


def clouds(named: Sequence[str] | None = None) -> tuple[dict[str, Provider], list[str]]:
    """The clouds with credentials here (quick HTTP settings), limited to `named` (None:
    all), and notes on those without a key."""
    keys, notes = cloud_keys()
    return {name: cloud(name, key, quick=True) for name, key in keys.items()
            if named is None or name in named}, notes


def _ask(provider: Provider, reqs: Sequence[Requirements]) -> tuple[list[Offer], dict[str, int],
                                                                    dict[str, int]]:
    offers: list[Offer] = []
    skipped: dict[str, int] = {}
    rejected: dict[str, int] = {}
    for req in reqs:
        offers += provider.offers(req)
        if isinstance(provider, ReportsSkipped):
            for name, n in provider.skipped.items():
                skipped[name] = skipped.get(name, 0) + n
        if isinstance(provider, ReportsRejected):
            for why, n in provider.rejected.items():
                rejected[why] = rejected.get(why, 0) + n
    return offers, skipped, rejected


def rejected_note(provider: str, rejected: Mapping[str, int]) -> str:
    """One line saying how many rows of `provider`'s answers were invalid, and why."""
    total = sum(rejected.values())
    parts = [f"{clean(why)} (x{n})" for why, n in sorted(rejected.items())]
    return (f"{provider}: {total} offer{'s' if total != 1 else ''} left out, invalid in the "
            f"provider's answer: " + "; ".join(parts[:3])
            + (f"; and {len(parts) - 3} more kinds" if len(parts) > 3 else ""))


def safe_names(skipped: Mapping[str, int]) -> dict[str, int]:
    """`skipped` with every provider-named GPU made safe to print (no control characters)."""
    safe: dict[str, int] = {}
    for name, n in skipped.items():
        key = clean(name, 100)
        safe[key] = safe.get(key, 0) + n
    return safe


def search(providers: Mapping[str, Provider], reqs: Sequence[Requirements],
           deadline_s: float = DEADLINE_S) -> Market:
    """Every provider's offers for each of `reqs`, all asked at once, within `deadline_s`."""
    if not providers:
        return Market()
    pool = ThreadPoolExecutor(max_workers=len(providers), thread_name_prefix="orch-market")
    futures = {name: pool.submit(_ask, p, reqs) for name, p in sorted(providers.items())}
    wait(futures.values(), timeout=deadline_s)
    pool.shutdown(wait=False, cancel_futures=True)
    offers: list[Offer] = []
    answered: list[str] = []
    notes: list[str] = []
    skipped: dict[str, dict[str, int]] = {}
    for name, fut in futures.items():
        if not fut.done():
            notes.append(f"{name}: no answer within {deadline_s:g} s; left out")
            continue
        try:
            found, skipped_here, rejected = fut.result()
        except ProviderError as exc:
            notes.append(f"{name}: offers unavailable ({clean(str(exc), 600)})")
            continue
        if skipped_here:
            skipped[name] = safe_names(skipped_here)
            notes.append(catalog.skipped_note(name, skipped[name]))
        if rejected and not found:  # what it offers is unknown: as if it did not answer
            notes.append(f"{name}: offers unavailable (no usable offer; "
                         f"{rejected_note(name, rejected)})")
            continue
        if rejected:
            notes.append(rejected_note(name, rejected))
        answered.append(name)
        # A Vast.ai machine's spot and on-demand offers share an id: both are kept.
        offers += {(o.offer_id, o.gpu_count, o.interruptible): o for o in found}.values()
    return Market(tuple(offers), tuple(answered), tuple(notes), skipped)
