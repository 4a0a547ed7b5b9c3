"""The names a job file gives (GPU models, providers, trainer.extra keys), checked against
orch's catalogs: on a validated spec, and on the raw file when the schema refused it, so that
one run reports every problem of a file (README: all at once)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from orchestrator.core import yamlpos
from orchestrator.core.specerrors import Problems, closest


def check_names(extra: Mapping[Any, Any], gpus: Sequence[str | None],
                providers_given: Sequence[str | None], found: Problems) -> None:
    """trainer.extra keys orch sets itself, and unknown GPU and provider names; on plain
    values, so also on a file the schema refused (None entries are skipped)."""
    from playbooks.axolotl import extra_clash
    from providers import catalog  # data only; kept here so the schema stays import-light

    for key in extra:
        why = extra_clash(key) if isinstance(key, str) else None
        if why:
            found.add(("trainer", "extra", key), why)
    for i, gpu in enumerate(gpus):
        if gpu is not None and not catalog.resolve_gpu(gpu):
            known = list(catalog.gpus())
            close = closest(gpu, known, n=1, cutoff=0.5)
            hint = f"did you mean {close[0]!r}? " if close else ""
            found.add(("resources", "gpus", i), f"unknown GPU {gpu!r}; {hint}known: "
                      f"{', '.join(known)}")
    providers = catalog.provider_names()
    for i, prov in enumerate(providers_given):
        if prov is not None and prov not in providers:
            close = closest(prov, providers, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            found.add(("resources", "providers", i), f"unknown provider {prov!r}; {hint}"
                      f"known: {', '.join(providers)}")


def with_name_problems(problems: list[str], raw: Any, name: str,
                       pos: yamlpos.Positions) -> list[str]:
    """`problems` (the schema's, sorted by line) and those of `check_names` on the raw data, by
    line; a line the schema already complained about gets no second message."""
    def section(*keys: str) -> Any:
        value = raw
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        return value

    def strings(value: Any) -> list[str | None]:  # None keeps the index of a non-string
        return [v if isinstance(v, str) else None for v in value] \
            if isinstance(value, list) else []

    found = Problems(name, pos)
    extra = section("trainer", "extra")
    check_names(extra if isinstance(extra, dict) else {}, strings(section("resources", "gpus")),
                strings(section("resources", "providers")), found)
    prefix = re.compile(rf"{re.escape(name)}:(\d+) ")
    merged = [(int(m.group(1)) if (m := prefix.match(p)) else 0, p) for p in problems]
    seen = {line for line, _ in merged}
    merged += [(line, msg) for line, msg in found.items if line not in seen]
    return [msg for _, msg in sorted(merged, key=lambda item: item[0])]
