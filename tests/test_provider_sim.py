"""The `sim` provider: catalog offers, real simulated hosts over SSH, state shared by processes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from conftest import KeyPair

from playbooks.ssh import ConnectionFactory, format_host_key, run, trust_on_first_use
from providers.base import (
    Billing,
    CapacityError,
    InstanceState,
    NotFound,
    Offer,
    Requirements,
    tag_for,
)
from providers.catalog import load
from providers.sim.compute import SimCloud

REPO = Path(__file__).resolve().parents[1]
GIB = 1024**3


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    """The sim cloud's state directory; every instance in it is terminated at the end."""
    folder = tmp_path / "sim"
    try:
        yield folder
    finally:
        SimCloud(folder).terminate_all()


def host_processes(host_dir: str) -> set[int]:
    """Live processes whose command line mentions the host's directory (sshd, init, jobs)."""
    found: set[int] = set()
    needle = host_dir.encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                if needle in handle.read():
                    found.add(int(entry))
        except OSError:
            continue
    return found


def cmdline(pid: int) -> bytes:
    """The process's command line (empty when it is gone or a zombie)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def refused(port: int) -> bool:
    """Whether nothing listens on 127.0.0.1:`port` any more."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return False
    except ConnectionRefusedError:
        return True


def host_dir(cloud: SimCloud, instance_id: str) -> str:
    return str(cloud.state_dir / "instances" / instance_id)


def one_offer(cloud: SimCloud, gpu: str, count: int = 1, spot: bool = True) -> Offer:
    [offer] = cloud.offers(Requirements(count, 0, gpus=frozenset({gpu}), interruptible=spot))
    return offer


def nvidia_smi(factory: ConnectionFactory, cloud: SimCloud, instance_id: str) -> list[str]:
    inst = cloud.get(instance_id)
    assert inst.reachable and inst.ssh_host and inst.ssh_port
    # As for Vast.ai and RunPod, the key is the one seen at first contact; it is the host's.
    key = format_host_key(trust_on_first_use(inst.ssh_host, inst.ssh_port))
    record = json.loads((cloud.state_dir / "sim.json").read_text())["instances"][instance_id]
    assert key == record["host_key"]
    conn = factory.connect(inst.ssh_host, inst.ssh_port, inst.ssh_user, key)
    result = run(conn, ["nvidia-smi", "--query-gpu=name,memory.total",
                        "--format=csv,noheader,nounits"], timeout=30).check()
    return result.stdout.strip().splitlines()


def test_offers_mirror_catalog_prices_and_filters(tmp_path: Path) -> None:
    cloud = SimCloud(tmp_path / "sim")
    catalog = {(o.gpu, o.gpu_count, o.interruptible): o.price_per_hour
               for o in load().offers if o.provider == "cloud"}
    for count in (1, 2, 4, 8):
        offers = cloud.offers(Requirements(count, 0))
        assert {(o.gpu, o.gpu_count, o.interruptible): o.price_per_hour for o in offers} == {
            k: v for k, v in catalog.items() if k[1] == count}
        assert all(o.provider == "sim" and o.billing is Billing.PER_SECOND for o in offers)
    assert one_offer(cloud, "A100 80GB", 8, spot=False).price_per_hour == Decimal("0.468") * 8
    assert [o.gpu for o in cloud.offers(Requirements(1, 0, gpus=frozenset({"RTX 4090"})))] == [
        "RTX 4090"]  # spot only: the catalog sells no on-demand 4090
    big = cloud.offers(Requirements(1, 32 * GIB))
    assert {o.gpu for o in big} == {"A100 80GB", "H100 PCIe"}
    assert all(not o.interruptible for o in cloud.offers(Requirements(1, 0, interruptible=False)))
    cheap = cloud.offers(Requirements(1, 0, max_price_per_hour=Decimal("0.2")))
    assert {(o.gpu, o.price_per_hour) for o in cheap} == {
        ("RTX 3090", Decimal("0.074")), ("RTX 4090", Decimal("0.177"))}
    prices = [o.price_per_hour or 0 for o in cloud.offers(Requirements(1, 0))]
    assert prices == sorted(prices)
    limited = SimCloud(tmp_path / "sim", capacity={"RTX 3090": 0}, gpus=["RTX 3090", "RTX 4090"])
    assert {o.gpu for o in limited.offers(Requirements(1, 0))} == {"RTX 4090"}
    with pytest.raises(ValueError, match="unknown GPU model"):
        SimCloud(tmp_path / "sim", gpus=["Voodoo 5"])


