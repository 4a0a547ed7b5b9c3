"""`orch sweep FILE`, `orch sweep show NAME` (also `orch sweep-show NAME`), `orch sweeps`.

`orch sweep FILE` is meant for cron: it validates the whole sweep first (every problem, as
`file:line key: problem`, exit 2, nothing written), then records the sweep and queues each
run not yet recorded for `orch worker`; running it again, or twice at once, queues nothing
twice. Output is one summary line and the database used (or `--json`); `--quiet` prints
nothing on an idle tick.

Exit codes: 0 done (also when the estimate exceeds the budget: the runs are queued and the
budget gate holds back those that would exceed it, which the summary says); 2 the sweep
file (or an argument) is invalid; 3 some runs fit no offer (the others were queued), or no
configured provider could run a run (then nothing is queued or recorded); 4 `show`
of an unknown sweep; 1 anything else (the database, say).

`orch sweep show NAME`: Typer cannot have a command `sweep FILE` and a group `sweep show`, so
`sweep` takes an optional second argument and treats `show` as the verb when one follows.
A sweep file named `show` in the current directory must be given as `./show`.
"""


from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import click
import typer
from typer.core import TyperCommand

from orchestrator.cli.common import (
    EXIT_ERROR,
    EXIT_INVALID,
    EXIT_NO_FIT,
    EXIT_NOT_FOUND,
    JsonFlag,
    fail,
    history_reader,
    open_db,
    print_json,
    problems_exit,
    require_runners,
)
from orchestrator.cli.tables import table
from orchestrator.core.money import usd
from orchestrator.core.states import SWEEP_COUNTED, SweepRunState

if TYPE_CHECKING:
    from orchestrator.core.sweepspec import LoadedSweep

EXIT_OK = 0


def _load(path: Path) -> "LoadedSweep":
    from orchestrator.cli.jobfile import LazySizer
    from orchestrator.core.spec import SpecError
    from orchestrator.core.sweepspec import load_sweep

    try:
        return load_sweep(path, hub_size=LazySizer(path))
    except SpecError as exc:
        problems_exit(path, exc.problems)


