"""YAML loading that remembers where every key and value came from (file:line errors)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import yaml

Loc = tuple[str | int, ...]

# libyaml's parser when PyYAML was built with it (several times faster), else pure Python.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class YamlError(ValueError):
    """A file that is not valid YAML, or is valid YAML with duplicate keys."""


@dataclass
class Positions:
    """Line numbers (1-based) for each path in a loaded document."""

    values: dict[Loc, int] = field(default_factory=dict)
    keys: dict[Loc, int] = field(default_factory=dict)

    def line(self, loc: Loc) -> int:
        """The line of `loc` (its key where it has one), else of its nearest ancestor."""
        probe = tuple(loc)
        while probe:
            hit = self.keys.get(probe, self.values.get(probe))
            if hit is not None:
                return hit
            probe = probe[:-1]
        return self.values.get((), 1)


def load(text: str, filename: str) -> tuple[Any, Positions]:
    """Parse one YAML document into plain Python values plus their positions."""
    try:
        node = yaml.compose(text, Loader=_LOADER)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise YamlError(f"{filename}{line}: not valid YAML: {problem}") from None
    positions = Positions()
    if node is None:
        return None, positions
    constructor = yaml.SafeLoader("")
    try:
        value = _walk(node, (), positions, filename, constructor)
    finally:
        constructor.dispose()
    return value, positions


def _walk(
    node: yaml.Node, loc: Loc, pos: Positions, filename: str, ctor: yaml.SafeLoader
) -> Any:
    pos.values[loc] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = _scalar(key_node, ctor)
            if key in out:
                raise YamlError(
                    f"{filename}:{key_node.start_mark.line + 1} {_dotted((*loc, key))}: "
                    "duplicate key; keep only one"
                )
            child = (*loc, key)
            pos.keys[child] = key_node.start_mark.line + 1
            out[key] = _walk(value_node, child, pos, filename, ctor)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_walk(item, (*loc, i), pos, filename, ctor) for i, item in enumerate(node.value)]
    return _scalar(node, ctor)


# PyYAML follows YAML 1.1, where `1e-4` (no dot) is a string; YAML 1.2 and every user
# reads it as a number, so plain (unquoted) scalars of that shape become floats.
_FLOAT_12 = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$")


def _scalar(node: yaml.Node, ctor: yaml.SafeLoader) -> Any:
    # Construct scalars with PyYAML's own resolver so `2.0e-4`, `true`, `null` keep their types.
    value = ctor.construct_object(node, deep=True)
    if isinstance(value, str) and isinstance(node, yaml.ScalarNode) and not node.style:
        # (plain style is None from PyYAML's parser and '' from libyaml's)
        if _FLOAT_12.match(value):
            return float(value)
    return value


def _dotted(loc: Loc) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


dotted = _dotted


def load_data(text: str) -> Any:
    """Parse a trusted data file (catalogs, model tables) with the fast safe loader."""
    return yaml.load(text, Loader=_LOADER)  # noqa: S506 - a safe loader
