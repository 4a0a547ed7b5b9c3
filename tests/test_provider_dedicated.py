"""Registered monthly servers as a provider: atomic claim, release, never destroyed."""

from __future__ import annotations

import threading
from decimal import Decimal
from pathlib import Path

import pytest

from orchestrator.records.store import Store, open_store
from providers.base import CapacityError, InstanceState, NotFound, Requirements
from providers.dedicated.compute import Dedicated, offer_id

GIB = 1024**3


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = open_store(f"sqlite:///{tmp_path / 'orch.db'}")
    s.add_server(name="box1", host="203.0.113.7", port=2222, user="ubuntu", gpu="H100 SXM",
                 gpu_count=1, monthly_price=Decimal("2190"))
    s.add_server(name="big", host="203.0.113.8", port=22, user="root", gpu="H200",
                 gpu_count=8, monthly_price=Decimal("25000"))
    return s


def job(store: Store, name: str) -> str:
    row = store.create_job(
        name=name, status="queued", method="qlora", base_model="m", spec_json="{}",
        spec_hash="0" * 64, placement=None, provider="dedicated", gpu="H100 SXM", gpu_count=1,
        billing="monthly", interruptible=False, est_hours=1.0, est_cost=Decimal(0),
        event_kind="queued", event_message="", event_data=None)
    return str(row.id)


def test_offers_filter_by_need(store: Store) -> None:
    d = Dedicated(store)
    ids = {o.offer_id for o in d.offers(Requirements(gpu_count=1, min_gpu_memory_bytes=60 * GIB))}
    assert ids == {offer_id("box1"), offer_id("big")}
    big = d.offers(Requirements(gpu_count=4, min_gpu_memory_bytes=100 * GIB))
    assert [o.offer_id for o in big] == [offer_id("big")]
    assert all(o.registered and o.price_per_hour is None for o in big)
    assert d.offers(Requirements(gpu_count=1, min_gpu_memory_bytes=1, interruptible=True)) == []


def test_claim_run_release_never_destroys(store: Store) -> None:
    d = Dedicated(store)
    j1, j2 = job(store, "a"), job(store, "b")
    offer = next(o for o in d.offers(Requirements(1, 1)) if o.offer_id == offer_id("box1"))
    inst = d.create(offer, "ssh-ed25519 AAAA", j1)
    assert inst.state is InstanceState.RUNNING and inst.job_id == j1
    assert (inst.ssh_host, inst.ssh_port, inst.ssh_user) == ("203.0.113.7", 2222, "ubuntu")
    assert offer_id("box1") not in {o.offer_id for o in d.offers(Requirements(1, 1))}
    with pytest.raises(CapacityError, match="busy"):
        d.create(offer, "ssh-ed25519 AAAA", j2)
    assert [i.instance_id for i in d.list(j1)] == ["box1"] and d.list(j2) == []
    d.terminate("box1")
    d.terminate("box1")  # already released: still fine
    assert d.get("box1").state is InstanceState.TERMINATED
    assert [s.name for s in store.list_servers()] == ["big", "box1"]  # nothing removed
    assert d.create(offer, "k", j2).job_id == j2
    with pytest.raises(NotFound):
        d.get("nope")


def test_two_jobs_racing_for_one_server_get_it_once(store: Store) -> None:
    jobs = [job(store, f"j{i}") for i in range(8)]
    wins: list[str] = []

    def claim(j: str) -> None:
        if store.claim_server("box1", j):
            wins.append(j)

    threads = [threading.Thread(target=claim, args=(j,)) for j in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1
    assert not store.release_server("box1", job_id="someone-else")
    assert store.release_server("box1", job_id=wins[0])


def test_plan_reads_the_servers_as_the_engine_does(store: Store, tmp_path: Path) -> None:
    """`orch plan`'s read-only look-up (`records.readonly`, no SQLAlchemy) and the engine's
    store give the same servers: one that failed its GPU check is offered by neither (issue
    37 §3: the read-only SQL once left `check_error` out, so `orch plan` chose a server the
    engine then refused)."""
    from orchestrator.records import readonly

    store.record_server_check("box1", error="nvidia-smi: no devices found")
    url = f"sqlite:///{tmp_path / 'orch.db'}"
    assert readonly.registered_servers(url) == store.registered()
    d = Dedicated(store)
    offered = {o.offer_id for o in d.offers(Requirements(gpu_count=1, min_gpu_memory_bytes=0))}
    assert offered == {offer_id("big")}
    from orchestrator.core.planning import server_offers

    assert {o.offer_id for o in server_offers(readonly.registered_servers(url))} == {
        o.offer_id for o in server_offers(store.registered())}
    assert offer_id("box1") not in {o.offer_id for o in server_offers(
        readonly.registered_servers(url))}
