"""The simulated cloud's spot market: seeded availability traces replayed per GPU model.

A `SpotMarket` is a regime of spot_regimes.yaml (calm, bursty, heavy: each modelled on
published AWS traces, with the statistics it matches), a seed and a time scale. Each GPU
model gets its own trace (providers/spottrace.py), drawn from the regime with a seed derived
from the market's seed and the GPU's name, so every process that opens the same market sees
the same trace. Trace hour 0 is the market's `origin` (an epoch kept in
`<state_dir>/spot_market.json`, written once: a worker, `orch reconcile` and the process that
created an instance agree on when spot is gone). `seconds_per_hour` scales it: at 3.6 a
trace hour passes in 3.6 s, so a bench runs a day of the market in under 90 s. The trace
repeats every `horizon_h` hours.

What the simulated cloud does with it (compute.py): while a GPU's spot is gone its
interruptible offers are not listed and renting one is refused as out of capacity; a spot
instance rented while it can be had is preempted when that availability ends (the same
watchdog as `preempt_after_s`, whichever comes first). On-demand offers are never
preempted and always listed.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import zlib
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

from providers import spottrace
from providers.base import CapacityError, Offer
from providers.datacache import read_yaml

_DATA = Path(__file__).resolve().parent / "spot_regimes.yaml"
ORIGIN_FILE = "spot_market.json"


@dataclass(frozen=True)
class RegimeSpec:
    """A regime as spot_regimes.yaml documents it: the model, and what it was matched to."""

    name: str
    regime: spottrace.Regime
    modelled_on: str
    files: tuple[str, ...]  # in skypilot-org/spot-traces
    matched: dict[str, float]


@cache
def regimes() -> dict[str, RegimeSpec]:
    """The documented regimes, by name."""
    raw: dict[str, Any] = read_yaml(_DATA)["regimes"]
    found = {}
    for name, spec in raw.items():
        regime = spottrace.Regime(name, spottrace.Spell(**spec["lifetime"]),
                                  spottrace.Spell(**spec["wait"]))
        found[name] = RegimeSpec(name, regime, str(spec["modelled_on"]), tuple(spec["files"]),
                                 {k: float(v) for k, v in spec["matched"].items()})
    return found


def regime(name: str) -> spottrace.Regime:
    """The regime called `name`; ValueError naming the known ones otherwise."""
    known = regimes()
    if name not in known:
        raise ValueError(f"sim: unknown spot regime {name!r} (known: {', '.join(known)})")
    return known[name].regime


@dataclass(frozen=True)
class SpotMarket:
    """A regime replayed from `origin` (an epoch), `seconds_per_hour` wall seconds per hour."""

    regime: spottrace.Regime
    seed: int
    origin: float
    seconds_per_hour: float = 3600.0
    horizon_h: float = 24.0 * 365

    def __post_init__(self) -> None:
        if not self.seconds_per_hour > 0 or not self.horizon_h > 0:
            raise ValueError("sim: a spot market needs seconds_per_hour > 0 and horizon_h > 0")

    def hour(self, epoch: float) -> float:
        """The trace hour at `epoch`."""
        return ((epoch - self.origin) / self.seconds_per_hour) % self.horizon_h

    def trace(self, gpu: str) -> spottrace.SpotTrace:
        """`gpu`'s trace (the same in every process)."""
        return _trace(self.regime, gpu_seed(self.seed, gpu), self.horizon_h)

    def available(self, gpu: str, epoch: float) -> bool:
        """Whether a spot `gpu` can be rented at `epoch`."""
        return self.trace(gpu).available(self.hour(epoch))

    def preempted_at(self, gpu: str, epoch: float) -> float | None:
        """The epoch a spot `gpu` rented at `epoch` is preempted (None: it cannot be rented)."""
        hour = self.hour(epoch)
        ends = self.trace(gpu).preempted_at(hour)
        return None if ends is None else epoch + (ends - hour) * self.seconds_per_hour


def gpu_seed(seed: int, gpu: str) -> int:
    """A GPU's trace seed: stable across processes (unlike `hash`)."""
    return zlib.crc32(f"{seed}:{gpu}".encode())


@lru_cache(maxsize=64)
def _trace(regime: spottrace.Regime, seed: int, horizon_h: float) -> spottrace.SpotTrace:
    return spottrace.generate(regime, seed, horizon_h)


def open_market(state_dir: Path, name: str, seed: int, seconds_per_hour: float,
                now: float) -> SpotMarket:
    """The market `name`/`seed` of the simulated cloud at `state_dir`, its origin shared.

    The first process to open it writes `now` as its origin; the others read it. Opening
    another regime or seed starts it afresh.
    """
    path = Path(state_dir) / ORIGIN_FILE
    key = {"regime": name, "seed": seed, "seconds_per_hour": seconds_per_hour}
    with contextlib.suppress(FileNotFoundError, ValueError, KeyError, TypeError):
        saved = json.loads(path.read_text())
        if {k: saved[k] for k in key} == key and math.isfinite(float(saved["origin"])):
            return SpotMarket(regime(name), seed, float(saved["origin"]), seconds_per_hour)
    market = SpotMarket(regime(name), seed, now, seconds_per_hour)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({**key, "origin": now}))
    os.replace(tmp, path)
    return market


def can_rent(market: SpotMarket | None, offer: Offer, now: float) -> bool:
    """Whether `offer` can be rented now (an on-demand one always can)."""
    return market is None or not offer.interruptible or market.available(offer.gpu, now)


def preempt_at(market: SpotMarket | None, after_s: float | None, offer: Offer,
               now: float) -> float | None:
    """When an instance of `offer` rented `now` is preempted (None: never); CapacityError
    when its spot cannot be had now. `after_s` is the cloud's fixed `preempt_after_s`."""
    if not offer.interruptible:
        return None
    ends = [now + after_s] if after_s is not None else []
    if market is not None:
        at = market.preempted_at(offer.gpu, now)
        if at is None:
            raise CapacityError(f"sim: no spot {offer.gpu} to be had now (the {market.regime.name}"
                                " market); try another offer or on-demand")
        ends.append(at)
    return min(ends) if ends else None
