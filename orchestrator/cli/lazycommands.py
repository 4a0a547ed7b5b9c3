"""The `orch` command group: a command's module is imported only when that command runs.

`orch plan` must not pay for the modules of `orch submit` or `orch report` (and what they
import). app.py defines its few commands itself; every other command is named in LAZY with
the module whose `register(app)` adds it. `get_command` (what click calls for the command
being run) imports that one module; listing every command (`orch --help`, completion, and
`commands`, which click's API and the tests read) imports them all.
tests/test_entry.py checks that LAZY names exactly what each module registers.
"""

from __future__ import annotations

import importlib
from typing import Any

import click
import typer
from typer.core import TyperGroup

from orchestrator.cli.helpstyle import gh_style

# (module, the commands its register() adds), in `orch --help`'s order.
LAZY: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("orchestrator.cli.jobs", ("submit", "worker", "show", "logs", "cancel")),
    ("orchestrator.cli.history", ("history", "cost", "sql", "advise")),
    ("orchestrator.cli.sweeps", ("sweep", "sweep-show", "sweeps")),
    ("orchestrator.cli.report", ("report",)),
    ("orchestrator.cli.models", ("models",)),
    ("orchestrator.cli.render", ("render",)),
    ("orchestrator.cli.schemacmd", ("schema",)),
    ("orchestrator.cli.servers", ("servers",)),
    ("orchestrator.cli.warmcmd", ("warm",)),
)
_MODULE_OF = {name: module for module, names in LAZY for name in names}


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
        lazy = [name for _module, names in LAZY for name in names]
        return [*[n for n in self._loaded if n not in _MODULE_OF], *lazy]
