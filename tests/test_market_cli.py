"""`orch offers`, `orch plan` and `orch submit`'s confirmation on the live market (issue 20 §2),
as real processes (submit on a real pseudo-terminal) against the Vast.ai emulator over real
HTTP on loopback, and on the price catalogs without a key."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest
from emulators.runpod import _closed_port
from emulators.vast import VastEmulator
from termutil import run_tty, visible
from test_cli import orch  # the `orch` process helper

from providers.catalog import snapshot

ROOT = Path(__file__).resolve().parent.parent
KEY = "vast-market-key-0123456789"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items()
         if k not in {"VAST_API_KEY", "RUNPOD_API_KEY", "ORCH_DB_URL", "ORCH_VASTAI_URL"}}
    e.update(XDG_DATA_HOME=str(tmp_path / "xdg"), XDG_CONFIG_HOME=str(tmp_path / "config"))
    return e


@pytest.fixture
def vast(env: dict[str, str]) -> Iterator[VastEmulator]:
    with VastEmulator(api_key=KEY) as emu:
        # Real `gpu_name` spellings (vast-cli 1.9.1): the 48 GB class, and a GPU orch skips.
        emu.add_offer(id=11, gpu_name="L40S", gpu_ram=46068, dph_base=0.52, min_bid=0.30)
        emu.add_offer(id=12, gpu_name="RTX 6000Ada", gpu_ram=49140, dph_base=0.61, min_bid=0.35)
        emu.add_offer(id=13, gpu_name="RTX A6000", gpu_ram=49140, dph_base=0.40, min_bid=0.25)
        emu.add_offer(id=14, gpu_name="Tesla V100", gpu_ram=16384, dph_base=0.09, min_bid=0.05)
        env.update(VAST_API_KEY=KEY, ORCH_VASTAI_URL=emu.url)
        yield emu


def job(tmp_path: Path, resources: str) -> Path:
    text = (ROOT / "examples" / "qlora-8b.yml").read_text()
    text = text.replace("resources:\n", f"resources:\n{resources}")
    text = text.replace("data/", str(ROOT / "examples" / "data") + "/")
    path = tmp_path / "job.yml"
    path.write_text(text)
    return path


def test_offers_without_a_key_show_the_catalog(env: dict[str, str]) -> None:
    out = json.loads(orch(env, "offers", "--json").stdout)
    assert out["source"] == "catalog" and out["from"] == []
    # The seed catalogs and (issue 36 §3) the dated snapshot of Vast.ai and RunPod listings.
    assert out["offers"] and {o["provider"] for o in out["offers"]} == {
        "cloud", "dedicated-host", "vastai", "runpod"}
    assert {o["source"] for o in out["offers"] if o["provider"] in {"vastai", "runpod"}} \
        == {f"snapshot {d}" for d in snapshot.load().dates.values()}
    human = orch(env, "offers", "--gpu", "rtx 4090").stdout
    assert "the price catalogs" in human and "VAST_API_KEY" in human and "RTX 4090" in human
    bad = orch(env, "offers", "--gpu", "Tesla V100", check=False)
    assert bad.returncode == 2 and "compute capability" in bad.stderr


def test_offers_with_a_key_are_live_and_name_what_was_skipped(env: dict[str, str],
                                                              vast: VastEmulator) -> None:
    out = json.loads(orch(env, "offers", "--json").stdout)
    assert out["source"] == "live" and out["from"] == ["vastai"]
    got = {(o["gpu"], o["interruptible"]) for o in out["offers"]}
    assert got == {(g, s) for g in ("L40S", "RTX 6000 Ada", "RTX A6000") for s in (False, True)}
    prices = [float(o["price_per_hour"]) for o in out["offers"]]
    assert prices == sorted(prices)
    assert out["skipped"] == {"vastai": {"Tesla V100": 2}}  # on-demand and bid searches
    assert any("Tesla V100 x2 (before Ampere" in n for n in out["notes"])
    only = json.loads(orch(env, "offers", "--gpu", "L40S", "--on-demand", "--json").stdout)
    assert [(o["gpu"], o["interruptible"]) for o in only["offers"]] == [("L40S", False)]
    human = orch(env, "offers", "--min-memory", "47").stdout
    assert "live offers from vastai" in human and "L40S" not in human  # 45 GiB < 47
    assert "RTX A6000" in human and "skipped" not in human  # Vast filtered the V100 out
    assert "note: vastai: 2 offers skipped, GPU not planned: Tesla V100 x2" in orch(
        env, "offers").stdout


def test_plan_ranks_live_offers_with_a_key(env: dict[str, str], vast: VastEmulator,
                                           tmp_path: Path) -> None:
    path = job(tmp_path, "  gpus: [L40S, RTX A6000]\n")
    out = json.loads(orch(env, "plan", str(path), "--json").stdout)
    assert out["offers_source"] == "live" and out["offers_from"] == ["vastai"]
    assert out["placement"]["provider"] == "vastai"
    # Dearer per hour than the RTX A6000, but over twice its BF16 peak: cheaper per job.
    assert out["placement"]["gpu"] == "L40S" and out["placement"]["interruptible"]
    assert {a["gpu"] for a in out["alternatives"]} == {"L40S", "RTX A6000"}
    assert {a["provider"] for a in out["alternatives"]} == {"vastai"}
    human = orch(env, "plan", str(path)).stdout
    assert "Offers: live, " in human and "from vastai just now" in human
    assert "Runs on: vastai" in human


def test_plan_falls_back_to_the_catalog_and_says_so(env: dict[str, str],
                                                    tmp_path: Path) -> None:
    path = job(tmp_path, "")
    human = orch(env, "plan", str(path)).stdout
    assert "Offers: the price catalogs (estimates: the market snapshot of Vast.ai" in human
    assert "no API key for a cloud this job may use" in human
    env.update(VAST_API_KEY=KEY, ORCH_VASTAI_URL=f"http://127.0.0.1:{_closed_port()}")
    out = json.loads(orch(env, "plan", str(path), "--json").stdout)
    assert out["offers_source"] == "catalog" and out["offers_from"] == []
    assert any(n.startswith("vastai: offers unavailable") for n in out["offers_notes"])
    assert out["placement"]["provider"] == "cloud"


def test_searches_record_prices_deduplicated(env: dict[str, str], vast: VastEmulator) -> None:
    assert "no prices seen for L40S" in orch(env, "prices", "L40S").stdout
    orch(env, "offers")
    orch(env, "offers", "--gpu", "L40S")  # the same prices again: nothing new is written
    seen = json.loads(orch(env, "prices", "l40s", "--json").stdout)
    assert [(r["provider"], r["gpu_count"], r["interruptible"], r["observations"])
            for r in seen] == [("vastai", 1, True, 1), ("vastai", 1, False, 1)]
    assert seen[1]["latest"] == seen[1]["median"]
    vast.remove_offer(11)
    vast.add_offer(id=15, gpu_name="L40S", gpu_ram=46068, dph_base=0.62, min_bid=0.30)
    orch(env, "offers")  # on-demand moved up by $0.10/h, spot did not
    seen = json.loads(orch(env, "prices", "L40S", "--since", "1d", "--json").stdout)
    on_demand = next(r for r in seen if not r["interruptible"])
    assert on_demand["observations"] == 2
    assert float(on_demand["max"]) - float(on_demand["min"]) == pytest.approx(0.10)
    assert next(r for r in seen if r["interruptible"])["observations"] == 1
    human = orch(env, "prices", "L40S").stdout
    assert "vastai" in human and "median $/h" in human
    bad = orch(env, "prices", "L40S", "--since", "yesterday", check=False)
    assert bad.returncode == 2 and "--since" in bad.stderr


# -- orch submit asks before renting, on a terminal only ------------------------------------

PROMPT = "Rent it and run the job? [y/N]"


def test_a_no_on_the_terminal_rents_and_records_nothing(env: dict[str, str],
                                                        vast: VastEmulator,
                                                        tmp_path: Path) -> None:
    path = job(tmp_path, "  gpus: [L40S]\n")
    code, out = run_tty(env, "submit", str(path), typed="n\n")
    out = visible(out)
    assert code == 1, out
    assert "Placement: vastai L40S x1 (spot) at $" in out and "for the job" in out
    assert "Offers: live, " in out and PROMPT in out
    assert "nothing was recorded or rented" in out
    assert json.loads(orch(env, "jobs", "--json").stdout) == []
    assert not vast.requests_to("PUT", "/api/v0/asks/")  # nothing rented


def test_a_yes_queues_it_and_yes_flag_or_no_terminal_never_ask(env: dict[str, str],
                                                               vast: VastEmulator,
                                                               tmp_path: Path) -> None:
    path = job(tmp_path, "  gpus: [L40S]\n")
    code, out = run_tty(env, "submit", "--detach", str(path), typed="y\n")
    assert code == 0 and PROMPT in visible(out) and "queued" in visible(out)
    code, out = run_tty(env, "submit", "--detach", "--yes", str(path))
    assert code == 0 and PROMPT not in visible(out) and "queued" in visible(out)
    piped = orch(env, "submit", "--detach", str(path))  # no terminal: cron, scripts
    assert PROMPT not in piped.stdout + piped.stderr and "queued" in piped.stdout
    jobs = json.loads(orch(env, "jobs", "--json").stdout)
    assert len(jobs) == 3 and {(j["provider"], j["gpu"]) for j in jobs} == {("vastai", "L40S")}


def test_plan_ranks_live_offers_by_host_memory_as_placement_does(
        env: dict[str, str], tmp_path: Path) -> None:
    # Issue 40 §2: three RTX 4090 machines, cheapest first. Host memory says the cheapest
    # failed its host check (left out) and the next delivered 60 % (ranked at price / 0.6,
    # dearer than the third): the plan chooses the third, as the engine's placement would,
    # and says why in one line.
    from orchestrator.core.hostmemory import Source
    from orchestrator.records.store import open_store

    path = job(tmp_path, "  gpus: [RTX 4090]\n")
    with VastEmulator(api_key=KEY) as emu:
        for offer, price, machine in ((21, 0.30, 4711), (22, 0.40, 4712), (23, 0.50, 4713)):
            emu.add_offer(id=offer, gpu_name="RTX 4090", dph_base=price, min_bid=price,
                          machine_id=machine)
        env.update(VAST_API_KEY=KEY, ORCH_VASTAI_URL=emu.url)
        before = json.loads(orch(env, "plan", str(path), "--json").stdout)
        assert before["placement"]["offer_id"] == "21" and not before.get("host_memory")

        store = open_store(f"sqlite:///{tmp_path / 'xdg' / 'orch' / 'orch.db'}")
        try:
            store.record_host_observation("vastai", "4711", Source.CHECK, failed=True,
                                          delivered=None, why="hub: no route to the Hub")
            store.record_host_observation("vastai", "4712", Source.RUN, failed=False,
                                          delivered=0.6, why="trained at 60% of its plan")
        finally:
            store.close()
        out = json.loads(orch(env, "plan", str(path), "--json").stdout)
        human = orch(env, "plan", str(path)).stdout
    assert out["placement"]["offer_id"] == "23"
    ranked = {a["offer_id"]: a for a in [out["placement"], *out["alternatives"]]}
    assert "21" not in ranked  # avoided
    assert Decimal(ranked["22"]["price_per_hour"]) > Decimal(ranked["23"]["price_per_hour"])
    (avoided, priced) = out["host_memory"]
    assert avoided.startswith("vastai machine 4711: failed its host check") and "no route" \
        in avoided
    assert priced.startswith("vastai machine 4712: delivered 60%") and "priced as" in priced
    line = next(ln for ln in human.splitlines() if ln.startswith("Host memory: "))
    assert "vastai machine 4711: failed its host check" in line
