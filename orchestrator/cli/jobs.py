"""`orch submit`, `orch worker`, `orch show`, `orch logs`, `orch cancel`: the engine's commands.

Each command is a top-level function, added to the Typer app by `register(app)`; heavy
modules (database, SSH, HTTP) are imported inside each command.
"""


import json
import time
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from orchestrator.cli import jobdeadline
from orchestrator.cli import plan as cli_plan
from orchestrator.cli.common import (
    EXIT_CANCELLED,
    EXIT_FAILED,
    EXIT_NO_FIT,
    EXIT_NOT_FOUND,
    JsonFlag,
    configured_here,
    fail,
    load,
    money,
    open_db,
    print_json,
    problems_exit,
    require_runners,
)
from orchestrator.cli.jobview import (
    Display,
    event_line,
    iso,
    job_summary,
    loss_curve,
    print_summary,
)
from orchestrator.cli.stops import stops_delivered
from orchestrator.cli.tables import table
from orchestrator.cli.term import human_time, is_tty, width
from orchestrator.core.jobstatus import JobStatus
from orchestrator.core.money import usd
from orchestrator.core.paths import describe_db
from orchestrator.core.planning import make_plan
from orchestrator.core.scheduler import NoFit
from orchestrator.core.settings import settings
from orchestrator.core.states import EndReason
from orchestrator.engine import trainlog
from orchestrator.engine.recovery import teardown_open
from orchestrator.engine.submission import record_job
from orchestrator.engine.watchdog import deadlines
from orchestrator.engine.wiring import declares, price_lists
from orchestrator.records.readonly import measured_throughput
from orchestrator.records.store import (
    FINAL_STATUSES,
    DatabaseFull,
    NotFoundError,
    Sweep,
    utcnow,
)
from providers.base import Simulated

if TYPE_CHECKING:
    from orchestrator.core.planning import Plan
    from orchestrator.core.spec import LoadedJob
    from orchestrator.engine.market import Market
    from orchestrator.engine.runner import Options
    from orchestrator.engine.worker import Timings
    from orchestrator.records.store import Event, Instance, Job, Store


def engine_options(quick: bool = False) -> "Options":
    """Engine timing: the defaults, quicker for simulated providers, the ORCH_* settings."""
    from orchestrator.engine.runner import Options
    base = Options(poll_s=0.5, watch_s=0.5, lease_s=15.0) if quick else Options()
    s = settings()
    return Options(stall_s=deadlines(s), poll_s=s.poll_s or base.poll_s,
                   watch_s=s.watch_s or base.watch_s, lease_s=s.lease_s or base.lease_s,
                   boot_deadline_s=s.boot_deadline_s or base.boot_deadline_s,
                   connect_deadline_s=base.connect_deadline_s,
                   max_placements=base.max_placements, max_attempts=base.max_attempts)


def timings() -> "Timings":
    """The engine's options for normal and for simulated-only jobs (exit 2 on a bad
    ORCH_*_S value)."""
    from orchestrator.engine.worker import Timings

    return Timings(normal=engine_options(), quick=engine_options(quick=True))


def _exit_code(job: "Job") -> int:
    return {JobStatus.SUCCEEDED: 0, JobStatus.CANCELLED: EXIT_CANCELLED}.get(job.status,
                                                                            EXIT_FAILED)


JobIdArg = Annotated[str, typer.Argument(help="The job id (j-...).")]


