"""Emulated Vast.ai / RunPod instances that are real simulated GPU hosts, reached over SSH.

The adapters talk to the emulators over HTTP exactly as in the adapter tests; with `hosts=`
the emulators boot a `simhost` host per instance, so the instance's reported SSH
endpoint answers with a real sshd whose `nvidia-smi` names the rented GPU.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from conftest import KeyPair
from emulators.hosts import SimHostBackend, nvidia_smi_gpu, public_keys_in
from emulators.runpod import RunPodEmulator
from emulators.vast import VastEmulator

from playbooks.ssh import ConnectionFactory, HostUnreachable, run, trust_on_first_use
from providers.base import CapacityError, Instance, InstanceState, NotFound, Requirements
from providers.runpod.compute import RunPod
from providers.vastai.compute import VastAI, _onstart

KEY = "emu-hosts-api-key-0123456789"
GIB = 1024**3
RUNPOD_CATALOG = [
    {"id": "NVIDIA GeForce RTX 4090", "name": "RTX 4090", "memory": 24, "secure": True,
     "community": True, "price": {"secure": "0.69", "community": "0.34"},
     "maxCount": {"secure": 8, "community": 2}, "availability": "HIGH", "dataCenters": []},
    {"id": "NVIDIA A100 80GB PCIe", "name": "A100 PCIe", "memory": 80, "secure": True,
     "community": True, "price": {"secure": "1.64", "community": "1.19"},
     "maxCount": {"secure": 8, "community": 8}, "availability": "LOW", "dataCenters": []},
]


class FakeHosts:
    """A HostBackend that records calls (and fails on demand) without booting anything."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.started: list[tuple[str, str, str, int]] = []
        self.stopped: list[str] = []
        self.containers: list[dict[str, Any] | None] = []

    def start(self, instance_id: str, public_key: str, gpu_name: str, gpu_count: int,
              container: dict[str, Any] | None = None) -> tuple[str, int, str]:
        self.containers.append(container)
        if self.fail:
            raise RuntimeError("sshd did not start")
        self.started.append((instance_id, public_key, gpu_name, gpu_count))
        return "127.0.0.1", 40000 + len(self.started), "tester"

    def stop(self, instance_id: str) -> None:
        self.stopped.append(instance_id)


def vast_adapter(emu: VastEmulator) -> VastAI:
    return VastAI(KEY, base_url=emu.url, attempts=4, initial_s=0.01, max_wait_s=0.05)


def runpod_adapter(emu: RunPodEmulator) -> RunPod:
    return RunPod(KEY, base_url=emu.url, attempts=4, deadline_s=10, initial_backoff_s=0.01,
                  max_backoff_s=0.05)


@pytest.fixture
def runpod_emu(sim_hosts: SimHostBackend) -> Iterator[RunPodEmulator]:
    with RunPodEmulator(api_key=KEY, gpus=json.loads(json.dumps(RUNPOD_CATALOG)),
                        hosts=sim_hosts) as emu:
        yield emu


def wait_running(api: Any, instance_id: str, timeout: float = 10.0) -> Instance:
    deadline = time.monotonic() + timeout
    while True:
        inst: Instance = api.get(instance_id)
        if inst.state is InstanceState.RUNNING:
            return inst
        assert time.monotonic() < deadline, f"{instance_id} still {inst.state}"
        time.sleep(0.02)


def gpu_names_over_ssh(keys: KeyPair, host: str, port: int, user: str) -> list[str]:
    """Connect as orch does (host key by trust on first use) and ask nvidia-smi."""
    host_key = trust_on_first_use(host, port, timeout=5, deadline=10)
    with ConnectionFactory(keys.private, connect_timeout=5, connect_deadline=10) as factory:
        conn = factory.connect(host, port, user, host_key)
        result = run(conn, ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                     timeout=30).check()
    return result.stdout.splitlines()


def assert_unreachable(keys: KeyPair, host: str, port: int, user: str, host_key: Any) -> None:
    with ConnectionFactory(keys.private, connect_timeout=1, connect_deadline=1) as factory:
        with pytest.raises(HostUnreachable):
            factory.connect(host, port, user, host_key)


# -- end to end through the adapters -----------------------------------------------------------


