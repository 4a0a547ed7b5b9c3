"""A bench script (bench/NAME.py) loaded as a module, for the tests of its pure parts.

bench/ is not a package orch installs, so its scripts are loaded from their files."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from termutil import ROOT


def load(name: str) -> ModuleType:
    """bench/`name`.py, registered as module `name`."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module