def _params(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={_value(v)}" for k, v in params.items()) or "-"


def _value(v: Any) -> str:
    return repr(v) if isinstance(v, str) else f"{v:g}" if isinstance(v, float) else str(v)


def _headers(keys: list[str]) -> list[str]:
    """The swept keys as column headers, their shared dotted prefix left out (`lora.r`,
    `lora.alpha` -> `r`, `alpha`) unless that makes two alike."""
    parts = [k.split(".") for k in keys]
    common = 0
    while all(len(p) > common + 1 for p in parts) and len({p[common] for p in parts}) == 1:
        common += 1
    short = [".".join(p[common:]) for p in parts]
    return short if len(set(short)) == len(short) else keys


def _rung(fraction: float | None) -> str:
    """The last rung a run reached, as a share of its steps (`45 %`; `-`: none yet)."""
    return "-" if fraction is None else f"{fraction * 100:g} %"


def _metric(value: float | None, nan: bool = False) -> str:
    """A run's objective: `-` when it reported none, `nan` when it reported one that is not a
    number (a diverged run)."""
    return ("nan" if nan else "-") if value is None else f"{value:g}"


def _submit(file: Path, retry_failed: bool, json_out: bool, quiet: bool, dry_run: bool) -> None:
    from sqlalchemy.exc import SQLAlchemyError

    from orchestrator.engine.wiring import price_lists
    from orchestrator.records.store import DatabaseReadOnly, StoreError
    from orchestrator.records.sweep.store import submit_sweep

    loaded = _load(file)
    store = open_db()
    try:
        # As `orch submit`: no run is queued (or reported as queueable) that nothing here
        # can run; a worker would only fail them one by one.
        # A tpe sweep's runs are proposed later, each from the base job with its params.
        jobs = [r.job for r in loaded.runs] or [loaded.base]
        require_runners(store, file, [j.spec.resources.providers for j in jobs])
        named = sorted({n for j in jobs for n in j.spec.resources.providers or ()})
        report = submit_sweep(store, loaded, retry_failed=retry_failed, dry_run=dry_run,
                              listed=price_lists(named))
    except DatabaseReadOnly as exc:  # nothing was recorded: no run to retry
        fail(f"{file}: {exc}")
    except (StoreError, SQLAlchemyError) as exc:
        fail(f"{file}: {exc}; runs recorded before the error stay recorded, run it again")
    finally:
        store.close()
    nofit = [r for r in report.runs if r.state == "nofit"]
    code = EXIT_NO_FIT if nofit else EXIT_OK
    if quiet and report.idle:
        raise typer.Exit(code)
    from orchestrator.core.paths import describe_db

    if json_out:
        print_json({**report.to_dict(), "database": describe_db()})
    else:
        for r in nofit:
            typer.echo(f"{file}: run {r.index} ({_params(r.params)}) fits nowhere: {r.message}",
                       err=True)
        for warning in report.warnings:
            typer.echo(f"warning: {file}: {warning}", err=True)
        cancelled = report.counts.get(SweepRunState.CANCELLED, 0)
        if retry_failed and cancelled:
            stay = "runs stay" if cancelled != 1 else "run stays"
            typer.echo(f"note: {file}: {cancelled} cancelled {stay} cancelled: --retry-failed "
                       "queues failed runs only (a cancel is final)", err=True)
        typer.echo(f"{report.summary()}\ndatabase: {describe_db()}")
    raise typer.Exit(code)


def _read_sqlite() -> bool:
    """Whether the database is SQLite: then status reads use sqlite3, not the store."""
    from orchestrator.core.paths import default_db_url

    return default_db_url().startswith("sqlite")


def _status(name: str) -> dict[str, Any]:
    if _read_sqlite():
        from orchestrator.records.sweep.view import SweepNotFound, sweep_status

        with history_reader(EXIT_ERROR) as reader:
            try:
                return sweep_status(reader, name)
            except SweepNotFound as exc:
                fail(str(exc), EXIT_NOT_FOUND)
    from orchestrator.records.store import NotFoundError
    from orchestrator.records.sweep.store import sweep_status as store_status

    store = open_db()
    try:
        return store_status(store, name)
    except NotFoundError as exc:
        fail(str(exc), EXIT_NOT_FOUND)
    finally:
        store.close()


def _all() -> list[dict[str, Any]]:
    if _read_sqlite():
        from orchestrator.records.sweep.view import list_sweeps

        with history_reader(EXIT_ERROR) as reader:
            return list_sweeps(reader)
    from orchestrator.records.sweep.store import list_sweeps as store_list

    store = open_db()
    try:
        return store_list(store)
    finally:
        store.close()


def _pruned(run: dict[str, Any]) -> str | None:
    """`pruned at 15 % (train.loss 1.42 > 1.31)` for a pruned run, else None."""
    if run["state"] != SweepRunState.PRUNED:
        return None
    at = next((g for g in run.get("rungs", ()) if g["decision"] == "prune"), None)
    if at is None:
        return None
    value = at["value"]
    if value is None:  # the metric was `nan` at the rung (a diverged run): no comparison
        return f"pruned at {at['fraction'] * 100:g} % ({at['metric']} nan)"
    worse = "<" if at["cutoff"] is not None and value < at["cutoff"] else ">"
    cutoff = "" if at["cutoff"] is None else f" {worse} {at['cutoff']:.4g}"
    return f"pruned at {at['fraction'] * 100:g} % ({at['metric']} {value:.4g}{cutoff})"


def _show(name: str, json_out: bool) -> None:
    status = _status(name)
    if json_out:
        print_json(status)
        return
    counts = ", ".join(f"{n} {s}" for s, n in status["counts"].items() if n) or "no runs"
    budget = f"budget {usd(status['budget'])}, " if status["budget"] else ""
    obj = status["objective"]
    search = status.get("search")
    sampler = (f"{search['sampler']}: {len(status['runs'])} of {search['trials']} trials; "
               if search and search["trials"] else "")
    pruned = (f", of which pruned runs {usd(status['pruned_spent'])}"
              if status["counts"].get(SweepRunState.PRUNED) else "")
    lines = [f"{status['sweep']} ({status['sweep_id']}): {sampler}{len(status['runs'])} runs: "
             f"{counts} ({budget}spent {usd(status['spent'])}{pruned}, estimated "
             f"{usd(status['estimated'])}; max_parallel {status['max_parallel']})"]
    metric_name = obj["metric"] if obj else "metric"
    best_id = status["best"]["job_id"] if status["best"] else None
    # One column per swept key, the key in the header: the values are what differs between
    # runs, and `training.learning_rate=` in every row hid them at 80 columns.
    keys = list(dict.fromkeys(k for r in status["runs"] for k in r["params"]))
    # Early stopping's column: the last rung each run reached (its share of the run's steps).
    stops = int(status.get("early_stop") is not None or any(r["rungs"] for r in status["runs"]))
    rows = []
    for r in status["runs"]:
        state = _pruned(r) or r["state"] + (f" ({r['waiting']})" if r["waiting"] else "")
        rows.append(["*" if r["job_id"] == best_id else "",
                     "-" if r["index"] is None else r["index"], r["job_id"],
                     *(_value(r["params"][k]) if k in r["params"] else "-" for k in keys),
                     state, *([_rung(r["last_rung"])] if stops else []),
                     _metric(r["metric"], r["metric_nan"]),
                     usd(r["cost"]), usd(r["est_cost"])])
    if rows:
        n = len(keys) + stops  # the columns before state's and metric's
        lines.append(table(["", "#", "job", *_headers(keys), "state",
                            *(["last rung"] if stops else []), metric_name, "cost", "est. cost"],
                           rows, right=[1, *([3 + n] if stops else []), 4 + n, 5 + n, 6 + n],
                           drop=[6 + n, 1], states=[3 + len(keys)]))
    if obj is None:
        lines.append("best: no objective in the sweep file")
    elif status["best"] is None:
        nan = sum(1 for r in status["runs"]
                  if r["state"] == SweepRunState.SUCCEEDED and r["metric_nan"])
        lines.append(f"best: none yet (no finished run reported {obj['metric']} as a number"
                     f"; {nan} reported nan: diverged?)" if nan else
                     f"best: none yet (no finished run reported {obj['metric']})")
    else:
        b = status["best"]
        lines.append(f"best ({obj['goal']} {obj['metric']}): {b['job_id']} {b['name']} "
                     f"{obj['metric']}={_metric(b['metric'])} ({_params(b['params'])})")
    failed = [r for r in status["runs"]
              if r["state"] == SweepRunState.FAILED and r["failure_reason"]]
    for r in failed:
        lines.append(f"  {r['job_id']} failed: {r['failure_reason'].splitlines()[0]}")
    typer.echo("\n".join(lines))


def _cancel(name: str, json_out: bool) -> None:
    """Cancel every queued and running run of sweep `name` in one transaction."""
    from orchestrator.records.store import NotFoundError
    from orchestrator.records.sweep.store import cancel_sweep

    store = open_db()
    try:
        result = cancel_sweep(store, name)
    except NotFoundError as exc:
        fail(str(exc), EXIT_NOT_FOUND)
    finally:
        store.close()
    if json_out:
        print_json(result)
        return
    n, m = len(result["cancelled"]), len(result["stopping"])
    typer.echo(f"{name}: {n} run{'s' if n != 1 else ''} cancelled"
               + (f", {m} running run{'s' if m != 1 else ''} stopping (their workers tear the "
                  "instances down; `orch sweep show " + name + "` follows them)" if m else "")
               + ("" if n or m else " (nothing was queued or running)"))


def sweep(
    file: Annotated[str, typer.Argument(
        help="The sweep file; or `show` or `cancel` followed by a sweep's name.")],
    name: Annotated[str | None, typer.Argument(
        help="With `show` or `cancel`: the sweep's name.", show_default=False)] = None,
    retry_failed: Annotated[bool, typer.Option(
        "--retry-failed", help="Queue failed runs again (cancelled ones stay).")] = False,
    json_out: JsonFlag = False,
    quiet: Annotated[bool, typer.Option(
        "--quiet", "-q", help="Print nothing when there was nothing to do (cron).")]
    = False,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Validate, plan and report; write nothing.")] = False,
) -> None:
    """Queue a sweep's runs for `orch worker`, once each (safe to rerun from cron).

    Exit codes: 0 ok (also over budget: runs past it are held back), 2 invalid file,
    3 some runs fit no offer or nothing here can run them, 1 other errors.
    `orch sweep show NAME` shows a sweep; `orch sweep cancel NAME` cancels its queued and
    running runs at once (a later `orch sweep FILE` does not queue them again).
    """
    if file in ("show", "cancel") and name is not None:
        if retry_failed or quiet or dry_run:
            fail(f"`orch sweep {file} NAME` takes only --json", EXIT_INVALID)
        (_show if file == "show" else _cancel)(name, json_out)
        return
    if file in ("show", "cancel"):
        fail(f"give the sweep's name: `orch sweep {file} NAME` (names: `orch sweeps`); a "
             f"sweep file named `{file}` is `./{file}`", EXIT_INVALID)
    if name is not None:
        fail(f"unexpected argument {name!r}: give one sweep file (or `show NAME`)",
             EXIT_INVALID)
    _submit(Path(file), retry_failed, json_out, quiet, dry_run)

def sweep_show(
    name: Annotated[str, typer.Argument(help="The sweep's name.")],
    json_out: JsonFlag = False,
) -> None:
    """A sweep's runs: parameters, state, metric, cost, and the best by its objective."""
    _show(name, json_out)

def sweep_cancel(
    name: Annotated[str, typer.Argument(help="The sweep's name.")],
    json_out: JsonFlag = False,
) -> None:
    """Cancel a sweep's queued and running runs at once (a later `orch sweep FILE` does not
    queue them again); running runs stop and their instances are torn down."""
    _cancel(name, json_out)


class _SweepCommand(TyperCommand):
    """`orch sweep`, whose `show NAME` / `cancel NAME` verbs answer `-h` with their own help.

    `--help` is eager: click would print `orch sweep FILE`'s help before the verb is seen, so
    the verb's help is printed here, from its own command (`sweep_show` / `sweep_cancel`).
    """

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """Print `orch sweep VERB`'s help when asked for it, else parse as usual."""
        names = ctx.help_option_names
        if args and args[0] in VERBS and any(a in names for a in args[1:]):
            verb = typer.main.get_command(_verb_app(args[0]))
            with click.Context(verb, info_name=f"{ctx.info_name} {args[0]}", parent=ctx.parent,
                               help_option_names=names) as sub:
                typer.echo(verb.get_help(sub))
            ctx.exit()
        return super().parse_args(ctx, args)


def _verb_app(verb: str) -> typer.Typer:
    """A one-command app for a sweep verb, so typer builds its help as for any command."""
    verb_app = typer.Typer(rich_markup_mode=None, add_completion=False)
    verb_app.command()(VERBS[verb])
    return verb_app


VERBS = {"show": sweep_show, "cancel": sweep_cancel}


def sweeps(json_out: JsonFlag = False) -> None:
    """List sweeps: runs, succeeded/running/queued/failed/cancelled, spent/budget, best run."""
    rows = _all()
    if json_out:
        print_json(rows)
        return
    if not rows:
        typer.echo(f"no sweeps yet; try `orch sweep {Path('examples') / 'sweep-sim.yml'}`")
        return
    out = []
    for s in rows:
        c = s["counts"]
        spent = usd(s["spent"]) + (f" / {usd(s['budget'])}" if s["budget"] else "")
        b = s["best"]
        best = "-" if b is None else (f"{b['job_id']} {s['objective']['metric']}="
                                      f"{_metric(b['metric'])}")
        out.append([s["sweep"], len(s["runs"]), *(c[k] for k in SWEEP_COUNTED), spent, best])
    typer.echo(table(["name", "runs", *SWEEP_COUNTED, "spent / budget", "best"], out,
                     right=[1, 2, 3, 4, 5, 6, 7, 8],
                     drop=[3, 4, 2]))


def register(app: typer.Typer) -> None:
    """Add the sweep commands to `app`."""
    app.command("sweep", cls=_SweepCommand)(sweep)
    # Kept for scripts written against it; `orch sweep show NAME` is the documented spelling.
    app.command("sweep-show", hidden=True)(sweep_show)
    app.command("sweeps")(sweeps)
