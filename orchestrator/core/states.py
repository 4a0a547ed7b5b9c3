"""The closed sets of words orch stores or decides with, beside a job's status (standard library
only, like `jobstatus`).

Each is a `StrEnum`: a member equals its stored text (`EndReason.RELEASED == "released"`), so
rows written before these enums existed read the same and the schema keeps its TEXT columns.
- `StopKind`: why the monitor stopped an attempt's pipeline (`engine.runner_core.Stop`);
- `Outcome`: how one run of a claimed job ended (`engine.runner.JobRunner.run`);
- `RowState`: an `instance` row's `state` (before create, the provider's states, parked);
- `EndReason`: why an `instance` or `warm_instance` row was closed (`end_reason`);
- `WarmState`: a `warm_instance` row's `state` (docs/warm.md);
- `ServerStatus`: a registered server's `status`;
- `SweepRunState`: a sweep run as `orch sweep` reports it;
- `EventKind`: the event kinds orch's own code writes and reads back by name (playbooks and
  the engine write more kinds, read only by people: those stay free text).
"""

from __future__ import annotations

from enum import StrEnum


class StopKind(StrEnum):
    """Why the monitor (or a check before a step) stopped the pipeline."""

    CANCELLED = "cancelled"  # `orch cancel`, or Ctrl-C in `orch submit`
    INTERRUPTED = "interrupted"  # the instance was lost (preempted, gone, unreachable)
    STALLED = "stalled"  # the watchdog: a phase made no progress for its deadline
    LOST = "lost"  # the lease: another worker took the job over
    PRUNED = "pruned"  # the sweep's early stopping: the run lost at a rung
    MOVED = "moved"  # the deadline policy moves the job off this machine (spot -> on-demand)
    BUDGET = "budget"  # the bill reached resources.max_cost (engine/budget.py): failed


class Outcome(StrEnum):
    """How one run of a claimed job ended: what is recorded, and how its instances end."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"  # an instance loss that escaped re-placement: failed
    STALLED = "stalled"  # a stall that escaped re-placement: failed
    LOST = "lost"  # another worker took the job over: nothing of it is ours to record
    REQUEUE = "requeue"  # `orch worker` stopping (SIGTERM, Ctrl-C): requeued to resume
    DATABASE = "database"  # the database refused writes (locked, full): requeued if it can
    DEFERRED = "deferred"  # its providers are unavailable: queued again with a backoff
    PRUNED = "pruned"  # the sweep's early stopping stopped it at a rung: final, nothing delivered
    MOVED = "moved"  # a move that escaped re-placement: failed
    BUDGET = "budget"  # the bill reached resources.max_cost: failed

    @classmethod
    def of_stop(cls, kind: StopKind) -> Outcome:
        """The outcome of a run a stop signal ended."""
        return cls(kind.value)


class RowState(StrEnum):
    """An `instance` row's `state`: `creating` until the provider's create returns, then what
    the provider reports (`providers.base.InstanceState`, same words), `parked` once kept
    warm (the `warm_instance` row owns the machine then)."""

    CREATING = "creating"
    PROVISIONING = "provisioning"
    RUNNING = "running"
    INTERRUPTED = "interrupted"
    TERMINATED = "terminated"
    FAILED = "failed"
    UNKNOWN = "unknown"
    PARKED = "parked"


class EndReason(StrEnum):
    """Why an `instance` row (or a `warm_instance` row) was closed."""

    RELEASED = "released"  # the job is done with it: terminated, or a kept server released
    INTERRUPTED = "interrupted"  # lost: preempted or gone (what the preemption rate counts)
    FAILED = "failed"  # the job failed, or its create failed
    CANCELLED = "cancelled"
    UNREACHABLE = "unreachable"  # never answered over SSH or never booted
    CAPACITY = "capacity"  # the provider had no capacity for the offer
    PRICE_CHANGED = "price_changed"  # the offer's price moved before the create
    LOST = "lost"  # a warm machine gone before it could be taken
    IDLE = "idle"  # `orch reconcile`: nobody drove the job that held it
    PARKED = "parked"  # kept warm: the `warm_instance` row owns the machine now
    EXPIRED = "expired"  # a warm machine's window closed
    HOST_CHECK_FAILED = "host_check_failed"  # failed its pre-flight check: released, re-placed
    MOVED = "moved"  # the deadline policy moved the job to on-demand (not an interruption)
    # Given up by orch while it still ran (stalled, a slow host, the job requeued): the job
    # is re-placed as after a loss, but the provider took nothing (not an interruption).
    REPLACED = "replaced"


class WarmState(StrEnum):
    """A `warm_instance` row's `state`."""

    PARKED = "parked"  # idle, owned by this row, takeable until `expires_at`
    TAKEN = "taken"  # a job took it (that job's instance row owns the machine)
    ENDING = "ending"  # being terminated (owned by this row until `ended`)
    ENDED = "ended"


