"""How a job looks on a terminal: the live progress line, its summary, the loss curve and an
event's line (`orch submit`, `orch show`, `orch logs`)."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any, TextIO

import typer

from orchestrator.cli import integrationview, jobdeadline
from orchestrator.cli.term import (
    colour_enabled,
    human_duration,
    iso_utc,
    paint,
    prose,
    sparkline,
    state_colour,
)
from orchestrator.core.jobstatus import lease_state
from orchestrator.core.money import hours_between, usd
from orchestrator.core.states import EventKind

if TYPE_CHECKING:
    from orchestrator.engine.runner import Progress
    from orchestrator.records.store import Event, Instance, Job, Metric, Store


class Display:
    """One live status line on a terminal, redrawn in place; a line per state change otherwise.

    The line is cut to the terminal's width (read at every redraw, so a resized window is
    followed): a line that wrapped could not be redrawn with `\r`, and each refresh would
    leave a cut-off line behind.
    """

    def __init__(self, stream: TextIO = sys.stderr) -> None:
        from orchestrator.cli.term import colour_enabled, is_tty

        self.stream = stream
        self.tty = is_tty(stream)
        self.colour = colour_enabled(stream)
        self.last: tuple[str, str] | None = None
        self.drawn = False

    def __call__(self, p: Progress) -> None:
        from orchestrator.cli.term import paint, state_colour, width
        elapsed = time.monotonic() - p.started
        step = f" step {p.step}/{p.total}" if p.step is not None else ""
        loss = f" loss {p.loss:.4f}" if p.loss is not None else ""
        retry = f" (attempt {p.attempt + 1})" if p.attempt else ""
        head = f"{p.status}{retry}{step}{loss}  {elapsed:5.0f}s  {usd(p.cost)}"
        if self.tty:
            # One column spare: writing the last column makes some terminals wrap.
            line = f"{head}  {p.message}"[: max(1, width(self.stream) - 1)]
            status = p.status[: len(line)]
            line = paint(status, state_colour(p.status), self.colour) + line[len(status):]
            # \r to the line's start, the new text, then erase what is left of the old one.
            self.stream.write(f"\r{line}\x1b[K")
            self.drawn = True
            self.stream.flush()
        elif self.last != (p.status, p.message):
            self.stream.write(f"[{elapsed:6.1f}s] {p.status}{retry}: {p.message}\n")
            self.stream.flush()
        self.last = (p.status, p.message)

    def close(self) -> None:
        if self.tty and self.drawn:
            self.stream.write("\n")
            self.stream.flush()
            self.drawn = False


def job_summary(store: Store, job: Job) -> dict[str, Any]:
    from orchestrator.records.store import from_micros

    metrics = {m.name: m.value for m in store.metrics(job.id) if m.step is None}
    return {
        "job_id": job.id, "name": job.name, "status": job.status,
        "failure_reason": job.failure_reason, "provider": job.provider, "gpu": job.gpu,
        "gpu_count": job.gpu_count, "interruptible": job.interruptible,
        "attempts": job.attempt + 1, "interruptions": job.interruptions,
        "lost_steps": job.lost_steps, "metrics": metrics,
        "cost": str(from_micros(job.cost_micros)),
        "storage_cost": str(from_micros(job.storage_micros)),
        "amortised_rent": str(from_micros(job.amortised_micros)),
        "est_cost": None if job.est_cost_micros is None else str(from_micros(job.est_cost_micros)),
        "artifacts_dir": job.artifacts_dir,
        "delivered": delivered(store, job.id),
        "kept_warm": kept_warm(store, job.id),
        "created_at": iso(job.created_at), "finished_at": iso(job.finished_at),
        **time_summary(job, store.instances_of(job.id)),
        "trackers": integrationview.trackers(job),
        "notify_failed": integrationview.notify_failures(store.events(job.id)),
    }


def kept_warm(store: Store, job_id: str) -> dict[str, Any] | None:
    """The window the job kept its machine warm for the next job (docs/warm.md), if any."""
    for w in store.warm_instances():
        if w.parked_by_job == job_id:
            return {"warm_id": w.id, "instance_id": w.provider_instance_id, "state": w.state,
                    "expires_at": iso(w.expires_at), "taken_by": w.taken_by_job}
    return None


def delivered(store: Store, job_id: str) -> list[dict[str, str]]:
    """Where each artifact of the job is (the last `delivered` event: what, where, location)."""
    for event in reversed(store.events(job_id)):
        if event.kind == EventKind.DELIVERED:
            return [p.as_stored() for p in event.data().places or ()]
    return []


def time_summary(job: Job, instances: list[Instance]) -> dict[str, Any]:
    """Estimated and actual hours: billed (every instance, create to terminate) and training.

    The estimates are what the planner priced at submit (`est_hours`, and the training part
    from the recorded placement); the actual figures come from the instance rows and the
    trainer's own tokens and seconds. Hours are floats: they are not money.
    """
    from orchestrator.records.store import utcnow

    now = utcnow()
    billed = (float(sum(hours_between(r.created_at, r.terminated_at or now) for r in instances))
              if instances else None)
    placed = job.placement().placement
    train_s = job.train_seconds
    return {
        "est_hours": job.est_hours, "hours": billed,
        "est_training_hours": None if placed is None else placed.est_training_hours,
        "training_hours": None if train_s is None else train_s / 3600,
        "tokens_per_s": job.tokens / train_s if job.tokens and train_s else None,
        "throughput_source": None if placed is None else placed.throughput_source,
    }


def _versus(actual: float | Decimal, estimate: float | Decimal,
            show: Callable[[Any], str]) -> str:
    """`estimated E, +N %`: the estimate, and how far what happened was from it."""
    off = f", {float(actual) / float(estimate) - 1:+.0%}" if float(estimate) > 0 else ""
    return f"estimated {show(estimate)}{off}"


def _hours(x: float) -> str:
    """Hours for people: `1.25 h`, `5.2 min`, `12 s`."""
    if x >= 0.1:
        return f"{x:.2f} h"
    return f"{x * 60:.1f} min" if x * 60 >= 1 else f"{x * 3600:.0f} s"


def iso(value: datetime | None) -> str | None:
    """A stored time as scripts read it (`term.iso_utc`)."""
    return iso_utc(value)


def print_summary(s: dict[str, Any]) -> None:
    status = paint(s["status"], state_colour(s["status"]), colour_enabled())
    lines = [f"{s['job_id']}  {s['name']}  {status}"]
    if s["failure_reason"]:
        lines.append(f"  reason: {s['failure_reason']}")
    lines.append(f"  ran on: {s['provider']} {s['gpu']} x{s['gpu_count']} "
                 f"({_kind(s)}); attempts {s['attempts']}"
                 + (f", {s['interruptions']} interruption(s), {s['lost_steps']} steps redone"
                    if s["interruptions"] else ""))
    if s["metrics"]:
        # None: the metric was not a number (a diverged run's `nan` eval loss).
        lines.append("  eval: " + ", ".join(f"{k}={'nan' if v is None else format(v, 'g')}"
                                            for k, v in sorted(s["metrics"].items())))
    cost = f"  cost: {usd(s['cost'])}"
    if Decimal(s["storage_cost"]) >= Decimal("0.0001"):
        cost += f" (volume {usd(s['storage_cost'])})"
    if Decimal(s["amortised_rent"]) > 0:
        cost += f"; monthly rent share {usd(s['amortised_rent'])} (already paid)"
    if s["est_cost"] is not None:
        cost += "; " + _versus(Decimal(s["cost"]), Decimal(s["est_cost"]), usd)
    lines.append(cost)
    if s["hours"] is not None:
        lines.append(_time_line(s))
    if s.get("deadline") is not None:  # `orch show` only
        lines.append(jobdeadline.line(s["deadline"], s["job_id"], s["status"]))
    # The artifacts directory, then what went elsewhere (a merged model's folder, the Hub).
    if s["artifacts_dir"]:
        lines.append(f"  artifacts: {s['artifacts_dir']}")
    lines += [f"  {p['what']}: {p['location']}" for p in s["delivered"]
              if p["location"] != s["artifacts_dir"]]
    warm = s["kept_warm"]
    if warm is not None and warm["state"] == "parked":
        lines.append(f"  kept warm: {warm['instance_id']} until {warm['expires_at']} for the "
                     "next job that fits it (billed while idle; `orch warm release "
                     f"{warm['warm_id']}` ends it now)")
    lines += integrationview.lines(s["trackers"], s["notify_failed"])
    typer.echo("\n".join(prose(line, "    ") for line in lines))


def _time_line(s: dict[str, Any]) -> str:
    """`  time: 0.21 h billed (estimated 0.25 h, -16 %); training 7.2 min at 2,950 tokens/s
    (estimated 9.0 min)`."""
    line = f"  time: {_hours(s['hours'])} billed"
    if s["est_hours"] is not None:
        line += f" ({_versus(s['hours'], s['est_hours'], _hours)})"
    if s["training_hours"] is not None:
        line += f"; training {_hours(s['training_hours'])}"
        if s["tokens_per_s"]:
            line += f" at {s['tokens_per_s']:,.0f} tokens/s"
        if s["est_training_hours"] is not None:
            line += f" ({_versus(s['training_hours'], s['est_training_hours'], _hours)})"
    return line


def _kind(s: dict[str, Any]) -> str:
    if s["provider"] == "dedicated":
        return "registered server"
    return "spot" if s["interruptible"] else "on-demand"


def loss_curve(metrics: list[Metric], columns: int) -> str:
    """The training loss as a sparkline that fits `columns`, with its first, last and min."""
    from orchestrator.records.store import nan_if_null  # loaded already: `metrics` are rows

    by_step = {m.step: nan_if_null(m.value) for m in metrics
               if m.name == "train.loss" and m.step is not None}
    if len(by_step) < 2:
        return ""
    steps = sorted(by_step)
    values = [by_step[k] for k in steps]
    # A diverged run's `nan` steps are left out of the line and are not its minimum.
    numbers = [v for v in values if math.isfinite(v)]
    least = f"{min(numbers):.4g}" if numbers else "nan"
    head = (f"  train loss: {values[0]:.4g} -> {values[-1]:.4g} (min {least}), "
            f"steps {steps[0]}-{steps[-1]}")
    return f"{head}\n  {sparkline(values, max(8, columns - 2))}"


def event_line(event: Event) -> str:
    """An event's message; a state change says which state it entered."""
    if event.kind != EventKind.STATE:
        return str(event.message)
    status = event.data().status or ""
    message = str(event.message)
    return message if not status or message.startswith(status) else f"{status}: {message}"


def lease_cell(job: Job, now: datetime) -> str:
    """`orch jobs`' lease column: `14s left`, `lapsed 3m ago` (its worker stopped renewing
    it; another worker or `orch reconcile` takes the job over), or `-` (no worker holds it)."""
    state = lease_state(job.lease_owner, job.lease_expires_at, now)
    if state is None or job.lease_expires_at is None:
        return "-"
    expires = job.lease_expires_at
    expires = expires if expires.tzinfo else expires.replace(tzinfo=UTC)
    seconds = int(abs((expires - now).total_seconds()))
    if state == "held":
        return f"{human_duration(seconds)} left"
    return f"lapsed {human_duration(seconds)} ago"
