"""A sweep's problems as `file:line key: message`, each pointing at the override (or the
base job file's line) at fault (pure; used by sweepspec's loading)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.core import spec as jobspec
from orchestrator.core import yamlpos
from orchestrator.core.hubsize import HubSizer
from orchestrator.core.spec import JobSpec, LoadedJob, SpecError
from orchestrator.core.sweepdraws import Origin, draws_of

if TYPE_CHECKING:
    from orchestrator.core.sweepmodel import SweepSpec


def problem(filename: str, pos: yamlpos.Positions, loc: tuple[str | int, ...],
            msg: str) -> tuple[int, str]:
    """`(line, "file:line key: msg")` for a problem at `loc` of the sweep file."""
    line = pos.line(loc)
    return line, f"{filename}:{line} {yamlpos.dotted(loc) or '(top level)'}: {msg}"


# Problems in the base file (caused by a run's combination) sort after the sweep file's own.
AFTER_SWEEP_LINES = 10**9


def ordered(problems: list[tuple[int, str]]) -> list[str]:
    """The messages, by line, each once."""
    return [m for _, m in sorted(dict.fromkeys(problems), key=lambda p: p[0])]


@dataclass
class RunProblems:
    """A sweep's problems, each pointing at the override (or the base file line) at fault."""

    spec: SweepSpec
    name: str  # the sweep file
    pos: yamlpos.Positions
    base_name: str
    base_pos: yamlpos.Positions
    found: list[tuple[int, str]] = field(default_factory=list)
    # Random problems are reported once per parameter: n samples would repeat them n times.
    random_seen: set[str] = field(default_factory=set)
    # The base job's Hub dataset sizes (a run overriding the dataset asks for tokens).
    hub_size: HubSizer | None = None

    def report(self, origins: list[Origin], msg_loc: tuple[str | int, ...] | None,
               msg: str, line_in_base: int | None) -> None:
        """Record one problem of the run made of `origins`."""
        dotted = yamlpos.dotted(msg_loc) if msg_loc else ""
        # A problem elsewhere (a dataset row, say) has no location to match an override by.
        for o in origins if msg_loc else []:
            if not _related(dotted, o.key):
                continue
            inner = "" if dotted == o.key else f"{dotted}: "
            if o.sample is not None:
                if o.key in self.random_seen:
                    return
                self.random_seen.add(o.key)
                inner = f"sample {o.sample} of {draws_of(self.spec)}: {inner}"
            self.found.append(problem(self.name, self.pos, o.loc, inner + msg))
            return
        # Not caused by one override alone: the combination with the base file is at fault.
        given = ", ".join(f"{o.key}={o.value!r}" for o in origins)
        given += f" from {self.name}:{self.pos.line(origins[0].loc)}" if origins else ""
        if msg_loc is None:
            self.found.append((AFTER_SWEEP_LINES, f"{msg} (in the run with {given})"))
            return
        line = line_in_base or self.base_pos.line(msg_loc)
        self.found.append((AFTER_SWEEP_LINES, f"{self.base_name}:{line} "
                           f"{dotted or '(top level)'}: {msg} (in the run with {given})"))

    def resolve(self, job: JobSpec, base_path: Path, origins: list[Origin]) -> LoadedJob | None:
        """`jobspec.resolve` of the run's spec; None (its problems recorded) if it fails."""
        try:
            return jobspec.resolve(job, base_path, self.base_pos, self.hub_size)
        except SpecError as exc:
            for p in exc.problems:
                line, loc_text, msg = _split_problem(p, self.base_name)
                if loc_text is None:
                    self.report(origins, None, p, None)
                else:
                    self.report(origins, _parse_dotted(loc_text), msg, line)
            return None


def _related(dotted: str, key: str) -> bool:
    """Whether an error at `dotted` is inside the override `key`, or `key` is inside it."""
    def inside(a: str, b: str) -> bool:
        return a == b or a.startswith(b + ".") or a.startswith(b + "[")
    return inside(dotted, key) or inside(key, dotted)


def _split_problem(problem: str, base_name: str) -> tuple[int | None, str | None, str]:
    """(line, dotted location, message) of a resolve() problem in the base file's format."""
    prefix = base_name + ":"
    if not problem.startswith(prefix):
        return None, None, problem  # about another file (a dataset row, say)
    line_text, _, rest = problem[len(prefix):].partition(" ")
    loc_text, sep, msg = rest.partition(": ")
    if not line_text.isdigit() or not sep:
        return None, None, problem
    return int(line_text), loc_text, msg


def _parse_dotted(text: str) -> tuple[str | int, ...]:
    out: list[str | int] = []
    for part in text.split("."):
        head, *indices = part.split("[")
        out.append(head)
        out.extend(int(i.rstrip("]")) for i in indices if i.rstrip("]").isdigit())
    return tuple(out)