def test_vast_instance_is_a_real_host(sim_hosts: SimHostBackend, ssh_keypair: KeyPair) -> None:
    with VastEmulator(api_key=KEY, hosts=sim_hosts) as vast:
        vast.add_offer(id=1, gpu_name="H100 SXM", gpu_ram=81559, num_gpus=2, dph_base=4.0,
                       min_bid=2.0)
        with vast_adapter(vast) as api:
            offer = api.offers(Requirements(gpu_count=2, min_gpu_memory_bytes=70 * GIB,
                                            gpus=frozenset({"H100 SXM"}),
                                            interruptible=True))[0]
            created = api.create(offer, ssh_keypair.public, "job-vast")
            sim = sim_hosts.host(created.instance_id)
            assert sim.running  # booted at create time ...
            first = api.get(created.instance_id)
            assert first.state is InstanceState.PROVISIONING  # ... the progression unchanged
            assert first.ssh_host is None and first.ssh_port is None
            inst = wait_running(api, created.instance_id)
        # The adapter is closed, so the emulator threads that served the create are gone:
        # the host, started with die_with_parent, must not have followed them.
        assert sim.running
        assert (inst.ssh_host, inst.ssh_port) == (sim.host, sim.port)
        assert inst.ssh_host and inst.ssh_port
        assert inst.ssh_user == "root"  # Vast always says root; the sim host's login is:
        user = sim.user
        assert gpu_names_over_ssh(ssh_keypair, inst.ssh_host, inst.ssh_port, user) == [
            "NVIDIA H100 80GB HBM3"] * 2
        assert sim.authorized_key == ssh_keypair.public
        assert sim.options.gpu_memory_mib == 81559 and sim.options.gpu_count == 2

        vast.preempt(created.instance_id)
        with vast_adapter(vast) as api:
            assert api.get(created.instance_id).state is InstanceState.INTERRUPTED
            assert not sim.running
            assert_unreachable(ssh_keypair, sim.host, sim.port, user, sim.host_key)

            api.terminate(created.instance_id)
            with pytest.raises(NotFound):
                api.get(created.instance_id)
        assert not sim.running and sim.processes() == set()


def test_runpod_pod_is_a_real_host(sim_hosts: SimHostBackend, runpod_emu: RunPodEmulator,
                                   ssh_keypair: KeyPair) -> None:
    sim_hosts.options = {"train_steps": 3, "train_step_seconds": 0.01}
    with runpod_adapter(runpod_emu) as api:
        offer = next(o for o in api.offers(Requirements(gpu_count=1,
                                                        min_gpu_memory_bytes=20 * GIB))
                     if o.gpu == "RTX 4090" and o.region == "community")
        created = api.create(offer, ssh_keypair.public, "job-runpod")
        assert created.ssh_host is None  # PROVISIONING: no ssh.direct yet
        sim = sim_hosts.host(created.instance_id)
        assert sim.running
        inst = wait_running(api, created.instance_id)
    assert sim.running
    assert (inst.ssh_host, inst.ssh_port, inst.ssh_user) == (sim.host, sim.port, sim.user)
    assert inst.ssh_host and inst.ssh_port
    assert gpu_names_over_ssh(ssh_keypair, inst.ssh_host, inst.ssh_port, inst.ssh_user) == [
        "NVIDIA GeForce RTX 4090"]
    assert sim.options.train_steps == 3 and sim.options.gpu_memory_mib == 24564

    runpod_emu.preempt(created.instance_id)
    with runpod_adapter(runpod_emu) as api:
        gone = api.get(created.instance_id)
        assert gone.state is InstanceState.INTERRUPTED and gone.raw_status == "EXITED"
        # The GPUs cost 0 once EXITED; its 100 GB volume disk bills $0.20/GB/month stopped
        # (docs.runpod.io/pods/pricing): 100 × 0.20 / 720 h.
        assert gone.ssh_host is None and str(gone.price_per_hour) == "0.027778"
        assert not sim.running
        assert_unreachable(ssh_keypair, sim.host, sim.port, sim.user, sim.host_key)

        api.terminate(created.instance_id)
        with pytest.raises(NotFound):
            api.get(created.instance_id)
    assert not sim.running and sim.processes() == set()