def test_create_boots_a_host_with_the_offers_gpus_seen_by_another_process_object(
    state_dir: Path, ssh_keypair: KeyPair, ssh_factory: ConnectionFactory
) -> None:
    cloud = SimCloud(state_dir)
    offer = one_offer(cloud, "RTX 4090", 2)
    inst = cloud.create(offer, ssh_keypair.public, "job-1")
    assert inst.state is InstanceState.RUNNING and inst.label == tag_for("job-1")
    assert inst.job_id == "job-1" and inst.ssh_host == "127.0.0.1" and inst.gpu_count == 2
    assert inst.price_per_hour == offer.price_per_hour and inst.interruptible
    gpus = nvidia_smi(ssh_factory, cloud, inst.instance_id)
    assert gpus == ["NVIDIA GeForce RTX 4090, 24564"] * 2

    other = SimCloud(state_dir)  # what another orch process (reconcile, a worker) constructs
    assert [i.instance_id for i in other.list()] == [inst.instance_id]
    assert [i.instance_id for i in other.list("job-1")] == [inst.instance_id]
    assert other.list("job-2") == []
    again = other.get(inst.instance_id)
    assert (again.state, again.ssh_port, again.label) == (inst.state, inst.ssh_port, inst.label)
    record = json.loads((state_dir / "sim.json").read_text())["instances"][inst.instance_id]
    assert record["created_at"].endswith("+00:00") and record["price_per_hour"] == "0.354"
    assert record["host_dir"] == host_dir(cloud, inst.instance_id)

    h100 = cloud.create(one_offer(cloud, "H100 PCIe", spot=False), ssh_keypair.public, "job-2")
    assert nvidia_smi(ssh_factory, cloud, h100.instance_id) == ["NVIDIA H100 PCIe, 81559"]
    a100 = cloud.create(one_offer(cloud, "A100 80GB"), ssh_keypair.public, "job-2")
    assert nvidia_smi(ssh_factory, cloud, a100.instance_id) == ["NVIDIA A100-SXM4-80GB, 81920"]
    assert {i.instance_id for i in other.list("job-2")} == {h100.instance_id, a100.instance_id}


def test_hosts_outlive_the_creating_process_and_terminate_from_another_one(
    state_dir: Path, ssh_keypair: KeyPair, ssh_factory: ConnectionFactory
) -> None:
    script = textwrap.dedent(f"""
        from pathlib import Path
        from providers.base import Requirements
        from providers.sim.compute import SimCloud
        cloud = SimCloud(Path({str(state_dir)!r}))
        [offer] = cloud.offers(Requirements(1, 0, gpus=frozenset({{"RTX 3090"}})))
        print(cloud.create(offer, {ssh_keypair.public!r}, "job-9").instance_id)
    """)
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                         text=True, timeout=60, check=True)  # fmt: skip
    instance_id = out.stdout.strip()
    cloud = SimCloud(state_dir)
    assert cloud.get(instance_id).state is InstanceState.RUNNING
    assert nvidia_smi(ssh_factory, cloud, instance_id) == ["NVIDIA GeForce RTX 3090, 24576"]
    port = cloud.get(instance_id).ssh_port
    assert port is not None and host_processes(host_dir(cloud, instance_id))
    ssh_factory.close_all()
    cloud.terminate(instance_id)
    assert host_processes(host_dir(cloud, instance_id)) == set() and refused(port)
    with pytest.raises(NotFound):
        cloud.get(instance_id)


def test_capacity_is_shared_and_freed_by_terminate(state_dir: Path, ssh_keypair: KeyPair) -> None:
    cloud = SimCloud(state_dir, capacity={"RTX 3090": 1})
    offer = one_offer(cloud, "RTX 3090")
    first = cloud.create(offer, ssh_keypair.public, "job-1")
    with pytest.raises(CapacityError, match="RTX 3090"):
        cloud.create(offer, ssh_keypair.public, "job-2")
    with pytest.raises(CapacityError):  # another process sees the same instances
        SimCloud(state_dir, capacity={"RTX 3090": 1}).create(offer, ssh_keypair.public, "job-2")
    assert [i.instance_id for i in cloud.list()] == [first.instance_id]  # nothing half-made
    cloud.create(one_offer(cloud, "RTX 4090"), ssh_keypair.public, "job-3")  # other models: fine
    cloud.terminate(first.instance_id)
    second = cloud.create(offer, ssh_keypair.public, "job-2")
    assert second.state is InstanceState.RUNNING