def submit(
    file: Annotated[Path, typer.Argument(help="The job file (job.yml).")],
    detach: Annotated[bool, typer.Option("--detach", "-d", help="Queue it for `orch "
                                         "worker` and return at once.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Plan and record the job as "
                                          "'planned'; start nothing.")] = False,
    json_out: JsonFlag = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Rent without asking (asked only "
                                      "on a terminal, never with --json).")] = False,
    resume_from: Annotated[str | None, typer.Option(
        "--resume-from", metavar="JOB", help="Start from the checkpoint an ended job of the "
        "same training kept (its budget stopped it): plan and pay for the rest only.")] = None,
) -> None:
    """Plan a job and run it in the foreground with live progress (or --detach)."""
    loaded = load(file)
    store = open_db()
    resume = None
    if resume_from is not None:
        from orchestrator.engine import resumefrom

        try:
            resume = resumefrom.find(store, resume_from, loaded)
            loaded = resume.apply(loaded)
        except resumefrom.ResumeRefused as exc:
            fail(f"{file}: --resume-from {resume_from}: {exc}")
    status = JobStatus.PLANNED if dry_run else JobStatus.QUEUED
    # Checked before anything is recorded, in every mode: a job nothing here can run is
    # neither queued for a worker to fail nor planned as if it could run.
    require_runners(store, file, [loaded.spec.resources.providers])
    if not (dry_run or detach):
        _refuse_known_failures(file, loaded)
        providers, notes = configured_here(store)
    market = None if dry_run else cli_plan.live_market(loaded)
    if market is not None and market.answered:
        from orchestrator.records import prices

        prices.record(store, market.offers)  # price history (`orch prices`)
    try:
        live = list(market.offers) if market is not None and market.answered else None
        # The throughput orch measured on finished jobs, as `orch plan` estimates with: the
        # recorded estimate is what the deadline policy plans with before the job's first step.
        plan = make_plan(loaded, store.registered(),
                         cli_plan.without_db(measured_throughput) or {}, live=live,
                         listed=price_lists(loaded.spec.resources.providers))
        if not (dry_run or yes or json_out):
            confirm(plan, market)
        row, plan = record_job(store, loaded, status=status, plan=plan,
                               message="dry run: nothing started" if dry_run else None,
                               resume=resume)
    except NoFit as exc:
        held = "" if resume is None else (
            f" (held to {resume.job_id}'s checkpoint: {resume.describe_pins()}, which these "
            "settings cannot change)")
        fail(f"{file}: {exc}{held}", EXIT_NO_FIT)
    p = plan.chosen
    placement = plan.to_dict(alternatives=10_000)
    head = (f"{row.id}  {status}  {p.offer.provider} {p.offer.gpu} x{p.offer.gpu_count}"
            f"  est. {p.est_hours:.2f} h  {money(p.est_cost)}")
    if dry_run or detach:
        if json_out:
            print_json({"job_id": row.id, "status": row.status, **placement,
                         "resume_from": None if resume is None else resume.record()})
        else:
            tail = ("(dry run: nothing started)" if dry_run
                    else "(queued: `orch worker` runs it; follow with `orch logs "
                    f"{row.id} -f`)")
            typer.echo(f"{head}  {tail}")
            if resume is not None:
                typer.echo(f"  {resume.describe()}")
        return
    if not json_out:
        typer.echo(head)
        if resume is not None:
            typer.echo(f"  {resume.describe()}")
    _run_here(store, row, providers, notes, json_out)


def _refuse_known_failures(file: Path, loaded: "LoadedJob") -> None:
    """Exit 2 (nothing recorded) on what would fail the job before renting in this process:
    a Hub dataset refused, a tracker's key or a webhook's variable missing (issue 39)."""
    import os

    from orchestrator.engine.integrations import submit_problems

    chosen = settings()
    problems = submit_problems(loaded.spec, os.environ, chosen.notify_url,
                               chosen.notify_secret_env)
    if problems:
        problems_exit(file, [f"{file}: {p}" for p in problems])


def confirm(plan: "Plan", market: "Market | None") -> None:
    """On a terminal, show what will be rented and what it should cost, and ask (as `sky
    launch` does); not on a pipe, under cron or a worker. A simulated provider spends
    nothing and is not asked about. A "no" exits 1 with nothing recorded."""
    import sys

    o, p = plan.chosen.offer, plan.chosen
    if declares(o.provider, Simulated) or not (is_tty() and is_tty(sys.stdin)):
        return
    rate = (f"{money(o.price_per_hour)}/h" if o.price_per_hour is not None else
            f"{money(o.monthly_price)}/month" if o.monthly_price is not None else "no rate")
    kind = "registered server" if o.registered else "spot" if o.interruptible else "on-demand"
    typer.echo(f"Placement: {o.provider} {o.gpu} x{o.gpu_count} ({kind}) at {rate}; "
               f"est. {p.est_hours:.2f} h, {money(p.est_cost)} for the job")
    typer.echo(cli_plan.offers_line(market))
    if not typer.confirm("Rent it and run the job?", default=False):
        typer.echo("not submitted; nothing was recorded or rented", err=True)
        raise typer.Exit(1)


