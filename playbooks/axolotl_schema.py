"""Check a rendered axolotl config against axolotl's own schema for the pinned version.

The schema (field names and simple types) is extracted from axolotl's source distribution by
scripts/axolotl_schema.py into playbooks/data/axolotl_schema.json. `problems(config)` names
every key axolotl does not know and every value of an incompatible type, so a renderer
change (or a key another module adds, e.g. a memory saver's plugin keys) that axolotl would
reject is caught without a GPU, torch or axolotl installed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cache
from importlib import resources
from typing import Any


@cache
def schema() -> dict[str, Any]:
    """playbooks/data/axolotl_schema.json (read once)."""
    text = resources.files("playbooks").joinpath("data", "axolotl_schema.json").read_text()
    data: dict[str, Any] = json.loads(text)
    return data


def problems(config: Mapping[str, Any]) -> list[str]:
    """What axolotl's schema rejects in `config` (empty when every key and value fits)."""
    doc = schema()
    fields: dict[str, Any] = dict(doc["fields"])
    enabled = set(config.get("plugins") or [])
    plugin_of: dict[str, str] = {}
    for plugin, keys in doc["plugins"].items():
        for key, kind in keys.items():
            plugin_of[key] = plugin
            if plugin in enabled:
                fields[key] = kind
    found: list[str] = []
    for key, value in config.items():
        if key not in fields:
            if key in plugin_of:
                found.append(f"{key}: needs plugins: [{plugin_of[key]}]")
            else:
                found.append(f"{key}: not an axolotl {doc['axolotl_version']} config key")
            continue
        found += _check(key, value, fields[key], doc["models"])
    return found + rule_problems(config)


def rule_problems(config: Mapping[str, Any]) -> list[str]:
    """axolotl 0.18.0's cross-field validators orch's layouts touch (the schema file holds
    types only): each message is axolotl's own, with its place in utils/schemas/validation.py.
    """
    found = []
    fsdp_config = config.get("fsdp_config") or {}
    if config.get("deepspeed") and (config.get("fsdp") or fsdp_config):
        # validation.py:1226-1229 (`fsdp`); accelerate takes one backend, so orch also
        # refuses DeepSpeed beside an `fsdp_config`.
        found.append("deepspeed: deepspeed and fsdp cannot be used together.")
    optimizer = str(config.get("optimizer"))
    if fsdp_config and str(config.get("fsdp_version")) == "2":
        if optimizer in ("adamw_8bit", "adamw_bnb_8bit"):  # validation.py:1140-1153
            found.append(f"optimizer: FSDP2 not compatible with {optimizer}, use "
                         "`adamw_torch_8bit` instead")
        if fsdp_config.get("offload_params") and "8bit" in optimizer:
            # examples/gpt-oss/gpt-oss-20b-fft-fsdp2-offload.yaml:40
            found.append(f"optimizer: 8bit optimizers do not work with FSDP2 offload "
                         f"(got {optimizer})")
    return found


def _check(where: str, value: Any, kinds: list[Any], models: dict[str, Any]) -> list[str]:
    deepest: list[str] = []
    for kind in kinds:
        inner = _fits(where, value, kind, models)
        if inner is None:
            return []
        if inner and (not deepest or len(inner) < len(deepest)):
            deepest = inner  # the closest model by shape: report what inside it is wrong
    if deepest:
        return deepest
    return [f"{where}: {value!r} ({type(value).__name__}) is not one of "
            f"{_describe(kinds)}"]


def _fits(where: str, value: Any, kind: Any, models: dict[str, Any]) -> list[str] | None:
    """None when `value` fits `kind`; else [] (no match) or the problems inside a model."""
    if kind == "any":
        return None
    if isinstance(kind, str):
        ok = {
            "str": isinstance(value, str),
            "int": isinstance(value, int) and not isinstance(value, bool),
            "float": isinstance(value, int | float) and not isinstance(value, bool),
            "bool": isinstance(value, bool),
            "null": value is None,
            "dict": isinstance(value, dict),
        }.get(kind, False)
        return None if ok else []
    if "literal" in kind:
        return None if value in kind["literal"] else []
    if "list" in kind:
        if not isinstance(value, list):
            return []
        inner = [p for i, item in enumerate(value)
                 for p in _check(f"{where}[{i}]", item, kind["list"], models)]
        return inner or None
    if "model" in kind:
        if not isinstance(value, dict):
            return []
        spec = models.get(kind["model"], {})
        inner = []
        for key, item in value.items():
            if key not in spec:
                inner.append(f"{where}.{key}: not a field of axolotl's {kind['model']}")
            else:
                inner += _check(f"{where}.{key}", item, spec[key], models)
        return inner or None
    return []


def _describe(kinds: list[Any]) -> str:
    out = []
    for kind in kinds:
        if isinstance(kind, str):
            out.append(kind)
        elif "literal" in kind:
            out.append(" | ".join(repr(v) for v in kind["literal"][:8]))
        elif "list" in kind:
            out.append(f"list of ({_describe(kind['list'])})")
        else:
            out.append(kind["model"])
    return ", ".join(out)
