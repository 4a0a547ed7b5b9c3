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

import bisect
import heapq
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import NamedTuple

from orchestrator.core import savers, throughput
from orchestrator.core.evalsizing import EvalWork
from orchestrator.core.scheduler import (
    Constraints,
    Extras,
    Placement,
    constraint_failure,
    priced,
    timed,
)
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
    index: int  # its place in the book: a stable tie-break
    # The cheapest price times the least boot, and over the fastest pull: the parts of the
    # group's cheap bound that no job changes (`_Search.walks`).
    boot_cost: float
    pull_cost: float


@dataclass(frozen=True)
class _Model:
    """The groups of one (GPU, count), what training time depends on besides the layout,
    with each part of their cheap bound at its least over the groups: the least of those
    parts together bounds every group's cheap bound from below, so a job prices its groups
    only once the model is reached (`_Search.walks`)."""

    gpu: str
    gpu_count: int
    groups: tuple[_Group, ...]
    boot_cost: float
    pull_cost: float
    price: float


class OfferBook(NamedTuple):
    """A market indexed for `best`: built once, used for any number of jobs."""

    groups: tuple[_Group, ...]
    others: tuple[Offer, ...]  # monthly and registered offers: priced one by one
    models: tuple[_Model, ...] = ()

    @classmethod
    def of(cls, offers: Iterable[Offer], alone: Iterable[Offer] = ()) -> OfferBook:
        """The book of `offers`; those in `alone` (machines kept warm: no boot, maybe the
        model cached) are priced one by one, outside the groups whose bounds they would
        loosen for every other offer."""
        by_key: dict[tuple[str, int, int, int | None], list[Offer]] = {}
        others = []
        single = {o.offer_id for o in alone}
        for o in offers:
            if o.billing is Billing.MONTHLY or o.price_per_hour is None or o.offer_id in single:
                others.append(o)
                continue
            by_key.setdefault((o.gpu, o.gpu_count, o.gpu_memory_bytes, o.ram_bytes),
                              []).append(o)
        groups: list[_Group] = []
        by_model: dict[tuple[str, int], list[_Group]] = {}
        for (gpu, count, mem, ram), members in by_key.items():
            members.sort(key=lambda o: (o.price_per_hour, o.offer_id))
            prices = tuple(float(o.price_per_hour or 0) for o in members)
            boot_h = min(o.boot_minutes for o in members) / 60
            pull = max(o.pull_gbps for o in members)
            g = _Group(gpu, count, mem, ram, tuple(members), prices, boot_h, pull,
                       len(groups), prices[0] * boot_h, prices[0] / pull)
            groups.append(g)
            by_model.setdefault((gpu, count), []).append(g)
        models = tuple(
            _Model(gpu, count, tuple(gs), min(g.boot_cost for g in gs),
                   min(g.pull_cost for g in gs), min(g.prices[0] for g in gs))
            for (gpu, count), gs in by_model.items())
        return cls(tuple(groups), tuple(others), models)


def best(
    w: Workload,
    tokens: int,
    book: OfferBook,
    gpus: Mapping[str, GpuSpec],
    constraints: Constraints = Constraints(),
    cached_on: frozenset[str] = frozenset(),
    measured: Mapping[throughput.MeasuredKey, throughput.Measured] | None = None,
    evaluation: EvalWork | None = None,
    extras: Extras = Extras(),
) -> Placement | None:
    """The placement `scheduler.rank` would rank first, or None when nothing is feasible."""
    found = top(w, tokens, book, gpus, 1, constraints, cached_on, measured, evaluation, extras)
    return found[0] if found else None


