"""SkyPilot's published price catalogs (github.com/skypilot-org/skypilot-catalog) read into the
rows of orch's market snapshot (`snapshot.yaml`, written by scripts/refresh_catalog.py).

Pure: CSV text in, rows out, and the snapshot file's text. Only `scripts/refresh_catalog.py`
and the tests use this module; planning reads the finished YAML (`catalog.snapshot`).

What each source's columns mean, from SkyPilot's fetchers (skypilot-org/skypilot,
sky/catalog/data_fetchers/):

* Vast.ai (`fetch_vast.py`): offers searched with `georegion chunked inet_down>=100
  disk_space>=80` are bucketed by `InstanceType` = `{num_gpus}x-{gpu_name}-{cpu_cores}-
  {cpu_ram}` (spaces as `_`); `Price` is the bucket's median `search.totalHour` (the offers
  at or under it are kept), `SpotPrice` the highest `min_bid` among those. Vast's `gpu_name`
  is in `InstanceType`; `AcceleratorName` is SkyPilot's own family name (H100 for SXM, NVL
  and PCIe alike), so the former is used. Every row of catalogs v6 to v9 reads 32 vCPUs and
  64 GiB whatever the machine (eight H200s included): not a host's RAM, so none is taken.
* RunPod (`fetch_runpod.py`): secure-cloud pods; `Price` is `securePrice` x count (rounded
  to cents), one row per data centre. `vCPUs` is the pod's. `MemoryGiB` is the fetcher's
  `memory x count` (get_gpu_info), where `memory` is its table's RAM per GPU, or for a GPU
  missing from that table the API's `minMemory` for that count, which is already the pod's:
  such rows are `count` times too big (skypilot-catalog@01acdfd419ce: B300 1x 503.0, 2x
  2012.0; RTX PRO 4500 SE 8x 6016.0 = 94 x 8 x 8). A row's RAM and vCPUs are therefore its
  GPU type's per GPU at the smallest count listed (where both readings agree) times its
  count: RunPod publishes both per GPU, and for every GPU of the fetcher's table this is
  the file's own figure (`minVcpu` can be a little more: RTX PRO 5000 2x lists 48, not 40).
  `SpotPrice` is ignored: RunPod withdrew spot pods (shared/reference/provider-apis.md;
  providers/runpod/compute.py sells none). Prices are the GPUs' alone: the pod's disks are
  added when the snapshot is planned (catalog/disks.py, as the live adapter adds them).
"""

from __future__ import annotations

import ast
import csv
import io
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

from providers import catalog

COUNTS = (1, 2, 4, 8)  # the machine sizes orch plans (planning.requirements)
CENT = Decimal("0.01")
# `InstanceType` of a Vast row: "2x-RTX_4090-32-65536".
_VAST_TYPE = re.compile(r"^(\d+)x-(.+)-([\d.]+)-([\d.]+)$")


class SourceError(ValueError):
    """A SkyPilot CSV orch cannot read (missing columns): names the file and what is wrong."""


@dataclass(frozen=True)
class Row:
    """One machine shape a provider lists: GPU model and count, its prices (the whole
    machine, $/h), host RAM in GB when published, and the source's name for it."""

    gpu: str  # orch's canonical GPU name
    count: int
    listed: str  # the source's instance type the facts were read from
    on_demand: Decimal | None
    spot: Decimal | None = None
    ram_gb: Decimal | None = None
    vcpu: Decimal | None = None


@dataclass
class Parsed:
    """What one source file gave: rows, and names or counts left out with how many."""

    rows: list[Row] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)

    def skip(self, why: str) -> None:
        self.skipped[why] = self.skipped.get(why, 0) + 1


def _records(text: str, path: str, needed: Iterable[str]) -> list[dict[str, str]]:
    reader = csv.DictReader(io.StringIO(text))
    missing = sorted(set(needed) - set(reader.fieldnames or ()))
    if missing:
        raise SourceError(f"{path}: not a SkyPilot vms.csv: no column {', '.join(missing)} "
                          f"(columns: {', '.join(reader.fieldnames or ()) or 'none'})")
    return list(reader)


