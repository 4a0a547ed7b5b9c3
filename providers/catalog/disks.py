"""What a rented machine's disks add to its hourly price: one rule for live offers and the
market snapshot (disks.yaml, with its sources).

The RunPod and Vast.ai adapters price their live offers with these functions, and the market
snapshot prices its rows with the same ones for the same disk, so `orch plan` without a key
and with one price a machine the same way (docs/providers.md "The market without keys").
"""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from functools import cache
from pathlib import Path
from typing import ClassVar

from providers.datacache import read_yaml

_FILE = Path(__file__).with_name("disks.yaml")
QUANTUM = Decimal("0.000001")  # prices are compared and stored to the micro-dollar


class DisksError(ValueError):
    """disks.yaml is not what this module reads: names the file, the field and what is wrong."""


class _Section:
    """A checked mapping of disks.yaml: every field of `KINDS` present, of its kind, no other.

    Plain classes, not pydantic models or dataclasses: the snapshot reads this file on every
    keyless `orch plan`, where building those classes cost that command 3 ms (importtime)."""

    KINDS: ClassVar[dict[str, type]] = {}
    __slots__ = ()

    def __init__(self, path: Path, name: str, raw: object) -> None:
        where = f"{path}: {name}"
        if not isinstance(raw, dict):
            raise DisksError(f"{where}: missing, or not a mapping")
        unknown = sorted(set(raw) - set(self.KINDS))
        missing = sorted(set(self.KINDS) - set(raw))
        if unknown or missing:
            raise DisksError(f"{where}: " + "; ".join(
                [f"unknown field {', '.join(unknown)}"] * bool(unknown)
                + [f"missing field {', '.join(missing)}"] * bool(missing)))
        for key, kind in self.KINDS.items():
            setattr(self, key, _value(f"{where}.{key}", kind, raw[key]))


class RunPodDisks(_Section):
    """RunPod's storage prices ($/GB/month) and the disks orch gives a pod."""

    KINDS: ClassVar[dict[str, type]] = {
        "source": str, "checked": str, "month_hours": int, "container_disk_running": Decimal,
        "volume_disk_running": Decimal, "volume_disk_stopped": Decimal,
        "container_disk_gb": int, "min_volume_gb": int}
    __slots__ = tuple(KINDS)
    source: str
    checked: str
    month_hours: int
    container_disk_running: Decimal
    volume_disk_running: Decimal
    volume_disk_stopped: Decimal
    container_disk_gb: int
    min_volume_gb: int

    def volume_gb(self, disk_gb: int) -> int:
        """The volume disk a pod for a job of `disk_gb` gets (RunPod's minimum or more)."""
        return max(self.min_volume_gb, int(disk_gb))

    def running_per_hour(self, container_gb: int, volume_gb: int) -> Decimal:
        """$/h a running pod's container disk and volume disk cost."""
        month = (container_gb * self.container_disk_running
                 + volume_gb * self.volume_disk_running)
        return month / self.month_hours

    def stopped_per_hour(self, volume_gb: int) -> Decimal:
        """$/h a stopped (EXITED) pod's volume disk costs (its container disk is gone)."""
        return volume_gb * self.volume_disk_stopped / self.month_hours

    def pod_per_hour(self, disk_gb: int) -> Decimal:
        """$/h the disks of a running pod orch creates for a job of `disk_gb` cost."""
        return self.running_per_hour(self.container_disk_gb, self.volume_gb(disk_gb))


class VastDisks(_Section):
    """Vast.ai's storage month and the storage price the snapshot assumes (no per-offer one)."""

    KINDS: ClassVar[dict[str, type]] = {
        "month_hours": int, "snapshot_storage_cost": Decimal, "snapshot_storage_source": str}
    __slots__ = tuple(KINDS)
    month_hours: int
    snapshot_storage_cost: Decimal
    snapshot_storage_source: str

    def per_hour(self, disk_gb: int | Decimal, storage_cost: Decimal) -> Decimal:
        """$/h of `disk_gb` of an offer's storage at `storage_cost` $/GB/month."""
        return Decimal(disk_gb) * storage_cost / self.month_hours


class Disks:
    """disks.yaml."""

    __slots__ = ("runpod", "vastai")

    def __init__(self, runpod: RunPodDisks, vastai: VastDisks) -> None:
        self.runpod = runpod
        self.vastai = vastai


def _value(where: str, kind: type, raw: object) -> object:
    """`raw` as `kind` (str; int > 0; Decimal >= 0), or a DisksError naming `where`."""
    if kind is str and isinstance(raw, str) and raw:
        return raw
    if kind is int and isinstance(raw, int) and not isinstance(raw, bool) and raw > 0:
        return raw
    if kind is Decimal and isinstance(raw, (str, int)) and not isinstance(raw, bool):
        try:
            d = Decimal(str(raw))
        except InvalidOperation:
            d = Decimal("NaN")
        if d.is_finite() and d >= 0:
            return d
    want = {str: "a non-empty string", int: "a whole number above 0",
            Decimal: "a finite number of at least 0 (a string, as \"0.10\")"}[kind]
    raise DisksError(f"{where}: {raw!r} is not {want}")


@cache
def load(path: Path = _FILE) -> Disks:
    """disks.yaml, checked (a wrong file is a DisksError naming the field)."""
    doc = read_yaml(path)
    doc = doc if isinstance(doc, dict) else {}
    return Disks(RunPodDisks(path, "runpod", doc.get("runpod")),
                 VastDisks(path, "vastai", doc.get("vastai")))


def runpod() -> RunPodDisks:
    """RunPod's storage prices and the disks orch gives a pod."""
    return load().runpod


def vast() -> VastDisks:
    """Vast.ai's storage month and the snapshot's assumed storage price."""
    return load().vastai


def snapshot_extra(provider: str, disk_gb: int, *, spot: bool, included_gb: int) -> Decimal:
    """$/h a market-snapshot row's listed price lacks for a machine with `disk_gb` of job disk,
    as the live adapter prices that provider's offers: RunPod's pod disks (the list price is
    the GPUs'), or Vast.ai's storage beyond the `included_gb` its listed on-demand price holds
    at the assumed storage price (a bid, `min_bid`, holds none). 0 for any other provider."""
    if provider == "runpod":
        return runpod().pod_per_hour(disk_gb)
    if provider == "vastai":
        v = vast()
        return v.per_hour(max(0, disk_gb - (0 if spot else included_gb)), v.snapshot_storage_cost)
    return Decimal(0)


def quantize(price: Decimal) -> Decimal:
    """A price to the micro-dollar, as offers carry it."""
    return price.quantize(QUANTUM, rounding=ROUND_HALF_UP)
