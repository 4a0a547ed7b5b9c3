"""The Vast.ai adapter against the Vast.ai emulator over real HTTP on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest
from emulators.vast import VastEmulator

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
)
from providers.vastai.compute import VastAI

KEY = "sekrit-vast-key-0123456789"
GIB = 1024**3
PUBKEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOrchTestKey orch-test"


@pytest.fixture
def vast() -> Iterator[VastEmulator]:
    with VastEmulator(api_key=KEY) as emu:
        yield emu


def adapter(emu: VastEmulator, key: str = KEY, **kw: object) -> VastAI:
    opts: dict[str, object] = {"attempts": 4, "initial_s": 0.01, "max_wait_s": 0.05}
    opts.update(kw)
    return VastAI(key, base_url=emu.url, **opts)  # type: ignore[arg-type]


def req(**kw: object) -> Requirements:
    base: dict[str, object] = {"gpu_count": 1, "min_gpu_memory_bytes": 20 * GIB}
    base.update(kw)
    return Requirements(**base)  # type: ignore[arg-type]


def seed(emu: VastEmulator) -> None:
    emu.add_offer(id=1, gpu_name="RTX 4090", dph_base=0.35, min_bid=0.177, storage_cost=0.15)
    emu.add_offer(id=2, gpu_name="RTX 4090", dph_base=0.29, min_bid=0.21, storage_cost=0.10)
    emu.add_offer(id=3, gpu_name="A100 SXM4", gpu_ram=81920, dph_base=0.80, min_bid=0.40)
    emu.add_offer(id=4, gpu_name="A100 PCIE", gpu_ram=40960, dph_base=0.50, min_bid=0.25)
    emu.add_offer(id=5, gpu_name="RTX 4090", num_gpus=2, dph_base=0.60, min_bid=0.30)
    emu.add_offer(id=6, gpu_name="RTX 4090", dph_base=0.20, min_bid=0.10, verified=False)
    emu.add_offer(id=7, gpu_name="RTX 4090", dph_base=0.25, min_bid=0.12, reliability=0.80)


def test_offer_reliability_is_read_under_either_name(vast: VastEmulator) -> None:
    """vast-cli 1.9.1 reads offers' `reliability` (its search field); an answer that still
    names it `reliability2` is read the same, so a minimum keeps the same offers."""
    vast.add_offer(id=1, gpu_name="RTX 4090", reliability=0.95)
    vast.add_offer(id=2, gpu_name="RTX 4090", reliability2=0.97).pop("reliability")
    offers = adapter(vast).offers(req(gpus=frozenset({"RTX 4090"}), interruptible=False))
    assert {o.offer_id: o.reliability for o in offers} == {"1": 0.95, "2": 0.97}


def spot(api: VastAI, **kw: object) -> Offer:
    return api.offers(req(gpus=frozenset({"RTX 4090"}), interruptible=True, **kw))[0]


# -- offers -----------------------------------------------------------------------------

def test_offers_filters_and_price_math(vast: VastEmulator) -> None:
    seed(vast)
    api = adapter(vast)
    ondemand = api.offers(req(gpus=frozenset({"RTX 4090"}), interruptible=False,
                              min_reliability=0.9, disk_gb=100))
    assert [o.offer_id for o in ondemand] == ["2", "1"]
    cheapest = ondemand[0]
    # dph_base + disk × storage_cost / 30 / 24, exactly, as Decimal.
    assert cheapest.price_per_hour == (Decimal("0.29") + Decimal(100) * Decimal("0.10")
                                       / Decimal(720)).quantize(Decimal("0.000001"))
    assert isinstance(cheapest.price_per_hour, Decimal)
    assert not cheapest.interruptible and cheapest.gpu == "RTX 4090"
    assert cheapest.gpu_memory_bytes == 24564 * 1024**2 and cheapest.provider == "vastai"

    body = vast.requests_to("POST", "/api/v0/bundles/")[-1].json
    assert body["type"] == "on-demand"  # vast-cli's spelling; a search field only
    assert body["external"] == {"eq": False} and body["allocated_storage"] == 100
    assert body["gpu_name"] == {"in": ["RTX 4090"]}
    assert body["num_gpus"] == {"eq": 1}
    assert body["gpu_ram"] == {"gte": 20 * 1024}
    assert body["verified"] == {"eq": True} and body["rentable"] == {"eq": True}
    assert body["rented"] == {"eq": False} and body["reliability"] == {"gte": 0.9}
    assert body["order"] == [["dph_total", "asc"]]

    bids = api.offers(req(gpus=frozenset({"RTX 4090"}), interruptible=True, disk_gb=50,
                          min_reliability=0.9))
    assert [o.offer_id for o in bids] == ["1", "2"]  # spot is ranked by min_bid + disk
    assert bids[0].interruptible
    assert bids[0].price_per_hour == (Decimal("0.177") + Decimal(50) * Decimal("0.15")
                                      / Decimal(720)).quantize(Decimal("0.000001"))
    assert vast.requests_to("POST", "/api/v0/bundles/")[-1].json["type"] == "bid"


def test_offers_a100_80gb_mapping_and_both_kinds(vast: VastEmulator) -> None:
    seed(vast)
    api = adapter(vast)
    found = api.offers(req(gpus=frozenset({"A100 80GB"}), min_gpu_memory_bytes=40 * GIB))
    sent = vast.requests_to("POST", "/api/v0/bundles/")[-1].json
    # vast-cli 1.9.1 knows three A100 names (vastai/data/query.py).
    assert sent["gpu_name"] == {"in": ["A100 PCIE", "A100 SXM", "A100 SXM4"]}
    # The 40 GB A100 PCIE is not an "A100 80GB"; both on-demand and bid offers come back.
    assert {(o.offer_id, o.interruptible) for o in found} == {("3", False), ("3", True)}
    assert all(o.gpu == "A100 80GB" for o in found)
    assert found[0].interruptible  # cheapest first
    # It is an "A100 40GB", its own model.
    forty = api.offers(req(gpus=frozenset({"A100 40GB"}), interruptible=False))
    assert [(o.offer_id, o.gpu) for o in forty] == [("4", "A100 40GB")]


def test_offers_max_price_and_count(vast: VastEmulator) -> None:
    seed(vast)
    api = adapter(vast)
    two = api.offers(req(gpu_count=2))
    assert {o.offer_id for o in two} == {"5"} and two[0].gpu_count == 2
    cheap = api.offers(req(max_price_per_hour=Decimal("0.20"), interruptible=True))
    assert cheap and all(o.price_per_hour is not None and o.price_per_hour <= Decimal("0.20")
                         for o in cheap)


def test_offers_need_a_driver_for_the_images_cuda(vast: VastEmulator) -> None:
    # The 0.18.0 trainer images are cu130: a host whose driver tops out at CUDA 12.x fails.
    vast.add_offer(id=11, gpu_name="RTX 4090", dph_base=0.20, cuda_max_good=12.8)
    vast.add_offer(id=12, gpu_name="RTX 4090", dph_base=0.30, cuda_max_good=13.0)
    vast.add_offer(id=13, gpu_name="RTX 4090", dph_base=0.40, cuda_max_good=13.1)
    api = adapter(vast)
    found = api.offers(req(interruptible=False, min_cuda="13.0"))
    assert [o.offer_id for o in found] == ["12", "13"]
    assert vast.requests_to("POST", "/api/v0/bundles/")[-1].json["cuda_max_good"] == {
        "gte": 13.0}
    assert [o.offer_id for o in api.offers(req(interruptible=False))] == ["11", "12", "13"]
    assert "cuda_max_good" not in vast.requests_to("POST", "/api/v0/bundles/")[-1].json


# -- create -----------------------------------------------------------------------------

def test_create_spot_tags_label_and_bids(vast: VastEmulator) -> None:
    seed(vast)
    api = adapter(vast)
    offer = spot(api, min_reliability=0.9)
    inst = api.create(offer, PUBKEY, "job-42", image="img:1", disk_gb=40)
    assert inst.label == "orch-job-42" and inst.job_id == "job-42"
    assert inst.state is InstanceState.PROVISIONING and inst.interruptible
    body = vast.requests_to("PUT", f"/api/v0/asks/{offer.offer_id}/")[-1].json
    # `vastai create instance --ssh --direct`'s runtype; the bid makes it interruptible
    assert body["label"] == "orch-job-42" and body["runtype"] == "ssh_direc ssh_proxy"
    assert body["price"] == pytest.approx(0.177) and body["disk"] == 40
    assert body["image"] == "img:1" and PUBKEY in body["onstart"]
    assert body["client_id"] == "me" and "type" not in body  # `type` is a search field
    # SSH sessions see the image's environment (PATH, venv) only if onstart persists it.
    assert body["onstart"].startswith("env >> /etc/environment;")
    assert vast.instances[int(inst.instance_id)]["is_bid"] is True


def test_create_on_demand_sends_no_price(vast: VastEmulator) -> None:
    seed(vast)
    api = adapter(vast)
    offer = api.offers(req(gpus=frozenset({"RTX 4090"}), interruptible=False))[0]
    inst = api.create(offer, PUBKEY, "j1", disk_gb=2)
    body = vast.requests_to("PUT", "/api/v0/asks/")[-1].json
    # On demand: `price` is null, as the CLI sends it without --bid_price.
    assert "price" in body and body["price"] is None and body["disk"] == 8  # Vast's minimum
    assert not inst.interruptible


def test_failed_contract_is_destroyed_and_capacity_error(vast: VastEmulator) -> None:
    seed(vast)
    api = adapter(vast)
    offer = spot(api)
    vast.fail_contract(int(offer.offer_id))
    with pytest.raises(CapacityError):
        api.create(offer, PUBKEY, "job-q")
    deletes = vast.requests_to("DELETE", "/api/v0/instances/")
    assert len(deletes) == 1 and not vast.instances  # the stopped contract was destroyed
    assert api.list("job-q") == []


def test_offer_gone_is_capacity_error(vast: VastEmulator) -> None:
    seed(vast)
    api = adapter(vast)
    offer = spot(api)
    vast.remove_offer(int(offer.offer_id))
    with pytest.raises(CapacityError, match="gone"):
        api.create(offer, PUBKEY, "job-g")
    # Renting an offer takes it off the market, too.
    other = api.offers(req(gpus=frozenset({"RTX 4090"}), interruptible=False))[0]
    api.create(other, PUBKEY, "job-h")
    with pytest.raises(CapacityError):
        api.create(other, PUBKEY, "job-i")


def test_invalid_args_is_provider_error_with_message(vast: VastEmulator) -> None:
    seed(vast)
    api = adapter(vast)
    offer = spot(api)
    vast.fail_next(1, 400, {"error": "invalid_args", "msg": "bad image name"}, method="PUT")
    with pytest.raises(ProviderError, match="bad image name") as info:
        api.create(offer, PUBKEY, "job-x")
    assert type(info.value) is ProviderError


def test_lost_create_response_found_by_list_and_not_rented_twice(vast: VastEmulator) -> None:
    seed(vast)
    # A crash right after the provider answered: the create never returns to the caller.
    once = adapter(vast, attempts=1)
    offer = spot(once)
    vast.drop_next_create()
    with pytest.raises(TransientError):
        once.create(offer, PUBKEY, "job-lost")
    found = once.list("job-lost")
    assert len(found) == 1 and found[0].job_id == "job-lost"
    once.terminate(found[0].instance_id)
    # With retries, the adapter finds its own instance instead of renting again.
    api = adapter(vast)
    offer = spot(api)
    vast.drop_next_create()
    inst = api.create(offer, PUBKEY, "job-lost2")
    assert inst.job_id == "job-lost2"
    assert len(vast.requests_to("PUT", "/api/v0/asks/")) == 2 and len(vast.instances) == 1


# -- get / states / list ----------------------------------------------------------------

def test_get_parses_single_object_and_boots_to_running(vast: VastEmulator) -> None:
    seed(vast)
    api = adapter(vast)
    inst = api.create(spot(api), PUBKEY, "job-b")
    vast.set_ssh(inst.instance_id, "127.0.0.1", 2222)
    states = [api.get(inst.instance_id) for _ in range(3)]
    assert [s.state for s in states] == [InstanceState.PROVISIONING,
                                         InstanceState.PROVISIONING, InstanceState.RUNNING]
    assert states[1].raw_status.startswith("loading")
    running = states[-1]
    assert running.reachable and (running.ssh_host, running.ssh_port) == ("127.0.0.1", 2222)
    assert running.ssh_user == "root" and running.gpu == "RTX 4090" and running.gpu_count == 1
    assert running.price_per_hour == Decimal(str(vast.instances[int(inst.instance_id)]
                                                 ["dph_total"]))
    # Direct SSH (public_ipaddr + ports["22/tcp"]) wins over the proxy.
    vast.set_ssh(inst.instance_id, "127.0.0.2", 40022, direct=True)
    direct = api.get(inst.instance_id)
    assert (direct.ssh_host, direct.ssh_port) == ("127.0.0.2", 40022)


def test_outbid_is_interrupted_and_other_states(vast: VastEmulator) -> None:
    seed(vast)
    api = adapter(vast)
    inst = api.create(spot(api), PUBKEY, "job-p")
    vast.preempt(inst.instance_id)
    got = api.get(inst.instance_id)
    assert got.state is InstanceState.INTERRUPTED and "outbid" in got.message
    for status, want in [("exited", InstanceState.FAILED), ("offline", InstanceState.FAILED),
                         ("unknown", InstanceState.UNKNOWN), ("running", InstanceState.RUNNING)]:
        vast.set_status(inst.instance_id, actual_status=status, cur_state="running",
                        intended_status="running", next_state="running")
        assert api.get(inst.instance_id).state is want


def test_get_missing_is_not_found(vast: VastEmulator) -> None:
    with pytest.raises(NotFound):
        adapter(vast).get("424242")


def test_list_finds_only_orch_instances(vast: VastEmulator) -> None:
    seed(vast)
    api = adapter(vast)
    a = api.create(spot(api), PUBKEY, "job-a")
    b = api.create(api.offers(req(gpus=frozenset({"RTX 4090"}), interruptible=False))[0],
                   PUBKEY, "job-b")
    vast.add_instance(label="my-notebook")
    vast.add_instance(label=None)
    vast.add_instance(label="orch-")
    assert {i.instance_id for i in api.list()} == {a.instance_id, b.instance_id}
    assert [i.instance_id for i in api.list("job-a")] == [a.instance_id]
    assert api.list("job-zzz") == []


def test_terminate_and_terminate_missing(vast: VastEmulator) -> None:
    seed(vast)
    api = adapter(vast)
    inst = api.create(spot(api), PUBKEY, "job-t")
    api.terminate(inst.instance_id)
    assert not vast.instances
    api.terminate(inst.instance_id)  # already gone: success
    api.terminate("999999")
    with pytest.raises(NotFound):
        api.get(inst.instance_id)


# -- errors and retries -----------------------------------------------------------------

def test_bad_key_is_auth_error_without_key(vast: VastEmulator) -> None:
    wrong = "wrong-key-should-not-leak-42"
    with pytest.raises(AuthError, match="VAST_API_KEY") as info:
        adapter(vast, key=wrong).offers(req())
    assert wrong not in str(info.value) and KEY not in str(info.value)
    assert len(vast.requests) == 1  # never retried
    with pytest.raises(AuthError):
        VastAI("")


def test_402_is_balance_error(vast: VastEmulator) -> None:
    seed(vast)
    api = adapter(vast)
    offer = spot(api)
    vast.fail_next(1, 402, method="PUT")
    with pytest.raises(BalanceError):
        api.create(offer, PUBKEY, "job-m")
    assert len(vast.requests_to("PUT", "/api/v0/asks/")) == 1


def test_429_plain_text_and_503_are_retried(vast: VastEmulator) -> None:
    seed(vast)
    api = adapter(vast)
    vast.fail_next(2, 429)
    vast.fail_next(1, 503)
    assert api.offers(req(interruptible=False))
    assert len(vast.requests_to("POST", "/api/v0/bundles/")) == 4
    inst = api.create(spot(api), PUBKEY, "job-r")
    vast.fail_next(1, 429, method="GET")
    vast.fail_next(1, 500, method="GET")
    assert api.get(inst.instance_id).instance_id == inst.instance_id
    vast.fail_next(1, 503, method="DELETE")
    api.terminate(inst.instance_id)
    assert not vast.instances


def test_429_retry_after_header_is_honoured(vast: VastEmulator) -> None:
    api = adapter(vast)
    vast.fail_next(1, 429, headers={"Retry-After": "0"})
    assert api.list() == []


def test_persistent_5xx_gives_transient_error(vast: VastEmulator) -> None:
    api = adapter(vast, attempts=3)
    vast.fail_next(10, 503)
    with pytest.raises(TransientError):
        api.list()
    assert len(vast.requests) == 3


def test_key_never_leaves_the_authorization_header(vast: VastEmulator) -> None:
    seed(vast)
    api = adapter(vast)
    inst = api.create(spot(api), PUBKEY, "job-k")
    api.get(inst.instance_id)
    api.list()
    api.terminate(inst.instance_id)
    vast.fail_next(5, 500, {"error": "server_error", "msg": f"echo {KEY}"})
    with pytest.raises(TransientError) as info:
        adapter(vast, attempts=2).list()
    assert KEY not in str(info.value) and KEY not in repr(api)
    assert vast.requests and all(r.authorized for r in vast.requests)
    for r in vast.requests:
        assert KEY not in r.path and KEY not in r.query and KEY not in r.body
        assert all(KEY not in v for v in r.headers.values())


def test_the_key_comes_from_the_environment_or_vastai_is_left_out(
        vast: VastEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.engine import wiring

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.delenv("VAST_API_KEY", raising=False)
    keys, notes = wiring.cloud_keys()
    assert "vastai" not in keys and any(n.startswith("vastai: no API key") for n in notes)
    monkeypatch.setenv("VAST_API_KEY", KEY)
    monkeypatch.setenv("ORCH_VASTAI_URL", vast.url)
    keys, _ = wiring.cloud_keys()
    with wiring.cloud("vastai", keys["vastai"]) as api:  # type: ignore[attr-defined]
        assert api.list() == []


def test_offers_and_instances_carry_the_machine_id(vast: VastEmulator) -> None:
    # The physical machine (vast-cli 1.9.1 `search offers` field `machine_id`, "machine id of
    # instance"): what orch's host memory keys on, known before renting (issue 40).
    seed(vast)
    vast.add_offer(id=8, gpu_name="RTX 4090", dph_base=0.31, min_bid=0.15, machine_id=4242)
    api = adapter(vast)
    offers = {o.offer_id: o for o in api.offers(req(gpus=frozenset({"RTX 4090"}),
                                                    interruptible=True))}
    assert offers["8"].machine_id == "4242" and offers["1"].machine_id == "5001"
    inst = api.create(offers["8"], PUBKEY, "job-m")
    assert inst.machine_id == "4242"
    assert api.get(inst.instance_id).machine_id == "4242"
    assert [i.machine_id for i in api.list("job-m")] == ["4242"]
