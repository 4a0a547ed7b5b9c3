"""The RunPod adapter against the RunPod REST v2 emulator, over real HTTP on loopback."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from decimal import ROUND_HALF_UP, Decimal

import pytest
from emulators.runpod import RunPodEmulator

from providers.base import (
    AuthError,
    BalanceError,
    CapacityError,
    InstanceState,
    NotFound,
    Offer,
    ProviderError,
    Requirements,
    TransientError,
    tag_for,
)
from providers.runpod.answers import Pod
from providers.runpod.compute import RunPod, canonical_gpu

KEY = "rp-secret-KEY-0123456789abcdef"
PUBKEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOrchTestKey orch-test"
GiB = 1024**3

CATALOG = [
    {"id": "NVIDIA GeForce RTX 4090", "name": "RTX 4090", "memory": 24, "secure": True,
     "community": True, "price": {"secure": "0.69", "community": "0.34"},
     "maxCount": {"secure": 8, "community": 2}, "availability": "HIGH",
     "dataCenters": [{"id": "EU-RO-1", "availability": "HIGH"}]},
    {"id": "NVIDIA A100 80GB PCIe", "name": "A100 PCIe", "memory": 80, "secure": True,
     "community": True, "price": {"secure": "1.64", "community": "1.19"},
     "maxCount": {"secure": 8, "community": 8}, "availability": "LOW", "dataCenters": []},
    {"id": "NVIDIA H100 80GB HBM3", "name": "H100 SXM", "memory": 80, "secure": True,
     "community": False, "price": {"secure": "2.99", "community": None},
     "maxCount": {"secure": 8, "community": 0}, "availability": "MEDIUM", "dataCenters": []},
    {"id": "NVIDIA H100 PCIe", "name": "H100 PCIe", "memory": 80, "secure": True,
     "community": True, "price": {"secure": "2.39", "community": "1.99"},
     "maxCount": {"secure": 4, "community": 4}, "availability": "NONE", "dataCenters": []},
    {"id": "AMD Instinct MI300X OAM", "name": "MI300X", "memory": 192, "secure": True,
     "community": False, "price": {"secure": "2.49", "community": None},
     "maxCount": {"secure": 8, "community": 0}, "availability": "HIGH", "dataCenters": []},
]


@pytest.fixture
def emu() -> Iterator[RunPodEmulator]:
    with RunPodEmulator(api_key=KEY, gpus=json.loads(json.dumps(CATALOG))) as emulator:
        yield emulator


def adapter(emu: RunPodEmulator, key: str = KEY, attempts: int = 4) -> RunPod:
    return RunPod(key, base_url=emu.url, attempts=attempts, deadline_s=10,
                  initial_backoff_s=0.01, max_backoff_s=0.05)


@pytest.fixture
def rp(emu: RunPodEmulator) -> Iterator[RunPod]:
    with adapter(emu) as provider:
        yield provider


def with_disks(gpus: str, container_gb: int = 50, volume_gb: int = 100) -> Decimal:
    """`gpus` $/h plus the pod's container disk and volume disk while it runs, at RunPod's
    published $0.10/GB/month for each (docs.runpod.io/pods/pricing), a month of 720 h."""
    disks = (container_gb + volume_gb) * Decimal("0.10") / 720
    return (Decimal(gpus) + disks).quantize(Decimal("0.000001"), ROUND_HALF_UP)


def req(count: int = 1, memory_gib: int = 20, **kw: object) -> Requirements:
    return Requirements(gpu_count=count, min_gpu_memory_bytes=memory_gib * GiB, **kw)  # type: ignore[arg-type]


def first_offer(rp: RunPod, gpu: str = "RTX 4090", cloud: str = "secure") -> Offer:
    return next(o for o in rp.offers(req()) if o.gpu == gpu and o.region == cloud)


def assert_no_key(emu: RunPodEmulator) -> None:
    for r in emu.requests:
        assert KEY not in r.path and KEY not in json.dumps(r.query)
        assert KEY not in json.dumps(r.body) and KEY not in json.dumps(r.headers)


# -- offers -------------------------------------------------------------------------------

def test_gpu_name_mapping() -> None:
    assert canonical_gpu("NVIDIA GeForce RTX 4090") == "RTX 4090"
    assert canonical_gpu("NVIDIA A100 80GB PCIe") == "A100 80GB"
    assert canonical_gpu("NVIDIA H100 80GB HBM3") == "H100 SXM"
    assert canonical_gpu("NVIDIA H100 PCIe") == "H100 PCIe"
    assert canonical_gpu("NVIDIA GeForce RTX 5090") == "RTX 5090"
    assert canonical_gpu("AMD Instinct MI300X OAM") is None


def test_every_mapped_gpu_passes_the_hosts_inventory_check() -> None:
    """RunPod GPU ids are the names nvidia-smi prints on the pod: each id orch maps to a
    catalog model must be accepted as that model by the GPU playbook, or orch rents a pod
    that it then refuses (H100 NVL used to be mapped to H100 PCIe)."""
    from playbooks.gpu import catalog_model
    from providers.runpod.compute import GPU_NAMES

    for runpod_id, model in GPU_NAMES.items():
        assert catalog_model(runpod_id) == model, runpod_id
    # H100 NVL (94 GB, NVLink-bridged pairs) is a product of its own: its own model, never
    # sold as an H100 PCIe.
    assert canonical_gpu("NVIDIA H100 NVL") == "H100 NVL"
    assert canonical_gpu("NVIDIA H200 NVL") == "H200 NVL"


def test_offers_mapping_filtering_and_price(rp: RunPod, emu: RunPodEmulator) -> None:
    offers = rp.offers(req(2))
    got = {(o.gpu, o.region): o for o in offers}
    # H100 PCIe availability NONE, MI300X unmapped, H100 SXM has no community cloud.
    assert set(got) == {("RTX 4090", "secure"), ("RTX 4090", "community"),
                        ("A100 80GB", "secure"), ("A100 80GB", "community"),
                        ("H100 SXM", "secure")}
    o = got[("RTX 4090", "community")]
    assert o.price_per_hour == with_disks("0.68") and isinstance(o.price_per_hour, Decimal)
    assert got[("H100 SXM", "secure")].price_per_hour == with_disks("5.98")
    assert o.provider == "runpod" and o.gpu_count == 2 and not o.interruptible
    assert o.billing.value == "per_second" and o.offer_id == "COMMUNITY|NVIDIA GeForce RTX 4090"
    assert [x.price_per_hour for x in offers] == sorted(x.price_per_hour for x in offers)  # type: ignore[type-var]
    # Availability is asked per cloud and per GPU count (openapi listGpuTypes: `cloud`,
    # `count`; without them it is SECURE and 1 GPU).
    assert [c.query for c in emu.calls("GET", "/v2/catalog/gpus")] == [
        {"include": ["AVAILABILITY"], "product": ["POD"], "cloud": [cloud], "count": ["2"]}
        for cloud in ("SECURE", "COMMUNITY")]


def test_offers_respect_max_count_memory_gpus_price_and_spot(rp: RunPod) -> None:
    four = {(o.gpu, o.region) for o in rp.offers(req(4))}
    assert ("RTX 4090", "community") not in four and ("RTX 4090", "secure") in four
    assert {o.gpu for o in rp.offers(req(1, memory_gib=40))} == {"A100 80GB", "H100 SXM"}
    only = rp.offers(req(1, gpus=frozenset({"A100 80GB"}), max_price_per_hour=Decimal("1.5")))
    assert [(o.gpu, o.price_per_hour) for o in only] == [("A100 80GB", with_disks("1.19"))]
    assert rp.offers(req(1, interruptible=True)) == []


def test_availability_is_per_cloud_and_count_and_max_count_is_no_stock(
        rp: RunPod, emu: RunPodEmulator) -> None:
    """`maxCount` is the largest machine's GPU count, not stock (openapi GpuType.maxCount):
    what can be created now is `availability` asked with `cloud` and `count`. A create past
    what that cloud can place is RunPod's 400 "no capacity"."""
    a100 = frozenset({"A100 80GB"})
    seen = next(o for o in rp.offers(req(2, gpus=a100)) if o.region == "secure")
    # The A100s: machines of 8 in both clouds, but only one GPU free in SECURE now.
    emu.gpus[1]["_stock"] = {"secure": 1, "community": 8}
    assert {o.region for o in rp.offers(req(2, gpus=a100))} == {"community"}
    assert {o.region for o in rp.offers(req(1, gpus=a100))} == {"secure", "community"}
    assert emu.calls("GET", "/v2/catalog/gpus")[-1].query["count"] == ["1"]
    # The offer seen while there was room: its create is refused now.
    with pytest.raises(CapacityError, match="no longer any instances"):
        rp.create(seen, PUBKEY, "too-many")
    assert emu.pod_ids == []


