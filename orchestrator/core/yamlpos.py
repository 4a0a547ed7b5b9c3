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
    except RecursionError:
        # The pure-Python composer recurses once per nesting level.
        raise YamlError(f"{filename}: not valid YAML: nested deeper than {MAX_DEPTH} "
                        "levels") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise YamlError(f"{filename}{line}: not valid YAML: {problem}") from None
    positions = Positions()
    if node is None:
        return None, positions
    walker = _Walker(filename, positions)
    try:
        value = walker.walk(node, ())
    finally:
        walker.ctor.dispose()
    return value, positions


# A job file has a few dozen values; aliases that expand past this are an "alias bomb".
MAX_NODES = 100_000
# A job file nests 3-4 levels (trainer.extra a few more); past this it is a generated or
# hostile file, and deeper values could not be serialized into the database anyway.
MAX_DEPTH = 32
# Digits in an integer: past this no field accepts it (and Python refuses past 4,300).
MAX_DIGITS = 30
_MERGE_TAG = "tag:yaml.org,2002:merge"
_INT_TAG = "tag:yaml.org,2002:int"


class _Walker:
    """Turns a composed node tree into plain values, recording each one's line."""

    def __init__(self, filename: str, pos: Positions) -> None:
        self.filename = filename
        self.pos = pos
        self.ctor = yaml.SafeLoader("")
        self.nodes = 0
        self.open: list[yaml.Node] = []  # the collections being walked, outermost first

    def fail(self, node: yaml.Node, loc: Loc, problem: str) -> YamlError:
        where = _dotted(loc) or "(top level)"
        return YamlError(f"{self.filename}:{node.start_mark.line + 1} {where}: {problem}")

    def walk(self, node: yaml.Node, loc: Loc) -> Any:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise self.fail(node, loc, f"more than {MAX_NODES:,} values (do aliases expand "
                            "recursively?); write the values out")
        if len(loc) >= MAX_DEPTH:
            raise self.fail(node, loc[:MAX_DEPTH], f"nested deeper than {MAX_DEPTH} levels "
                            "(a recursive alias?); flatten it")
        if node in self.open:
            raise self.fail(node, loc, "a recursive alias (it contains itself); write the "
                            "values out")
        self.pos.values[loc] = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode | yaml.SequenceNode):
            self.open.append(node)
            try:
                return self.collection(node, loc)
            finally:
                self.open.pop()
        return self.scalar(node, loc)

    def collection(self, node: yaml.Node, loc: Loc) -> Any:
        if isinstance(node, yaml.MappingNode):
            out: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                if key_node.tag == _MERGE_TAG:
                    raise self.fail(key_node, loc, "merge keys (<<) are not supported; write "
                                    "the keys out")
                if not isinstance(key_node, yaml.ScalarNode):
                    raise self.fail(key_node, loc, "keys must be plain names, not lists or "
                                    "mappings")
                key = self.scalar(key_node, loc)
                if not isinstance(key, str):
                    raise self.fail(key_node, loc, f"keys must be names (got {key!r}); quote "
                                    "it if it is meant as a name")
                if key in out:
                    raise self.fail(key_node, (*loc, key), "duplicate key; keep only one")
                child = (*loc, key)
                self.pos.keys[child] = key_node.start_mark.line + 1
                out[key] = self.walk(value_node, child)
            return out
        return [self.walk(item, (*loc, i)) for i, item in enumerate(node.value)]

    def scalar(self, node: yaml.Node, loc: Loc) -> Any:
        if node.tag == _INT_TAG and sum(c.isdigit() for c in str(node.value)) > MAX_DIGITS:
            raise self.fail(node, loc, f"an integer with more than {MAX_DIGITS} digits; no "
                            "field takes one that large")
        # PyYAML's own constructor keeps `2.0e-4`, `true`, `null` typed as YAML means them.
        try:
            value = self.ctor.construct_object(node, deep=True)
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or str(exc)
            raise self.fail(node, loc, f"not a plain value: {problem}") from None
        except ValueError as exc:  # e.g. a base-60 integer past Python's digit limit
            raise self.fail(node, loc, f"not a plain value: {str(exc)[:80]}") from None
        plain = isinstance(node, yaml.ScalarNode) and not node.style
        if isinstance(value, str) and plain and _FLOAT_12.match(value):
            # (plain style is None from PyYAML's parser and '' from libyaml's)
            return float(value)
        return value


# PyYAML follows YAML 1.1, where `1e-4` (no dot) is a string; YAML 1.2 and every user
# reads it as a number, so plain (unquoted) scalars of that shape become floats.
_FLOAT_12 = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$")


def _dotted(loc: Loc) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


dotted = _dotted
