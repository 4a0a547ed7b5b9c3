"""What every `orch` command module shares: exit codes, the `--json` flag, failing with one
line, JSON/CSV output, opening the database or the history reader, the runnable-job check.

Every cli_* module imports its helpers from here and from no other cli_* module's private
names, so the command modules form no import cycle. Like the commands, this module imports
the database layer inside the functions that need it: `orch --help` and the history
commands must not pay for SQLModel/SQLAlchemy.
"""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

# Defined beside `orch plan` (the first command that needed them); the other commands take
# them from here.
from orchestrator.cli.jobfile import EXIT_INVALID, EXIT_NO_FIT, load, money, problems_exit

if TYPE_CHECKING:
    from orchestrator.records.history import Reader
    from orchestrator.records.store import Store
    from providers.base import Provider

__all__ = ["EXIT_CANCELLED", "EXIT_ERROR", "EXIT_FAILED", "EXIT_INVALID", "EXIT_NO_FIT",
           "EXIT_NOT_FOUND", "JsonFlag", "fail", "history_reader", "load", "money",
           "one_format", "open_history", "open_db", "print_csv", "print_json",
           "problems_exit", "require_runners"]

# The documented exit codes (README, "Exit codes"); 2 and 3 come from cli_plan.
EXIT_ERROR = 1
EXIT_FAILED = 1  # a job that ran and failed
EXIT_NOT_FOUND = 4
EXIT_CANCELLED = 130

JsonFlag = Annotated[bool, typer.Option("--json", help="Print one JSON object for scripts.")]


def fail(message: str, code: int = EXIT_ERROR) -> NoReturn:
    """Print `error: message` on stderr and exit with `code`."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def print_json(obj: object) -> None:
    """`obj` as indented JSON on stdout (what JSON lacks, as text: Decimal, datetime)."""
    typer.echo(json.dumps(obj, indent=2, default=str))


def print_csv(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """A header row, then `rows`; None becomes an empty cell."""
    out = csv.writer(sys.stdout, lineterminator="\n")
    out.writerow(headers)
    # Booleans as JSON and SQL tools spell them (Python's csv writes `True`).
    out.writerows(["" if c is None else str(c).lower() if isinstance(c, bool) else c
                   for c in row] for row in rows)


def one_format(json_out: bool, csv_out: bool) -> None:
    """Exit 2 when both --json and --csv are given."""
    if json_out and csv_out:
        fail("--json and --csv: choose one output format", EXIT_INVALID)


def open_db(*, repair: bool = True) -> Store:
    """The store at ORCH_DB_URL (migrated); exit 1 or 2 (a bad URL) with one line if not.

    With `repair`, jobs whose worker's lease lapsed are requeued first (`orch reconcile`
    opens without it: it does that itself, and reports it, or only reports it in a dry run).
    """
    from orchestrator.cli.exits import exit_code
    from orchestrator.records.store import StoreError, open_store

    try:
        store = open_store()
    except StoreError as exc:
        fail(str(exc), exit_code(exc))
    if repair:
        _repair(store)
    return store


def _repair(store: Store) -> None:
    """Requeue the jobs whose worker died or stopped on a full or locked database: the next
    orch command repairs that state, not only `orch reconcile` (issue 23 §7). Best effort:
    a read-only role, or a database still full, leaves it to the next one."""
    from sqlalchemy.exc import DBAPIError

    from orchestrator.records.store import StoreError

    try:
        store.requeue_lapsed()
    except (StoreError, DBAPIError):
        pass


def open_history() -> Reader | None:
    """The read-only history reader (None: no database yet); exit 1 or 2 if it cannot open."""
    from orchestrator.cli.exits import exit_code
    from orchestrator.core.paths import default_db_url
    from orchestrator.records.history import HistoryError, open_reader

    try:
        return open_reader(default_db_url())
    except HistoryError as exc:
        fail(str(exc), exit_code(exc))


@contextmanager
def history_reader(error_code: int = EXIT_INVALID) -> Iterator[Reader | None]:
    """The history reader for one command: a HistoryError from its reads exits
    `error_code` with one line, and the reader is closed whatever happens."""
    from orchestrator.records.history import HistoryError

    reader = open_history()
    try:
        yield reader
    except HistoryError as exc:
        fail(str(exc), error_code)
    finally:
        if reader is not None:
            reader.close()


def require_runners(store: Store, file: Path, named: list[list[str] | None]) -> None:
    """Exit 3, recording nothing, unless a configured provider could run each of the jobs
    whose `resources.providers` are `named`: the check every path that queues work makes."""
    from orchestrator.engine.runnable import runners

    has_servers = bool(store.registered())
    for providers in dict.fromkeys(None if n is None else tuple(n) for n in named):
        found = runners(None if providers is None else list(providers), has_servers)
        if not found:
            fail(found.problem(file), EXIT_NO_FIT)


def configured_here(store: Store) -> tuple[dict[str, Provider], list[str]]:
    """The providers this machine can use (the simulated cloud too), and notes on those left
    out; exit 2 with one line for a malformed ORCH_SIM_* variable."""
    from orchestrator.engine.wiring import configured_providers

    try:
        return configured_providers(store, sim=True)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
