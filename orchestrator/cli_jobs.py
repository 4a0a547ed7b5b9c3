"""`orch submit`, `orch worker`, `orch show`, `orch logs`, `orch cancel`: the engine's commands.

Registered on the Typer app by `orchestrator.cli`; heavy modules (database, SSH, HTTP) are
imported inside each command.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from orchestrator.engine import Options, Progress
    from orchestrator.store import Job, Store

JsonFlag = Annotated[bool, typer.Option("--json", help="Print one JSON object for scripts.")]
EXIT_FAILED = 1
EXIT_CANCELLED = 130


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        typer.echo(f"error: {name}={raw!r}: give a number of seconds", err=True)
        raise typer.Exit(2) from None
    if value <= 0:
        typer.echo(f"error: {name} must be > 0 (got {raw})", err=True)
        raise typer.Exit(2)
    return value


def engine_options(quick: bool = False) -> Options:
    """Engine timing: the defaults, quicker for the simulated cloud, ORCH_*_S overrides."""
    from orchestrator.engine import Options
    from orchestrator.watchdog import deadlines_from_env

    base = Options(poll_s=0.5, watch_s=0.5, lease_s=15.0) if quick else Options()
    try:
        stall_s = deadlines_from_env()  # ORCH_STALL_<PHASE>_S
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    return Options(stall_s=stall_s, poll_s=_env_float("ORCH_POLL_S", base.poll_s),
                   watch_s=_env_float("ORCH_WATCH_S", base.watch_s),
                   lease_s=_env_float("ORCH_LEASE_S", base.lease_s),
                   boot_deadline_s=_env_float("ORCH_BOOT_DEADLINE_S", base.boot_deadline_s),
                   connect_deadline_s=base.connect_deadline_s,
                   max_placements=base.max_placements, max_attempts=base.max_attempts)


def _sim_only(job: Job) -> bool:
    spec = json.loads(job.spec_json)
    named = (spec.get("resources") or {}).get("providers") or []
    return bool(named) and set(named) == {"sim"}


class _Display:
    """One live status line on a terminal, redrawn in place; a line per state change otherwise.

    The line is cut to the terminal's width (read at every redraw, so a resized window is
    followed): a line that wrapped could not be redrawn with `\r`, and each refresh would
    leave a cut-off line behind.
    """

    def __init__(self, stream: Any = sys.stderr) -> None:
        from orchestrator.term import colour_enabled, is_tty

        self.stream = stream
        self.tty = is_tty(stream)
        self.colour = colour_enabled(stream)
        self.last: tuple[str, str] | None = None
        self.drawn = False

    def __call__(self, p: Progress) -> None:
        from orchestrator.pricing import usd
        from orchestrator.term import paint, state_colour, width

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


def _on_sigterm(_signum: int, _frame: Any) -> None:
    from orchestrator.engine import Terminated

    # Second signal while tearing down: ignore it, teardown must finish.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Terminated()


def _providers(store: Store) -> tuple[dict[str, Any], list[str]]:
    from orchestrator.wiring import configured_providers

    try:
        return configured_providers(store, sim=True)
    except ValueError as exc:  # a malformed ORCH_SIM_* variable
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


def _summary(store: Store, job: Job) -> dict[str, Any]:
    from orchestrator.store import from_micros

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
        "created_at": _iso(job.created_at), "finished_at": _iso(job.finished_at),
    }


def _iso(value: Any) -> str | None:
    from orchestrator.term import iso_utc

    return iso_utc(value)


def _print_summary(s: dict[str, Any]) -> None:
    from orchestrator.pricing import usd
    from orchestrator.term import colour_enabled, paint, prose, state_colour

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
    if s["artifacts_dir"]:
        lines.append(f"  artifacts: {s['artifacts_dir']}")
    typer.echo("\n".join(prose(line, "    ") for line in lines))


def _kind(s: dict[str, Any]) -> str:
    if s["provider"] == "dedicated":
        return "registered server"
    return "spot" if s["interruptible"] else "on-demand"


def _exit_code(job: Job) -> int:
    return {"succeeded": 0, "cancelled": EXIT_CANCELLED}.get(job.status, EXIT_FAILED)


def register(app: typer.Typer) -> None:
    """Add the engine's commands to `app`."""

    @app.command()
    def submit(
        file: Annotated[Path, typer.Argument(help="The job file (job.yml).")],
        detach: Annotated[bool, typer.Option("--detach", "-d", help="Queue it for `orch "
                                             "worker` and return at once.")] = False,
        dry_run: Annotated[bool, typer.Option("--dry-run", help="Plan and record the job as "
                                              "'planned'; start nothing.")] = False,
        json_out: JsonFlag = False,
    ) -> None:
        """Plan a job and run it in the foreground with live progress (or --detach)."""
        from orchestrator import cli
        from orchestrator.scheduler import NoFit
        from orchestrator.submission import record_job

        loaded = cli._load(file)
        store = cli._store()
        status = "planned" if dry_run else "queued"
        # Checked before anything is recorded, in every mode: a job nothing here can run is
        # neither queued for a worker to fail nor planned as if it could run.
        require_runners(store, file, [loaded.spec.resources.providers])
        if not (dry_run or detach):
            providers, notes = _providers(store)
        try:
            row, plan = record_job(store, loaded, status=status,
                                   message="dry run: nothing started" if dry_run else None)
        except NoFit as exc:
            cli._fail(f"{file}: {exc}", cli.EXIT_NO_FIT)
        p = plan.chosen
        placement = plan.to_dict(alternatives=10_000)
        head = (f"{row.id}  {status}  {p.offer.provider} {p.offer.gpu} x{p.offer.gpu_count}"
                f"  est. {p.est_hours:.2f} h  {cli._money(p.est_cost)}")
        if dry_run or detach:
            if json_out:
                cli._print_json({"job_id": row.id, "status": row.status, **placement})
            else:
                tail = ("(dry run: nothing started)" if dry_run
                        else "(queued: `orch worker` runs it; follow with `orch logs "
                        f"{row.id} -f`)")
                typer.echo(f"{head}  {tail}")
            return
        if not json_out:
            typer.echo(head)
        from orchestrator.engine import JobRunner, owner_id

        owner = owner_id("submit")
        opts = engine_options(quick=_sim_only(row))
        if store.claim_job(row.id, owner, opts.lease_s) is None:
            cli._fail(f"{row.id} was taken by a worker; follow it with `orch logs {row.id} -f`")
        for note in notes:
            store.add_event(row.id, "providers.note", note)
        display = _Display()
        runner = JobRunner(store, providers, owner, opts,
                           on_progress=None if json_out else display, on_signal="cancel")
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
        try:
            job = runner.run(row.id)
        except KeyboardInterrupt:
            display.close()
            job = store.get_job(row.id)
            typer.echo(f"interrupted: {row.id} {job.status}; its instances were torn down",
                       err=True)
            raise typer.Exit(EXIT_CANCELLED) from None
        except BaseException as exc:
            from orchestrator.engine import Terminated

            if isinstance(exc, Terminated):
                display.close()
                typer.echo(f"terminated: {row.id} {store.get_job(row.id).status}; its "
                           "instances were torn down", err=True)
                raise typer.Exit(143) from None
            raise
        finally:
            signal.signal(signal.SIGTERM, previous)
        display.close()
        summary = _summary(store, job)
        if json_out:
            cli._print_json(summary)
        else:
            _print_summary(summary)
        raise typer.Exit(_exit_code(job))

    @app.command()
    def worker(
        once: Annotated[bool, typer.Option("--once", help="Run queued jobs until the queue "
                                           "is empty, then exit.")] = False,
        max_jobs: Annotated[int, typer.Option(help="Exit after this many jobs (0 = no "
                                              "limit).")] = 0,
        poll: Annotated[float, typer.Option(help="Seconds between queue checks.")] = 2.0,
        quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Only errors.")] = False,
    ) -> None:
        """Run queued jobs, one at a time, until stopped (several workers may run at once).

        Each job is claimed with a lease the worker renews; a worker that dies loses its
        lease and the job is resumed by another worker (or after `orch reconcile`).
        SIGTERM/Ctrl-C: the current job's instances are torn down and it is requeued.
        A job requeued because its providers were unavailable waits out its backoff
        (`not_before`); --once does not wait for it.
        """
        from orchestrator import cli
        from orchestrator.engine import JobRunner, owner_id

        if not 0 < poll < 86_400:  # also refuses nan, which time.sleep would raise on
            cli._fail(f"--poll must be > 0 and < 86400 seconds (got {poll})", 2)
        store = cli._store()
        owner = owner_id("worker")
        providers, notes = _providers(store)
        if not quiet:
            typer.echo(f"worker {owner}: providers {', '.join(sorted(providers))}", err=True)
            for note in notes:
                typer.echo(f"note: {note}", err=True)
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
        done = 0
        try:
            while True:
                for stale in store.expired_leases():
                    store.requeue(stale.id, f"worker {stale.lease_owner} lost its lease while "
                                  f"the job was {stale.status}; {owner} resumes it")
                quick_job = _next_is_sim(store)
                opts = engine_options(quick=quick_job)
                job = store.claim_next(owner, opts.lease_s)
                if job is None:
                    if once:
                        break
                    time.sleep(poll)
                    continue
                if not quiet:
                    typer.echo(f"{job.id} {job.name}: started", err=True)
                finished = JobRunner(store, providers, owner, engine_options(_sim_only(job)),
                                     on_signal="requeue").run(job.id)
                if not quiet:
                    typer.echo(f"{finished.id} {finished.name}: {finished.status}"
                               + (f" ({finished.failure_reason.splitlines()[0]})"
                                  if finished.failure_reason else ""), err=True)
                done += 1
                if max_jobs and done >= max_jobs:
                    break
        except KeyboardInterrupt:
            typer.echo("worker stopped (Ctrl-C); the current job was requeued", err=True)
            raise typer.Exit(EXIT_CANCELLED) from None
        except BaseException as exc:
            from orchestrator.engine import Terminated

            if isinstance(exc, Terminated):
                typer.echo("worker stopped (SIGTERM); the current job was requeued", err=True)
                raise typer.Exit(143) from None
            raise
        finally:
            signal.signal(signal.SIGTERM, previous)

    @app.command()
    def show(
        job_id: Annotated[str, typer.Argument(help="The job id (j-...).")],
        json_out: JsonFlag = False,
        events: Annotated[int, typer.Option(help="How many of the newest events.")] = 25,
    ) -> None:
        """A job's state, attempts, instances, costs, metrics, events and ranked placements."""
        from orchestrator import cli
        from orchestrator.engine import instance_cost
        from orchestrator.pricing import usd
        from orchestrator.render import table
        from orchestrator.store import NotFoundError, utcnow
        from orchestrator.term import human_time, prose

        store = cli._store()
        try:
            job = store.get_job(job_id)
        except NotFoundError as exc:
            cli._fail(str(exc), cli.EXIT_NOT_FOUND)
        summary = _summary(store, job)
        now = utcnow()
        instances = []
        rows = store.instances_of(job.id)
        for r in rows:
            charged, amortised = instance_cost(r, now)
            instances.append({
                "provider": r.provider, "instance_id": r.provider_instance_id, "gpu": r.gpu,
                "gpu_count": r.gpu_count, "interruptible": r.interruptible,
                "price_per_hour": str(r.price_per_hour_micros / 1_000_000),
                "attempt": r.attempt, "state": r.state, "end_reason": r.end_reason,
                "created_at": _iso(r.created_at), "terminated_at": _iso(r.terminated_at),
                "cost": str(charged), "amortised": str(amortised)})
        placement = json.loads(job.placement_json or "{}")
        ranked = [placement.get("placement"), *placement.get("alternatives", [])]
        ranked = [p for p in ranked if p]
        evs = store.events(job.id)
        if json_out:
            cli._print_json({**summary, "instances": instances, "placements": ranked,
                             "events": [{"at": _iso(e.at), "kind": e.kind,
                                         "message": e.message} for e in evs],
                             "metrics_all": [{"name": m.name, "value": m.value, "step": m.step}
                                             for m in store.metrics(job.id)]})
            return
        _print_summary(summary)
        from orchestrator.term import width

        curve = loss_curve(store.metrics(job.id), width() - 2)
        if curve:
            typer.echo(curve)
        if instances:
            typer.echo("\nInstances:")
            typer.echo(table(["#", "provider", "instance", "GPU", "spot", "$/h", "created",
                              "ended", "why", "cost"],
                             [[i["attempt"], i["provider"], i["instance_id"] or "-",
                               f"{i['gpu']} x{i['gpu_count']}",
                               "yes" if i["interruptible"] else "no",
                               usd(i["price_per_hour"]), human_time(r.created_at),
                               human_time(r.terminated_at) if r.terminated_at else "running",
                               i["end_reason"] or "-", usd(i["cost"])]
                              for i, r in zip(instances, rows, strict=True)],
                             right=[5, 9], drop=[2, 4, 5, 7, 8, 6]))
        if ranked:
            typer.echo("\nPlacements ranked at submit (cheapest first):")
            typer.echo(table(["#", "provider", "GPU", "n", "spot", "est. h", "est. cost"],
                             [[n, p["provider"], p["gpu"], p["gpu_count"],
                               "yes" if p["interruptible"] else "no", f"{p['est_hours']:.2f}",
                               usd(p["est_cost"])] for n, p in enumerate(ranked[:8], 1)],
                             right=[0, 3, 5, 6], drop=[5, 4]))
            if len(ranked) > 8:
                typer.echo(f"  ... {len(ranked) - 8} more (--json)")
        typer.echo("\n" + prose(f"Events (newest {min(events, len(evs))} of {len(evs)}; "
                                f"all with `orch logs {job.id}`):"))
        typer.echo(table(["at", "kind", "message"],
                         [[human_time(e.at), e.kind, _line(e)] for e in evs[-events:]],
                         drop=[1]))

    @app.command()
    def logs(
        job_id: Annotated[str, typer.Argument(help="The job id (j-...).")],
        follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new lines "
                                             "until the job finishes.")] = False,
        train: Annotated[bool, typer.Option("--train", help="The trainer's own output "
                                            "(kept after the instance is gone) instead of "
                                            "orch's events.")] = False,
        json_out: Annotated[bool, typer.Option("--json", help="One JSON object per line.")]
        = False,
    ) -> None:
        """A job's events, oldest first (`-f` follows a running job; `--train` the trainer)."""
        from orchestrator import cli
        from orchestrator.store import FINAL_STATUSES, NotFoundError
        from orchestrator.term import human_time

        store = cli._store()
        try:
            store.get_job(job_id)
        except NotFoundError as exc:
            cli._fail(str(exc), cli.EXIT_NOT_FOUND)
        if train:
            _train_logs(store, job_id, follow, json_out)
            return

        def print_event(e: Any) -> None:
            if json_out:
                typer.echo(json.dumps({"id": e.id, "at": _iso(e.at), "kind": e.kind,
                                       "message": e.message,
                                       "data": json.loads(e.data_json or "null")}))
            else:
                typer.echo(f"{human_time(e.at)}  {e.kind:<20} {_line(e)}")

        last = 0
        while True:
            for e in store.events_after(job_id, last):
                last = e.id or last
                print_event(e)
            if not follow or store.get_job(job_id).status in FINAL_STATUSES:
                # One more read: events written with the final state.
                if follow:
                    for e in store.events_after(job_id, last):
                        print_event(e)
                return
            time.sleep(0.5)

    @app.command()
    def cancel(
        job_id: Annotated[str, typer.Argument(help="The job id (j-...).")],
        wait: Annotated[float, typer.Option(help="Seconds to wait for the teardown.")] = 120.0,
        json_out: JsonFlag = False,
    ) -> None:
        """Stop a job: its worker terminates the instance and marks it cancelled."""
        from orchestrator import cli
        from orchestrator.store import FINAL_STATUSES, NotFoundError

        store = cli._store()
        try:
            before = store.get_job(job_id).status
            job = store.request_cancel(job_id)
        except NotFoundError as exc:
            cli._fail(str(exc), cli.EXIT_NOT_FOUND)
        if before in FINAL_STATUSES:
            if json_out:
                cli._print_json({"job_id": job_id, "status": before, "instances_left": []})
            else:
                typer.echo(f"{job_id}: already {before}; nothing to cancel")
            return
        deadline = time.monotonic() + max(0.0, wait)
        while job.status not in FINAL_STATUSES:
            if _orphaned(job):
                _cancel_orphan(store, job)
            if time.monotonic() > deadline:
                break
            time.sleep(0.3)
            job = store.get_job(job_id)
        left = [r for r in store.instances_of(job_id) if r.terminated_at is None]
        if left and job.status == "cancelled" and _orphaned(job):
            # A requeued job no worker has adopted yet still holds its instance: nobody
            # else will tear it down.
            from orchestrator.recovery import teardown_open

            teardown_open(store, _providers(store)[0], job_id, "cancelled")
            left = [r for r in store.instances_of(job_id) if r.terminated_at is None]
        if json_out:
            cli._print_json({"job_id": job_id, "status": job.status,
                             "instances_left": [r.provider_instance_id for r in left]})
        else:
            typer.echo(f"{job_id}: {job.status}" + (
                f"; {len(left)} instance(s) not yet terminated, run `orch reconcile`"
                if left else ""))
        if job.status != "cancelled" and job.status not in FINAL_STATUSES:
            raise typer.Exit(EXIT_FAILED)


