"""How often a job saves a checkpoint: Young's interval on spot, never over the user's setting.

A preemption loses the training since the last durable checkpoint (on average half an
interval T), and every checkpoint stalls training while it is written (C seconds). Young
(J. W. Young, "A first order approximation to the optimum checkpoint interval", CACM 17(9),
1974) minimises the sum of the two for interruptions at a mean interval M:

    T* = sqrt(2 * C * M)

(both in seconds; Daly, FGCS 22(3), 2006, refines it for C not much smaller than M: for the
checkpoints here, seconds against hours, the two differ by under 2 %). M is 1 / the spot
GPU's preemption rate (core/preemption: the prior, then orch's history); C is the
checkpoint's bytes (`sizing.checkpoint_bytes`) at the slowest write a host passes orch's
host check at (the disk floor, playbooks/data/hostchecks.yaml: half the planned download
rate), on the long side for a host that passed it (serialising the tensors is not counted;
with the host check off, a slower disk is not ruled out).

The interval is bounded:
- at most `longest_s` (`ORCH_CHECKPOINT_EVERY_S`, 15 min unless the user says otherwise): on
  on-demand and kept servers, which are not preempted, that is the interval; on spot it is
  the most a preemption loses whatever the market;
- at least `SHORTEST_S` (unless `longest_s` is shorter): each checkpoint is also copied off
  the host (the mirror a resume starts from), once per checkpoint at most. The floor costs at
  most the loss it keeps, T / 2M = rate / 120 of the training time at T = 60 s: under 1 % up
  to 1.2 preemptions an hour (the bench's heavy regime has 1.09).

At a shorter interval the trainer keeps more checkpoints (`kept`), so that each stays on the
host as long as at the longest one, and a copy off the host that kept up then keeps up now.

At the catalog's floor (125 MB/s) and the prior's 0.30 preemptions/h: a QLoRA adapter of an
8B model and its 8-bit optimizer state (0.25 GB, a 2 s write) every 3.7 min; a LoRA of it
with AdamW (0.5 GB) every 5.2 min; a full fine-tune of it (48 GB with AdamW, a 6.4 min write:
Young's optimum is 51 min) stays at the 15 min cap (docs/deadline.md has the table).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

SHORTEST_S = 60.0
KEEP = 3  # checkpoints the trainer keeps at the longest interval (`save_total_limit`)
# Of the 10 GB the host's disk is sized with for checkpoints, data and caches
# (planning.host_disk_gb): what the more checkpoints kept on spot may take.
KEEP_BUDGET_BYTES = 5_000_000_000


@dataclass(frozen=True)
class Interval:
    """Training seconds between checkpoints, and what set them (for events and `orch plan`)."""

    seconds: float
    write_s: float | None  # C, the estimated write time (None: not on spot)
    young_s: float | None  # sqrt(2 C M) before the bounds (None: not on spot, or no rate)

    def describe(self) -> str:
        """`every 3.7 min (Young's optimum for a 2.0 s write)`, or `every 15 min`."""
        text = f"every {_minutes(self.seconds)}"
        if self.young_s is None or self.write_s is None:
            return text
        if math.isclose(self.seconds, self.young_s):
            return f"{text} (Young's optimum for a {_seconds(self.write_s)} write)"
        young = "none: no preemptions" if math.isinf(self.young_s) else _minutes(self.young_s)
        return f"{text} (bounded; Young's optimum for a {_seconds(self.write_s)} write: {young})"


def young_s(write_s: float, preemptions_per_hour: float) -> float:
    """Young's optimum interval in seconds (infinite with no preemptions)."""
    if write_s < 0 or preemptions_per_hour < 0:
        raise ValueError(f"checkpoint interval: write {write_s} s, "
                         f"{preemptions_per_hour} preemptions/h")
    if preemptions_per_hour == 0:
        return math.inf
    return math.sqrt(2.0 * write_s * 3600.0 / preemptions_per_hour)


class Spot(NamedTuple):
    """What a spot machine's interval is chosen from."""

    preemptions_per_hour: float  # of its provider's GPU (core/preemption)
    write_bytes_per_s: float  # the slowest write its host check passes (the disk floor)


def interval(longest_s: float, spot: Spot | None = None,
             checkpoint_bytes: int | None = None) -> Interval:
    """The checkpoint interval of a run: `longest_s` on a machine that is not preempted
    (`spot` None), else Young's optimum for a checkpoint of `checkpoint_bytes` within
    [SHORTEST_S, longest_s] (never above `longest_s`, which the user may have set below a
    minute)."""
    if not longest_s > 0:
        raise ValueError(f"checkpoint interval: the longest must be > 0 s (got {longest_s})")
    if spot is None:
        return Interval(longest_s, None, None)
    if checkpoint_bytes is None or checkpoint_bytes < 0:
        raise ValueError(f"checkpoint interval: a spot machine needs the checkpoint's size "
                         f"(got {checkpoint_bytes})")
    if not spot.write_bytes_per_s > 0:
        raise ValueError(f"checkpoint interval: write rate {spot.write_bytes_per_s} B/s")
    write = checkpoint_bytes / spot.write_bytes_per_s
    best = young_s(write, spot.preemptions_per_hour)
    return Interval(min(longest_s, max(SHORTEST_S, best)), write, best)


def kept(every: Interval, longest_s: float, checkpoint_bytes: int) -> int:
    """How many checkpoints the trainer keeps (`save_total_limit`) at interval `every`: as
    many as cover the time KEEP of them did at `longest_s`, within KEEP_BUDGET_BYTES, never
    under KEEP. The trainer deletes the oldest as it saves a new one; orch copies the newest
    off the host while it runs. Checkpoints minutes apart would otherwise be deleted minutes
    after they were written, before a copy over a slow link could finish (playbooks/
    checkpoints.mirror gives up on one deleted mid-copy)."""
    if every.seconds >= longest_s:
        return KEEP
    want = math.ceil(KEEP * longest_s / every.seconds)
    room = KEEP_BUDGET_BYTES // checkpoint_bytes if checkpoint_bytes > 0 else want
    return max(KEEP, min(want, room))


def _seconds(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 60 else _minutes(seconds)


def _minutes(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds % 60 else f"{seconds / 60:.0f} min"
