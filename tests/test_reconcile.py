"""`reconcile` against real providers: the sim cloud (real hosts) and the Vast.ai emulator."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from conftest import KeyPair
from emulators.vast import VastEmulator
from rows import set_job_columns

from orchestrator.engine.reconcile import reconcile
from orchestrator.records.store import Instance as InstanceRow
from orchestrator.records.store import Job, Store, open_store, utcnow
from providers.base import InstanceState, NotFound, Requirements
from providers.dedicated.compute import Dedicated
from providers.sim.compute import SimCloud
from providers.vastai.compute import VastAI


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return open_store(f"sqlite:///{tmp_path / 'orch.db'}")


@pytest.fixture
def cloud(tmp_path: Path) -> Iterator[SimCloud]:
    c = SimCloud(tmp_path / "sim")
    try:
        yield c
    finally:
        c.terminate_all()


def new_job(store: Store, status: str) -> str:
    job = store.create_job(
        name="t", status=status, method="qlora", base_model="m", spec_json="{}",
        spec_hash="0" * 64, placement=None, provider="sim", gpu="RTX 3090", gpu_count=1,
        billing="per_second", interruptible=True, est_hours=1.0, est_cost=Decimal("0.1"),
        event_kind="queued", event_message="", event_data=None)
    return str(job.id)


def spot_offer(cloud: SimCloud):  # type: ignore[no-untyped-def]
    [offer] = cloud.offers(Requirements(1, 0, gpus=frozenset({"RTX 3090"}), interruptible=True))
    return offer


def test_orphans_are_terminated_and_live_jobs_kept(store: Store, cloud: SimCloud,
                                                   ssh_keypair: KeyPair) -> None:
    done, running = new_job(store, "succeeded"), new_job(store, "training")
    # A live worker drives `running` (its lease is current), so its instance is kept even
    # before the worker wrote the instance's id down.
    set_job_columns(store, running, lease_owner="worker-1",
                            lease_expires_at=utcnow() + timedelta(minutes=5))
    offer = spot_offer(cloud)
    finished = cloud.create(offer, ssh_keypair.public, done)
    active = cloud.create(offer, ssh_keypair.public, running)
    # Created at the provider, then orch was killed before the database heard of the job.
    unknown = cloud.create(offer, ssh_keypair.public, "j-neverrecorded")

    dry = reconcile(store, {"sim": cloud}, dry_run=True)
    assert {a.instance_id for a in dry.of("terminate")} == {finished.instance_id,
                                                             unknown.instance_id}
    assert len(cloud.list()) == 3  # a dry run changes nothing

    report = reconcile(store, {"sim": cloud})
    assert {a.instance_id for a in report.of("terminate")} == {finished.instance_id,
                                                                unknown.instance_id}
    assert [a.instance_id for a in report.of("keep")] == [active.instance_id]
    assert [i.instance_id for i in cloud.list()] == [active.instance_id]
    for gone in (finished, unknown):
        with pytest.raises(NotFound):
            cloud.get(gone.instance_id)
    assert any(e.kind == "reconcile.terminated" for e in store.events(done))
    # Nothing left to do the second time.
    assert not reconcile(store, {"sim": cloud}).of("terminate")


def test_stale_rows_closed_and_dead_workers_jobs_requeued(store: Store) -> None:
    job_id = new_job(store, "training")
    with store.transaction() as s:
        job = s.get(Job, job_id)
        assert job is not None
        job.lease_owner, job.lease_expires_at = "worker-1", utcnow() - timedelta(minutes=1)
        s.add(InstanceRow(job_id=job_id, provider="vastai", provider_instance_id="4242",
                          gpu="RTX 3090", gpu_count=1, billing="per_second",
                          interruptible=True, price_per_hour_micros=74_000, state="running"))
    with VastEmulator("k") as emu:
        vast = VastAI("k", base_url=emu.url, initial_s=0.01)
        report = reconcile(store, {"vastai": vast})
    assert [a.kind for a in report.actions] == ["mark-terminated", "requeue"]
    assert store.open_instances() == []
    again = store.get_job(job_id)
    assert again.status == "queued" and again.attempt == 1 and again.lease_owner is None
    assert any(e.kind == "requeued" for e in store.events(job_id))


def test_vast_orphan_found_by_label(store: Store) -> None:
    with VastEmulator("k") as emu:
        emu.add_offer(id=1, gpu_name="RTX 3090", num_gpus=1, gpu_ram=24576, dph_base=0.07,
                      dph_total=0.08, min_bid=0.05, storage_cost=0.1, reliability=0.99,
                      verified=True, rentable=True, rented=False, cpu_cores_effective=8,
                      cpu_ram=32000, disk_space=100, geolocation="X", cuda_max_good=12.8)
        vast = VastAI("k", base_url=emu.url, initial_s=0.01)
        [offer] = [o for o in vast.offers(Requirements(1, 0, interruptible=False))]
        inst = vast.create(offer, "ssh-ed25519 AAAA", "j-lost")
        report = reconcile(store, {"vastai": vast})
        assert [a.instance_id for a in report.of("terminate")] == [inst.instance_id]
        assert vast.list() == []


def test_dedicated_server_of_a_finished_job_is_released(store: Store) -> None:
    store.add_server(name="box1", host="h", port=22, user="root", gpu="H100 SXM", gpu_count=1,
                     monthly_price=Decimal("2190"))
    job_id = new_job(store, "failed")
    assert store.claim_server("box1", job_id)
    reconcile(store, {"dedicated": Dedicated(store)})
    assert Dedicated(store).get("box1").state is InstanceState.TERMINATED
    assert [s.name for s in store.idle_servers()] == ["box1"]