def test_catalog_query_is_checked_as_the_v2_api_checks_it(emu: RunPodEmulator) -> None:
    import httpx

    def status(**params: str) -> int:
        return httpx.get(emu.url + "/catalog/gpus", params=params,
                         headers={"Authorization": f"Bearer {KEY}"}).status_code

    assert status() == 200
    assert status(include="AVAILABILITY", product="POD", cloud="COMMUNITY", count="4") == 200
    assert status(include="AVAILABILITY") == 400  # product is required with it
    assert status(count="2") == 400  # count, cloud, product: only with include=AVAILABILITY
    assert status(cloud="SECURE") == 400
    assert status(include="AVAILABILITY", product="POD", cloud="ALL") == 422
    assert status(include="AVAILABILITY", product="POD", count="0") == 422
    assert status(include="AVAILABILITY", product="POD", minCudaVersion="12.8",
                  cudaVersions="12.8") == 400


# -- lifecycle ----------------------------------------------------------------------------

def test_create_sends_tag_and_key_then_runs_with_ssh(rp: RunPod, emu: RunPodEmulator) -> None:
    offer = first_offer(rp)
    inst = rp.create(offer, PUBKEY, "job42", image="img:1", disk_gb=50)
    assert inst.state is InstanceState.PROVISIONING and inst.label == tag_for("job42")
    # The pod's `cost` is its GPUs' price (openapi Pod example: 0.44 for one RTX 4090 in
    # SECURE, the catalog's price.secure); its 50 GB container disk and 50 GB volume add.
    assert inst.job_id == "job42" and inst.price_per_hour == with_disks("0.69", 50, 50)
    (post,) = emu.calls("POST", "/v2/pods")
    # The volume goes to /workspace/data: RunPod's default /workspace would hide the
    # image's /workspace/axolotl and /workspace/axolotl-venv.
    assert post.body == {"name": "orch-job42", "image": "img:1",
                         "gpu": {"id": "NVIDIA GeForce RTX 4090", "count": 1},
                         "cloud": "SECURE", "disk": 50, "ports": ["22/tcp"],
                         "env": {"PUBLIC_KEY": PUBKEY}, "startSsh": True,
                         "mounts": {"persistent": {"size": 50, "path": "/workspace/data"}}}
    assert not emu.calls("PUT", "/v2/account/ssh-keys")
    emu.set_ssh(inst.instance_id, "203.0.113.7", 40022)
    first = rp.get(inst.instance_id)
    assert first.state is InstanceState.PROVISIONING and first.raw_status == "STARTING"
    assert first.ssh_host is None and not first.reachable
    running = rp.get(inst.instance_id)
    assert running.state is InstanceState.RUNNING and running.reachable
    assert (running.ssh_host, running.ssh_port, running.ssh_user) == ("203.0.113.7", 40022,
                                                                     "root")
    assert running.gpu == "RTX 4090" and running.gpu_count == 1
    assert_no_key(emu)


