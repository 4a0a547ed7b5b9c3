"""orch's shipped YAML data files (catalogs, GPU specs, model shapes, thresholds), read through
a compiled cache as Python reads modules through their bytecode.

`orch plan` reads eight of these files on every start; parsing them (libyaml's parser, PyYAML's
Python constructor) was ~15 ms of its ~220 ms. `read_yaml` keeps what it parsed beside the file
in `__pycache__/<name>.<cache tag>.marshal`, stamped with the YAML's size and modification time
(as a .pyc is by default), and takes the cache only while both still match: an edited file is
parsed afresh, whatever the cache holds. The cache is written where Python would write bytecode
(not under PYTHONDONTWRITEBYTECODE, honouring PYTHONPYCACHEPREFIX); `scripts/install` writes it
once for every shipped file (`python -m providers.datacache orchestrator providers playbooks`),
as it compiles orch's modules, so that machines which never write bytecode still use it.

`marshal` (the format of .pyc files, built into the interpreter: nothing to import, read in C)
carries what these files hold: mappings, lists, text, numbers, booleans, nulls. A file holding
anything else (a YAML date, say) is not cached and is parsed on each read, as before. The
name carries the interpreter's cache tag, as marshal's format is the interpreter's own.

Layer: the bottom one with `providers.retrying`; it imports nothing of orch's, so core, the
providers and the playbooks all read their data through it (tests/test_layers.py).
"""

from __future__ import annotations

import contextlib
import marshal
import os
import sys
from pathlib import Path
from typing import Any

import yaml

# Bumped when the cache's layout changes: an older cache is then ignored, never misread.
_FORMAT = 1
# libyaml's safe loader where installed (as every reader of these files used before).
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def cache_path(path: Path) -> Path:
    """Where the cache of the YAML file `path` lives (where its .pyc would, were it a module)."""
    name = f"{path.name}.{sys.implementation.cache_tag}.marshal"
    if sys.pycache_prefix:
        folder = path.parent.resolve()
        return Path(sys.pycache_prefix, *folder.parts[1:], name)
    return path.parent / "__pycache__" / name


def _stamp(path: Path) -> tuple[int, int, int]:
    st = path.stat()
    return _FORMAT, st.st_mtime_ns, st.st_size


def _cached(cache: Path, stamp: tuple[int, int, int]) -> tuple[bool, Any]:
    try:
        found = marshal.loads(cache.read_bytes())
    except (OSError, EOFError, ValueError, TypeError):  # none, or not one of ours
        return False, None
    if isinstance(found, tuple) and len(found) == 2 and found[0] == stamp:
        return True, found[1]
    return False, None


def write_cache(path: Path, data: Any, stamp: tuple[int, int, int] | None = None) -> None:
    """Keep `data`, parsed from `path`, as its cache; a folder orch cannot write, or data
    marshal cannot carry, is no error (the file is then parsed on each read, as before)."""
    cache = cache_path(path)
    tmp = cache.with_name(f"{cache.name}.{os.getpid()}.tmp")
    try:
        blob = marshal.dumps((stamp or _stamp(path), data))
    except ValueError:  # "unmarshallable object"
        return
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(blob)
        os.replace(tmp, cache)  # whole or not at all: a reader never sees half a cache
    except OSError:
        with contextlib.suppress(OSError):  # no folder there: nothing was written
            tmp.unlink(missing_ok=True)


def parse_yaml(text: str) -> Any:
    """Parse trusted YAML data text with the fast safe loader."""
    return yaml.load(text, Loader=_LOADER)  # noqa: S506 - a safe loader


def read_yaml(path: Path) -> Any:
    """The parsed content of the shipped YAML file `path`: from its cache while the cache
    matches the file's size and modification time, else parsed (and the cache written)."""
    stamp = _stamp(path)
    hit, data = _cached(cache_path(path), stamp)
    if hit:
        return data
    data = parse_yaml(path.read_text(encoding="utf-8"))
    if not sys.dont_write_bytecode:
        write_cache(path, data, stamp)
    return data


def compile_all(roots: list[Path]) -> list[Path]:
    """Write the cache of every YAML file under `roots` (the install step); the files done."""
    done = []
    for root in roots:
        for path in sorted(root.rglob("*.yaml")):
            if "__pycache__" not in path.parts:
                write_cache(path, parse_yaml(path.read_text(encoding="utf-8")))
                done.append(path)
    return done


if __name__ == "__main__":
    compile_all([Path(a) for a in sys.argv[1:]])