def test_terminating_a_running_instance_powers_its_host_off(
    sim_hosts: SimHostBackend, runpod_emu: RunPodEmulator, ssh_keypair: KeyPair
) -> None:
    with runpod_adapter(runpod_emu) as api:
        offer = next(o for o in api.offers(Requirements(gpu_count=1,
                                                        min_gpu_memory_bytes=70 * GIB))
                     if o.gpu == "A100 80GB" and o.region == "secure")
        created = api.create(offer, ssh_keypair.public, "job-a100")
        inst = wait_running(api, created.instance_id)
        sim = sim_hosts.host(created.instance_id)
        assert inst.ssh_host and inst.ssh_port
        assert gpu_names_over_ssh(ssh_keypair, inst.ssh_host, inst.ssh_port,
                                  inst.ssh_user) == ["NVIDIA A100 80GB PCIe"]
        api.terminate(created.instance_id)
        assert created.instance_id not in runpod_emu.pod_ids
    assert not sim.running and sim.processes() == set()


# -- the emulators' use of a HostBackend (no hosts booted) ---------------------------------------


def test_vast_uses_the_onstart_key_else_the_account_key() -> None:
    pub = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPD0Rz8nc2DwRW5mU1t3+jXOqgRxL1z8vh5p0Z8vCk1M a b"
    account = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBHvGQ9t3lL8bDzY7o3VQv6c2fEJmHq1yW0o2vS8uR4T"
    hosts = FakeHosts()
    with VastEmulator(api_key=KEY, hosts=hosts) as vast:
        vast.add_offer(id=1, gpu_name="RTX 4090")
        vast.add_offer(id=2, gpu_name="A100 SXM4", gpu_ram=81920, num_gpus=4)
        vast.add_offer(id=3, gpu_name="RTX 3090")
        headers = {"Authorization": f"Bearer {KEY}"}
        with httpx.Client(base_url=vast.url, headers=headers) as http:
            body = {"image": "img", "disk": 16, "label": "orch-x"}
            first = http.put("/asks/1/", json={**body, "onstart": _onstart(pub)}).json()
            assert http.put("/asks/3/", json={**body, "onstart": "echo hi"}).json()["success"]
            assert http.post("/ssh/", json={"ssh_key": account}).json()["success"]
            second = http.put("/asks/2/", json={**body, "onstart": "echo hi"}).json()
            for _ in range(4):  # null → loading → running
                listed = http.get("/instances/").json()["instances"]
        assert hosts.started == [
            (str(first["new_contract"]), pub, "RTX 4090", 1),
            (str(second["new_contract"]), account, "A100 SXM4", 4),
        ]  # offer 3 had no key anywhere: no host, no SSH endpoint
        views = {i["id"]: i for i in listed}
        assert views[first["new_contract"]]["ssh_port"] == 40001
        assert views[second["new_contract"]]["ssh_port"] == 40002
        assert all(v["ssh_host"] is None for k, v in views.items()
                   if k not in (first["new_contract"], second["new_contract"]))


def test_vast_failed_contract_boots_nothing_and_a_failed_boot_is_failed() -> None:
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPD0Rz8nc2DwRW5mU1t3+jXOqgRxL1z8vh5p0Z8vCk1M"
    hosts = FakeHosts()
    with VastEmulator(api_key=KEY, hosts=hosts) as vast, vast_adapter(vast) as api:
        vast.add_offer(id=1, gpu_name="RTX 4090")
        vast.fail_contract(1)
        offer = api.offers(Requirements(gpu_count=1, min_gpu_memory_bytes=20 * GIB))[0]
        with pytest.raises(CapacityError, match="could not be rented"):
            api.create(offer, key, "job")
        assert hosts.started == []

    with VastEmulator(api_key=KEY, hosts=FakeHosts(fail=True)) as vast, \
            vast_adapter(vast) as api:
        vast.add_offer(id=1, gpu_name="RTX 4090")
        offer = api.offers(Requirements(gpu_count=1, min_gpu_memory_bytes=20 * GIB))[0]
        inst = api.create(offer, key, "job")
        got = api.get(inst.instance_id)
        assert got.state is InstanceState.FAILED and "host failed to boot" in got.message