def test_default_image_starts_sshd_and_ssh_is_read_from_v2(rp: RunPod,
                                                           emu: RunPodEmulator) -> None:
    """Without an image the pod runs the trainer's cloud image, which starts sshd from
    PUBLIC_KEY (an image that does not never answers on 22); the endpoint is `ssh.direct`,
    or the public mapping of 22/tcp in `runtime.ports`, never the interactive-only proxy."""
    inst = rp.create(first_offer(rp), PUBKEY, "j7", disk_gb=5)
    (post,) = emu.calls("POST", "/v2/pods")
    assert post.body["image"].startswith("axolotlai/axolotl-cloud:0.18.0-")
    assert post.body["mounts"]["persistent"]["size"] == 10  # RunPod's minimum volume
    emu.set_ssh(inst.instance_id, "203.0.113.9", 40100)
    rp.get(inst.instance_id)
    running = rp.get(inst.instance_id)
    assert (running.ssh_host, running.ssh_port) == ("203.0.113.9", 40100)
    pod = emu.pod(inst.instance_id)
    assert pod["ssh"]["proxy"]["host"] == "ssh.runpod.io"  # not for orch: no SFTP, no exec
    # The same pod as a RunPod that reports only `runtime.ports` still gives the endpoint.
    pod["ssh"]["direct"] = None
    inst2 = rp._instance(Pod.model_validate(pod))
    assert (inst2.ssh_host, inst2.ssh_port, inst2.ssh_user) == ("203.0.113.9", 40100, "root")


