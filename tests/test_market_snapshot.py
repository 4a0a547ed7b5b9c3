"""The market without keys (issue 36 §3): the dated snapshot of what Vast.ai and RunPod list
(providers/catalog/snapshot.yaml), refreshed by scripts/refresh_catalog.py from SkyPilot's
published catalogs, planned and listed with its source and date when no API key is set.

The refresh runs offline on fixture CSVs with the real column layout of
skypilot-org/skypilot-catalog `catalogs/v8/{vast,runpod}/vms.csv`, in a real git checkout.
"""

from __future__ import annotations

import csv
import io
import os
import re
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest
import yaml

from providers import catalog
from providers.catalog import skypilot, snapshot

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "refresh_catalog.py"

# The real files' headers (skypilot-org/skypilot-catalog catalogs/v8, Vast at commit
# 01b8cdda2878, RunPod at 01acdfd419ce) and rows shaped as theirs, written by Python's csv
# module as SkyPilot's fetchers write them (CRLF, GpuInfo a quoted Python literal).
VAST_HEADER = ("InstanceType", "AcceleratorName", "AcceleratorCount", "vCPUs", "MemoryGiB",
               "GpuInfo", "Price", "SpotPrice", "Region")
RUNPOD_HEADER = ("InstanceType", "AcceleratorName", "AcceleratorCount", "vCPUs", "MemoryGiB",
                 "Region", "SpotPrice", "Price", "AvailabilityZone", "GpuInfo")


def gpu_info(name: str, count: int, mib: int, maker: str | None = None) -> str:
    made = f"'Manufacturer': '{maker}', " if maker else ""
    return (f"{{'Gpus': [{{'Name': '{name}', {made}'Count': {count}, 'MemoryInfo': "
            f"{{'SizeInMiB': {mib}}}}}], 'TotalGpuMemoryInMiB': {mib * count}}}")


def vast_row(vast_name: str, family: str, count: int, mib: int, price: str, bid: str,
             region: str) -> tuple[str, ...]:
    kind = f"{count}x-{vast_name.replace(' ', '_')}-32-65536"
    return (kind, family, str(count), "32", "64.0", gpu_info(family, count, mib), price, bid,
            region)


def runpod_row(kind: str, name: str, count: int, vcpu: int, ram: int, price: str, zone: str,
               display: str, gb: int, maker: str = "Nvidia") -> tuple[str, ...]:
    return (kind, name, f"{count}.0", f"{vcpu}.0", f"{ram}.0", zone[:2], price, price, zone,
            gpu_info(display, count, gb, maker))


def csv_text(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf)  # lineterminator \r\n, as the real files
    writer.writerow(header)
    writer.writerows(rows)
    return buf.getvalue()