def test_vast_preempt_and_delete_stop_the_host_once_per_call() -> None:
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPD0Rz8nc2DwRW5mU1t3+jXOqgRxL1z8vh5p0Z8vCk1M"
    hosts = FakeHosts()
    with VastEmulator(api_key=KEY, hosts=hosts) as vast, vast_adapter(vast) as api:
        vast.add_offer(id=1, gpu_name="RTX 4090", min_bid=0.1)
        vast.drop_next_create()  # the response is lost; the retry adopts the instance
        offer = api.offers(Requirements(gpu_count=1, min_gpu_memory_bytes=20 * GIB,
                                        interruptible=True))[0]
        inst = api.create(offer, key, "job")
        assert [s[0] for s in hosts.started] == [inst.instance_id]
        vast.preempt(inst.instance_id)
        assert hosts.stopped == [inst.instance_id]
        api.terminate(inst.instance_id)
        api.terminate(inst.instance_id)  # already gone: no second stop
        assert hosts.stopped == [inst.instance_id] * 2


def test_runpod_lost_create_boots_one_host_and_failed_boot_is_error() -> None:
    hosts = FakeHosts()
    catalog = json.loads(json.dumps(RUNPOD_CATALOG))
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPD0Rz8nc2DwRW5mU1t3+jXOqgRxL1z8vh5p0Z8vCk1M"
    with RunPodEmulator(api_key=KEY, gpus=catalog, hosts=hosts) as emu, \
            runpod_adapter(emu) as api:
        emu.add_pod("someone-elses")  # no PUBLIC_KEY: no host
        emu.lose_next_create()
        offer = api.offers(Requirements(gpu_count=1, min_gpu_memory_bytes=20 * GIB))[0]
        inst = api.create(offer, key, "job")
        assert hosts.started == [(inst.instance_id, key, "NVIDIA GeForce RTX 4090", 1)]
        running = wait_running(api, inst.instance_id)
        assert (running.ssh_host, running.ssh_port, running.ssh_user) == (
            "127.0.0.1", 40001, "tester")
        api.terminate(inst.instance_id)
        assert hosts.stopped == [inst.instance_id]

    with RunPodEmulator(api_key=KEY, gpus=catalog, hosts=FakeHosts(fail=True)) as emu, \
            runpod_adapter(emu) as api:
        offer = api.offers(Requirements(gpu_count=1, min_gpu_memory_bytes=20 * GIB))[0]
        assert api.create(offer, key, "job").state is InstanceState.FAILED


# -- helpers --------------------------------------------------------------------------------------


def test_public_keys_in_scripts() -> None:
    blob = "AAAAC3NzaC1lZDI1NTE5AAAAIPD0Rz8nc2DwRW5mU1t3+jXOqgRxL1z8vh5p0Z8vCk1M"
    key = f"ssh-ed25519 {blob}"
    assert public_keys_in(_onstart(f"{key} me@laptop")) == [f"{key} me@laptop"]
    assert public_keys_in(_onstart(f"{key} it's \"quoted\"")) == [f"{key} it's \"quoted\""]
    heredoc = f"cat >> ~/.ssh/authorized_keys <<EOF\n{key} c\nEOF\n"
    assert public_keys_in(heredoc) == [key]  # words split apart: found in the raw text
    assert public_keys_in(f"echo '{key} x >> f") == [key]  # unbalanced quote
    assert public_keys_in(f"echo {shlex.quote(key)} > a; echo {shlex.quote(key)} > b") == [key]
    assert public_keys_in("echo 'ssh-ed25519 AAAAnotakey x'") == []
    assert public_keys_in("ssh-rsa " + blob) == []  # an ed25519 blob is not an RSA key
    assert public_keys_in(None) == public_keys_in("") == []


@pytest.mark.parametrize(("emulator_name", "smi_name", "mib"), [
    ("RTX 4090", "NVIDIA GeForce RTX 4090", 24564),  # Vast names
    ("H100 SXM", "NVIDIA H100 80GB HBM3", 81559),
    ("H100 PCIE", "NVIDIA H100 PCIe", 81559),
    ("A100 SXM4", "NVIDIA A100-SXM4-80GB", 81920),
    ("H200", "NVIDIA H200", 143771),
    ("NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 4090", 24564),  # RunPod ids
    ("NVIDIA A100 80GB PCIe", "NVIDIA A100 80GB PCIe", 81920),
    ("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3", 81559),
    ("Tesla T4", "NVIDIA Tesla T4", None),  # unknown: a plausible name, default memory
])
def test_nvidia_smi_names(emulator_name: str, smi_name: str, mib: int | None) -> None:
    assert nvidia_smi_gpu(emulator_name) == (smi_name, mib)


