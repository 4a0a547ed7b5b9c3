"""The simulated cloud as a marketplace: machines with stable ids, a seeded share of bad ones,
each bad in one documented way, which the host check catches on the real simulated host."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import KeyPair, Reports

from playbooks import hostcheck
from playbooks.base import Host, HostPaths
from playbooks.gpu import GpuExpectation, catalog_model
from playbooks.hostreport import Check, thresholds
from playbooks.ssh import ConnectionFactory, format_host_key, trust_on_first_use
from providers import catalog
from providers.base import Requirements
from providers.sim import market
from providers.sim.compute import SimCloud
from providers.sim.market import Fault, Market
from simhost import SimHostOptions

RENTAL = "axolotlai/axolotl-cloud:0.18.0-py3.12-cu130-2.12.0"


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "sim"
    try:
        yield folder
    finally:
        SimCloud(folder).terminate_all()


def test_a_fifth_of_each_pool_is_bad_by_the_seed_and_ids_are_stable() -> None:
    fifth = Market(seed=7, bad_fraction=0.2)
    machines = market.pool(fifth, "H100 SXM")
    assert [m.machine_id for m in machines] == [f"sim-h100-sxm-{i:02d}" for i in range(10)]
    assert sum(m.fault is not None for m in machines) == 2
    assert market.pool(Market(seed=7, bad_fraction=0.2), "H100 SXM") == machines  # repeatable
    # Another seed: other machines are bad, under the same ids.
    others = market.pool(Market(seed=8, bad_fraction=0.2), "H100 SXM")
    assert [m.machine_id for m in others] == [m.machine_id for m in machines]
    all_seeds = [tuple(m.fault for m in market.pool(Market(seed=s, bad_fraction=0.2),
                                                     "H100 SXM")) for s in range(20)]
    assert len(set(all_seeds)) > 10
    # Every default kind turns up across pools (gpu_busy only when named); a market of one
    # kind has only that kind.
    kinds = Counter(m.fault for gpu in ("RTX 3090", "RTX 4090", "A100 80GB", "H100 PCIe",
                                        "H100 SXM", "H200", "B200")
                    for m in market.pool(Market(seed=1, bad_fraction=0.5), gpu) if m.fault)
    assert set(kinds) == set(market.DEFAULT_KINDS) == set(Fault) - {Fault.GPU_BUSY}
    only = Market(seed=3, bad_fraction=1.0, kinds=(Fault.NO_HUB,))
    assert {m.fault for m in market.pool(only, "RTX 4090")} == {Fault.NO_HUB}
    assert {m.fault for m in market.pool(Market(), "RTX 4090")} == {None}


def test_market_options_parse_and_bad_ones_say_how_to_write_them() -> None:
    assert Market.parse("seed=7,bad=0.2") == Market(seed=7, bad_fraction=0.2)
    assert Market.parse("seed=1, bad=0.5, kinds=slow_gpu+no_hub, machines=4, offers=machine") \
        == Market(1, 0.5, (Fault.SLOW_GPU, Fault.NO_HUB), 4, True)
    for bad, says in [("bad=2", "between 0 and 1"), ("kinds=fast_gpu", "'fast_gpu' is not"),
                      ("seed", "expected key=value"), ("colour=red", "unknown key"),
                      ("offers=all", "offers is model or machine")]:
        with pytest.raises(ValueError, match=says) as info:
            Market.parse(bad)
        if "between" not in says:
            assert "write e.g. seed=7,bad=0.2" in str(info.value)


@pytest.mark.parametrize("fault", list(Fault))
def test_each_fault_is_a_valid_host_of_its_kind(fault: Fault) -> None:
    sold = "H100 SXM"
    machine = market.Machine("sim-h100-sxm-00", sold, fault)
    options = SimHostOptions(**market.host_options(machine))  # only fields the host knows
    healthy = catalog.gpus()[sold].bf16_tflops * market.healthy_fraction()
    assert options.gpu_matmul_tflops == pytest.approx(healthy)
    if fault is Fault.WRONG_GPU:
        # nvidia-smi shows the neighbour, which the GPU check recognises as what it is.
        assert catalog_model(options.gpu_model) == "H100 PCIe"
        assert options.gpu_speed == pytest.approx(756 / 989, abs=0.01)
    expected = {Fault.SLOW_GPU: ("gpu_speed", 0.5), Fault.NO_HUB: ("hub_unreachable", True),
                Fault.SLOW_HUB: ("download_bytes_per_second", 3e6),
                Fault.SLOW_DISK: ("disk_write_bytes_per_second", 40e6),
                Fault.OLD_DRIVER: ("cuda_version", "12.8"),
                Fault.GPU_BUSY: ("gpu_memory_held_mib", 12288)}
    if fault in expected:
        name, value = expected[fault]
        assert getattr(options, name) == value


def test_the_market_and_the_host_check_agree_on_a_healthy_card() -> None:
    assert market.healthy_fraction() == thresholds().matmul.healthy_fraction_of_rated


def test_instances_report_their_machine_and_rentals_are_repeatable(
        state_dir: Path, ssh_keypair: KeyPair) -> None:
    fifth = Market(seed=11, bad_fraction=0.2)
    cloud = SimCloud(state_dir, market=fifth)
    [offer] = cloud.offers(Requirements(1, 0, gpus=frozenset({"RTX 3090"})))
    assert offer.machine_id is None  # sold by model: the provider picks the machine
    first = cloud.create(offer, ssh_keypair.public, "job-1")
    second = SimCloud(state_dir, market=fifth).create(offer, ssh_keypair.public, "job-2")
    expected = [market.draw(fifth, "RTX 3090", n).machine_id for n in range(2)]
    assert [first.machine_id, second.machine_id] == expected
    assert cloud.get(first.instance_id).machine_id == first.machine_id
    assert [i.machine_id for i in cloud.list("job-2")] == [second.machine_id]


def test_a_machine_offer_rents_that_machine_with_its_fault(state_dir: Path,
                                                           ssh_keypair: KeyPair) -> None:
    cloud = SimCloud(state_dir, market=Market.parse("seed=5,bad=0.2,offers=machine"))
    offers = cloud.offers(Requirements(1, 0, gpus=frozenset({"RTX 3090"}), interruptible=True))
    assert [o.machine_id for o in offers] == [f"sim-rtx-3090-{i:02d}" for i in range(10)]
    assert len({o.offer_id for o in offers}) == 10
    bad = next(m for m in market.pool(cloud.market, "RTX 3090") if m.fault is not None)
    offer = next(o for o in offers if o.machine_id == bad.machine_id)
    inst = cloud.create(offer, ssh_keypair.public, "job-1")
    assert inst.machine_id == bad.machine_id
    options: dict[str, Any] = json.loads(
        (state_dir / "instances" / inst.instance_id / "state" / "options.json").read_text())
    assert all(options[k] == v for k, v in market.host_options(bad).items())


@pytest.mark.parametrize(("fault", "failing"), [(Fault.SLOW_GPU, Check.MATMUL),
                                                (Fault.WRONG_GPU, Check.INVENTORY),
                                                (Fault.SLOW_DISK, Check.DISK),
                                                (Fault.OLD_DRIVER, Check.DRIVER),
                                                (Fault.NO_HUB, Check.HUB)])
def test_the_host_check_catches_each_bad_machine_of_the_market(
        state_dir: Path, ssh_keypair: KeyPair, reports: Reports, fault: Fault,
        failing: Check) -> None:
    cloud = SimCloud(state_dir, market=Market(seed=2, bad_fraction=1.0, kinds=(fault,)),
                     host_options={"container_image": RENTAL})
    [offer] = cloud.offers(Requirements(1, 0, gpus=frozenset({"RTX 4090"})))
    inst = cloud.create(offer, ssh_keypair.public, "job-1")
    assert inst.ssh_host and inst.ssh_port
    with ConnectionFactory(ssh_keypair.private) as factory:
        key = format_host_key(trust_on_first_use(inst.ssh_host, inst.ssh_port))
        conn = factory.connect(inst.ssh_host, inst.ssh_port, inst.ssh_user, key)
        host = Host(conn, HostPaths(cloud.host_root(inst)), command_timeout=60)
        base = thresholds()
        limits = base.model_copy(update={
            "matmul": base.matmul.model_copy(update={"seconds": 0.2}),
            "disk": base.disk.model_copy(update={"test_mib": 64}),
            "hub": base.hub.model_copy(update={"range_mib": 4})})
        spec = hostcheck.HostCheckSpec(
            job_id="job-1", gpu=GpuExpectation("RTX 4090", 1, 24_000), rated_tflops=165.2,
            disk_need_bytes=20 * 10**9, repo="Qwen/Qwen2.5-0.5B", limits=limits)
        report = hostcheck.run(host, spec, reports)
    assert list(report.failures) == [failing]
