"""The `orch` console script (pyproject.toml): the cyclic garbage collector off while orch
starts, then `cli/app.py`'s `main`.

Starting orch makes tens of thousands of objects that all live until the process ends
(modules, classes, pydantic's schemas, typer's commands): the collector only walks them again
and again, ~3 % of `orch plan`'s instructions (callgrind). It is off from the first import.
Every command but `orch plan` turns it back on before its own work, after freezing what
start-up made (moved out of the collector's reach, as at exit), so a worker that runs for days
collects as usual. `orch plan` is one bounded computation (one job file, its placements) that
ends the process, and runs to its end with the collector off. Tests call `app.main` itself
and keep their collector.
"""

from __future__ import annotations

import gc
import sys


def main() -> None:
    """Console-script entry point."""
    gc.disable()
    from orchestrator.cli.app import main as run

    if sys.argv[1:2] != ["plan"]:
        gc.freeze()
        gc.enable()
    run()