def test_emulator_rejects_what_the_v2_api_rejects(rp: RunPod, emu: RunPodEmulator) -> None:
    import httpx

    base = {"name": "x", "image": "runpod/base:1.0.2", "gpu": {"id": "NVIDIA GeForce RTX 4090"}}
    bad = [{**base, "volumeInGb": 20},  # a v1 field: CreatePodRequest has no such property
           {**base, "mounts": {"persistent": {"size": 5, "path": "/workspace/data"}}},
           {**base, "mounts": {"persistent": {"size": 20}}}]
    for body in bad:
        response = httpx.post(emu.url + "/pods", json=body,
                              headers={"Authorization": f"Bearer {KEY}"})
        assert response.status_code == 422, body
    both = {**base, "mounts": {"persistent": {"size": 20, "path": "/d"},
                               "network": [{"volumeId": "v", "path": "/n"}]}}
    response = httpx.post(emu.url + "/pods", json=both,
                          headers={"Authorization": f"Bearer {KEY}"})
    assert response.status_code == 400


def test_offers_and_create_need_a_driver_with_the_images_cuda(rp: RunPod,
                                                              emu: RunPodEmulator) -> None:
    # The 0.18.0 trainer images are cu130. The catalog scopes availability to machines with
    # CUDA >= minCudaVersion, and the create names it too (gpu.minCudaVersion), so a pod
    # never lands on a CUDA 12 driver (api-reference-v2/openapi.json).
    emu.gpus[0]["cudaVersions"] = [{"version": "12.8", "available": True}]
    emu.gpus[1]["cudaVersions"] = [{"version": "12.8", "available": True},
                                   {"version": "13.0", "available": True}]
    offers = rp.offers(req(min_cuda="13.0"))
    assert "RTX 4090" not in {o.gpu for o in offers}
    assert emu.calls("GET", "/v2/catalog/gpus")[-1].query["minCudaVersion"] == ["13.0"]
    a100 = next(o for o in offers if o.gpu == "A100 80GB")
    emu.gpus[1]["cudaVersions"][1]["available"] = False  # the CUDA 13 machines filled up
    with pytest.raises(CapacityError):
        rp.create(a100, PUBKEY, "job-cuda")
    emu.gpus[1]["cudaVersions"][1]["available"] = True
    assert rp.create(a100, PUBKEY, "job-cuda").state is InstanceState.PROVISIONING
    bodies = [c.body for c in emu.calls("POST", "/v2/pods")]
    assert [b["gpu"]["minCudaVersion"] for b in bodies] == ["13.0", "13.0"]
    # Without a CUDA floor the CUDA 12 machines are offered, and nothing is asked at create.
    assert "RTX 4090" in {o.gpu for o in rp.offers(req())}
    assert "minCudaVersion" not in emu.calls("GET", "/v2/catalog/gpus")[-1].query