def _dec(value: str | None) -> Decimal | None:
    try:
        d = Decimal(str(value).strip())
    except (InvalidOperation, ValueError):
        return None
    return d if d.is_finite() and d >= 0 else None


def _gpu_mib(info: str, count: int) -> int:
    """Per-GPU memory from a `GpuInfo` cell (a Python literal; 0 when unreadable)."""
    try:
        total = ast.literal_eval(info)["TotalGpuMemoryInMiB"]
        return int(total) // max(1, count)
    except (ValueError, SyntaxError, KeyError, TypeError):
        return 0


def vast_gpu(name: str, gpu_mib: int) -> str | None:
    """orch's GPU for a Vast `gpu_name` with this much memory per GPU (gpus.yaml `spellings:
    vastai` and `vastai_min_gpu_ram_mb`, as providers/vastai/compute.py reads them)."""
    floors = catalog.min_gpu_ram_mb("vastai")
    hits = [(floors.get(canonical, 0), canonical)
            for canonical, names in catalog.spellings("vastai").items()
            if name in names and gpu_mib >= floors.get(canonical, 0)]
    return max(hits)[1] if hits else None


def vast(text: str, path: str = "vast/vms.csv") -> Parsed:
    """Rows of SkyPilot's Vast.ai catalog: one per GPU model, count and Vast `gpu_name`."""
    out = Parsed()
    best: dict[tuple[str, int, str], Row] = {}
    for rec in _records(text, path, ("InstanceType", "AcceleratorCount", "GpuInfo", "Price",
                                     "SpotPrice")):
        m = _VAST_TYPE.match(rec["InstanceType"].strip())
        if m is None:
            out.skip(f"unreadable InstanceType {rec['InstanceType']!r}")
            continue
        count, name = int(m.group(1)), m.group(2).replace("_", " ")
        if count not in COUNTS:
            out.skip(f"{count} GPUs per machine (orch plans 1, 2, 4, 8)")
            continue
        gpu = vast_gpu(name, _gpu_mib(rec["GpuInfo"], count))
        price = _dec(rec["Price"])
        if gpu is None:
            out.skip(f"{name} ({catalog.skip_reason('vastai', name)})")
            continue
        if price is None or price == 0:
            out.skip(f"{name}: no price")
            continue
        bid = _dec(rec["SpotPrice"])
        # 0.00 is "no bid seen"; a bid above the median price is not a spot price.
        spot = bid if bid is not None and 0 < bid < price else None
        row = Row(gpu, count, rec["InstanceType"].strip(), price, spot)
        key = (gpu, count, name)
        old = best.get(key)
        if old is None or (old.on_demand or price) > price:
            best[key] = row
    out.rows = sorted(best.values(), key=_order)
    return out


def runpod_gpu(display: str) -> str | None:
    """orch's GPU for a RunPod display name ("H100 SXM", "A100 PCIe"): gpus.yaml `spellings:
    runpod_display` where a name is not a model name or alias, else `catalog.resolve_gpu`."""
    for canonical, names in catalog.spellings("runpod_display").items():
        if display in names:
            return canonical
    hits = catalog.resolve_gpu(display)
    return hits[0] if len(hits) == 1 else None


def _display(info: str, fallback: str) -> str:
    try:
        return str(ast.literal_eval(info)["Gpus"][0]["Name"])
    except (ValueError, SyntaxError, KeyError, IndexError, TypeError):
        return fallback


