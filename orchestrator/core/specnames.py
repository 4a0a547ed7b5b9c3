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
            meant = gpu_suggestion(gpu)
            hint = f"did you mean {meant!r}? " if meant else ""
            found.add(("resources", "gpus", i), f"unknown GPU {gpu!r}; {hint}known: "
                      f"{', '.join(known)}")
    providers = catalog.provider_names()
    for i, prov in enumerate(providers_given):
        if prov is not None and prov not in providers:
            close = closest(prov, providers, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            found.add(("resources", "providers", i), f"unknown provider {prov!r}; {hint}"
                      f"known: {', '.join(providers)}")


# Words that name no model: the vendor and product lines around the model number.
_VENDOR_WORDS = {"nvidia", "geforce", "tesla"}


def _words(name: str) -> list[str]:
    """`name`'s words, lower case, vendor words left out ("NVIDIA H100s" -> h100, s)."""
    return [w for w in re.findall(r"[a-z]*[0-9]+|[a-z]+", name.lower())
            if w not in _VENDOR_WORDS]


def _model_number(joined: str) -> str | None:
    """The model number in a joined spelling: digits, with a one-letter series prefix kept
    (h100 and a100 differ; rtx4090 and 4090 do not)."""
    found = re.search(r"([a-z]*)([0-9]+)", joined)
    if found is None:
        return None
    prefix = found.group(1)
    return (prefix if len(prefix) == 1 else "") + found.group(2)


def _spellings() -> dict[str, str]:
    """Every spelling of a GPU orch knows (its name, aliases, the providers' own names),
    joined words → the name to suggest: the model's, or the family's ("H100") when the
    spelling names several."""
    from providers import catalog

    out: dict[str, str] = {}
    for gpu in catalog.gpus().values():
        names = [gpu.name, *gpu.aliases]
        names += [n for p in catalog.provider_names()
                  for n in catalog.spellings(p).get(gpu.name, ())]
        for spelling in names:
            hits = catalog.resolve_gpu(spelling) or [gpu.name]
            out.setdefault("".join(_words(spelling)), hits[0] if len(hits) == 1 else spelling)
    return out


def gpu_suggestion(name: str) -> str | None:
    """The GPU a misspelt `name` most likely means (None: no good guess).

    Among the known spellings with the same model number, the closest (difflib; a tie
    between models is their family: "H100-80GB" → H100); else the longest run of its words
    that is a known spelling; else, for a name without a model number, the closest of all.
    """
    import difflib

    known = _spellings()
    words = _words(name)
    joined = "".join(words)
    number = _model_number(joined)
    same = [k for k in known if number is not None and _model_number(k) == number]
    if number is not None and same:
        ratio = {k: difflib.SequenceMatcher(None, joined, k).ratio() for k in same}
        best = max(ratio.values())
        tops = sorted({known[k] for k in same if ratio[k] == best})
        return tops[0] if len(tops) == 1 else known.get(number, tops[0])
    for size in range(len(words), 0, -1):
        for start in range(len(words) - size + 1):
            hit = known.get("".join(words[start:start + size]))
            if hit is not None:
                return hit
    if number is not None:
        return None  # a model number orch does not know (V100, T4): no look-alike to offer
    close = closest(joined, known, n=1, cutoff=0.6)
    return known[close[0]] if close else None


def with_name_problems(problems: list[str], raw: Any, name: str, pos: yamlpos.Positions,
                       more: Sequence[tuple[int, str]] = ()) -> list[str]:
    """`problems` (the schema's, sorted by line) and those of `check_names` on the raw data, by
    line; a line the schema already complained about gets no second message. `more`: (line,
    message) found otherwise (the files the job names), all kept."""
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
    merged += [item for item in dict.fromkeys(more) if item not in merged]
    return [msg for _, msg in sorted(merged, key=lambda item: item[0])]
