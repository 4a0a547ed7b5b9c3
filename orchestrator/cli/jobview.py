"""How a job looks on a terminal: the live progress line, its summary, the loss curve and an
event's line (`orch submit`, `orch show`, `orch logs`)."""

from __future__ import annotations

import json
import sys
import time
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from orchestrator.engine.runner import Progress
    from orchestrator.records.store import Job, Store


class Display:
    """One live status line on a terminal, redrawn in place; a line per state change otherwise.

    The line is cut to the terminal's width (read at every redraw, so a resized window is
    followed): a line that wrapped could not be redrawn with `\r`, and each refresh would
    leave a cut-off line behind.
    """

    def __init__(self, stream: Any = sys.stderr) -> None:
        from orchestrator.cli.term import colour_enabled, is_tty

        self.stream = stream
        self.tty = is_tty(stream)
        self.colour = colour_enabled(stream)
        self.last: tuple[str, str] | None = None
        self.drawn = False

    def __call__(self, p: Progress) -> None:
        from orchestrator.cli.term import paint, state_colour, width
        from orchestrator.core.money import usd

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
        "created_at": iso(job.created_at), "finished_at": iso(job.finished_at),
    }


def delivered(store: Store, job_id: str) -> list[dict[str, str]]:
    """Where each artifact of the job is (the last `delivered` event: what, where, location)."""
    import json

    for event in reversed(store.events(job_id)):
        if event.kind == "delivered":
            places: list[dict[str, str]] = json.loads(event.data_json or "{}").get("places") or []
            return places
    return []


def iso(value: Any) -> str | None:
    from orchestrator.cli.term import iso_utc

    return iso_utc(value)


def print_summary(s: dict[str, Any]) -> None:
    from orchestrator.cli.term import colour_enabled, paint, prose, state_colour
    from orchestrator.core.money import usd

    status = paint(s["status"], state_colour(s["status"]), colour_enabled())
    lines = [f"{s['job_id']}  {s['name']}  {status}"]
    if s["failure_reason"]:
        lines.append(f"  reason: {s['failure_reason']}")
    lines.append(f"  ran on: {s['provider']} {s['gpu']} x{s['gpu_count']} "
                 f"({_kind(s)}); attempts {s['attempts']}"
                 + (f", {s['interruptions']} interruption(s), {s['lost_steps']} steps redone"
                    if s["interruptions"] else ""))
    if s["metrics"]:
        lines.append("  eval: " + ", ".join(f"{k}={v:g}" for k, v in sorted(s["metrics"].items())))
    cost = f"  cost: {usd(s['cost'])}"
    if Decimal(s["storage_cost"]) >= Decimal("0.0001"):
        cost += f" (volume {usd(s['storage_cost'])})"
    if Decimal(s["amortised_rent"]) > 0:
        cost += f"; monthly rent share {usd(s['amortised_rent'])} (already paid)"
    if s["est_cost"] is not None:
        cost += f"; estimated {usd(s['est_cost'])}"
    lines.append(cost)
    if s["delivered"]:
        lines += [f"  {p['what']}: {p['location']}" for p in s["delivered"]]
    elif s["artifacts_dir"]:
        lines.append(f"  artifacts: {s['artifacts_dir']}")
    typer.echo("\n".join(prose(line, "    ") for line in lines))


def _kind(s: dict[str, Any]) -> str:
    if s["provider"] == "dedicated":
        return "registered server"
    return "spot" if s["interruptible"] else "on-demand"


def loss_curve(metrics: list[Any], columns: int) -> str:
    """The training loss as a sparkline that fits `columns`, with its first, last and min."""
    from orchestrator.cli.term import sparkline

    by_step = {m.step: m.value for m in metrics if m.name == "train.loss" and m.step is not None}
    if len(by_step) < 2:
        return ""
    steps = sorted(by_step)
    values = [by_step[k] for k in steps]
    head = (f"  train loss: {values[0]:.4g} -> {values[-1]:.4g} (min {min(values):.4g}), "
            f"steps {steps[0]}-{steps[-1]}")
    return f"{head}\n  {sparkline(values, max(8, columns - 2))}"


def event_line(event: Any) -> str:
    """An event's message; a state change says which state it entered."""
    if event.kind != "state":
        return str(event.message)
    status = json.loads(event.data_json or "{}").get("status", "")
    message = str(event.message)
    return message if not status or message.startswith(status) else f"{status}: {message}"