def require_runners(store: Store, file: Path, named: list[list[str] | None]) -> None:
    """Exit 3, recording nothing, unless a configured provider could run each of the jobs
    whose `resources.providers` are `named`: the check every path that queues work makes."""
    from orchestrator import cli
    from orchestrator.runnable import runners

    has_servers = bool(store.registered())
    for providers in dict.fromkeys(None if n is None else tuple(n) for n in named):
        found = runners(None if providers is None else list(providers), has_servers)
        if not found:
            cli._fail(found.problem(file), cli.EXIT_NO_FIT)


def _train_logs(store: Store, job_id: str, follow: bool, json_out: bool) -> None:
    """Print the kept training output; with `follow`, new lines until the job ends."""
    from orchestrator import trainlog
    from orchestrator.store import FINAL_STATUSES

    shown: list[str] = []

    def emit() -> None:
        lines = trainlog.read(job_id) or []
        for line in trainlog.merge(shown, lines):
            typer.echo(json.dumps({"job_id": job_id, "line": line}) if json_out else line)
        shown[:] = lines

    emit()
    if not follow:
        if trainlog.read(job_id) is None:
            status = store.get_job(job_id).status
            typer.echo(f"{job_id} ({status}): no training output recorded here; it is kept by "
                       "the orch process that ran the job (`orch submit` or `orch worker`), "
                       f"under {trainlog.log_path(job_id).parent}", err=True)
        return
    while store.get_job(job_id).status not in FINAL_STATUSES:
        time.sleep(0.5)
        emit()
    emit()


