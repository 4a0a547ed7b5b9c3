"""`orch warm`: the machines kept warm between jobs, and `orch warm release` to end them now.

A machine is kept warm after a job with `resources.keep_warm` (docs/warm.md). Listing reads
the database only; releasing terminates the machine at its provider (the window's idle cost
is recorded) and is safe against a job taking it at the same moment: the row moves to
`ending` first, so exactly one of the two happens.
"""

from datetime import UTC, datetime, timedelta
from typing import Annotated

import typer

from orchestrator.cli.common import (
    EXIT_INVALID,
    JsonFlag,
    configured_here,
    fail,
    history_reader,
    open_db,
    print_json,
)
from orchestrator.cli.tables import table
from orchestrator.cli.term import human_time
from orchestrator.core.money import usd
from orchestrator.core.states import EndReason, WarmState


def _list(all_rows: bool, json_out: bool) -> None:
    from orchestrator.records import warmidle

    now = datetime.now(UTC)
    open_db().close()  # the schema upgraded: an older database gets the table
    with history_reader() as reader:
        everything = [] if reader is None else warmidle.windows(
            reader, datetime(1970, 1, 1, tzinfo=UTC), now + timedelta(days=2), now)
    day = now - timedelta(days=1)
    rows = everything if all_rows else [r for r in everything if r.state in ("parked", "ending")
                                        or r.parked_at >= day]
    if json_out:
        print_json({"warm": [r.to_dict() for r in rows]})
        return
    if not rows:
        typer.echo("no machine kept warm in the last day (`resources.keep_warm` in a job file "
                   "keeps one for the next job; --all for every window)")
        return
    from orchestrator.records.history import dollars

    typer.echo(table(
        ["id", "state", "provider", "instance", "GPU", "$/h", "parked by", "until",
         "taken by", "idle cost"],
        [[r.id, r.state, r.provider, r.instance_id, f"{r.gpu} x{r.gpu_count}",
          usd(dollars(r.price_per_hour_micros)), r.parked_by, human_time(r.expires_at),
          r.taken_by or "-", usd(dollars(r.idle_micros))] for r in rows],
        right=[0, 5, 9]))


def _release(ids: list[int], all_parked: bool, json_out: bool) -> None:
    from orchestrator.engine.warm import end_one

    if not ids and not all_parked:
        fail("name the warm instances to release (ids from `orch warm`), or --all",
             EXIT_INVALID)
    store = open_db()
    try:
        providers, _notes = configured_here(store)
        rows = store.warm_instances((WarmState.PARKED, WarmState.ENDING))
        chosen = rows if all_parked else [r for r in rows if r.id in ids]
        unknown = sorted(set(ids) - {r.id for r in rows})
        results = []
        for row in chosen:
            provider = providers.get(row.provider)
            if provider is None:
                results.append((row, f"provider {row.provider} is not configured here"))
                continue
            ended = end_one(store, provider, row, EndReason.RELEASED, expired_only=False)
            results.append((row, "taken by a job meanwhile" if ended is None else
                            ended.error or "terminated"))
    finally:
        store.close()
    if json_out:
        print_json({"released": [{"id": r.id, "instance_id": r.provider_instance_id,
                                  "result": why} for r, why in results],
                    "unknown": unknown})
    else:
        for r, why in results:
            typer.echo(f"warm instance {r.id} ({r.provider} {r.provider_instance_id}): {why}")
        for wid in unknown:
            typer.echo(f"warm instance {wid}: not parked (see `orch warm --all`)", err=True)
        if not results and not unknown:
            typer.echo("no machine is kept warm")
    if unknown or any(why not in ("terminated",) for _r, why in results):
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add `orch warm` (list) and `orch warm release` to the app."""
    warm = typer.Typer(help="Machines kept warm between jobs (resources.keep_warm).",
                       invoke_without_command=True, no_args_is_help=False)

    @warm.callback()
    def listing(
        ctx: typer.Context,
        all_rows: Annotated[bool, typer.Option("--all", help="Every window, not only the "
                                               "last day's and those open now.")] = False,
        json_out: JsonFlag = False,
    ) -> None:
        """List machines kept warm: parked now, and the last day's windows."""
        if ctx.invoked_subcommand is None:
            _list(all_rows, json_out)

    @warm.command("release")
    def release(
        ids: Annotated[list[int] | None, typer.Argument(help="Warm instance ids "
                                                        "(`orch warm`).")] = None,
        all_parked: Annotated[bool, typer.Option("--all", help="Every machine parked "
                                                 "now.")] = False,
        json_out: JsonFlag = False,
    ) -> None:
        """Terminate machines kept warm now, before their window ends."""
        _release(ids or [], all_parked, json_out)

    app.add_typer(warm, name="warm")
