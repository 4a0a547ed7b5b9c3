"""The market snapshot is priced as live offers are (issue 36 §3): one disk rule for both
(providers/catalog/disks.py), so `orch plan` without a key and with one price the same
machine the same way, and RunPod's snapshot holds every GPU type its source lists.

RunPod: a live offer goes through the adapter against the RunPod REST v2 emulator over real
HTTP; Vast.ai: a live offer is priced by the adapter's own `hourly_price` from a checked
`/bundles/` row.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest
from emulators.runpod import RunPodEmulator
from test_market_snapshot import RUNPOD_HEADER, VAST_CSV, csv_text, refresh, runpod_row

from providers.base import Offer, Requirements
from providers.catalog import disks, skypilot, snapshot
from providers.runpod.compute import RunPod
from providers.vastai import answers as vast_answers
from providers.vastai.compute import hourly_price

KEY = "rp-secret-KEY-0123456789abcdef"
DISK_GB = 100  # what `orch plan` and `orch offers` search and price a rental with


def snapshot_offer(gpu: str, provider: str, count: int = 1, spot: bool = False,
                   path: Path | None = None) -> Offer:
    priced = snapshot.offers(DISK_GB, path) if path else snapshot.offers(DISK_GB)
    return min((o for o in priced if (o.gpu, o.provider, o.gpu_count, o.interruptible)
                == (gpu, provider, count, spot)), key=lambda o: o.price_per_hour or 0)


@pytest.fixture
def runpod_live() -> Iterator[RunPod]:
    """The RunPod adapter on an emulator whose catalog lists an RTX 3090 at the snapshot's
    list price (skypilot-catalog@01acdfd419ce: 1x_RTX3090_SECURE, $0.5)."""
    gpus = [{"id": "NVIDIA GeForce RTX 3090", "name": "RTX 3090", "memory": 24,
             "secure": True, "community": False, "price": {"secure": "0.50", "community": None},
             "maxCount": {"secure": 8, "community": 0}, "availability": "HIGH",
             "dataCenters": []}]
    with RunPodEmulator(api_key=KEY, gpus=json.loads(json.dumps(gpus))) as emu, \
            RunPod(KEY, base_url=emu.url, attempts=2, deadline_s=10) as provider:
        yield provider


def test_a_runpod_snapshot_row_is_priced_as_the_live_pod_with_its_disks(
        runpod_live: RunPod) -> None:
    for count in (1, 4):
        live = runpod_live.offers(Requirements(gpu_count=count, min_gpu_memory_bytes=0,
                                               disk_gb=DISK_GB))
        (pod,) = [o for o in live if o.gpu == "RTX 3090"]
        snap = snapshot_offer("RTX 3090", "runpod", count)
        assert snap.price_per_hour == pod.price_per_hour
        # The GPUs' list price plus a 50 GB container disk and a 100 GB volume while running,
        # at $0.10/GB/month each over 720 h (catalog/disks.yaml).
        assert snap.price_per_hour == disks.quantize(
            Decimal("0.5") * count + Decimal(150) * Decimal("0.10") / 720)
    # The listed row keeps the source's price; the disk is added when it is priced.
    assert {o.price_per_hour for o in snapshot.load().listed_offers
            if (o.gpu, o.provider, o.gpu_count) == ("RTX 3090", "runpod", 1)} == {Decimal("0.5")}


def test_a_vast_snapshot_row_is_priced_as_a_live_offer_of_the_same_machine(
        tmp_path: Path) -> None:
    (tmp_path / "v.csv").write_text(VAST_CSV)
    (tmp_path / "r.csv").write_text(csv_text(RUNPOD_HEADER, [
        runpod_row("1x_L40S_SECURE", "L40S", 1, 12, 62, "0.99", "AP-IN-1", "L40S", 48)]))
    out = tmp_path / "snapshot.yaml"
    assert refresh("--vast", str(tmp_path / "v.csv"), "--runpod", str(tmp_path / "r.csv"),
                   "--out", str(out)).returncode == 0
    cost = disks.vast().snapshot_storage_cost
    # SkyPilot's price is search.totalHour with 5 GB of storage: the same machine live has
    # dph_base = that price less those 5 GB, and the snapshot's assumed storage_cost.
    listed, bid = Decimal("1.20"), Decimal("0.45")  # L40S x2 in VAST_CSV
    row = vast_answers.Offer(id=1, dph_base=listed - 5 * cost / 720, min_bid=bid,
                             storage_cost=cost)
    for spot in (False, True):
        snap = snapshot_offer("L40S", "vastai", 2, spot, out)
        assert snap.price_per_hour == hourly_price(row, DISK_GB, spot), spot
    assert snapshot_offer("L40S", "vastai", 2, False, out).price_per_hour == disks.quantize(
        listed + 95 * Decimal("0.10") / 720)


# What RunPod lists for the GPUs orch knows in the shipped source
# (skypilot-catalog@01acdfd419ce catalogs/v8/runpod/vms.csv, read 2026-12-06): every count
# 1..max is listed in every data centre; these are the counts among 1, 2, 4, 8. Two listings
# for A100 80GB (PCIe and SXM) and RTX PRO 6000 (Server and Workstation Edition). Not orch's:
# MI300X, RTX PRO 4500 SE.
RUNPOD_LISTS = {
    "A100 80GB": (1, 2, 4, 8), "A40": (1, 2, 4, 8), "B200": (1, 2, 4, 8), "B300": (1, 2),
    "H100 PCIe": (1, 2, 4, 8), "H100 NVL": (1, 2, 4, 8), "H100 SXM": (1, 2, 4, 8),
    "H200": (1, 2, 4, 8), "L4": (1, 2, 4, 8), "L40": (1, 2, 4, 8), "L40S": (1, 2, 4, 8),
    "RTX 2000 Ada": (1, 2, 4, 8), "RTX 3090": (1, 2, 4, 8), "RTX 4000 Ada": (1, 2, 4, 8),
    "RTX 4090": (1, 2, 4, 8), "RTX 5090": (1, 2, 4, 8), "RTX 6000 Ada": (1, 2, 4, 8),
    "RTX A4000": (1, 2, 4, 8), "RTX A4500": (1, 2, 4), "RTX A5000": (1, 2, 4, 8),
    "RTX A6000": (1, 2, 4, 8), "RTX PRO 4000": (1, 2, 4), "RTX PRO 4500": (1, 2),
    "RTX PRO 5000": (1, 2, 4), "RTX PRO 6000": (1, 2, 4, 8),
}


def test_every_gpu_runpod_lists_has_its_rows_with_source_date_and_ram() -> None:
    counts: dict[str, set[int]] = defaultdict(set)
    for o in snapshot.load().listed_offers:
        if o.provider != "runpod":
            continue
        counts[o.gpu].add(o.gpu_count)
        where = snapshot.load().listed[(o.provider, o.offer_id)]
        assert where.source == "skypilot-catalog@01acdfd419ce catalogs/v8/runpod/vms.csv"
        assert where.date == "2026-12-06" and o.ram_bytes and o.vcpu, o
    assert {g: tuple(sorted(c)) for g, c in counts.items()} == RUNPOD_LISTS


def test_runpod_ram_is_per_gpu_times_count_where_the_file_scales_it_twice() -> None:
    # fetch_runpod.py multiplies the API's minMemory for a count, already the pod's, by the
    # count again for a GPU missing from its table: B300 reads 503.0 for 1, 2012.0 for 2.
    text = csv_text(RUNPOD_HEADER, [
        runpod_row("1x_B300_SECURE", "B300", 1, 43, 503, "7.89", "AP-IN-1", "B300", 288),
        runpod_row("2x_B300_SECURE", "B300", 2, 86, 2012, "15.78", "AP-IN-1", "B300", 288)])
    rows = {r.count: r for r in skypilot.runpod(text).rows}
    assert (rows[2].ram_gb, rows[2].vcpu, rows[2].on_demand) == (1006, 86, Decimal("15.78"))
    assert (rows[1].ram_gb, rows[1].listed) == (503, "1x_B300_SECURE")


def test_a_wrong_disks_file_names_the_field_and_the_fix(tmp_path: Path) -> None:
    good = (Path(disks.__file__).with_name("disks.yaml")).read_text()
    cases = (
        (good.replace('volume_disk_running: "0.10"', 'volume_disk_running: "-1"'),
         "runpod.volume_disk_running: '-1' is not a finite number of at least 0"),
        (good.replace("  month_hours: 720\n", "  month_hours: 720\n  extra: 1\n", 1),
         "runpod: unknown field extra"),
        (good.replace("  min_volume_gb: 10\n", ""), "runpod: missing field min_volume_gb"))
    for broken, said in cases:
        path = tmp_path / "disks.yaml"
        path.write_text(broken)
        with pytest.raises(disks.DisksError, match=re.escape(f"{path}: {said}")):
            disks.load.__wrapped__(path)