def test_backend_rejects_unknown_options(tmp_path: Any) -> None:
    with pytest.raises(TypeError):
        SimHostBackend(tmp_path, {"no_such_option": 1})
    backend = SimHostBackend(tmp_path, {"gpu_memory_mib": 1000})
    assert backend.host_options("RTX 4090", 2).gpu_memory_mib == 1000  # options win
    backend.stop("never-started")  # idempotent, unknown ids ignored
    with pytest.raises(KeyError):
        backend.host("never-started")


# -- container rentals: what a real Vast.ai / RunPod machine lets a command see ----------------


def ssh_sh(keys: KeyPair, inst: Instance, user: str, script: str) -> Any:
    """`sh -c SCRIPT` over SSH as orch runs commands (non-interactive, no login shell)."""
    assert inst.ssh_host and inst.ssh_port
    host_key = trust_on_first_use(inst.ssh_host, inst.ssh_port, timeout=5, deadline=10)
    with ConnectionFactory(keys.private, connect_timeout=5, connect_deadline=10) as factory:
        conn = factory.connect(inst.ssh_host, inst.ssh_port, user, host_key)
        return run(conn, ["sh", "-c", script], timeout=30)


def test_vast_host_is_a_container_whose_env_comes_from_onstart(
        sim_hosts: SimHostBackend, ssh_keypair: KeyPair) -> None:
    image = "axolotlai/axolotl-cloud:0.18.0-py3.12-cu130-2.12.0"
    with VastEmulator(api_key=KEY, hosts=sim_hosts) as vast:
        vast.add_offer(id=1, dph_base=0.4, min_bid=0.2)
        vast.add_offer(id=2, dph_base=0.5, min_bid=0.2)
        with vast_adapter(vast) as api:
            offer = api.offers(Requirements(gpu_count=1, min_gpu_memory_bytes=20 * GIB,
                                            interruptible=False))[0]
            made = api.create(offer, ssh_keypair.public, "job-env", image=image)
            inst = wait_running(api, made.instance_id)
        sim = sim_hosts.host(made.instance_id)
        venv = sim.path("/workspace/axolotl-venv/bin")
        # orch's onstart persists the image's environment: a plain command finds the venv.
        found = ssh_sh(ssh_keypair, inst, sim.user, "command -v axolotl; command -v hf")
        assert found.ok and found.stdout.split() == [str(venv / "axolotl"), str(venv / "hf")]
        # uv is not in the venv: in root's ~/.local/bin (axolotl docker/Dockerfile-uv-base).
        uv = ssh_sh(ssh_keypair, inst, sim.user, "command -v uv")
        assert uv.ok and uv.stdout.split() == [str(sim.path("/root/.local/bin/uv"))]
        assert not (venv / "uv").exists()
        # A container rental: no Docker inside, no systemd.
        assert ssh_sh(ssh_keypair, inst, sim.user, "docker --version").exit_code == 127
        assert not ssh_sh(ssh_keypair, inst, sim.user, "systemctl is-active docker").ok
        assert ssh_sh(ssh_keypair, inst, sim.user, "command -v vllm").exit_code != 0

        # The same image rented with an onstart that does not persist the environment.
        response = httpx.put(f"{vast.url}/asks/2/", headers={"Authorization": f"Bearer {KEY}"},
                             json={"client_id": "me", "image": image, "disk": 20,
                                   "runtype": "ssh_direc ssh_proxy", "price": None,
                                   "onstart": _onstart(ssh_keypair.public).split("; ", 1)[1]})
        other = str(response.json()["new_contract"])
        with vast_adapter(vast) as api:
            bare = wait_running(api, other)
        plain = ssh_sh(ssh_keypair, bare, sim.user, "command -v axolotl")
        assert plain.exit_code != 0  # the image's PATH is not the session's
        assert ssh_sh(ssh_keypair, bare, sim.user, "command -v uv").exit_code != 0
        bare_uv = shlex.quote(str(sim_hosts.host(other).path("/root/.local/bin/uv")))
        assert ssh_sh(ssh_keypair, bare, sim.user, f"test -x {bare_uv}").ok
        venv_bin = shlex.quote(str(sim_hosts.host(other).path("/workspace/axolotl-venv/bin")))
        explicit = ssh_sh(ssh_keypair, bare, sim.user, f"PATH={venv_bin}:$PATH command -v axolotl")
        assert explicit.ok