def runpod(text: str, path: str = "runpod/vms.csv") -> Parsed:
    """Rows of SkyPilot's RunPod catalog for 1, 2, 4 and 8 GPUs up to the most it lists.

    A count the file lists is taken with its price; one up to the largest listed that it
    does not list is the smallest listed machine scaled per GPU, as `fetch_runpod.py` builds
    every count (price x count, RAM x count), and keeps that machine's name in `listed`.
    RAM and vCPUs are always the smallest listing's per GPU x count (module docstring).
    """
    out = Parsed()
    seen: dict[tuple[str, str], dict[int, Row]] = {}
    for rec in _records(text, path, ("InstanceType", "AcceleratorName", "AcceleratorCount",
                                     "MemoryGiB", "vCPUs", "Price", "GpuInfo")):
        name = rec["AcceleratorName"].strip()
        if not name:
            continue  # a CPU-only pod
        count = int(float(rec["AcceleratorCount"]))
        gpu = runpod_gpu(_display(rec["GpuInfo"], name))
        price = _dec(rec["Price"])
        if gpu is None:
            out.skip(f"{name} (no GPU of gpus.yaml)")
            continue
        if price is None or price == 0:
            out.skip(f"{name}: no price")
            continue
        row = Row(gpu, count, rec["InstanceType"].strip(), price, None,
                  _dec(rec["MemoryGiB"]), _dec(rec["vCPUs"]))
        seen.setdefault((gpu, name), {}).setdefault(count, row)
    for (_gpu, _name), by_count in seen.items():
        out.rows += _counts(by_count)
    out.rows.sort(key=_order)
    return out


def _counts(by_count: dict[int, Row]) -> list[Row]:
    base = by_count[min(by_count)]
    rows = []
    for n in COUNTS:
        if n > max(by_count):
            break
        listed = by_count.get(n)
        rows.append(_per_gpu(listed, base) if listed is not None else _scaled(base, n))
    return rows


def _per_gpu(row: Row, base: Row) -> Row:
    """`row` with the RAM and vCPUs of its count at `base`'s per GPU (the module docstring)."""
    if row is base:
        return row

    def scale(value: Decimal | None) -> Decimal | None:
        return None if value is None else value / base.count * row.count

    return replace(row, ram_gb=scale(base.ram_gb), vcpu=scale(base.vcpu))


def _scaled(base: Row, n: int) -> Row:
    def per(value: Decimal | None, quantum: Decimal | None = None) -> Decimal | None:
        if value is None:
            return None
        v = value / base.count * n
        return v.quantize(quantum, rounding=ROUND_HALF_UP) if quantum else v.normalize()

    return replace(base, count=n, on_demand=per(base.on_demand, CENT),
                   ram_gb=per(base.ram_gb), vcpu=per(base.vcpu))


def _order(r: Row) -> tuple[str, int, str]:
    return r.gpu, r.count, r.listed


@dataclass(frozen=True)
class Source:
    """Where one provider's rows come from: the file, its commit, and the date."""

    provider: str
    path: str  # the file inside skypilot-org/skypilot-catalog, e.g. catalogs/v8/vast/vms.csv
    commit: str  # full hash, or "" when the file was not read from a git checkout
    date: str  # YYYY-MM-DD
    date_is: str  # "committed" (the commit's date) or "retrieved" (read that day)

    @property
    def cite(self) -> str:
        at = f"@{self.commit[:12]}" if self.commit else ""
        return f"skypilot-catalog{at} {self.path}"


# Planning assumptions per provider (the adapters' defaults): what the source does not give.
# `storage_in_price_gb`: the disk the listed on-demand price already pays for (Vast.ai: the
# 5 GB SkyPilot's search prices, catalog/disks.yaml); the snapshot adds the rest of orch's
# disk as the live adapter prices it (catalog/disks.py).
SETTINGS = {
    "vastai": {"billing": "per_second", "boot_minutes": 5.0, "pull_gbps": 2.0,
               "storage_in_price_gb": 5},
    "runpod": {"billing": "per_second", "boot_minutes": 5.0, "pull_gbps": 2.0,
               "storage_in_price_gb": 0},
}