def top(
    w: Workload,
    tokens: int,
    book: OfferBook,
    gpus: Mapping[str, GpuSpec],
    k: int,
    constraints: Constraints = Constraints(),
    cached_on: frozenset[str] = frozenset(),
    measured: Mapping[throughput.MeasuredKey, throughput.Measured] | None = None,
    evaluation: EvalWork | None = None,
    extras: Extras = Extras(),
) -> list[Placement]:
    """The `k` placements `scheduler.rank` would rank first, in its order (fewer when fewer
    are feasible): the engine's retry list. The walk stops once a lower bound on the next
    offer's cost exceeds the k-th best exact cost found so far (the evaluation's hours,
    never negative, are left out of the bound; the delivery's are in it)."""
    search = _Search(w, tokens, gpus, constraints, cached_on, measured, k, evaluation, extras)
    for offer in book.others:
        if constraint_failure(offer, constraints) is None:
            gpu = gpus[offer.gpu]
            est = search.fit(offer, gpu)
            if est is not None:
                search.consider(offer, est, gpu)
    for hours, g, est, gpu in search.walks(book):
        for price, offer in zip(g.prices, g.offers, strict=True):
            if price * hours * (1 - _SLACK) - _ROUNDING > search.bound:
                break
            if constraint_failure(offer, constraints) is not None:
                continue
            search.consider(offer, est, gpu)
    return [p for _key, p in search.kept]