@pytest.mark.parametrize("mount", ["/workspace/data", "/workspace"])
def test_runpod_host_keeps_the_image_env_in_rp_environment(
        sim_hosts: SimHostBackend, runpod_emu: RunPodEmulator, ssh_keypair: KeyPair,
        mount: str) -> None:
    body = {"name": "orch-rp-env", "image": "axolotlai/axolotl-cloud:0.18.0-py3.12-cu130-2.12.0",
            "gpu": {"id": "NVIDIA GeForce RTX 4090", "count": 1}, "cloud": "SECURE",
            "ports": ["22/tcp"], "env": {"PUBLIC_KEY": ssh_keypair.public}, "startSsh": True,
            "disk": 50, "mounts": {"persistent": {"size": 20, "path": mount}}}
    pod = httpx.post(runpod_emu.url + "/pods", json=body,
                     headers={"Authorization": f"Bearer {KEY}"}).json()
    with runpod_adapter(runpod_emu) as api:
        inst = wait_running(api, pod["id"])
    sim = sim_hosts.host(pod["id"])
    rp_env = shlex.quote(str(sim.path("/etc/rp_environment")))
    # A non-interactive command does not source /etc/rp_environment ...
    assert ssh_sh(ssh_keypair, inst, sim.user, "command -v axolotl").exit_code != 0
    assert ssh_sh(ssh_keypair, inst, sim.user, "docker --version").exit_code == 127
    sourced = ssh_sh(ssh_keypair, inst, sim.user, f". {rp_env} && command -v axolotl")
    # ... sourcing it finds the venv, unless the volume hides /workspace/axolotl-venv.
    assert sourced.ok is (mount == "/workspace/data")
    assert sim.path(mount).is_dir()
    df = ssh_sh(ssh_keypair, inst, sim.user, f"df -B1 {shlex.quote(str(sim.path(mount)))}")
    assert df.ok and str(sim.path(mount)) in df.stdout


def test_runpod_image_without_public_key_support_never_answers_ssh(
        sim_hosts: SimHostBackend, runpod_emu: RunPodEmulator, ssh_keypair: KeyPair) -> None:
    with runpod_adapter(runpod_emu) as api:
        offer = next(o for o in api.offers(Requirements(gpu_count=1,
                                                        min_gpu_memory_bytes=20 * GIB))
                     if o.gpu == "RTX 4090")
        made = api.create(offer, ssh_keypair.public, "job-nossh",
                          image="nvidia/cuda:13.0.1-runtime-ubuntu24.04")
        inst = wait_running(api, made.instance_id)
    assert inst.reachable and inst.ssh_host and inst.ssh_port  # RunPod publishes 22/tcp ...
    assert made.instance_id not in sim_hosts.instance_ids  # ... but no sshd ever starts
    with pytest.raises(HostUnreachable):
        trust_on_first_use(inst.ssh_host, inst.ssh_port, timeout=1, deadline=1)


def test_which_images_ship_the_axolotl_venv_and_what_a_volume_hides() -> None:
    from simhost.standins.container import hidden, is_axolotl_image

    for image in ("axolotlai/axolotl-cloud:0.18.0-py3.12-cu130-2.12.0",
                  "axolotlai/axolotl:0.18.0-latest", "docker.io/axolotlai/axolotl-cloud-uv:x",
                  "axolotlai/axolotl-cloud@sha256:abc"):
        assert is_axolotl_image(image), image
    for image in ("runpod/pytorch:2.4.0", "nvidia/cuda:13.0.1-runtime-ubuntu24.04",
                  "someone/axolotl:1", "axolotlai/other:1"):
        assert not is_axolotl_image(image), image
    assert hidden("/workspace/axolotl-venv", "/workspace")
    assert hidden("/workspace/axolotl-venv", "/workspace/")
    assert hidden("/workspace/axolotl-venv", "/")
    assert not hidden("/workspace/axolotl-venv", "/workspace/data")
    assert not hidden("/workspace/axolotl-venv", None)