def _run_here(store: "Store", row: "Job", providers: dict[str, Any], notes: list[str],
              json_out: bool) -> NoReturn:
    """Run the just-recorded job in this process (`orch submit` without --detach) and exit
    with its outcome; Ctrl-C or SIGTERM tear its instances down first."""
    from orchestrator.engine.runner import JobRunner, owner_id

    owner = owner_id("submit")
    opts = timings().of(row, providers)
    if store.claim_job(row.id, owner, opts.lease_s) is None:
        fail(f"{row.id} was taken by a worker; follow it with `orch logs {row.id} -f`")
    for note in notes:
        store.add_event(row.id, "providers.note", note)
    display = Display()
    runner = JobRunner(store, providers, owner, opts,
                       on_progress=None if json_out else display, on_signal="cancel")
    with stops_delivered():
        try:
            job = runner.run(row.id)
        except KeyboardInterrupt:
            display.close()
            job = store.get_job(row.id)
            typer.echo(f"interrupted: {row.id} {job.status}; its instances were torn down",
                       err=True)
            raise typer.Exit(EXIT_CANCELLED) from None
        except BaseException as exc:
            from orchestrator.engine.runner import Terminated

            if isinstance(exc, Terminated):
                display.close()
                typer.echo(f"terminated: {row.id} {store.get_job(row.id).status}; its "
                           "instances were torn down", err=True)
                raise typer.Exit(143) from None
            raise
    display.close()
    summary = job_summary(store, job)
    if json_out:
        print_json(summary)
    else:
        print_summary(summary)
    raise typer.Exit(_exit_code(job))


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
    from orchestrator.engine.runner import owner_id
    from orchestrator.engine.worker import work

    if not 0 < poll < 86_400:  # also refuses nan, which time.sleep would raise on
        fail(f"--poll must be > 0 and < 86400 seconds (got {poll})", 2)
    if not 0 <= max_jobs <= 1_000_000_000:
        fail(f"--max-jobs must be 0 (no limit) to 1000000000 (got {max_jobs})", 2)
    store = open_db()
    owner = owner_id("worker")
    providers, notes = configured_here(store)
    # The handler first: a SIGTERM right after the banner is a stop like any other.
    with stops_delivered():
        current: list[str] = []  # the job being run, if any: what a stop has to say
        try:
            # The database is named even with --quiet: a worker idling on the wrong database
            # (an env file sourced without `export`) must say so in the journal at start.
            typer.echo(f"worker {owner}: database {describe_db()}"
                       + ("" if quiet else f"; providers {', '.join(sorted(providers))}"),
                       err=True)
            if not quiet:
                for note in notes:
                    typer.echo(f"note: {note}", err=True)
            work(store, providers, owner, timings(), once=once, max_jobs=max_jobs, poll=poll,
                 say=lambda line, always: typer.echo(line, err=True) if always or not quiet
                 else None, current=current)
        except DatabaseFull as exc:  # nothing can be recorded: stop, one line
            fail(f"worker stopped: {exc}", 1)
        except KeyboardInterrupt:
            typer.echo(f"worker stopped (Ctrl-C); {_stopped(current)}", err=True)
            raise typer.Exit(EXIT_CANCELLED) from None
        except BaseException as exc:
            from orchestrator.engine.runner import Terminated

            if isinstance(exc, Terminated):
                typer.echo(f"worker stopped (SIGTERM); {_stopped(current)}", err=True)
                raise typer.Exit(143) from None
            raise


def _stopped(current: list[str]) -> str:
    return (f"job {current[0]} was requeued to resume" if current
            else "it was idle: no job was running")


def _get_job(store: "Store", job_id: str) -> "Job":
    """The job, or exit 4 with the store's message."""
    try:
        return store.get_job(job_id)
    except NotFoundError as exc:
        fail(str(exc), EXIT_NOT_FOUND)