VAST_CSV = csv_text(VAST_HEADER, [
    vast_row("L40S", "L40S", 1, 46068, "0.60", "0.00", "Taichung City, TW, AS"),
    vast_row("L40S", "L40S", 2, 46068, "1.20", "0.45", "Oregon, US, NA"),
    vast_row("L40S", "L40S", 2, 46068, "1.20", "0.45", "Taichung City, TW, AS"),
    vast_row("A100 SXM4", "A100", 1, 40960, "0.76", "0.00", "Georgia, US, NA"),
    vast_row("A100 PCIE", "A100", 1, 81920, "0.87", "0.00", "Oklahoma, US, NA"),
    vast_row("H100 NVL", "H100", 1, 95830, "2.08", "2.50", "Bulgaria, BG, EU"),
    vast_row("RTX 4090", "RTX4090", 5, 24564, "2.00", "0.00", "Iceland, IS, EU"),
    vast_row("Tesla V100", "V100", 8, 16384, "0.85", "0.00", "Sweden, SE, EU"),
])
RUNPOD_CSV = csv_text(RUNPOD_HEADER, [
    runpod_row("1x_L40S_SECURE", "L40S", 1, 12, 62, "0.99", "AP-IN-1", "L40S", 48),
    runpod_row("1x_L40S_SECURE", "L40S", 1, 12, 62, "0.99", "AP-IN-2", "L40S", 48),
    runpod_row("2x_L40S_SECURE", "L40S", 2, 24, 124, "1.98", "AP-IN-1", "L40S", 48),
    runpod_row("5x_A100-80GB-SXM_SECURE", "A100-80GB-SXM", 5, 80, 585, "7.95", "EU-SE-2",
               "A100 SXM", 80),
    runpod_row("1x_MI300X_SECURE", "MI300X", 1, 24, 283, "2.49", "US-TX-1", "MI300X", 192,
               "AMD"),
    ("cpu3c-2-4", "", "", "2.0", "4.0", "US", "", "0.06", "US-TX-1", ""),
])


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid",
           "GIT_AUTHOR_DATE": "2026-11-30T12:00:00+00:00",
           "GIT_COMMITTER_DATE": "2026-11-30T12:00:00+00:00"}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, env=env,
                          capture_output=True, text=True).stdout.strip()


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A git checkout shaped like skypilot-catalog with the fixture files committed."""
    repo = tmp_path / "skypilot-catalog"
    for folder, text in (("vast", VAST_CSV), ("runpod", RUNPOD_CSV)):
        (repo / "catalogs" / "v8" / folder).mkdir(parents=True)
        (repo / "catalogs" / "v8" / folder / "vms.csv").write_bytes(text.encode())
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "catalogs")
    return repo


def refresh(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)


def rows(path: Path) -> dict[str, list[dict[str, object]]]:
    doc = yaml.safe_load(path.read_text())
    return {p: snapshot.rows(doc, p) for p in doc["providers"]}


def test_refresh_reads_a_checkout_with_its_commit_and_date(checkout: Path,
                                                           tmp_path: Path) -> None:
    out = tmp_path / "snapshot.yaml"
    proc = refresh("--catalog", str(checkout), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    head = git(checkout, "rev-parse", "HEAD")
    got = rows(out)
    cite = f"skypilot-catalog@{head[:12]} catalogs/v8/vast/vms.csv"
    assert {(r["gpu"], r["count"], r["on_demand"], r["spot"], r["ram_gb"]) for r in
            got["vastai"]} == {("L40S", 1, "0.60", None, None), ("L40S", 2, "1.20", "0.45", None),
                               ("A100 40GB", 1, "0.76", None, None),
                               ("A100 80GB", 1, "0.87", None, None),
                               # a "bid" above the median price is not a spot price
                               ("H100 NVL", 1, "2.08", None, None)}
    assert all(r["source"] == cite and r["date"] == "2026-11-30" for r in got["vastai"])
    # RunPod: listed counts as listed; A100 SXM (5 GPUs listed) scaled per GPU to 1, 2, 4.
    assert {(r["gpu"], r["count"], r["listed"], r["on_demand"], r["ram_gb"], r["spot"])
            for r in got["runpod"]} == {
        ("L40S", 1, "1x_L40S_SECURE", "0.99", "62.0", None),
        ("L40S", 2, "2x_L40S_SECURE", "1.98", "124.0", None),
        ("A100 80GB", 1, "5x_A100-80GB-SXM_SECURE", "1.59", "117", None),
        ("A100 80GB", 2, "5x_A100-80GB-SXM_SECURE", "3.18", "234", None),
        ("A100 80GB", 4, "5x_A100-80GB-SXM_SECURE", "6.36", "468", None)}
    assert all(r["date"] == "2026-11-30" and "catalogs/v8/runpod/vms.csv" in str(r["source"])
               for r in got["runpod"])
    doc = yaml.safe_load(out.read_text())["providers"]
    assert doc["vastai"]["date_is"] == doc["runpod"]["date_is"] == "committed"
    # What was left out is said, with the reason from gpus.yaml.
    assert "5 GPUs per machine" in proc.stdout and "Tesla V100 (before Ampere" in proc.stdout
    assert "MI300X (no GPU of gpus.yaml)" in proc.stdout


def test_refresh_of_files_cites_the_given_commit_and_loads_as_offers(tmp_path: Path) -> None:
    (tmp_path / "v.csv").write_text(VAST_CSV)
    (tmp_path / "r.csv").write_text(RUNPOD_CSV)
    out = tmp_path / "snapshot.yaml"
    commit = "0123456789abcdef0123456789abcdef01234567"
    proc = refresh("--vast", str(tmp_path / "v.csv"), "--runpod", str(tmp_path / "r.csv"),
                   "--commit", commit, "--date", "2026-12-01", "--out", str(out),
                   "--note", "runpod=cut for a test")
    assert proc.returncode == 0, proc.stderr
    doc = yaml.safe_load(out.read_text())["providers"]
    assert doc["runpod"]["note"] == "cut for a test" and doc["vastai"]["note"] is None
    assert doc["vastai"]["date_is"] == "retrieved"
    assert doc["vastai"]["source"] == "skypilot-catalog@0123456789ab catalogs/v8/vast/vms.csv"
    snap = snapshot.load.__wrapped__(out)
    l40s = {(o.provider, o.gpu_count, o.interruptible): o for o in snap.listed_offers
            if o.gpu == "L40S"}
    assert l40s[("vastai", 2, True)].price_per_hour == Decimal("0.45")
    assert l40s[("runpod", 1, False)].ram_bytes == 62 * 1000**3  # GB, the smaller reading
    assert l40s[("vastai", 1, False)].ram_bytes is None
    assert not any(o.interruptible for o in snap.listed_offers if o.provider == "runpod")
    assert snap.dates == {"vastai": "2026-12-01", "runpod": "2026-12-01"}
    assert snap.listed[("runpod", l40s[("runpod", 1, False)].offer_id)].listed == \
        "1x_L40S_SECURE"


def test_a_file_that_is_not_a_skypilot_catalog_is_refused(tmp_path: Path) -> None:
    (tmp_path / "v.csv").write_text("InstanceType,Price\n1x-L40S-32-65536,0.60\n")
    (tmp_path / "r.csv").write_text(RUNPOD_CSV)
    out = tmp_path / "snapshot.yaml"
    proc = refresh("--vast", str(tmp_path / "v.csv"), "--runpod", str(tmp_path / "r.csv"),
                   "--out", str(out))
    assert proc.returncode == 2
    assert "v.csv" in proc.stderr and "no column AcceleratorCount, GpuInfo, SpotPrice" in \
        proc.stderr
    assert not out.exists()  # nothing half-written
    bad = refresh("--vast", "v.csv", "--runpod", "r.csv", "--date", "30/11/2026")
    assert bad.returncode == 2 and "--date '30/11/2026': YYYY-MM-DD" in bad.stderr


def test_the_shipped_snapshot_names_a_source_and_date_on_every_row() -> None:
    doc = yaml.safe_load((ROOT / "providers" / "catalog" / "snapshot.yaml").read_text())
    gpus = catalog.gpus()
    assert set(doc["providers"]) == {"vastai", "runpod"}
    for provider in doc["providers"]:
        folder = {"vastai": "vast", "runpod": "runpod"}[provider]
        assert snapshot.rows(doc, provider), provider
        for r in snapshot.rows(doc, provider):
            assert r["gpu"] in gpus and gpus[r["gpu"]].memory_bytes > 0, r
            assert gpus[r["gpu"]].bf16_tflops > 0 and gpus[r["gpu"]].source, r
            assert r["count"] in skypilot.COUNTS, r
            assert Decimal(r["on_demand"]) > 0, r
            assert r["spot"] is None or Decimal(r["spot"]) < Decimal(r["on_demand"]), r
            assert re.fullmatch(rf"skypilot-catalog@[0-9a-f]{{12}} catalogs/v\d+/{folder}/"
                                r"vms\.csv", str(r["source"])), r
            assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", str(r["date"])), r
            # Host RAM only where the source publishes it (RunPod's pods), never guessed.
            assert (r["ram_gb"] is None) == (provider == "vastai"), r
    # The README's example GPU is listed by both providers.
    assert {p for p in doc["providers"]
            if any(r["gpu"] == "L40S" for r in snapshot.rows(doc, p))} == {"vastai", "runpod"}