def test_concurrent_creates_never_exceed_capacity(state_dir: Path, ssh_keypair: KeyPair) -> None:
    # Separate objects lock the state file separately, like separate worker processes.
    clouds = [SimCloud(state_dir, capacity={"RTX 3090": 2}) for _ in range(4)]
    offer = one_offer(clouds[0], "RTX 3090")
    outcomes: list[str] = []

    def create(cloud: SimCloud) -> None:
        try:
            outcomes.append(cloud.create(offer, ssh_keypair.public, "job-1").instance_id)
        except CapacityError:
            outcomes.append("full")

    threads = [threading.Thread(target=create, args=(c,)) for c in clouds]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(outcomes).count("full") == 2
    assert {i.instance_id for i in clouds[0].list("job-1")} == set(outcomes) - {"full"}


class Clock:
    """A settable wall clock."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def test_boot_seconds_then_running_and_per_second_cost(
    state_dir: Path, ssh_keypair: KeyPair
) -> None:
    clock = Clock()
    cloud = SimCloud(state_dir, boot_seconds=30, clock=clock)
    offer = one_offer(cloud, "H100 PCIe", spot=False)
    inst = cloud.create(offer, ssh_keypair.public, "job-1")
    assert inst.state is InstanceState.PROVISIONING and not inst.reachable
    assert inst.ssh_port is None
    clock.now += 29.5
    assert cloud.get(inst.instance_id).state is InstanceState.PROVISIONING
    clock.now += 0.5
    running = cloud.get(inst.instance_id)
    assert running.state is InstanceState.RUNNING and running.reachable
    assert cloud.charged_seconds(inst.instance_id) == 30
    clock.now += 60.2  # a started second is charged
    assert cloud.charged_seconds(inst.instance_id) == 91
    cost = cloud.cost(inst.instance_id)
    assert isinstance(cost, Decimal)
    assert cost == (Decimal("1.811") * 91 / 3600).quantize(Decimal("0.000001"))
    cloud.terminate(inst.instance_id)
    clock.now += 1000  # the meter stopped at terminate
    assert cloud.charged_seconds(inst.instance_id) == 91 and cloud.cost(inst.instance_id) == cost
    assert SimCloud(state_dir, clock=clock).cost(inst.instance_id) == cost


def wait_for(predicate: Callable[[], Any], timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def test_preempt_stops_the_host_and_keeps_its_disks(
    state_dir: Path, ssh_keypair: KeyPair, ssh_factory: ConnectionFactory
) -> None:
    cloud = SimCloud(state_dir)
    inst = cloud.create(one_offer(cloud, "RTX 5090"), ssh_keypair.public, "job-1")
    assert nvidia_smi(ssh_factory, cloud, inst.instance_id) == ["NVIDIA GeForce RTX 5090, 32607"]
    ssh_factory.close_all()
    assert inst.ssh_port is not None
    cloud.preempt(inst.instance_id)
    gone = SimCloud(state_dir).get(inst.instance_id)
    assert gone.state is InstanceState.INTERRUPTED and not gone.reachable
    assert gone.raw_status == "preempted"
    assert refused(inst.ssh_port)
    assert host_processes(host_dir(cloud, inst.instance_id)) == set()
    assert (Path(host_dir(cloud, inst.instance_id)) / "state").is_dir()  # disks kept
    assert [i.state for i in cloud.list("job-1")] == [InstanceState.INTERRUPTED]


def test_preempt_after_s_preempts_spot_instances_on_its_own(
    state_dir: Path, ssh_keypair: KeyPair
) -> None:
    cloud = SimCloud(state_dir, preempt_after_s=1.0)
    spot = cloud.create(one_offer(cloud, "RTX 3090"), ssh_keypair.public, "job-1")
    on_demand = cloud.create(one_offer(cloud, "A100 80GB", spot=False), ssh_keypair.public, "j2")
    port = spot.ssh_port
    assert spot.state is InstanceState.RUNNING and port is not None
    # Nobody polls the provider: the detached watchdog powers the host off on time.
    wait_for(lambda: refused(port), timeout=30)
    assert cloud.get(spot.instance_id).state is InstanceState.INTERRUPTED
    assert cloud.get(on_demand.instance_id).state is InstanceState.RUNNING


def test_terminate_twice_leaves_no_process_and_unknown_is_success(
    state_dir: Path, ssh_keypair: KeyPair
) -> None:
    cloud = SimCloud(state_dir, preempt_after_s=60)
    inst = cloud.create(one_offer(cloud, "RTX 3090"), ssh_keypair.public, "job-1")
    folder = host_dir(cloud, inst.instance_id)
    assert host_processes(folder)
    watchdogs = wait_for(lambda: list((state_dir / "watchdogs").glob("*.pid")))
    watchdog = int(watchdogs[0].read_text())
    cloud.terminate(inst.instance_id)
    cloud.terminate(inst.instance_id)
    SimCloud(state_dir).terminate(inst.instance_id)
    cloud.terminate("sim-never-existed")
    assert host_processes(folder) == set()
    wait_for(lambda: inst.instance_id.encode() not in cmdline(watchdog))  # watchdog killed
    assert cloud.list() == [] and not Path(folder).exists()
    with pytest.raises(NotFound):
        cloud.get(inst.instance_id)
    assert cloud.charged_seconds(inst.instance_id) >= 0  # billing survives terminate


def test_a_host_that_powers_off_on_its_own_reads_as_interrupted(
    state_dir: Path, ssh_keypair: KeyPair
) -> None:
    cloud = SimCloud(state_dir)
    inst = cloud.create(one_offer(cloud, "RTX 3090", spot=True), ssh_keypair.public, "job-1")
    init = int((Path(host_dir(cloud, inst.instance_id)) / "state" / "init.pid").read_text())
    os.kill(init, signal.SIGUSR1)  # what the `host_dies_at_step` fault does
    other = SimCloud(state_dir)
    gone = wait_for(lambda: other.get(inst.instance_id).state is InstanceState.INTERRUPTED)
    assert gone and other.get(inst.instance_id).raw_status == "stopped"
    assert cloud.get(inst.instance_id).state is InstanceState.INTERRUPTED


def test_the_environment_shapes_the_simulated_cloud(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.engine.wiring import sim_from_env

    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    for name, value in {"ORCH_SIM_BOOT_S": "5", "ORCH_SIM_TRAIN_STEPS": "20",
                        "ORCH_SIM_STEP_S": "0.15", "ORCH_SIM_MODEL_BYTES": "16060522496",
                        "ORCH_SIM_DOWNLOAD_BPS": "1.5e10"}.items():
        monkeypatch.setenv(name, value)
    cloud = sim_from_env()
    assert isinstance(cloud, SimCloud)
    assert cloud.settings.boot_seconds == 5.0
    assert cloud.host_options == {"train_steps": 20, "train_step_seconds": 0.15,
                                  "model_size_bytes": 16060522496,
                                  "download_bytes_per_second": 1.5e10}
    monkeypatch.setenv("ORCH_SIM_DOWNLOAD_BPS", "fast")
    with pytest.raises(ValueError, match="ORCH_SIM_DOWNLOAD_BPS='fast': must be a number"):
        sim_from_env()


@pytest.mark.parametrize("shell", ["/usr/sbin/nologin", "/bin/false", "/nonexistent/sh"])
def test_an_account_without_a_login_shell_is_named_as_the_cause(shell: str) -> None:
    """Issue 36 §6: as docs/team.md's nologin `orch` user, sim jobs failed with "no working
    NVIDIA driver ... This account is currently not available": each host's sshd runs the
    commands through the account's login shell. The cause is now said, before renting."""
    import pwd

    from simhost.host import login_shell_problem

    entry = pwd.struct_passwd(("orch", "x", 999, 999, "", "/var/lib/orch", shell))
    problem = login_shell_problem(entry)
    assert problem is not None and f"as orch, and sshd runs each with that account's login " \
        f"shell, {shell}, which runs nothing" in problem
    assert "usermod --shell /bin/sh orch" in problem
    assert login_shell_problem(pwd.struct_passwd(("orch", "x", 999, 999, "", "/", "/bin/sh"))) \
        is None
    assert login_shell_problem() is None  # this test's own account runs the sim hosts