# The warm states in which the warm row owns the machine.
WARM_OWNING: frozenset[WarmState] = frozenset({WarmState.PARKED, WarmState.ENDING})


class ServerStatus(StrEnum):
    """A registered server's `status`."""

    IDLE = "idle"
    BUSY = "busy"
    DISABLED = "disabled"


class SweepRunState(StrEnum):
    """A sweep run as `orch sweep` reports it (in summary order): a job status, `running`
    (every state a worker drives, as `orch jobs --status running`), or what this `orch
    sweep` call did with it (`new`, `requeued`) or could not (`nofit`)."""

    NEW = "new"
    REQUEUED = "requeued"
    SUCCEEDED = "succeeded"
    RUNNING = "running"
    QUEUED = "queued"
    FAILED = "failed"
    CANCELLED = "cancelled"
    PRUNED = "pruned"  # stopped at a rung by the sweep's early stopping
    NOFIT = "nofit"


class RungDecision(StrEnum):
    """A sweep trial's check at a rung of its early stopping (`sweep_rung.decision`)."""

    CONTINUE = "continue"
    PRUNE = "prune"


# The run states `orch sweep show` and `orch sweeps` count, in their columns' order (the runs
# a sweep file's submit did something with are `SubmitReport`'s).
SWEEP_COUNTED: tuple[SweepRunState, ...] = (
    SweepRunState.SUCCEEDED, SweepRunState.RUNNING, SweepRunState.QUEUED, SweepRunState.FAILED,
    SweepRunState.CANCELLED, SweepRunState.PRUNED,
)


class EventKind(StrEnum):
    """Event kinds that orch's code reads back by name (the others are for people)."""

    STATE = "state"  # a status change; data `{"status": ...}`
    QUEUED = "queued"  # a job's first event when submitted queued (a sweep's: its params)
    PLANNED = "planned"  # ... and when recorded by a dry run
    REQUEUED = "requeued"
    CANCEL_REQUESTED = "cancel.requested"
    DELIVERED = "delivered"  # where each artifact went; data `{"places": [...]}`
    TRAIN_PROGRESS = "train.progress"
    # The first loss (or eval loss) of a job that was not a number; data `{metric, step,
    # value, reason, stops_after}` (and `webhook_id` when a `notify:` target was sent it).
    TRAIN_NOT_FINITE = "train.not_finite"
    # A spot machine's checkpoints as the trainer on it was given them (a takeover of the
    # same machine keeps them); data `{instance, save_steps, seconds, keep, ...}`.
    CHECKPOINT_INTERVAL = "checkpoint.interval"
    CHECKPOINT_MIRRORED = "checkpoint.mirrored"  # a checkpoint copied off the host; `step`
    INSTANCE_TERMINATED = "instance.terminated"
    INSTANCE_RELEASED = "instance.released"
    # What people wait for: each is a job event (persisted first, with its webhook id) and
    # the `type` of the webhook sent for it (`engine/notifications.py`, docs/integrations.md).
    JOB_SUCCEEDED = "job.succeeded"
    JOB_FAILED = "job.failed"
    JOB_PREEMPTED = "job.preempted"
    JOB_REPLACED = "job.replaced"
    JOB_BUDGET_REACHED = "job.budget_reached"
    SWEEP_FINISHED = "sweep.finished"
    NOTIFY_FAILED = "notify.failed"  # a webhook that did not get through; `orch show` lists it
    NOTIFY_SENT = "notify.sent"  # a webhook delivered (a takeover re-sends what has neither)
    TRACKER = "tracker"  # where the run is logged (W&B, MLflow); data `{"url": ...}`
    HOST_CHECKED = "host.checked"  # the pre-flight host check's report; data: its JSON
    PRUNED = "pruned"  # the job's end by early stopping; data `{rung, resource, step, ...}`
    # The deadline contract (engine/deadlines.py, docs/deadline.md): each decision of the
    # policy, a move of the job spot -> on-demand, and the first sign it will miss.
    DEADLINE_DECISION = "deadline.decision"
    DEADLINE_MOVE = "deadline.move"
    DEADLINE_WILL_MISS = "deadline.will_miss"


# The event kinds webhooks are sent for, in the order the docs list them (a `notify:` target's
# `events` names some of them); a later kind (a deadline at risk, say) joins here.
NOTIFIED: tuple[EventKind, ...] = (
    EventKind.JOB_SUCCEEDED, EventKind.JOB_FAILED, EventKind.JOB_PREEMPTED,
    EventKind.JOB_REPLACED, EventKind.JOB_BUDGET_REACHED, EventKind.SWEEP_FINISHED,
    EventKind.DEADLINE_WILL_MISS, EventKind.TRAIN_NOT_FINITE,
)


__all__ = [
    "NOTIFIED", "SWEEP_COUNTED", "WARM_OWNING", "EndReason", "EventKind", "Outcome", "RowState",
    "RungDecision", "ServerStatus", "StopKind", "SweepRunState", "WarmState",
]