def test_states_exited_error_and_missing(rp: RunPod, emu: RunPodEmulator) -> None:
    inst = rp.create(first_offer(rp), PUBKEY, "j1")
    emu.exit_pod(inst.instance_id)
    exited = rp.get(inst.instance_id)
    assert exited.state is InstanceState.INTERRUPTED and exited.raw_status == "EXITED"
    # An EXITED pod's GPUs cost 0; its 100 GB volume disk bills $0.20/GB/month stopped.
    stopped = (100 * Decimal("0.20") / 720).quantize(Decimal("0.000001"), ROUND_HALF_UP)
    assert exited.price_per_hour == stopped and exited.ssh_host is None
    emu.set_status(inst.instance_id, "ERROR")
    assert rp.get(inst.instance_id).state is InstanceState.FAILED
    emu.set_status(inst.instance_id, "TERMINATED")
    assert rp.get(inst.instance_id).state is InstanceState.TERMINATED
    with pytest.raises(NotFound):
        rp.get("pod9999x")


def test_list_only_orch_pods_and_a_lost_create(rp: RunPod, emu: RunPodEmulator) -> None:
    emu.add_pod("my-notebook")
    emu.add_pod("orch-")  # the prefix alone is no job
    mine = rp.create(first_offer(rp), PUBKEY, "a")
    emu.lose_next_create(500)
    with pytest.raises(TransientError):  # only one attempt: the response is "lost"
        adapter(emu, attempts=1).create(first_offer(rp), PUBKEY, "b")
    assert {i.job_id for i in rp.list()} == {"a", "b"}
    (lost,) = rp.list("b")
    assert lost.label == "orch-b" and lost.instance_id != mine.instance_id
    assert rp.list("nobody") == []


def test_create_retry_after_lost_response_does_not_duplicate(rp: RunPod,
                                                             emu: RunPodEmulator) -> None:
    emu.lose_next_create(503)
    inst = rp.create(first_offer(rp), PUBKEY, "once")
    assert len(emu.calls("POST", "/v2/pods")) == 1
    assert [i.instance_id for i in rp.list("once")] == [inst.instance_id]


def test_terminate_and_terminate_missing(rp: RunPod, emu: RunPodEmulator) -> None:
    inst = rp.create(first_offer(rp), PUBKEY, "t")
    rp.terminate(inst.instance_id)
    assert inst.instance_id not in emu.pod_ids
    rp.terminate(inst.instance_id)  # 404: already gone = success
    assert [r.status for r in emu.calls("DELETE")] == [204, 404]


# -- errors -------------------------------------------------------------------------------

def test_capacity_400_and_403_on_create(rp: RunPod, emu: RunPodEmulator) -> None:
    offer = first_offer(rp)
    emu.no_capacity_on_create()
    with pytest.raises(CapacityError, match="no longer any instances"):
        rp.create(offer, PUBKEY, "c")
    emu.fail_next(403, method="POST", path="/v2/pods", detail="no access to this pool")
    with pytest.raises(CapacityError, match="no access"):
        rp.create(offer, PUBKEY, "c")
    assert len(emu.calls("POST", "/v2/pods")) == 2 and emu.pod_ids == []


def test_401_is_auth_error_without_the_key(emu: RunPodEmulator) -> None:
    wrong = "rp-WRONG-key-should-not-leak"
    with adapter(emu, key=wrong) as rp, pytest.raises(AuthError) as err:
        rp.offers(req())
    text = str(err.value) + repr(err.value) + repr(rp)
    assert "RUNPOD_API_KEY" in text and wrong not in text and "401" in text
    assert len(emu.requests) == 1  # never retried
    assert all(wrong not in json.dumps(r.headers) for r in emu.requests)


