"""The composition root: every adapter orch has, by name, and the providers built from them.

`ADAPTERS` is the one place a provider's name meets its class; everything else asks what a
provider can do (`declares(name, capability)`, or `isinstance` on the built provider) and
never compares names. A cloud without credentials is left out with a note (never a
traceback); `sim` is available wherever its state directory exists, `dedicated` always (it
is the `server` table). Base URLs can be pointed elsewhere (`ORCH_VASTAI_URL`,
`ORCH_RUNPOD_URL`) for emulators.

Light to import (`orch plan` reads it): an adapter's module is imported when its class is
first asked for (the HTTP ones pull in httpx), the store only for its type.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.core.paths import data_dir
from orchestrator.core.settings import settings
from providers import credentials
from providers.base import HubMirror, Offer, PriceList, Provider

if TYPE_CHECKING:
    from orchestrator.records.store import Store
    from providers.sim.spotmarket import SpotMarket


def _vastai() -> type:
    from providers.vastai.compute import VastAI

    return VastAI


def _runpod() -> type:
    from providers.runpod.compute import RunPod

    return RunPod


def _dedicated() -> type:
    from providers.dedicated.compute import Dedicated

    return Dedicated


def _sim() -> type:
    from providers.sim.compute import SimCloud

    return SimCloud


# Every adapter by the name jobs (`resources.providers`), offers and the store use, in the
# order notes name them; each class's `name` is its key (tests/test_capabilities.py).
ADAPTERS: dict[str, Callable[[], type]] = {
    "vastai": _vastai, "runpod": _runpod, "dedicated": _dedicated, "sim": _sim}
# Adapters that rent machines through an API key (providers/credentials.py).
CLOUDS = tuple(name for name in ADAPTERS if name in credentials.ENV)
# `orch reconcile` sweeps every provider: one that does not answer must not hold it up for
# the adapters' full retry budget (minutes), so it gets short timeouts and few retries and
# reports the provider as an error instead; the next run tries again. `orch offers` and
# `orch plan` ask with the same settings.
QUICK_HTTP = {"timeout_s": 5.0, "attempts": 2, "deadline_s": 10.0}


@cache
def adapter(name: str) -> type | None:
    """The adapter class of provider `name` (None: no such adapter, e.g. a price catalog)."""
    load = ADAPTERS.get(name)
    return None if load is None else load()


def declares(name: str, capability: type) -> bool:
    """Whether provider `name`'s adapter declares `capability` (a marker or a protocol of
    methods only, `providers.base`)."""
    cls = adapter(name)
    return cls is not None and issubclass(cls, capability)


def keyless() -> tuple[str, ...]:
    """The adapters that need no API key (their machines are local or registered)."""
    return tuple(name for name in ADAPTERS if name not in CLOUDS)


def price_lists(named: Sequence[str] | None) -> list[Offer]:
    """The offers of the keyless providers `named` whose offers are a fixed price list
    (`providers.base.PriceList`): planned without asking anyone."""
    found: list[Offer] = []
    for name in keyless():
        if named is None or name not in named:
            continue  # its module is not even imported
        cls = adapter(name)
        if cls is not None and issubclass(cls, PriceList):
            found += cls.price_list()
    return found


def cloud_keys() -> tuple[dict[str, str], list[str]]:
    """(provider -> API key) for each cloud with credentials; a note for each left out."""
    keys: dict[str, str] = {}
    notes: list[str] = []
    for name in CLOUDS:
        try:
            key = credentials.api_key(name)
        except credentials.CredentialsError as exc:
            notes.append(f"{name}: {exc}")
            continue
        if not key:
            notes.append(f"{name}: no API key ({credentials.ENV[name]} or "
                         f"{credentials.credentials_file()}); left out")
            continue
        keys[name] = key
    return keys, notes


def cloud(name: str, key: str, quick: bool = False) -> Provider:
    """The adapter of cloud `name` with API key `key`; its base URL from `ORCH_<NAME>_URL`
    when set (emulators); `quick`: short HTTP timeouts and few retries."""
    url = settings().api_url(name)
    kwargs: dict[str, Any] = {"base_url": url} if url else {}
    if quick:
        kwargs.update(QUICK_HTTP)
    cls = adapter(name)
    assert cls is not None and name in CLOUDS, name
    built: Provider = cls(key, **kwargs)
    return built


def clouds(named: Sequence[str] | None = None) -> tuple[dict[str, Provider], list[str]]:
    """The clouds with credentials here (quick HTTP settings), limited to `named` (None:
    all), and notes on those without a key."""
    keys, notes = cloud_keys()
    return {name: cloud(name, key, quick=True) for name, key in keys.items()
            if named is None or name in named}, notes


def sim_state_dir() -> Path:
    """Where the simulated cloud keeps its instances."""
    from providers.sim.compute import SimCloud

    return data_dir() / SimCloud.name


def sim_from_env() -> Provider:
    """The simulated cloud, shaped by the ORCH_SIM_* settings (docs/settings.md).

    ORCH_SIM_BOOT_S (seconds until an instance runs), ORCH_SIM_PREEMPT_AFTER_S (spot
    instances are preempted that long after create), ORCH_SIM_CAPACITY ("RTX 3090=0,H100
    PCIe=2": live instances per GPU model), ORCH_SIM_TRAIN_STEPS / ORCH_SIM_STEP_S (how long
    the stand-in trainer runs), ORCH_SIM_MODEL_BYTES / ORCH_SIM_DOWNLOAD_BPS (the base model's
    size and the hosts' download rate in bytes per second: `hf download` takes that long),
    ORCH_SIM_MARKET (its machines, a seeded share of them bad: `providers/sim/market.py`),
    ORCH_SIM_SPOT_REGIME (a replayed spot market).
    """
    from providers.sim.compute import SimCloud

    s = settings()
    given = {"train_steps": s.sim_train_steps, "train_step_seconds": s.sim_step_s,
             "model_size_bytes": s.sim_model_bytes,
             "download_bytes_per_second": s.sim_download_bps}
    host: dict[str, object] = {k: v for k, v in given.items() if v is not None}
    from providers.sim.market import Market

    return SimCloud(sim_state_dir(), capacity=s.sim_capacity_by_gpu(),
                    boot_seconds=s.sim_boot_s, preempt_after_s=s.sim_preempt_after_s,
                    host_options=host, market=Market.parse(s.sim_market),
                    spot_market=sim_spot_market())


def sim_spot_market() -> SpotMarket | None:
    """The simulated cloud's spot market ORCH_SIM_SPOT_REGIME / _SEED / _SECONDS_PER_HOUR
    name (docs/deadline.md), its origin shared by every process; None: no market."""
    s = settings()
    if s.sim_spot_regime is None:
        return None
    import time

    from providers.sim import spotmarket

    return spotmarket.open_market(sim_state_dir(), s.sim_spot_regime, s.sim_spot_seed,
                                  s.sim_spot_seconds_per_hour, time.time())


def mirrored_hub(named: Sequence[str] | None) -> str | None:
    """The Hub the hosts of a job that may run only on `named` download from, when each of
    those providers has one of its own (`providers.base.HubMirror`: the simulated cloud,
    the one such adapter in ADAPTERS); None: HF_ENDPOINT or huggingface.co, as anywhere."""
    if not named or not all(declares(name, HubMirror) for name in named):
        return None
    mirror = sim_from_env()
    return mirror.hub_endpoint() if isinstance(mirror, HubMirror) else None


def configured_providers(store: Store, *, sim: bool | None = None, quick: bool = False
                         ) -> tuple[dict[str, Provider], list[str]]:
    """(name -> provider, notes about the ones left out); `quick`: short HTTP timeouts.
    `sim`: include the simulated cloud (None: where its state directory exists)."""
    from providers.dedicated.compute import Dedicated

    found: dict[str, Provider] = {"dedicated": Dedicated(store)}
    if sim or (sim is None and sim_state_dir().exists()):
        sim_cloud = sim_from_env()
        found[sim_cloud.name] = sim_cloud
    keys, notes = cloud_keys()
    for name, key in keys.items():
        found[name] = cloud(name, key, quick)
    return found, notes
