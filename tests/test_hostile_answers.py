"""A provider's answer is input, not truth (issue 36 §7): the Vast.ai and RunPod emulators
serve hostile answers over real HTTP (NaN, Infinity and `1e999999` prices, negative prices,
strings where numbers belong, a non-list `offers`, JSON nested 100,000 deep, escape
sequences in names, bodies of hundreds of MB, a gzip bomb) to the adapters, to a worker
with a queued job, and to `orch offers` / `orch plan` as real processes.

What must hold: a bad row is left out and counted, a bad answer makes that provider
unavailable (never an internal error, never a failed job), nothing costs less than zero,
nothing a provider names reaches a terminal with its control characters, and no answer is
read past `providers.http.MAX_ANSWER_BYTES`.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import test_engine
import test_engine_providers
from emulators.hosts import SimHostBackend
from emulators.runpod import RunPodEmulator
from emulators.vast import VastEmulator
from test_emulator_hosts import RUNPOD_CATALOG
from test_engine import Rig
from test_engine_providers import KEY, job_for, runpod, vast
from test_faults import assert_invariants, last_state, run
from test_market_cli import env, job  # noqa: F401 - the CLI tests' environment fixture
from test_market_cli import orch as orch_cli

from providers.base import BadAnswer, ProviderError, Requirements
from providers.http import MAX_ANSWER_BYTES
from providers.runpod.compute import RunPod
from providers.vastai.compute import VastAI

rig = test_engine.rig
hosts = test_engine_providers.hosts

BUNDLES = "/api/v0/bundles/"
CATALOG = "/v2/catalog/gpus"
MIB = 2**20
GIB = 1024**3
# What a terminal acts on: ESC (window title, screen clear), BEL, C1 CSI, a bidi override.
ESCAPES = "\x1b]0;pwned\x07\x1b[2J\x9b31m\u202e"
HUGE = "__1e999999__"  # a placeholder json.dumps cannot write: replaced by the raw number

GOOD_VAST_ROW: dict[str, Any] = {
    "id": 1, "machine_id": 5001, "gpu_name": "RTX 4090", "gpu_ram": 24564, "num_gpus": 1,
    "dph_base": 0.30, "min_bid": 0.15, "storage_cost": 0.10, "cpu_cores_effective": 16.0,
    "cpu_ram": 64000, "disk_space": 500.0, "geolocation": "US", "reliability": 0.99,
    "verified": True, "cuda_max_good": 13.0}


def raw_json(doc: Any) -> str:
    """`doc` as JSON, with NaN/Infinity as Python's json writes them and `HUGE` as 1e999999."""
    return json.dumps(doc).replace(f'"{HUGE}"', "1e999999")


def vast_row(**over: Any) -> dict[str, Any]:
    return {**GOOD_VAST_ROW, **over}


def nested(depth: int = 100_000) -> str:
    return "[" * depth + "]" * depth


def spot_and_on_demand(count: int = 1) -> Requirements:
    return Requirements(gpu_count=count, min_gpu_memory_bytes=20 * GIB, interruptible=False)


def quick_vast(emu: VastEmulator) -> VastAI:
    return VastAI(KEY, base_url=emu.url, attempts=4, initial_s=0.01, max_wait_s=0.05)


def quick_runpod(emu: RunPodEmulator) -> RunPod:
    return RunPod(KEY, base_url=emu.url, attempts=4, deadline_s=10, initial_backoff_s=0.01,
                  max_backoff_s=0.05)


def no_escapes(text: str) -> bool:
    return not any(ch in text for ch in "\x1b\x07\x9b\u202e")


# Rows that break the documented shape, each with the field orch names for it.
HOSTILE_VAST_ROWS = [
    (vast_row(id=2, dph_base=float("nan")), "dph_base: Input should be a finite number"),
    (vast_row(id=3, dph_base=float("inf")), "dph_base: Input should be a finite number"),
    (vast_row(id=4, dph_base=HUGE), "dph_base: Input should be a finite number"),
    (vast_row(id=5, dph_base=-0.0166), "dph_base: Input should be greater than or equal to 0"),
    (vast_row(id=6, dph_base="cheap"), "dph_base: Input should be a valid decimal"),
    (vast_row(id=7, num_gpus="two"), "num_gpus: Input should be a valid integer"),
    (vast_row(id=8, gpu_ram=float("-inf")), "gpu_ram: Input should be a finite number"),
    (vast_row(id=9, storage_cost=-1), "storage_cost: Input should be greater than or equal"),
    (vast_row(id=10, dph_base=1e9), "dph_base: Input should be less than or equal to 1000"),
]


# --- Vast.ai --------------------------------------------------------------------------------


@pytest.fixture
def vemu() -> Iterator[VastEmulator]:
    with VastEmulator(api_key=KEY) as emu:
        yield emu


