"""The real `vastai` CLI (pip `vastai`, pinned in the `test` extra) against the Vast.ai emulator.

The CLI is run as a user would (`vastai --url URL --raw ...`, the key in `VAST_API_KEY`), so
the emulator is proven to accept what the official client sends for search, create, show
and destroy. Then orch's adapter and the CLI do the same operations against one emulator and
their captured requests are compared: orch sends no field the client does not, spells the
shared ones the same way, and uses the same endpoints.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest
from emulators.vast import Recorded, VastEmulator

from providers.base import Requirements
from providers.vastai.compute import VastAI

KEY = "vast-cli-key-0123456789abcdef"
PUBKEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHVhc3RDTElUZXN0S2V5MDEyMzQ1Njc4OWFiY2RlZg cli"
IMAGE = "axolotlai/axolotl-cloud:0.18.0-py3.12-cu130-2.12.0"
GIB = 1024**3
VASTAI = Path(sys.executable).with_name("vastai")


@pytest.fixture
def emu() -> Iterator[VastEmulator]:
    with VastEmulator(api_key=KEY) as emulator:
        for offer_id in (11, 12, 13, 14):  # two for the CLI, two for orch
            emulator.add_offer(id=offer_id, gpu_name="RTX 4090", dph_base=0.30 + offer_id / 100,
                               min_bid=0.15)
        yield emulator


def cli(emu: VastEmulator, tmp_path: Path, *args: str) -> Any:
    """Run `vastai --raw ARGS` against the emulator; returns its parsed JSON output."""
    if not VASTAI.exists():
        pytest.fail(f"{VASTAI} is missing: run scripts/install (vastai is in the test extra)")
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home),
           "XDG_CONFIG_HOME": str(home / ".config"), "XDG_CACHE_HOME": str(home / ".cache"),
           "VAST_API_KEY": KEY, "VASTAI_NO_UPDATE_CHECK": "1", "LANG": "C.UTF-8"}
    root = emu.url.removesuffix("/api/v0")
    done = subprocess.run([str(VASTAI), "--url", root, "--raw", *args], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return json.loads(done.stdout) if done.stdout.strip() else None


def orch(emu: VastEmulator) -> VastAI:
    return VastAI(KEY, base_url=emu.url, attempts=2, initial_s=0.01, max_wait_s=0.05)


def req(interruptible: bool) -> Requirements:
    return Requirements(gpu_count=1, min_gpu_memory_bytes=20 * GIB,
                        gpus=frozenset({"RTX 4090"}), interruptible=interruptible, disk_gb=40)


def last(emu: VastEmulator, method: str, prefix: str) -> Recorded:
    return emu.requests_to(method, prefix)[-1]


def test_real_cli_searches_creates_shows_and_destroys(emu: VastEmulator,
                                                      tmp_path: Path) -> None:
    offers = cli(emu, tmp_path, "search", "offers", "num_gpus=1 gpu_name=RTX_4090",
                 "-o", "dph_total")
    assert [o["id"] for o in offers] == [11, 12, 13, 14]
    made = cli(emu, tmp_path, "create", "instance", "11", "--image", IMAGE, "--disk", "40",
               "--label", "orch-cli", "--ssh", "--direct", "--cancel-unavail",
               "--onstart-cmd", "env >> /etc/environment")
    assert made["success"] is True
    iid = made["new_contract"]
    bid = cli(emu, tmp_path, "create", "instance", "12", "--image", IMAGE, "--disk", "40",
              "--bid_price", "0.2", "--ssh")
    listed = cli(emu, tmp_path, "show", "instances")
    assert {i["id"] for i in listed} == {iid, bid["new_contract"]}
    shown = cli(emu, tmp_path, "show", "instance", str(iid))
    assert shown["label"] == "orch-cli" and shown["image_uuid"] == IMAGE
    assert shown["is_bid"] is False
    assert cli(emu, tmp_path, "show", "instance", str(bid["new_contract"]))["is_bid"] is True
    for instance_id in (iid, bid["new_contract"]):
        cli(emu, tmp_path, "destroy", "instance", str(instance_id), "-y")
    assert emu.instances == {}
    # Every request the client made was authorised and answered by a real route.
    assert all(r.authorized for r in emu.requests)


@pytest.mark.parametrize("interruptible", [False, True])
def test_orch_sends_what_the_cli_sends(emu: VastEmulator, tmp_path: Path,
                                       interruptible: bool) -> None:
    kind = ["--type", "bid"] if interruptible else ["--type", "on-demand"]
    # -- search ------------------------------------------------------------------------
    cli(emu, tmp_path, "search", "offers", "num_gpus=1 gpu_name in [RTX_4090]", "-o",
        "dph_total", "--storage", "40", *kind)
    theirs = last(emu, "POST", "/api/v0/bundles/").json
    api = orch(emu)
    found = api.offers(req(interruptible))
    ours = last(emu, "POST", "/api/v0/bundles/").json
    assert found and all(o.interruptible is interruptible for o in found)
    for field in ("type", "verified", "external", "rentable", "order"):
        assert ours[field] == theirs[field], field
    assert float(ours["allocated_storage"]) == float(theirs["allocated_storage"])
    # -- create ------------------------------------------------------------------------
    flags = ["--bid_price", "0.2"] if interruptible else []
    cli(emu, tmp_path, "create", "instance", "11", "--image", IMAGE, "--disk", "40",
        "--label", "made-by-cli", "--onstart-cmd", "true", "--ssh", "--direct",
        "--cancel-unavail", *flags)
    theirs = last(emu, "PUT", "/api/v0/asks/11/").json
    offer = next(o for o in found if o.offer_id == "13")
    inst = api.create(offer, PUBKEY, "j1", image=IMAGE, disk_gb=40)
    ours = last(emu, "PUT", "/api/v0/asks/13/").json
    assert set(ours) <= set(theirs), set(ours) - set(theirs)
    for field in ("client_id", "image", "env", "price", "disk", "label", "onstart", "runtype",
                  "cancel_unavail"):
        assert field in ours, field
    for field in ("client_id", "image", "env", "runtype", "cancel_unavail"):
        assert ours[field] == theirs[field], field
    if interruptible:
        assert isinstance(ours["price"], float) and isinstance(theirs["price"], float)
    else:
        assert ours["price"] is None and theirs["price"] is None
    # -- list, get, destroy ------------------------------------------------------------
    cli(emu, tmp_path, "show", "instances")
    theirs_q = parse_qs(last(emu, "GET", "/api/v1/instances/").query)
    # Only orch's instance: the CLI's is not labelled as orch's.
    assert [i.instance_id for i in api.list()] == [inst.instance_id]
    ours_q = parse_qs(last(emu, "GET", "/api/v1/instances/").query)
    assert set(ours_q) <= set(theirs_q) | {"after_token"}
    assert json.loads(ours_q["order_by"][0]) == json.loads(theirs_q["order_by"][0])
    assert int(ours_q["limit"][0]) <= 25
    cli(emu, tmp_path, "show", "instances", "--label", "orch-j1")
    theirs_q = parse_qs(last(emu, "GET", "/api/v1/instances/").query)
    assert [i.instance_id for i in api.list("j1")] == [inst.instance_id]
    ours_q = parse_qs(last(emu, "GET", "/api/v1/instances/").query)
    assert json.loads(ours_q["select_filters"][0]) == json.loads(theirs_q["select_filters"][0])
    api.get(inst.instance_id)
    cli(emu, tmp_path, "show", "instance", inst.instance_id)
    gets = [(r.path, r.query) for r in emu.requests_to("GET", "/api/v0/instances/")][-2:]
    assert gets[0] == gets[1] == (f"/api/v0/instances/{inst.instance_id}/", "owner=me")
    api.terminate(inst.instance_id)
    cli(emu, tmp_path, "destroy", "instance", "9001", "-y")
    deletes = [r.path for r in emu.requests_to("DELETE", "/api/v0/instances/")]
    assert deletes == [f"/api/v0/instances/{inst.instance_id}/", "/api/v0/instances/9001/"]
    assert emu.instances == {}


def test_orch_lists_every_page(emu: VastEmulator) -> None:
    """The v1 listing returns at most 25 instances a page: orch follows `next_token`."""
    for n in range(30):
        emu.add_instance(label=f"orch-job{n}")
    emu.add_instance(label="someone-else")
    api = orch(emu)
    assert len(api.list()) == 30
    assert [i.label for i in api.list("job7")] == ["orch-job7"]
    pages = emu.requests_to("GET", "/api/v1/instances/")
    assert any("after_token" in parse_qs(r.query) for r in pages)
