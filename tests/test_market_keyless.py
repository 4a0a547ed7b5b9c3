"""`orch offers` and `orch plan` without API keys (issue 36 §3), as real `orch` processes:
the market snapshot is listed with its source date, a pinned offload layout places on a
rental whose host RAM is known, and a search that finds nothing says why."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import pytest
from emulators.vast import VastEmulator
from test_cli import orch  # the `orch` process helper

ROOT = Path(__file__).resolve().parent.parent
KEY = "vast-keyless-key-0123456789"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items()
         if k not in {"VAST_API_KEY", "RUNPOD_API_KEY", "ORCH_DB_URL", "ORCH_VASTAI_URL",
                      "ORCH_RUNPOD_URL"}}
    e.update(XDG_DATA_HOME=str(tmp_path / "xdg"), XDG_CONFIG_HOME=str(tmp_path / "config"))
    return e


@pytest.fixture
def vast(env: dict[str, str]) -> Iterator[VastEmulator]:
    with VastEmulator(api_key=KEY) as emu:
        emu.add_offer(id=21, gpu_name="RTX A6000", gpu_ram=49140, dph_base=0.40, min_bid=0.25)
        env.update(VAST_API_KEY=KEY, ORCH_VASTAI_URL=emu.url)
        yield emu


def job(tmp_path: Path, resources: str) -> Path:
    """examples/quickstart.yml (Llama-3.2-1B QLoRA) with `resources` for its resources."""
    text = (ROOT / "examples" / "quickstart.yml").read_text().split("\nresources:")[0]
    text = text.replace("data/", str(ROOT / "examples" / "data") + "/")
    path = tmp_path / "job.yml"
    path.write_text(f"{text}\nresources:\n{resources}")
    return path


def test_offers_for_l40s_without_keys_list_the_snapshot_with_its_date(
        env: dict[str, str]) -> None:
    out = json.loads(orch(env, "offers", "--gpu", "L40S", "--json").stdout)
    assert out["source"] == "catalog" and out["offers"]
    assert {o["provider"] for o in out["offers"]} == {"vastai", "runpod"}
    assert all(re.fullmatch(r"snapshot \d{4}-\d{2}-\d{2}", o["source"]) for o in out["offers"])
    from providers.catalog import snapshot

    dates = snapshot.load().dates
    assert {(o["provider"], o["source"]) for o in out["offers"]} == {
        (p, f"snapshot {dates[p]}") for p in ("vastai", "runpod")}
    assert all(o["gpu"] == "L40S" and o["gpu_count"] == 1 for o in out["offers"])
    runpod = next(o for o in out["offers"] if o["provider"] == "runpod")
    assert runpod["ram_gb"] and runpod["ram_gb"] > 0  # RunPod publishes its pods' RAM
    human = orch(env, "offers", "--gpu", "L40S").stdout
    assert human.startswith(f"{len(out['offers'])} offers, cheapest first: the price catalogs")
    assert f"snapshot {dates['vastai']}" in human and "no API key" in human


@pytest.mark.parametrize(("gpu", "listed"), [("RTX 3090", "0.50"), ("RTX 5090", "0.99"),
                                           ("A40", "0.44"), ("RTX A6000", "0.53"),
                                           ("L40S", "0.99")])
def test_runpod_gpus_without_keys_are_listed_with_their_date_and_disks(
        env: dict[str, str], gpu: str, listed: str) -> None:
    out = json.loads(orch(env, "offers", "--provider", "runpod", "--gpu", gpu,
                          "--json").stdout)
    assert out["source"] == "catalog" and out["offers"], out["why_none"]
    (row,) = out["offers"]
    assert (row["gpu"], row["gpu_count"], row["source"]) == (gpu, 1, "snapshot 2026-12-06")
    # The GPU's list price (skypilot-catalog@01acdfd419ce) plus the pod's 50 GB container
    # disk and 100 GB volume at $0.10/GB/month (720 h), as a live RunPod offer is priced.
    assert Decimal(row["price_per_hour"]) == (Decimal(listed) + Decimal(150) * Decimal(
        "0.10") / 720).quantize(Decimal("0.000001"), ROUND_HALF_UP)
    assert row["ram_gb"] and row["ram_gb"] > 0


def test_a_pinned_offload_job_plans_on_a_rental_whose_host_ram_is_known(
        env: dict[str, str], tmp_path: Path) -> None:
    path = job(tmp_path, "  layout: zero3_offload\n")
    out = json.loads(orch(env, "plan", str(path), "--json").stdout)
    p = out["placement"]
    assert p["strategy"] == "zero3_offload" and p["billing"] == "per_second"
    assert p["provider"] in {"vastai", "runpod"} and p["source"].startswith("snapshot ")
    from providers.catalog import snapshot

    offer = next(o for o in snapshot.load().listed_offers
                 if (o.provider, o.offer_id) == (p["provider"], p["offer_id"]))
    need = out["estimate"]["host_ram_bytes"]
    assert need > 0 and offer.ram_bytes is not None and offer.ram_bytes >= need
    # Offers without a stated host RAM are left out by name, not silently.
    assert out["rejected"]["host RAM unknown, and resources.layout offloads to it"] > 0
    human = orch(env, "plan", str(path)).stdout
    assert f"at {p['provider']}'s listed prices (snapshot " in human


def test_no_offers_say_why_without_keys(env: dict[str, str]) -> None:
    out = json.loads(orch(env, "offers", "--gpu", "L40S", "--count", "8", "--spot",
                          "--json").stdout)
    assert out["offers"] == []
    why = out["why_none"]
    assert why[0].startswith("no API key for vastai or runpod: searched the market snapshot")
    assert any("--gpu L40S left out" in w and "--count 8 left out" in w for w in why)
    human = orch(env, "offers", "--provider", "runpod", "--gpu", "RTX 3080 Ti").stdout
    assert "note: 0 offers: no API key for runpod: searched the market snapshot" in human
    assert "note: 0 offers: nothing of RTX 3080 Ti in the catalogs" in human
    assert "--provider runpod left out" in human
    bad = orch(env, "offers", "--gpu", "L41", check=False)
    assert bad.returncode == 2 and "did you mean L4 or L40?" in bad.stderr


def test_no_live_offers_say_why(env: dict[str, str], vast: VastEmulator) -> None:
    out = json.loads(orch(env, "offers", "--gpu", "H100", "--json").stdout)
    assert out["source"] == "live" and out["offers"] == []
    assert out["why_none"][0] == "no API key for runpod: not searched"
    # Vast was asked for H100s only (the filters go with a live search): it had none.
    assert out["why_none"][1] == "vastai listed no offer for --gpu H100 --count 1"
    out = json.loads(orch(env, "offers", "--min-memory", "80", "--json").stdout)
    assert out["why_none"][1] == "vastai listed no offer for --count 1 --min-memory 80"
    # With offers, the cloud left out for want of a key is still named.
    shown = orch(env, "offers").stdout
    assert "RTX A6000" in shown and "note: runpod: no API key" in shown


def test_a_plan_that_fits_nothing_says_where_it_looked(env: dict[str, str],
                                                       tmp_path: Path) -> None:
    path = job(tmp_path, "  providers: [runpod]\n  gpus: [RTX 3080 Ti]\n")
    proc = orch(env, "plan", str(path), check=False)
    assert proc.returncode == 3
    assert "no placement fits" in proc.stderr
    assert "Offers: the price catalogs (estimates: the market snapshot of Vast.ai and RunPod" \
        in proc.stderr and "no API key for a cloud this job may use" in proc.stderr