def test_vast_bad_rows_are_left_out_and_counted_by_field(vemu: VastEmulator) -> None:
    rows = [row for row, _ in HOSTILE_VAST_ROWS]
    rows += [vast_row(id=11, gpu_name=f"Evil{ESCAPES}GPU"), "not an object", GOOD_VAST_ROW]
    vemu.answer_next(raw_json({"offers": rows}), path=BUNDLES)
    with quick_vast(vemu) as adapter:
        offers = adapter.offers(spot_and_on_demand())
        assert [(o.offer_id, o.price_per_hour) for o in offers] == [("1", Decimal("0.313889"))]
        assert all(o.price_per_hour is not None and o.price_per_hour >= 0 for o in offers)
        rejected = adapter.rejected
        assert sum(rejected.values()) == len(HOSTILE_VAST_ROWS) + 1, rejected
        for _, why in HOSTILE_VAST_ROWS:
            assert any(k.startswith(why) for k in rejected), (why, rejected)
        # The unknown GPU is named, without a byte a terminal would act on.
        (name,) = adapter.skipped
        assert no_escapes(name) and name.startswith("Evil]0;pwned") and name.endswith("GPU")
    # Host RAM and disk come from the answer (cpu_ram in MiB, disk_space in GB).
    assert offers[0].ram_bytes == 64000 * MIB and offers[0].disk_bytes == 500 * 1000**3


@pytest.mark.parametrize("body", [
    '{"offers": {"id": 1}}',  # not a list
    '{"offers": "many"}',
    '{"offers": ' + nested() + "}",  # 100,000 deep
    nested(),
    "<html>502 Bad Gateway</html>",
    "[]",
    '{"offers": [' + '{"id": 1},' * 3 + "",  # cut short
], ids=["dict", "string", "deep", "deep-top", "html", "list", "truncated"])
def test_vast_answer_of_the_wrong_shape_is_a_bad_answer_not_retried(vemu: VastEmulator,
                                                                    body: str) -> None:
    vemu.answer_next(body, path=BUNDLES)
    with quick_vast(vemu) as adapter, pytest.raises(BadAnswer) as err:
        adapter.offers(spot_and_on_demand())
    assert "Vast.ai POST /bundles/" in str(err.value) and len(str(err.value)) < 1000
    assert len(vemu.requests_to("POST", BUNDLES)) == 1


def test_vast_instance_fields_orch_cannot_trust_read_as_absent(vemu: VastEmulator) -> None:
    vemu.add_offer(id=1)
    with quick_vast(vemu) as adapter:
        offer = adapter.offers(spot_and_on_demand())[0]
        inst = adapter.create(offer, "ssh-ed25519 AAAA test", "job1")
        vemu.set_status(inst.instance_id, actual_status="running",
                        ssh_host="-oProxyCommand=touch /tmp/pwned", ssh_port=22,
                        dph_total=float("nan"), status_msg=f"bad {ESCAPES} day",
                        gpu_name=f"RTX{ESCAPES}")
        got = adapter.get(inst.instance_id)
        assert got.ssh_host is None and not got.reachable  # never handed to ssh
        assert got.price_per_hour is None  # the engine bills the offer's checked price
        assert no_escapes(got.message) and got.message.startswith("bad ]0;pwned")
        assert got.gpu is not None and no_escapes(got.gpu)
        assert [i.instance_id for i in adapter.list("job1")] == [inst.instance_id]


def test_vast_error_texts_reach_no_terminal_raw(vemu: VastEmulator) -> None:
    vemu.fail_next(1, 400, {"success": False, "error": f"x{ESCAPES}",
                            "msg": f"refused {ESCAPES}"}, path=BUNDLES)
    with quick_vast(vemu) as adapter, pytest.raises(ProviderError) as err:
        adapter.offers(spot_and_on_demand())
    assert no_escapes(str(err.value)) and "refused" in str(err.value)
    vemu.fail_next(1, 400, f"plain text {ESCAPES}", content_type="text/plain", path=BUNDLES)
    with quick_vast(vemu) as adapter, pytest.raises(ProviderError) as err:
        adapter.offers(spot_and_on_demand())
    assert no_escapes(str(err.value)) and "plain text" in str(err.value)


# --- the size cap ------------------------------------------------------------------------


def endless(total: int, chunk: bytes = b" " * 65536) -> Any:
    """A JSON body of `total` bytes (`{"offers": [` then spaces), generated as it is sent."""
    def chunks() -> Iterator[bytes]:
        yield b'{"offers": ['
        sent = 12
        while sent < total:
            yield chunk
            sent += len(chunk)
    return chunks