def test_402_is_balance_error_with_one_hour_note(rp: RunPod, emu: RunPodEmulator) -> None:
    offer = first_offer(rp)
    emu.fail_next(402, method="POST", detail="insufficient balance")
    with pytest.raises(BalanceError, match="at least one hour of credit"):
        rp.create(offer, PUBKEY, "p")
    assert len(emu.calls("POST")) == 1


def test_422_not_retried(rp: RunPod, emu: RunPodEmulator) -> None:
    offer = first_offer(rp)
    emu.fail_next(422, 5, method="POST", detail="disk must be >= 10")
    with pytest.raises(ProviderError, match="disk must be") as err:
        rp.create(offer, PUBKEY, "v")
    assert not isinstance(err.value, (TransientError, CapacityError))
    assert len(emu.calls("POST")) == 1


def test_429_honours_retry_after(rp: RunPod, emu: RunPodEmulator) -> None:
    emu.fail_next(429, 2, path="/v2/catalog/gpus", retry_after=0.3)
    started = time.monotonic()
    assert rp.offers(req())
    elapsed = time.monotonic() - started
    assert [r.status for r in emu.calls("GET", "/v2/catalog/gpus")] == [429, 429, 200, 200]
    assert elapsed >= 0.55  # two 0.3 s waits, not the 0.01 s backoff


def test_429_without_retry_after_uses_ratelimit_reset(rp: RunPod, emu: RunPodEmulator) -> None:
    emu.fail_next(429, path="/v2/pods", reset_s=0.2)
    started = time.monotonic()
    assert rp.list() == []
    assert time.monotonic() - started >= 0.18
    assert len(emu.calls("GET", "/v2/pods")) == 2


def test_429_on_create_is_resent(rp: RunPod, emu: RunPodEmulator) -> None:
    offer = first_offer(rp)
    emu.fail_next(429, method="POST", retry_after=0)
    inst = rp.create(offer, PUBKEY, "r")
    assert len(emu.calls("POST")) == 2 and not emu.calls("GET", "/v2/pods")
    assert emu.pod_ids == [inst.instance_id]


def test_5xx_retried_then_success(rp: RunPod, emu: RunPodEmulator) -> None:
    inst = rp.create(first_offer(rp), PUBKEY, "s")
    emu.fail_next(500, path="/v2/pods/")
    emu.fail_next(503, path="/v2/pods/")
    assert rp.get(inst.instance_id).instance_id == inst.instance_id
    assert [r.status for r in emu.calls("GET", f"/v2/pods/{inst.instance_id}")] == [500, 503,
                                                                                    200]


def test_persistent_5xx_is_transient_error(rp: RunPod, emu: RunPodEmulator) -> None:
    emu.fail_next(503, 100, path="/v2/pods/")
    with pytest.raises(TransientError, match="503"):
        rp.terminate("pod0001x")
    assert len(emu.calls("DELETE")) == 4  # attempts=4


def test_network_error_is_transient(emu: RunPodEmulator) -> None:
    url = emu.url
    emu.stop()
    rp = RunPod(KEY, base_url=url, attempts=2, initial_backoff_s=0.01, max_backoff_s=0.02)
    with pytest.raises(TransientError) as err:
        rp.list()
    assert KEY not in str(err.value)


def test_key_never_leaks_into_requests_or_errors(rp: RunPod, emu: RunPodEmulator) -> None:
    offer = first_offer(rp)
    emu.fail_next(400, method="POST", detail=f"bad token {KEY} echoed")
    with pytest.raises(CapacityError) as err:
        rp.create(offer, PUBKEY, "k")
    assert KEY not in str(err.value) and "***" in str(err.value)
    rp.create(offer, PUBKEY, "k")
    rp.list()
    assert KEY not in repr(rp)
    assert all(r.authorized for r in emu.requests)
    assert_no_key(emu)
