"""Which configured provider could run a job: the one check every path that queues work makes
first (`orch submit` in all its modes, `orch sweep`), and what `orch plan` reports.

Only credentials and registered servers are looked at (no network, no heavy imports), so
`orch plan` can say it too. Price catalogs (`cloud`, `dedicated-host`) estimate costs but
run nothing: a job runs on `vastai`/`runpod` with an API key, on `dedicated` (a registered
server), or on an opt-in provider (the simulated cloud) when the job names it.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from orchestrator.engine.wiring import CLOUDS, cloud_keys, declares, keyless
from providers.base import OptInOnly

# What to configure when nothing can run a job (README: "Providers").
HOW_TO_CONFIGURE = ("Set VAST_API_KEY or RUNPOD_API_KEY, register a server with `orch servers "
                    "add`, or try the simulated cloud with `resources.providers: [sim]` (see "
                    "examples/quickstart.yml)")


class Runners(NamedTuple):
    """The configured providers that could run a job, and why the others cannot."""

    providers: tuple[str, ...]
    notes: tuple[str, ...]

    def __bool__(self) -> bool:
        return bool(self.providers)

    def problem(self, file: Path | str) -> str:
        """The error when nothing can run the job in `file` (exit 3, nothing recorded)."""
        why = "; ".join(self.notes) or "no provider configured"
        return (f"{file}: nothing can run this job here ({why}). {HOW_TO_CONFIGURE}. Nothing "
                "was recorded.")


def runners(named: list[str] | None, has_servers: bool,
            configured: frozenset[str] | None = None, notes: list[str] | None = None
            ) -> Runners:
    """Who could run a job whose `resources.providers` is `named` (None: any).

    `configured`/`notes` default to the clouds with credentials here and the adapters that
    need no key (the simulated cloud, the server table), which are always configured; but a
    provider that is opt-in only (`OptInOnly`) runs only jobs that name it, and `dedicated`
    only with a server registered.
    """
    if configured is None:
        keys, notes = cloud_keys()
        configured = frozenset({*keyless(), *keys})
    found = []
    left_out = list(notes or [])
    for name in sorted(configured):
        if named is not None and name not in named:
            continue
        if declares(name, OptInOnly) and not (named and name in named):
            continue
        if name == "dedicated" and not has_servers:
            if named is not None:
                left_out.append("dedicated: no server registered (`orch servers add`)")
            continue
        found.append(name)
    if named is not None:
        # A named cloud without a key: say so even when its note was about another cloud.
        left_out = [n for n in left_out if n.split(":", 1)[0] in named]
        catalogs = [n for n in named if n not in configured and n not in CLOUDS]
        left_out += [f"{n}: a price catalog, it runs nothing" for n in catalogs]
    return Runners(tuple(found), tuple(left_out))
