"""The cheapest placement over thousands of offers in well under a millisecond (pure).

`scheduler.rank` prices every offer: right for `orch plan`, which shows them all, but
linear in the market. Offers differ mostly in price, so an `OfferBook` groups metered
offers by what sizing depends on (GPU model, count, per-GPU memory, host RAM) and keeps each
group sorted by price, once per market. `best` then sizes and times the job once per group
and walks each group cheapest first, stopping as soon as a lower bound on the next offer's
cost (price × the group's training hours plus its least overhead) exceeds the best exact
cost found. The answer is the same placement as `scheduler.rank(...).chosen` (property test
in tests/test_offerbook.py); only the work differs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal

from orchestrator.core import savers, throughput
from orchestrator.core.scheduler import Constraints, Placement, constraint_failure, priced, timed
from orchestrator.core.sizing import MemoryEstimate, Workload
from providers.base import Billing, GpuSpec, Offer

# Relative slack on the float lower bound: float sums may differ from the exact Decimal
# cost in the last bits; pruning must never skip an offer that could tie the best.
_SLACK = 1e-9
# Exact costs round to micro-dollars (half up): at most this far below price × hours.
_ROUNDING = 1e-6


@dataclass(frozen=True)
class _Group:
    gpu: str
    gpu_count: int
    gpu_memory_bytes: int
    ram_bytes: int | None
    offers: tuple[Offer, ...]  # metered, cheapest first
    prices: tuple[float, ...]
    min_boot_h: float
    max_pull_gbps: float


@dataclass(frozen=True)
class OfferBook:
    """A market indexed for `best`: built once, used for any number of jobs."""

    groups: tuple[_Group, ...]
    others: tuple[Offer, ...]  # monthly and registered offers: priced one by one

    @classmethod
    def of(cls, offers: Iterable[Offer]) -> OfferBook:
        by_key: dict[tuple[str, int, int, int | None], list[Offer]] = {}
        others = []
        for o in offers:
            if o.billing is Billing.MONTHLY or o.price_per_hour is None:
                others.append(o)
                continue
            by_key.setdefault((o.gpu, o.gpu_count, o.gpu_memory_bytes, o.ram_bytes),
                              []).append(o)
        groups = []
        for (gpu, count, mem, ram), members in by_key.items():
            members.sort(key=lambda o: (o.price_per_hour, o.offer_id))
            groups.append(_Group(
                gpu, count, mem, ram, tuple(members),
                tuple(float(o.price_per_hour or 0) for o in members),
                min(o.boot_minutes for o in members) / 60,
                max(o.pull_gbps for o in members)))
        return cls(tuple(groups), tuple(others))


def best(
    w: Workload,
    tokens: int,
    book: OfferBook,
    gpus: Mapping[str, GpuSpec],
    constraints: Constraints = Constraints(),
    cached_on: frozenset[str] = frozenset(),
    measured: Mapping[throughput.MeasuredKey, throughput.Measured] | None = None,
) -> Placement | None:
    """The placement `scheduler.rank` would rank first, or None when nothing is feasible."""
    search = _Search(w, tokens, gpus, constraints, cached_on, measured)
    for offer in book.others:
        if constraint_failure(offer, constraints) is None:
            gpu = gpus[offer.gpu]
            est = search.fit(offer, gpu)
            if est is not None:
                search.consider(offer, est, gpu)
    bound = float("inf")
    for first, hours, g, est, gpu in search.walks(book):
        if first * (1 - _SLACK) - _ROUNDING > bound:
            break  # every later group starts dearer still
        for price, offer in zip(g.prices, g.offers, strict=True):
            if price * hours * (1 - _SLACK) - _ROUNDING > bound:
                break
            if constraint_failure(offer, constraints) is not None:
                continue
            cost = search.consider(offer, est, gpu)
            if cost is not None and cost < bound:
                bound = cost
    return search.winner


class _Search:
    """One job's walk over a book: the layouts, fits and durations it has worked out so
    far, and the best placement found."""

    def __init__(self, w: Workload, tokens: int, gpus: Mapping[str, GpuSpec],
                 c: Constraints, cached_on: frozenset[str],
                 measured: Mapping[throughput.MeasuredKey, throughput.Measured] | None,
                 ) -> None:
        self.w, self.tokens, self.gpus, self.c = w, tokens, gpus, c
        self.cached_on, self.measured = cached_on, measured
        self.layouts: dict[tuple[object, ...], tuple[savers.Layout, ...]] = {}
        self.fits: dict[tuple[object, ...], MemoryEstimate | None] = {}
        self.times: dict[tuple[object, ...], throughput.Duration] = {}
        self.winner: Placement | None = None
        self.winner_key: tuple[Decimal, float, str, str, int] | None = None

    def fit(self, offer: Offer, gpu: GpuSpec) -> MemoryEstimate | None:
        """The first layout (savers included) that fits `offer`, worked out once per shape."""
        key = (offer.gpu_count, offer.gpu_memory_bytes, offer.ram_bytes, gpu.scaling)
        if key not in self.fits:
            lkey = (offer.gpu_count, gpu.scaling)
            if lkey not in self.layouts:
                self.layouts[lkey] = savers.layouts(self.w, offer.gpu_count, gpu.scaling)
            self.fits[key] = savers.first_fit(self.layouts[lkey], offer.gpu_memory_bytes,
                                              offer.ram_bytes)
        return self.fits[key]

    def consider(self, offer: Offer, est: MemoryEstimate, gpu: GpuSpec) -> float | None:
        """Price `offer` exactly; keep it if it beats the winner; its cost as a float."""
        dur = timed(self.w, self.tokens, offer, gpu, est, self.cached_on, self.measured,
                    self.times)
        placed = priced(offer, est, dur, self.c)
        if isinstance(placed, str):
            return None
        key = placed.sort_key()
        if self.winner_key is None or key < self.winner_key:
            self.winner, self.winner_key = placed, key
        return float(placed.est_cost)

    def walks(self, book: OfferBook) -> list[tuple[float, float, _Group, MemoryEstimate,
                                                     GpuSpec]]:
        """The groups the job fits, each with a lower bound on its cheapest offer's cost
        and on its hours, cheapest bound first.

        A group's least possible hours: training (the same for all its offers) plus the
        smallest boot and pull any of its offers has, plus merge and eval.
        """
        w, c = self.w, self.c
        model_bits = throughput.model_download_bytes(w) * 8
        # Seconds to pull the model per Gbit/s of link (0 if any host has it: a lower
        # bound), and the merge + eval after training (throughput.duration's terms).
        pull_bits = 0.0 if self.cached_on else model_bits / 1e9
        after = throughput.merge_eval_seconds(w)
        trains: dict[tuple[str, int, int], float] = {}
        walks = []
        for g in book.groups:
            if g.gpu_count > c.max_gpus or (c.gpu_count is not None
                                            and g.gpu_count != c.gpu_count):
                continue
            if c.gpus is not None and g.gpu not in c.gpus:
                continue
            gpu = self.gpus[g.gpu]
            est = self.fit(g.offers[0], gpu)
            if est is None:
                continue
            tkey = (g.gpu, g.gpu_count, id(est))  # est objects outlive the search: ids safe
            train = trains.get(tkey)
            if train is None:
                train = trains[tkey] = training_hours(g.gpu, g.gpu_count, est, gpu, w,
                                                      self.tokens, self.measured)
            dur = g.min_boot_h + train + (pull_bits / g.max_pull_gbps + after) / 3600
            walks.append((g.prices[0] * dur, dur, g, est, gpu))
        walks.sort(key=lambda x: x[0])
        return walks


def training_hours(name: str, count: int, est: MemoryEstimate, gpu: GpuSpec, w: Workload,
                   tokens: int,
                   measured: Mapping[throughput.MeasuredKey, throughput.Measured] | None,
                   ) -> float:
    """Training hours on `count` x `gpu` (a learned rate where one is known), as duration."""
    learned = measured.get(throughput.measured_key(w, name, count)) if measured else None
    use = learned if learned is not None and learned.tokens_per_s > 0 else None
    return throughput.training_seconds(est.workload or w, tokens, gpu, count, est.strategy,
                                       use.tokens_per_s if use else None) / 3600