def show(
    job_id: JobIdArg,
    json_out: JsonFlag = False,
    events: Annotated[int, typer.Option(help="How many of the newest events.")] = 25,
) -> None:
    """A job's state, attempts, instances, costs, metrics, events and ranked placements."""
    from orchestrator.engine.runner import instance_cost
    if not 0 <= events <= 100_000:
        fail(f"--events must be 0 to 100000 (got {events})", 2)
    store = open_db()
    job = _get_job(store, job_id)
    summary = job_summary(store, job)
    now = utcnow()
    evs = store.events(job.id)
    summary["deadline"] = jobdeadline.summary(job, evs, now)
    instances = []
    rows = store.instances_of(job.id)
    for r in rows:
        charged, amortised = instance_cost(r, now)
        instances.append({
            "provider": r.provider, "instance_id": r.provider_instance_id, "gpu": r.gpu,
            "gpu_count": r.gpu_count, "interruptible": r.interruptible,
            "price_per_hour": str(r.price_per_hour_micros / 1_000_000),
            "attempt": r.attempt, "state": r.state, "end_reason": r.end_reason,
            "created_at": iso(r.created_at), "terminated_at": iso(r.terminated_at),
            "cost": str(charged), "amortised": str(amortised)})
    ranked = [p.as_stored() for p in job.placement().ranked()]
    ranked = [p for p in ranked if p]
    rejected = [i for i in instances if i["end_reason"] == EndReason.HOST_CHECK_FAILED]
    summary["host_checks"] = {"rejected": len(rejected),
                              "cost": str(sum((Decimal(str(i["cost"])) for i in rejected),
                                              Decimal(0)))}
    if json_out:
        print_json({**summary, "instances": instances, "placements": ranked,
                   "events": [{"at": iso(e.at), "kind": e.kind,
                                "message": e.message} for e in evs],
                   "metrics_all": [{"name": m.name, "value": m.value, "step": m.step}
                                    for m in store.metrics(job.id)]})
        return
    print_summary(summary)
    _print_details(store, job, instances, rows, ranked)
    _print_events(job, evs, events)


def _print_details(store: "Store", job: "Job", instances: list[dict[str, Any]],
                   rows: list["Instance"],
                   ranked: list[dict[str, Any]]) -> None:
    """`orch show`'s loss curve, instances and ranked placements."""
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
        rejected = [i for i in instances if i["end_reason"] == EndReason.HOST_CHECK_FAILED]
        if rejected:
            spent = sum((Decimal(i["cost"]) for i in rejected), Decimal(0))
            typer.echo(f"Host checks: {len(rejected)} machine(s) failed their check and were "
                       f"released at once; they billed {usd(spent)} (in the job's cost; "
                       "`orch hosts` says why)")
    if ranked:
        typer.echo("\nPlacements ranked at submit (cheapest first):")
        typer.echo(table(["#", "provider", "GPU", "n", "spot", "est. h", "est. cost"],
                         [[n, p["provider"], p["gpu"], p["gpu_count"],
                           "yes" if p["interruptible"] else "no", f"{p['est_hours']:.2f}",
                           usd(p["est_cost"])] for n, p in enumerate(ranked[:8], 1)],
                         right=[0, 3, 5, 6], drop=[5, 4]))
        if len(ranked) > 8:
            typer.echo(f"  ... {len(ranked) - 8} more (--json)")


def _print_events(job: "Job", evs: list["Event"], events: int) -> None:
    """`orch show`'s newest `events` events."""
    from orchestrator.cli.term import human_time, prose

    typer.echo("\n" + prose(f"Events (newest {min(events, len(evs))} of {len(evs)}; "
                            f"all with `orch logs {job.id}`):"))
    typer.echo(table(["at", "kind", "message"],
                     # evs[-0:] would be all of them: `--events 0` is none
                     [[human_time(e.at), e.kind, event_line(e)]
                      for e in evs[len(evs) - min(events, len(evs)):]],
                     drop=[1]))


