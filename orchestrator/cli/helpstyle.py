"""Help that reads like gh's: flags show no `<bool>`, options name what they take.

Typer labels every option with its Python type in angle brackets (`--json <bool>`,
`--limit <int>`). gh and kubectl show nothing after a flag and a plain word after an option
that takes a value (`--limit int`); this sets those labels on the built Click command tree.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

# Typer's type names, in the words gh uses.
_WORDS = {"int": "int", "str": "string", "float": "number", "Path": "path", "bool": ""}
_CLICK = {"integer": "int", "text": "str", "float": "float", "path": "Path", "boolean": "bool"}


HELP_NAMES = ["-h", "--help"]


def gh_style(command: Any) -> Any:
    """Relabel the options of `command` and every subcommand; returns `command`."""
    relabel(command)
    for sub in getattr(command, "commands", {}).values():
        gh_style(sub)
    return command


def relabel(command: Any) -> None:
    """Relabel the options of `command` itself (not of its subcommands)."""
    # The help option is made (and cached) on first use; make it now to relabel it too.
    helper = command.get_help_option(SimpleNamespace(help_option_names=HELP_NAMES))
    params = [*getattr(command, "params", []), *([helper] if helper is not None else [])]
    for param in params:
        if getattr(param, "param_type_name", "") == "argument" and param.metavar is None:
            param.metavar = param.name.upper()  # `orch show JOB_ID`, as gh writes <number>
            continue
        if getattr(param, "param_type_name", "") != "option" or param.metavar is not None:
            continue
        if getattr(param, "is_flag", False) or getattr(param, "count", False):
            param.metavar = ""
            continue
        if hasattr(param, "bare_type"):  # typer >= 0.26 carries its own parameter types
            bare = param.bare_type()
            if bare.startswith("list[") and bare.endswith("]"):
                bare = bare[5:-1]  # a repeatable option: its help says "repeat"
        else:  # earlier typer: Click's types
            bare = _CLICK.get(param.type.name, param.type.name)
        param.metavar = _WORDS.get(bare, bare.lower())