HEADER = """\
# Dated snapshot of what Vast.ai and RunPod list for the GPUs orch knows: planning without
# API keys (`orch plan`, `orch offers`). Written by scripts/refresh_catalog.py from SkyPilot's
# published catalogs (github.com/skypilot-org/skypilot-catalog); do not edit by hand, refresh:
#     .venv/bin/python scripts/refresh_catalog.py --catalog PATH_TO_CHECKOUT   (or --vast/--runpod
#     with files or URLs; see the script's --help)
# Live offers replace these rows whenever a key is configured (orchestrator/core/planning.py).
#
# Each row (a list under `columns`): one machine shape (GPU model x count), the source's
# instance type (`listed`), the whole machine's $/h on demand and spot as the source lists
# it, host RAM in GB and vCPUs where published (null: unknown, never guessed), and its source
# (file @ commit) and date.
# Disks: orch adds to a row's price what the machine's disks cost for the job's disk, with
# the live adapter's rule (providers/catalog/disks.py and disks.yaml), so `orch offers` and
# `orch plan` show the price a live offer of that machine would have.
# * vastai: a marketplace. `on_demand` is SkyPilot's per-instance-type figure: the MEDIAN of
#   Vast's `search.totalHour` over the offers of that GPU, count and CPU shape
#   (sky/catalog/data_fetchers/fetch_vast.py); it pays for the 5 GB of storage the search
#   prices (`storage_in_price_gb`), and orch adds the rest of its disk at the storage price
#   disks.yaml assumes (the source has no per-offer `storage_cost`). `spot` is the highest
#   `min_bid` among the offers at or under that median (no storage in it), null when the file
#   has none (0.00) or it is not below on-demand. Host RAM is null: every row of the file
#   reads 64 GiB / 32 vCPUs whatever the machine (a bucket label, not the host's), so offload
#   layouts plan on live Vast offers (`cpu_ram`) instead.
# * runpod: list prices of secure-cloud pods (`securePrice` x count, fetch_runpod.py), the
#   GPUs only: orch adds the pod's 50 GB container disk and its volume while running, as the
#   live adapter does. Host RAM (and vCPUs) is the pod's per GPU x count (GB; read as 10^9
#   bytes, the smaller reading of SkyPilot's `MemoryGiB`), per GPU from the smallest count
#   listed (providers/catalog/skypilot.py says why). No spot: RunPod withdrew spot pods. A
#   count up to the largest listed that the file does not list is the smallest listing
#   scaled per GPU, as the fetcher builds every count (`listed` names the listing).
"""


def _q(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, Decimal):
        return json.dumps(format(value, "f"))  # as the source wrote it ("0.60", "117.0")
    return json.dumps(value)


# A row is a flow list under these names: a mapping per row takes PyYAML twice as long to
# build, and the snapshot is read on every keyless `orch plan`.
COLUMNS = ("gpu", "count", "listed", "on_demand", "spot", "ram_gb", "vcpu", "source", "date")


def render(parts: list[tuple[Source, Parsed, str | None]]) -> str:
    """The text of snapshot.yaml for each provider's source, rows and note (deterministic)."""
    lines = [HEADER.rstrip("\n"), f"columns: [{', '.join(COLUMNS)}]", "providers:"]
    for src, parsed, note in parts:
        lines.append(f"  {src.provider}:")
        for key, value in SETTINGS[src.provider].items():
            lines.append(f"    {key}: {_q(value)}")
        lines += [f"    source: {_q(src.cite)}", f"    date: {_q(src.date)}",
                  f"    date_is: {_q(src.date_is)}", f"    note: {_q(note)}", "    rows:"]
        for r in parsed.rows:
            cells = (r.gpu, r.count, r.listed, r.on_demand, r.spot, r.ram_gb, r.vcpu, src.cite,
                     src.date)
            lines.append(f"      - [{', '.join(_q(c) for c in cells)}]")
    return "\n".join(lines) + "\n"