@pytest.mark.parametrize("announce", [False, True], ids=["chunked", "content-length"])
def test_an_answer_past_the_cap_is_not_read(vemu: VastEmulator, announce: bool) -> None:
    total = 400 * MIB  # the probe's 400 MB body
    vemu.answer_next(endless(total), path=BUNDLES, length=total if announce else None)
    with quick_vast(vemu) as adapter, pytest.raises(BadAnswer, match="MiB") as err:
        adapter.offers(spot_and_on_demand())
    assert ("announces" in str(err.value)) is announce
    # The client stopped at the cap: what the server got out is the cap plus what the
    # sockets buffer (measured 11-13 MiB here; Linux may grow a receive buffer to
    # net.ipv4.tcp_rmem's 32 MiB), a tenth of the body at most.
    assert vemu.raw_sent < MAX_ANSWER_BYTES + 32 * MIB <= total // 10
    assert len(vemu.requests_to("POST", BUNDLES)) == 1


def test_a_gzip_bomb_is_capped_after_decompression(vemu: VastEmulator) -> None:
    bomb = gzip.compress(b'{"offers": [' + b" " * (64 * MIB) + b"]}", compresslevel=9)
    assert len(bomb) < MIB
    vemu.answer_next(bomb, path=BUNDLES, headers={"Content-Encoding": "gzip"})
    with quick_vast(vemu) as adapter, pytest.raises(BadAnswer, match="larger than"):
        adapter.offers(spot_and_on_demand())


# --- RunPod ------------------------------------------------------------------------------


def runpod_row(**over: Any) -> dict[str, Any]:
    return {**json.loads(json.dumps(RUNPOD_CATALOG[0])), **over}


@pytest.fixture
def remu() -> Iterator[RunPodEmulator]:
    with RunPodEmulator(api_key=KEY, gpus=json.loads(json.dumps(RUNPOD_CATALOG))) as emu:
        yield emu


def test_runpod_bad_rows_are_left_out_and_counted_by_field(remu: RunPodEmulator) -> None:
    rows = [runpod_row(price={"secure": float("nan"), "community": 0.3}),
            runpod_row(price={"secure": HUGE, "community": 0.3}),
            runpod_row(price={"secure": -0.5, "community": 0.3}),
            runpod_row(price={"secure": "cheap", "community": 0.3}),
            runpod_row(maxCount={"secure": "eight", "community": 2}),
            runpod_row(id=f"NVIDIA Evil{ESCAPES}", name=None),
            runpod_row(availability="PLENTY"),
            json.loads(json.dumps(RUNPOD_CATALOG[1]))]  # the one good row
    for _ in range(2):  # the SECURE and the COMMUNITY search
        remu.answer_next(raw_json({"gpus": rows}), path=CATALOG)
    with quick_runpod(remu) as adapter:
        offers = adapter.offers(spot_and_on_demand())
        assert {(o.gpu, o.region) for o in offers} == {("A100 80GB", "secure"),
                                                      ("A100 80GB", "community")}
        assert all(o.price_per_hour is not None and o.price_per_hour > 0 for o in offers)
        rejected = adapter.rejected
        assert sum(rejected.values()) == 2 * 6, rejected
        assert any(k.startswith("price.secure: Input should be a finite number")
                   for k in rejected)
        assert any(k.startswith("price.secure: Input should be greater than or equal to 0")
                   for k in rejected)
        assert any(k.startswith("maxCount.secure: Input should be a valid integer")
                   for k in rejected)
        (name,) = adapter.skipped
        assert no_escapes(name) and name.startswith("NVIDIA Evil]0;pwned")


@pytest.mark.parametrize("body", ['{"gpus": {"id": "x"}}', '{"gpus": ' + nested() + "}",
                                  "null", "<html></html>"],
                         ids=["dict", "deep", "null", "html"])
def test_runpod_answer_of_the_wrong_shape_is_a_bad_answer(remu: RunPodEmulator,
                                                          body: str) -> None:
    remu.answer_next(body, path=CATALOG)
    with quick_runpod(remu) as adapter, pytest.raises(BadAnswer, match="RunPod offers"):
        adapter.offers(spot_and_on_demand())
    assert len(remu.calls("GET", CATALOG)) == 1


def test_runpod_pod_fields_orch_cannot_trust_read_as_absent(remu: RunPodEmulator) -> None:
    with quick_runpod(remu) as adapter:
        offer = adapter.offers(spot_and_on_demand())[0]
        inst = adapter.create(offer, "ssh-ed25519 AAAA test", "job2")
        remu.set_ssh(inst.instance_id, "-oProxyCommand=x", 22, username="root;rm -rf /")
        pod = remu._pods[inst.instance_id].doc
        pod.update(cost=-3, message=f"hello {ESCAPES}")
        adapter.get(inst.instance_id)
        got = adapter.get(inst.instance_id)
        assert got.state.value == "running" and got.ssh_host is None and not got.reachable
        assert got.price_per_hour is None and no_escapes(got.message)
        assert [i.instance_id for i in adapter.list("job2")] == [inst.instance_id]


