"""Which machine kept warm a job may take, and whether the ranking takes it (pure; issue 22).

A warm machine is priced running (no boot) and, when it holds the job's base model, without
the download; the scheduler takes it only when that beats every fresh placement *with* its
setup. What the scheduler cannot see (image, disk, provider, window) is checked first.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest

from orchestrator.core import scheduler, warmfit
from orchestrator.core.architectures import lookup
from orchestrator.core.sizing import Workload
from providers import catalog
from providers.base import Billing, Offer

GPUS = catalog.gpus()
NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
IMAGE = "axolotlai/axolotl-cloud:0.18.0-py3.12-cu130-2.12.0"
MODEL = ("meta-llama/Llama-3.1-8B", "main")
W = Workload(lookup(MODEL[0]).architecture, "lora", sequence_len=2048)
TOKENS = 2_000_000


def _offer(oid: str, gpu: str, cents: int, boot: float = 5.0) -> Offer:
    return Offer(provider="vastai", offer_id=oid, gpu=gpu, gpu_count=1,
                 gpu_memory_bytes=GPUS[gpu].memory_bytes, billing=Billing.PER_SECOND,
                 interruptible=False, price_per_hour=Decimal(cents) / 100, boot_minutes=boot,
                 pull_gbps=2.0)


def _machine(offer: Offer, wid: int = 1, **changes: object) -> warmfit.WarmMachine:
    m = warmfit.WarmMachine(warm_id=wid, offer=offer, price_per_hour=offer.price_per_hour
                            or Decimal(0), image=IMAGE, disk_gb=100, model=MODEL,
                            parked_by="j-a", expires_at=NOW + timedelta(minutes=10),
                            instance_id="i-1")
    return m._replace(**changes)  # type: ignore[arg-type]


def _offers(machines: list[warmfit.WarmMachine],
            **kw: object) -> tuple[list[Offer], frozenset[str]]:
    args: dict[str, object] = {"providers": {"vastai"}, "image": IMAGE, "disk_gb": 100,
                               "model": MODEL, "now": NOW, **kw}
    return warmfit.offers(machines, **args)  # type: ignore[arg-type]


def test_the_same_machine_warm_beats_it_fresh_by_its_setup() -> None:
    fresh = _offer("o1", "A100 80GB", 120)
    warm, cached = _offers([_machine(fresh)])
    assert [o.offer_id for o in warm] == ["warm:1"] and cached == {"warm:1"}
    assert warm[0].boot_minutes == 0
    ranking = scheduler.rank(W, TOKENS, [fresh, *warm], GPUS, cached_on=cached)
    saving = warmfit.saving(ranking.placements)
    assert saving is not None and saving.fresh is not None
    assert saving.warm.offer.offer_id == "warm:1" and saving.fresh.offer.offer_id == "o1"
    # What it saves is the fresh machine's boot and model download at its price (up to the
    # per-second rounding of each whole-job cost).
    d = saving.fresh.duration
    setup_h = Decimal(repr(d.boot + d.model_pull))
    assert saving.saves == pytest.approx(setup_h * Decimal("1.20"), abs=Decimal("0.001"))
    # Without the model on it, only the boot is saved.
    _, none_cached = _offers([_machine(fresh, model=("other/model", "main"))])
    assert none_cached == frozenset()


def test_a_cheaper_fresh_machine_beats_an_expensive_warm_one() -> None:
    # The same GPU for less than half the price: cheaper even with its boot and download.
    dear = _offer("o-on-demand", "A100 80GB", 120)
    cheap = _offer("o-cheap", "A100 80GB", 50)
    warm, cached = _offers([_machine(dear)])
    ranking = scheduler.rank(W, TOKENS, [cheap, *warm], GPUS, cached_on=cached)
    assert ranking.placements[0].offer.offer_id == "o-cheap"
    assert warmfit.saving(ranking.placements) is None
    assert any(p.offer.offer_id == "warm:1" for p in ranking.placements)


@pytest.mark.parametrize(("changes", "kw", "why"), [
    ({"image": "axolotlai/axolotl-cloud:0.18.0-py3.12-cu130-2.11.0"}, {}, "it runs"),
    ({"disk_gb": 50}, {}, "its disk is 50 GB"),
    ({"expires_at": NOW}, {}, "its window closed"),
    ({}, {"providers": {"runpod"}}, "provider vastai is not one"),
])
def test_what_the_scheduler_cannot_see_is_checked_first(changes: dict[str, object],
                                                        kw: dict[str, object], why: str) -> None:
    m = _machine(_offer("o1", "A100 80GB", 120), **changes)
    args: dict[str, object] = {"providers": {"vastai"}, "image": IMAGE, "disk_gb": 100,
                               "now": NOW, **kw}
    problem = warmfit.problem(m, **args)  # type: ignore[arg-type]
    assert problem is not None and why in problem
    assert _offers([m], **kw) == ([], frozenset())


def test_limits_apply_to_warm_machines_as_to_fresh_ones() -> None:
    fresh = _offer("o1", "A100 80GB", 120)
    warm, cached = _offers([_machine(fresh)])
    capped = scheduler.Constraints(max_price_per_hour=Decimal("1.00"))
    ranking = scheduler.rank(W, TOKENS, warm, GPUS, capped, cached_on=cached)
    assert ranking.placements == () and ranking.rejected


def test_the_offer_round_trips_through_its_json() -> None:
    o = _offer("o1", "A100 80GB", 123)
    assert warmfit.offer_from_json(warmfit.offer_json(o)) == o
    assert warmfit.warm_id(replace(o, offer_id="warm:42")) == 42
    with pytest.raises(ValueError, match="not a warm machine"):
        warmfit.warm_id(o)


def test_keep_warm_is_not_part_of_a_jobs_identity(tmp_path: Path) -> None:
    # Adding keep_warm to a sweep's base must not run its finished runs again.
    import shutil

    from orchestrator.core.spec import load_job

    examples = Path(__file__).resolve().parent.parent / "examples"
    shutil.copytree(examples / "data", tmp_path / "data")
    text = (examples / "quickstart.yml").read_text()
    plain, warm = tmp_path / "plain.yml", tmp_path / "warm.yml"
    plain.write_text(text)
    warm.write_text(text + "  keep_warm: 15m\n")
    a, b = load_job(plain), load_job(warm)
    assert b.spec.resources.keep_warm == 900
    assert a.spec_hash == b.spec_hash