class _Search:
    """One job's walk over a book: the layouts, fits and durations it has worked out so
    far, and the best placement found."""

    def __init__(self, w: Workload, tokens: int, gpus: Mapping[str, GpuSpec],
                 c: Constraints, cached_on: frozenset[str],
                 measured: Mapping[throughput.MeasuredKey, throughput.Measured] | None,
                 k: int = 1, evaluation: EvalWork | None = None,
                 extras: Extras = Extras()) -> None:
        self.w, self.tokens, self.gpus, self.c = w, tokens, gpus, c
        self.cached_on, self.measured, self.evaluation = cached_on, measured, evaluation
        self.extras = extras
        self.layouts: dict[tuple[object, ...], tuple[savers.Layout, ...]] = {}
        self.fits: dict[tuple[object, ...], MemoryEstimate | None] = {}
        self.times: dict[tuple[object, ...], throughput.Duration | None] = {}
        self.k = max(1, k)
        # The best placements so far, by `Placement.sort_key`, at most k of them.
        self.kept: list[tuple[tuple[Decimal, float, str, str, int], Placement]] = []
        self.bound = float("inf")  # the k-th best cost once k are kept

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

    def consider(self, offer: Offer, est: MemoryEstimate, gpu: GpuSpec) -> None:
        """Price `offer` exactly; keep it if it is among the k best so far."""
        dur = timed(self.w, self.tokens, offer, gpu, est, self.cached_on, self.measured,
                    self.times, self.evaluation, self.extras)
        if dur is None:
            return  # the machine cannot serve the model for the evaluation
        placed = priced(offer, est, dur, self.c, self.extras)
        if isinstance(placed, str):
            return
        key = placed.sort_key()
        if len(self.kept) == self.k and key >= self.kept[-1][0]:
            return
        bisect.insort(self.kept, (key, placed), key=lambda kp: kp[0])
        del self.kept[self.k:]
        if len(self.kept) == self.k:
            self.bound = float(self.kept[-1][0][0])

    def walks(self, book: OfferBook) -> Iterator[tuple[float, _Group, MemoryEstimate, GpuSpec]]:
        """The groups the job fits, each with a lower bound on its hours, in the order of a
        cheap lower bound on their cheapest offer's cost; ends once that bound passes the
        k-th best cost found (`self.bound`, which falls as the caller prices offers).

        The cheap bound needs no sizing: the group's least price x (its least boot and pull,
        merge, and `throughput.training_seconds_floor`). Only the groups it does not
        rule out are sized (`fit`) and timed exactly, so a market of many GPU models costs
        a job little more than one of few.
        """
        w, c = self.w, self.c
        model_bits = throughput.model_download_bytes(w) * 8
        # Seconds to pull the model per Gbit/s of link (0 if any host has it: a lower
        # bound), and the merge after training (throughput.duration's terms).
        # (Offers priced alone, `book.others`, are exact already: only grouped ones count.)
        grouped_cached = self.cached_on - {o.offer_id for o in book.others}
        pull_bits = 0.0 if grouped_cached else model_bits / 1e9
        # The merge, and the delivery (the same hours on every machine).
        after = throughput.merge_seconds(w) + self.extras.delivery_hours * 3600
        pull_h, after_h = pull_bits / 3600, after / 3600
        # Two levels, popped lazily from one heap: a (GPU, count) model under the least of
        # its groups' bound parts, then, once reached, each of its groups under its own
        # bound (never below its model's). Most models are never reached, and a job prices
        # the groups of only those it reaches. Entries: (bound, unique order, model rest
        # hours or -1 for a group, the model or group); the order keeps ties stable.
        floor_of = self._floors()
        n = len(book.groups)
        cheap: list[tuple[float, int, float, _Model | _Group]] = []
        for i, m in enumerate(book.models):
            if m.gpu_count > c.max_gpus or (c.gpu_count is not None
                                            and m.gpu_count != c.gpu_count):
                continue
            if c.gpus is not None and m.gpu not in c.gpus:
                continue
            rest = after_h + floor_of(m.gpu, m.gpu_count)
            cheap.append((m.boot_cost + pull_h * m.pull_cost + m.price * rest, n + i, rest, m))
        heapq.heapify(cheap)
        trains: dict[tuple[str, int, int], float] = {}
        while cheap:
            low, _i, rest, item = heapq.heappop(cheap)
            if low * (1 - _SLACK) - _ROUNDING > self.bound:
                return  # every later model and group starts dearer still
            if isinstance(item, _Model):
                for g in item.groups:
                    heapq.heappush(cheap, (g.boot_cost + pull_h * g.pull_cost
                                           + g.prices[0] * rest, g.index, -1.0, g))
                continue
            g = item
            gpu = self.gpus[g.gpu]
            est = self.fit(g.offers[0], gpu)
            if est is None:
                continue
            tkey = (g.gpu, g.gpu_count, id(est))  # est objects outlive the search: ids safe
            train = trains.get(tkey)
            if train is None:
                train = trains[tkey] = training_hours(g.gpu, g.gpu_count, est, gpu, w,
                                                      self.tokens, self.measured)
            yield g.min_boot_h + pull_h / g.max_pull_gbps + after_h + train, g, est, gpu

    def _floors(self) -> Callable[[str, int], float]:
        """A lower bound on training hours on (GPU, count) under any layout: a learned rate
        where one is known (it does not depend on the layout), else the formula's floor
        (`throughput.training_seconds_floor`, which scales as 1 / count)."""
        one = {name: throughput.training_seconds_floor(self.w, self.tokens, gpu, 1) / 3600
               for name, gpu in self.gpus.items()}
        measured = self.measured
        if not measured:
            return lambda name, count: one[name] / count

        def floor(name: str, count: int) -> float:
            learned = measured.get(throughput.measured_key(self.w, name, count))
            if learned is not None and learned.tokens_per_s > 0:
                return self.tokens / learned.tokens_per_s / 3600
            return one[name] / count

        return floor


def training_hours(name: str, count: int, est: MemoryEstimate, gpu: GpuSpec, w: Workload,
                   tokens: int,
                   measured: Mapping[throughput.MeasuredKey, throughput.Measured] | None,
                   ) -> float:
    """Training hours on `count` x `gpu` (a learned rate where one is known), as duration."""
    learned = measured.get(throughput.measured_key(w, name, count)) if measured else None
    use = learned if learned is not None and learned.tokens_per_s > 0 else None
    return throughput.training_seconds(est.workload or w, tokens, gpu, count, est.strategy,
                                       use.tokens_per_s if use else None) / 3600