def test_runpod_problem_texts_reach_no_terminal_raw(remu: RunPodEmulator) -> None:
    remu.answer_next(json.dumps({"title": f"Bad{ESCAPES}", "status": 400,
                                 "detail": f"no {ESCAPES}",
                                 "errors": [{"field": f"gpu{ESCAPES}", "message": "x"}]}),
                     status=400, path=CATALOG)
    with quick_runpod(remu) as adapter, pytest.raises(ProviderError) as err:
        adapter.offers(spot_and_on_demand())
    assert no_escapes(str(err.value)) and "Bad]0;pwned" in str(err.value)


# --- a worker with a queued job -------------------------------------------------------------

HOSTILE_SEARCHES = {
    "bad-rows": raw_json({"offers": [row for row, _ in HOSTILE_VAST_ROWS]
                                    + [vast_row(id=11, gpu_name=f"X{ESCAPES}")]}),
    "not-a-list": '{"offers": {"id": 1, "dph_base": 0.01}}',
    "deep": '{"offers": ' + nested() + "}",
}


@pytest.mark.parametrize("kind", ["bad-rows", "deep"])
def test_a_hostile_provider_beside_a_good_one_never_fails_the_job(
        rig: Rig, hosts: SimHostBackend, kind: str) -> None:
    """Vast.ai answers garbage, including a negative price that would be chosen first; the
    job runs on RunPod and nothing is recorded at less than zero."""
    with VastEmulator(api_key=KEY, hosts=hosts) as vemu, \
            RunPodEmulator(api_key=KEY, gpus=json.loads(json.dumps(RUNPOD_CATALOG)),
                           hosts=hosts) as remu:
        vemu.answer_next(HOSTILE_SEARCHES[kind], count=10_000, path=BUNDLES)
        job_id = job_for(rig, "vastai, runpod")
        done = run(rig, {"vastai": hosts.serving(vast(vemu)),
                         "runpod": hosts.serving(runpod(remu))}, job_id)
        assert done.status == "succeeded", done.failure_reason
        rows = rig.store.instances_of(job_id)
        assert [r.provider for r in rows] == ["runpod"]
        assert all(r.price_per_hour_micros > 0 for r in rows)
        notes = [e.message for e in rig.store.events(job_id) if e.kind == "offers.note"]
        assert any(n.startswith("vastai: ") for n in notes) and all(map(no_escapes, notes))
        assert_invariants(rig.store, list(vemu.instances) + remu.pod_ids)


@pytest.mark.parametrize("kind", sorted(HOSTILE_SEARCHES))
def test_only_a_hostile_provider_leaves_the_job_queued_with_a_reason(
        rig: Rig, hosts: SimHostBackend, kind: str) -> None:
    with VastEmulator(api_key=KEY, hosts=hosts) as vemu:
        vemu.answer_next(HOSTILE_SEARCHES[kind], count=10_000, path=BUNDLES)
        job_id = job_for(rig, "vastai")
        queued = run(rig, {"vastai": hosts.serving(vast(vemu))}, job_id)
        assert queued.status == "queued", queued.failure_reason
        reason = last_state(rig.store, job_id)
        assert "vastai: provider unavailable" in reason and no_escapes(reason)
        assert queued.not_before is not None and rig.store.instances_of(job_id) == []
        assert_invariants(rig.store, list(vemu.instances))


# --- `orch offers` and `orch plan` ----------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(HOSTILE_SEARCHES))
def test_offers_and_plan_report_a_hostile_provider_and_go_on(
        env: dict[str, str], tmp_path: Path, kind: str) -> None:  # noqa: F811
    with VastEmulator(api_key=KEY) as emu:
        emu.answer_next(HOSTILE_SEARCHES[kind], count=10_000, path=BUNDLES)
        env.update(VAST_API_KEY=KEY, ORCH_VASTAI_URL=emu.url)
        out = orch_cli(env, "offers", "--json")
        doc = json.loads(out.stdout)
        assert all(Decimal(o["price_per_hour"]) >= 0 for o in doc["offers"]
                   if o["price_per_hour"] is not None)  # None: a monthly server
        assert any(n.startswith("vastai: ") for n in doc["notes"])
        human = orch_cli(env, "offers")
        assert "internal error" not in human.stdout + human.stderr
        assert no_escapes(human.stdout + human.stderr) and "vastai: " in human.stdout
        plan = orch_cli(env, "plan", str(job(tmp_path, "")), "--json")
        assert json.loads(plan.stdout)["placement"]["provider"] != "vastai"
        assert no_escapes(plan.stdout + plan.stderr)
