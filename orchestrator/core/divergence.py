"""When a run has diverged for good: the training loss was NaN at several logged steps in a row.

A logged training loss of NaN means every step of that logging window had a NaN loss
(transformers' `logging_nan_inf_filter`, on by default, averages finite steps in and logs
NaN only when none was; playbooks/trainjob.py reads its `0.0` beside a NaN grad norm as NaN).
With bf16 or fp32 weights the optimizer step after a NaN gradient makes the weights NaN, and
every later step is NaN too: the run cannot come back, and each further second is billed for
nothing. fp16's loss scaler skips an overflowing step instead, but its loss is a number then
(a NaN *loss* at every step of three windows is no scaler's overflow). An eval loss of NaN is
not counted: a held-out split with no trained token reads NaN on a healthy run.

Pure: the engine passes the losses it recorded (step -> value) and stops the job with the
reason this returns (`training.stop_on_nan`, docs/job-file.md); a sweep trial with
`early_stop:` is pruned instead, as optuna's pruners prune a NaN report at once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

# Logged steps in a row with a NaN training loss before the run is taken as diverged: one
# window could be an unlucky batch under fp16, three cannot. They cost three logging
# intervals: at axolotl's default (`logging_steps`: 0.5 % of the steps, 1 to 10) at most 30
# steps after the first NaN.
NAN_LOGS = 3
# How a job stopped for it starts its failure reason (what the sweep search reads back).
REASON_PREFIX = "diverged:"


@dataclass(frozen=True)
class Diverged:
    """Every logged training loss from step `first` to step `last` (`logs` of them, the
    newest) was NaN."""

    first: int
    last: int
    logs: int

    def what(self) -> str:
        """What happened, in a line."""
        return (f"train.loss was nan at every logged step from step {self.first} to step "
                f"{self.last} ({self.logs} logs): its weights are NaN")

    def reason(self) -> str:
        """A job's failure reason: what happened and what to change."""
        return (f"{REASON_PREFIX} {self.what()}, so every further step is paid for nothing; "
                "stopped, nothing delivered. A lower learning_rate, warm-up or gradient "
                "clipping are the usual fixes (`training.stop_on_nan: false` trains on)")


def diverged(losses: Mapping[int, float], logs: int = NAN_LOGS) -> Diverged | None:
    """The run's divergence when its newest `logs` (or more) logged training losses are all
    NaN; the run of NaN losses it names reaches back to the first of them."""
    if logs < 1:
        raise ValueError(f"logs must be >= 1 (got {logs})")
    steps = sorted(losses)
    bad = 0
    while bad < len(steps) and math.isnan(losses[steps[-1 - bad]]):
        bad += 1
    if bad < logs:
        return None
    return Diverged(steps[-bad], steps[-1], bad)


def told(metric: str, value: object, step: object, why: str, stops_after: int | None,
         job_id: str) -> str:
    """What a `train.not_finite` event says: its message, and a webhook's text after the
    job's name (core/webhooks.summary), from the event's data."""
    return (f"{metric} is {value} at step {step}: {why}; {fate(stops_after)} "
            f"(`orch cancel {job_id}` stops it now)")


def fate(stops_after: int | None) -> str:
    """What becomes of a run whose loss was `nan`, as `train.not_finite` says it (its data's
    `stops_after`: the logs in a row that stop it, None when nothing will)."""
    if stops_after is None:
        return "it trains on"
    return (f"orch stops it if the loss is nan at {stops_after} logged steps in a row, as "
            "training.stop_on_nan says")