def loss_curve(metrics: list[Any], columns: int) -> str:
    """The training loss as a sparkline that fits `columns`, with its first, last and min."""
    from orchestrator.term import sparkline

    by_step = {m.step: m.value for m in metrics if m.name == "train.loss" and m.step is not None}
    if len(by_step) < 2:
        return ""
    steps = sorted(by_step)
    values = [by_step[k] for k in steps]
    head = (f"  train loss: {values[0]:.4g} -> {values[-1]:.4g} (min {min(values):.4g}), "
            f"steps {steps[0]}-{steps[-1]}")
    return f"{head}\n  {sparkline(values, max(8, columns - 2))}"


def _line(event: Any) -> str:
    """An event's message; a state change says which state it entered."""
    if event.kind != "state":
        return str(event.message)
    status = json.loads(event.data_json or "{}").get("status", "")
    message = str(event.message)
    return message if not status or message.startswith(status) else f"{status}: {message}"


def _next_is_sim(store: Store) -> bool:
    queued = store.list_jobs(limit=1, status="queued")
    return bool(queued) and _sim_only(queued[0])


def _orphaned(job: Job) -> bool:
    from orchestrator.store import utcnow

    return job.lease_expires_at is None or job.lease_expires_at < utcnow()


def _cancel_orphan(store: Store, job: Job) -> None:
    """No live worker holds the job: terminate its instances here and mark it cancelled."""
    from orchestrator.recovery import teardown_open

    teardown_open(store, _providers(store)[0], job.id, "cancelled")
    store.cancel_orphan(job.id, "cancelled; no worker held it, so `orch cancel` tore it down")
