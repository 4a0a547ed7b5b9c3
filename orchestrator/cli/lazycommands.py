"""The `orch` command group: a command's module is imported only when that command runs.

`orch plan` must not pay for the modules of `orch submit` or `orch report` (and what they
import), nor `orch --help` for any of them. app.py defines its few commands itself; every
other command is named in LAZY with the module whose `register(app)` adds it and the first
paragraph of its help, which is all `orch --help` shows of it. `get_command` (what click calls
for the command being run) imports that one module; `commands` (click's API, the tests and
completion of options) imports them all. So a command module imports what its commands need
at module level, and only its commands pay for it. tests/test_entry.py checks that LAZY names
exactly what each module registers, with its help.
"""

from __future__ import annotations

import importlib
from typing import Any

import click
import typer
from typer.core import TyperGroup

from orchestrator.cli.helpstyle import gh_style

# (module, {command: the first paragraph of its help}), in `orch --help`'s order. Hidden
# commands are left out of the help, as click leaves them.
LAZY: tuple[tuple[str, dict[str, str]], ...] = (
    ("orchestrator.cli.jobs", {
        "submit": "Plan a job and run it in the foreground with live progress (or --detach).",
        "worker": "Run queued jobs, one at a time, until stopped (several workers may run at "
                  "once).",
        "show": "A job's state, attempts, instances, costs, metrics, events and ranked "
                "placements.",
        "logs": "A job's events, oldest first (`-f` follows a running job; `--train` the "
                "trainer).",
        "cancel": "Stop a job: its worker terminates the instance and marks it cancelled."}),
    ("orchestrator.cli.history", {
        "history": "List past and current jobs, filtered and sorted.",
        "cost": "Spending rollups: jobs, GPU-hours, cost, amortised rent and spot savings.",
        "sql": "Run one read-only SQL query on the history (writes are refused).",
        "advise": "Would monthly servers have been cheaper? Which rented servers sit idle?"}),
    ("orchestrator.cli.sweeps", {
        "sweep": "Queue a sweep's runs for `orch worker`, once each (safe to rerun from cron).",
        "sweep-show": "",  # hidden: `orch sweep show NAME`
        "sweeps": "List sweeps: runs, succeeded/running/queued/failed/cancelled, spent/budget, "
                  "best run."}),
    ("orchestrator.cli.report", {
        "report": "One self-contained HTML file: loss curves, eval metrics, placements, "
                  "costs."}),
    ("orchestrator.cli.models", {
        "models": "Known base models (repo ids usable as `base_model:`) and how to size any "
                  "other."}),
    ("orchestrator.cli.render", {
        "render": "Show exactly what would run: axolotl config, image, every command on the "
                  "host."}),
    ("orchestrator.cli.schemacmd", {
        "schema": "Print the JSON Schema of the job or sweep file (editors validate with it;\n"
                  "docs/job-file.md shows the YAML language-server line)."}),
    ("orchestrator.cli.servers", {"servers": "The monthly dedicated servers you rent."}),
    ("orchestrator.cli.warmcmd", {
        "warm": "Machines kept warm between jobs (resources.keep_warm)."}),
    ("orchestrator.cli.hostscmd", {
        "hosts": "What orch remembers of each machine it rented: checks, measured speed, and "
                 "why."}),
)
_MODULE_OF = {name: module for module, helps in LAZY for name in helps}
_HELP = {name: text for _module, helps in LAZY for name, text in helps.items()}


def new_app(**settings: Any) -> typer.Typer:
    """A Typer configured as `orch` is (a module's commands are built in one like it)."""
    return typer.Typer(pretty_exceptions_enable=False, rich_markup_mode=None, **settings)


def registered(module: str) -> dict[str, click.Command]:
    """The click commands `module`'s register() adds, built as the `orch` app builds its own."""
    app = new_app()
    importlib.import_module(module).register(app)
    return dict(typer.main.get_group(app).commands)


class LazyGroup(TyperGroup):
    """The root group: app.py's commands, then LAZY's, each module loaded on first use."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._loaded: dict[str, click.Command] = {}
        super().__init__(*args, **kwargs)

    @property  # type: ignore[override]
    def commands(self) -> dict[str, click.Command]:  # every command, all modules loaded
        for module, _names in LAZY:
            self._load(module)
        return self._loaded

    @commands.setter
    def commands(self, value: dict[str, click.Command]) -> None:
        self._loaded = {name: gh_style(command) for name, command in value.items()}

    def _load(self, module: str) -> None:
        if all(name in self._loaded for name in dict(LAZY)[module]):
            return
        for name, command in registered(module).items():
            self._loaded.setdefault(name, gh_style(command))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """The command `cmd_name`, its module imported now if it is a lazy one."""
        if cmd_name not in self._loaded and cmd_name in _MODULE_OF:
            self._load(_MODULE_OF[cmd_name])
        return self._loaded.get(cmd_name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        """Every command's name in help order, without importing any module."""
        return [*[n for n in self._loaded if n not in _MODULE_OF], *_MODULE_OF]

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The help's list of commands, each lazy one from LAZY (no module imported)."""
        rows = []
        for name in self.list_commands(ctx):
            command = self._loaded.get(name)
            if command is None and _HELP.get(name):
                command = click.Command(name, help=_HELP[name])
            if command is not None and not command.hidden:
                rows.append((name, command))
        if rows:
            limit = formatter.width - 6 - max(len(name) for name, _ in rows)
            with formatter.section("Commands"):
                formatter.write_dl([(name, c.get_short_help_str(limit)) for name, c in rows])
