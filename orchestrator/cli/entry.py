"""The `orch` console script: a plain `orch plan FILE [--json] [--all]` skips typer.

Importing typer (its click copy and parameter adapters) and every command's module costs
more than planning; `orch plan` is the command people run over and over while editing a
job file (bench/startup.py). Anything else, `--help` and unknown options included, goes to
the typer app, which parses and reports exactly as before.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

_PLAN_FLAGS = {"--json": "json_out", "--all": "all_rows"}


def plan_args(argv: list[str]) -> tuple[Path, bool, bool] | None:
    """(file, --json, --all) when `argv` is a plain `plan` command line, else None."""
    if not argv or argv[0] != "plan":
        return None
    flags = {"json_out": False, "all_rows": False}
    files = []
    for arg in argv[1:]:
        if arg in _PLAN_FLAGS:
            flags[_PLAN_FLAGS[arg]] = True
        elif arg.startswith("-") or arg == "":
            return None  # --help, a typo: typer answers
        else:
            files.append(arg)
    if len(files) != 1:
        return None
    return Path(files[0]), flags["json_out"], flags["all_rows"]


def main() -> None:
    """Console-script entry point."""
    from orchestrator.core.paths import BLANK_DB_URL, blank_db_url

    if blank_db_url() and not {"--help", "-h"} & set(sys.argv[1:]) and sys.argv[1:]:
        print(f"error: {BLANK_DB_URL}", file=sys.stderr)
        sys.exit(2)
    args = plan_args(sys.argv[1:])
    if args is None:
        from orchestrator.cli.app import main as typer_main

        typer_main()
        return
    from orchestrator.cli.plan import run

    try:
        run(*args)
        sys.stdout.flush()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except BrokenPipeError:
        # `orch plan job.yml | head`: the reader left; say nothing more (as click does).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
