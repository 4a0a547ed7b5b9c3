"""The simulated cloud's machines: stable ids per GPU model, and a seeded share of bad ones.

A real marketplace sells machines, not GPU models: the same offer name hides a card at half
its speed, a disk at 40 MB/s, an old driver, a host without a route to the Hub, a GPU that is
not the one listed (issue 40). `Market` (seed, bad fraction, fault kinds) makes `sim` such a
market: every GPU model it sells is a pool of machines with stable ids (the provider's
physical host id: Vast.ai's `machine_id`, RunPod's `machineId`), of which that fraction are
bad, each with one fault (market.yaml, with what each one does). Which machines are bad, and
how, depends only on the seed, so a bench run is repeatable; so is the machine the n-th
rental of a model lands on (`draw`).

Two ways to sell them, as the real providers do: by model (RunPod: the provider picks the
machine, its id is known once the instance exists, `Instance.machine_id`), or one offer per
machine (`per_machine_offers`, as Vast.ai lists offers with their `machine_id`), so that a
placement can avoid a machine it remembers before paying for it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from enum import StrEnum
from functools import cache
from pathlib import Path
from typing import Any

from providers import catalog
from providers.base import Offer
from providers.datacache import read_yaml

_DATA = Path(__file__).resolve().parent / "market.yaml"


class Fault(StrEnum):
    """What a bad machine gets wrong (market.yaml `faults`, and `wrong_gpu`)."""

    SLOW_GPU = "slow_gpu"
    WRONG_GPU = "wrong_gpu"
    SLOW_DISK = "slow_disk"
    OLD_DRIVER = "old_driver"
    NO_HUB = "no_hub"
    SLOW_HUB = "slow_hub"
    GPU_BUSY = "gpu_busy"


# The faults a market draws from unless named: gpu_busy only when named (it is what shared and
# kept servers show more than rentals; adding it here would change every seeded market's draws).
DEFAULT_KINDS = tuple(f for f in Fault if f is not Fault.GPU_BUSY)


@cache
def _data() -> dict[str, Any]:
    raw: dict[str, Any] = read_yaml(_DATA)
    return raw


def healthy_fraction() -> float:
    """A healthy card's bf16 matmul as a fraction of its rated figure (market.yaml)."""
    return float(_data()["healthy_fraction_of_rated"])


@dataclass(frozen=True)
class Market:
    """A market whose `bad_fraction` of machines are bad, with faults from `kinds`."""

    seed: int = 0
    bad_fraction: float = 0.0
    kinds: tuple[Fault, ...] = DEFAULT_KINDS
    machines_per_gpu: int | None = None  # None: market.yaml's
    per_machine_offers: bool = False

    def __post_init__(self) -> None:
        if not 0.0 <= self.bad_fraction <= 1.0:
            raise ValueError(f"the bad fraction is between 0 and 1 (got {self.bad_fraction})")
        if not self.kinds:
            raise ValueError("a market needs at least one kind of bad machine")
        if self.machines_per_gpu is not None and self.machines_per_gpu < 1:
            raise ValueError(f"machines per GPU model must be >= 1 (got {self.machines_per_gpu})")

    @classmethod
    def parse(cls, text: str) -> Market:
        """`seed=7,bad=0.2,kinds=slow_gpu+no_hub,machines=10,offers=machine` (any subset);
        ValueError naming the part and the fix."""
        fields: dict[str, Any] = {}
        for part in (p.strip() for p in text.split(",") if p.strip()):
            key, eq, value = part.partition("=")
            try:
                if not eq:
                    raise ValueError("expected key=value")
                if key == "seed":
                    fields["seed"] = int(value)
                elif key == "bad":
                    fields["bad_fraction"] = float(value)
                elif key == "kinds":
                    fields["kinds"] = tuple(Fault(k) for k in value.split("+") if k)
                elif key == "machines":
                    fields["machines_per_gpu"] = int(value)
                elif key == "offers":
                    if value not in ("model", "machine"):
                        raise ValueError("offers is model or machine")
                    fields["per_machine_offers"] = value == "machine"
                else:
                    raise ValueError("unknown key")
            except ValueError as exc:
                raise ValueError(
                    f"sim market {part!r}: {exc} (write e.g. seed=7,bad=0.2,"
                    f"kinds={'+'.join(Fault)},machines=10,offers=model|machine)") from None
        return cls(**fields)

    @property
    def size(self) -> int:
        """Machines per GPU model."""
        return self.machines_per_gpu or int(_data()["machines_per_gpu"])


@dataclass(frozen=True)
class Machine:
    """One physical machine of the simulated cloud."""

    machine_id: str
    gpu: str  # the catalog model it is sold as
    fault: Fault | None = None


def _slug(gpu: str) -> str:
    return "-".join(gpu.lower().replace("/", " ").split())


@cache
def pool(market: Market, gpu: str) -> tuple[Machine, ...]:
    """The machines sold as `gpu`: ids `sim-<model>-NN`, round(size x bad_fraction) of them
    bad, which ones and how chosen by the seed (the kinds in turn from a seeded start)."""
    rng = random.Random(f"{market.seed}:{gpu}")
    bad = rng.sample(range(market.size), round(market.size * market.bad_fraction))
    start = rng.randrange(len(market.kinds))
    faults = {index: market.kinds[(start + n) % len(market.kinds)]
              for n, index in enumerate(sorted(bad))}
    return tuple(Machine(f"sim-{_slug(gpu)}-{i:02d}", gpu, faults.get(i))
                 for i in range(market.size))


def machine(market: Market, gpu: str, machine_id: str) -> Machine | None:
    """The machine `machine_id` of `gpu`'s pool (None: not one of them)."""
    return next((m for m in pool(market, gpu) if m.machine_id == machine_id), None)


def draw(market: Market, gpu: str, rentals: int) -> Machine:
    """The machine the provider gives the `rentals`-th rental (0-based) of `gpu`."""
    machines = pool(market, gpu)
    return machines[random.Random(f"{market.seed}:{gpu}:{rentals}").randrange(len(machines))]


def offers(market: Market, offers: list[Offer]) -> list[Offer]:
    """`offers` as this market sells them: unchanged (by model), or one per machine."""
    if not market.per_machine_offers:
        return offers
    return [replace(o, offer_id=f"{o.offer_id}@{m.machine_id}", machine_id=m.machine_id)
            for o in offers for m in pool(market, o.gpu)]


def host_options(found: Machine) -> dict[str, Any]:
    """The SimHostOptions fields of `found`: its GPUs' healthy speed, and its fault's."""
    specs = catalog.gpus()
    sold = specs[found.gpu]
    options: dict[str, Any] = {"gpu_matmul_tflops": sold.bf16_tflops * healthy_fraction()}
    if found.fault is Fault.WRONG_GPU:
        table = _data()["wrong_gpu"]
        real = specs[str(table.get(found.gpu, table["default"]))]
        # The matmul and the training run at the real card's speed: a healthy `sold` card's
        # figure times real / sold.
        options.update(gpu_model=catalog.spellings("sim")[real.name][0],
                       gpu_memory_mib=real.memory_bytes // 2**20,
                       gpu_speed=real.bf16_tflops / sold.bf16_tflops)
    elif found.fault is not None:
        options.update(_data()["faults"][found.fault.value])
    return options