def logs(
    job_id: JobIdArg,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new lines "
                                         "until the job finishes.")] = False,
    train: Annotated[bool, typer.Option("--train", help="The trainer's own output "
                                        "(kept after the instance is gone) instead of "
                                        "orch's events.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="One JSON object per line.")]
    = False,
) -> None:
    """A job's events, oldest first (`-f` follows a running job; `--train` the trainer)."""
    store = open_db()
    _get_job(store, job_id)
    if train:
        _train_logs(store, job_id, follow, json_out)
        return
    last = 0
    while True:
        for e in store.events_after(job_id, last):
            last = e.id or last
            _print_event(e, json_out)
        if not follow or store.get_job(job_id).status in FINAL_STATUSES:
            # One more read: events written with the final state.
            if follow:
                for e in store.events_after(job_id, last):
                    _print_event(e, json_out)
            return
        time.sleep(0.5)


def _print_event(e: "Event", json_out: bool) -> None:
    """One line of `orch logs`: a JSON object, or time, kind and message."""
    from orchestrator.cli.term import human_time
    from orchestrator.records.columns import document

    if json_out:
        typer.echo(json.dumps({"id": e.id, "at": iso(e.at), "kind": e.kind,
                               "message": e.message, "data": document(e.data_json)}))
    else:
        typer.echo(f"{human_time(e.at)}  {e.kind:<20} {event_line(e)}")


def cancel(
    job_id: JobIdArg,
    wait: Annotated[float, typer.Option(help="Seconds to wait for the teardown.")] = 120.0,
    json_out: JsonFlag = False,
) -> None:
    """Stop a job: its worker terminates the instance and marks it cancelled."""
    from orchestrator.records.store import FINAL_STATUSES, NotFoundError

    if not 0 <= wait <= 86_400:  # also refuses nan
        fail(f"--wait must be 0 to 86400 seconds (got {wait})", 2)
    store = open_db()
    try:
        before = store.get_job(job_id).status
        job = store.request_cancel(job_id)
    except NotFoundError as exc:
        fail(_sweep_hint(store, job_id) or str(exc), EXIT_NOT_FOUND)
    if before in FINAL_STATUSES:
        if json_out:
            print_json({"job_id": job_id, "status": before, "instances_left": []})
        else:
            typer.echo(f"{job_id}: already {before}; nothing to cancel")
        return
    deadline = time.monotonic() + max(0.0, wait)
    while job.status not in FINAL_STATUSES:
        if _orphaned(store, job):
            _cancel_orphan(store, job)
        if time.monotonic() > deadline:
            break
        time.sleep(0.3)
        job = store.get_job(job_id)
    left = [r for r in store.instances_of(job_id) if r.terminated_at is None]
    if left and job.status == JobStatus.CANCELLED and _orphaned(store, job):
        # A requeued job no worker has adopted yet still holds its instance: nobody
        # else will tear it down.
        from orchestrator.engine.recovery import teardown_open

        teardown_open(store, configured_here(store)[0], job_id, EndReason.CANCELLED)
        left = [r for r in store.instances_of(job_id) if r.terminated_at is None]
    # What the worker did ("cancelled in evaluating; adapter kept at ...; ... terminated").
    said = _final_message(store, job_id) if job.status == JobStatus.CANCELLED else None
    if json_out:
        print_json({"job_id": job_id, "status": job.status, "message": said,
                   "instances_left": [r.provider_instance_id for r in left]})
    else:
        typer.echo(f"{job_id}: {said or job.status}" + (
            f"; {len(left)} instance(s) not yet terminated, run `orch reconcile`"
            if left and not (said and "orch reconcile" in said) else ""))
    if job.status != JobStatus.CANCELLED and job.status not in FINAL_STATUSES:
        raise typer.Exit(EXIT_FAILED)


def _final_message(store: "Store", job_id: str) -> str | None:
    """The message of the job's last state change (how it ended)."""
    states = [e for e in store.events(job_id) if e.kind == "state"]
    return states[-1].message if states else None


def _sweep_hint(store: "Store", name: str) -> str | None:
    """What to run when `orch cancel` was given a sweep's name rather than a job id."""
    from sqlmodel import select

    with store.session() as session:
        if session.exec(select(Sweep.id).where(Sweep.name == name)).first() is None:
            return None
    return (f"{name!r} is a sweep, not a job id; cancel all its queued and running runs with "
            f"`orch sweep cancel {name}`")


def register(app: typer.Typer) -> None:
    """Add the engine's commands to `app`."""
    for command in (submit, worker, show, logs, cancel):
        app.command()(command)


def _train_logs(store: "Store", job_id: str, follow: bool, json_out: bool) -> None:
    """Print the kept training output; with `follow`, new lines until the job ends."""
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


def _orphaned(store: "Store", job: "Job") -> bool:
    return job.lease_expires_at is None or job.lease_expires_at < store.now()


def _cancel_orphan(store: "Store", job: "Job") -> None:
    """No live worker holds the job: terminate its instances here and mark it cancelled."""
    teardown_open(store, configured_here(store)[0], job.id, EndReason.CANCELLED)
    store.cancel_orphan(job.id, "cancelled; no worker held it, so `orch cancel` tore it down")
