"""A job file loaded for a command, or its problems printed and exit 2; the exit codes scripts
rely on (README, "Exit codes") and dollars for people.

Its own module, light, because every command uses it (through `cli/common.py`): the planning
modules `cli/plan.py` imports are loaded only by the commands that plan.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from orchestrator.cli.exits import EXIT_INVALID

if TYPE_CHECKING:
    from collections.abc import Callable
    from decimal import Decimal

    from orchestrator.core.datafiles import DatasetSize
    from orchestrator.core.hubsize import HubDatasetRef
    from orchestrator.core.spec import LoadedJob

__all__ = ["EXIT_INVALID", "EXIT_NO_FIT", "LazySizer", "err", "load", "money", "problems_exit"]

EXIT_NO_FIT = 3  # nothing can run the job under its constraints


def err(line: str) -> None:
    """One line on standard error."""
    print(line, file=sys.stderr)


def problems_exit(path: Path, problems: list[str]) -> NoReturn:
    """Print a job or sweep file's problems, one per line, and exit EXIT_INVALID."""
    for problem in problems:
        err(problem)
    n = len(problems)
    err(f"{path}: {n} problem{'s' if n != 1 else ''}; nothing was done")
    raise SystemExit(EXIT_INVALID)


def load(path: Path) -> LoadedJob:
    """The job file loaded; a Hub dataset without `tokens:` sized from the Hub's published
    information (`engine/integrations.PlanSizer`); its problems printed, exit 2."""
    # The job file's models (pydantic) only for the commands that read a job file.
    from orchestrator.core.spec import SpecError, load_job

    sizer = LazySizer(path)
    try:
        return load_job(path, hub_size=sizer)
    except SpecError as exc:
        problems_exit(path, exc.problems)


class LazySizer:
    """`PlanSizer`, imported (with HTTP) only for a job that has a Hub dataset to size."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.real: Callable[[HubDatasetRef], DatasetSize | None] | None = None

    def __call__(self, ref: HubDatasetRef) -> DatasetSize | None:
        if self.real is None:
            import os

            from orchestrator.core.settings import settings
            from orchestrator.engine.integrations import PlanSizer

            self.real = PlanSizer(self.path, os.environ, settings().datasets_server_url)
        return self.real(ref)


def money(value: Decimal | str | None) -> str:
    """Dollars for people (`core.money.usd`)."""
    # core.money imports providers.base (its dataclasses and enums: ~0.1 G instructions),
    # which `orch jobs` and `orch --help` need not load.
    from orchestrator.core.money import usd

    return usd(value)
