#!/usr/bin/env python3
"""Regenerate playbooks/data/axolotl_schema.json: axolotl's config keys and simple types.

Downloads the axolotl source distribution of the pinned version from PyPI (or reads one
given with --sdist), checks its sha256 when --sha256 is given, and PARSES (ast; importing
axolotl needs torch) the pydantic models under src/axolotl/utils/schemas/ and every
integration's args.py (cut_cross_entropy, liger, ...). The result lists, for the top-level
config (`AxolotlInputConfig` and the classes it derives from) and for each nested model,
every field with its type reduced to what a YAML value can be checked against:

    "str" "int" "float" "bool" "null" "dict" "any"
    {"list": [alternatives]}  {"model": "ClassName"}  {"literal": [values]}

Integration fields carry the plugin that enables them. tests/test_axolotl_schema.py renders
every config orch can produce and checks each key and value against this file.

    .venv/bin/python scripts/axolotl_schema.py            # version from images.yaml
    .venv/bin/python scripts/axolotl_schema.py --sdist /tmp/axolotl-0.18.0.tar.gz
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "playbooks" / "data" / "axolotl_schema.json"
TOP = "AxolotlInputConfig"

Type = list[Any]  # alternatives

_SIMPLE = {"str": "str", "int": "int", "float": "float", "bool": "bool", "dict": "dict",
           "Any": "any", "None": "null", "PositiveInt": "int", "NonNegativeInt": "int",
           "PositiveFloat": "float", "NonNegativeFloat": "float", "StrictBool": "bool",
           "StrictStr": "str", "StrictInt": "int", "Path": "str", "bytes": "str",
           "Dict": "dict", "object": "any"}
_LISTS = {"list", "List", "tuple", "Tuple", "set", "Set", "Sequence"}
_DICTS = {"dict", "Dict", "Mapping"}


class Module:
    """The classes of one parsed source file."""

    def __init__(self, path: str, tree: ast.Module) -> None:
        self.path = path
        self.classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
        self.aliases: dict[str, ast.expr] = {}
        for node in tree.body:  # `Name = Literal[...]` style aliases
            if (isinstance(node, ast.Assign) and len(node.targets) == 1
                    and isinstance(node.targets[0], ast.Name)):
                self.aliases[node.targets[0].id] = node.value


class Extractor:
    """Turns annotations into simple types, given every class and enum found."""

    def __init__(self, modules: list[Module]) -> None:
        self.classes: dict[str, ast.ClassDef] = {}
        self.aliases: dict[str, ast.expr] = {}
        for module in modules:
            self.classes.update(module.classes)
            self.aliases.update(module.aliases)
        self.models: dict[str, dict[str, Type]] = {}

    def is_enum(self, name: str) -> bool:
        node = self.classes.get(name)
        return node is not None and any(_base_name(b).endswith("Enum") for b in node.bases)

    def enum_values(self, name: str) -> list[Any]:
        values = []
        for stmt in self.classes[name].body:
            if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant):
                values.append(stmt.value.value)
        return values

    def fields(self, name: str, seen: frozenset[str] = frozenset()) -> dict[str, Type]:
        """A model's fields, its bases' included (bases first, like pydantic)."""
        node = self.classes.get(name)
        if node is None or name in seen:
            return {}
        out: dict[str, Type] = {}
        for base in node.bases:
            out.update(self.fields(_base_name(base), seen | {name}))
        for stmt in node.body:
            if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                    and not stmt.target.id.startswith("_")
                    and _base_name(stmt.annotation) != "ClassVar"
                    and stmt.target.id != "model_config"):
                out[stmt.target.id] = self.type_of(stmt.annotation)
        return out

    def model(self, name: str) -> dict[str, Any]:
        """Reference a nested model, extracting it once."""
        if name not in self.models:
            self.models[name] = {}
            self.models[name] = self.fields(name)
        return {"model": name}

    def type_of(self, node: ast.expr | None) -> Type:
        if node is None:
            return ["any"]
        if isinstance(node, ast.Constant):
            if node.value is None:
                return ["null"]
            if isinstance(node.value, str):  # a string annotation
                return self.type_of(ast.parse(node.value, mode="eval").body)
            return ["any"]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            return _merge(self.type_of(node.left), self.type_of(node.right))
        if isinstance(node, ast.Name | ast.Attribute):
            name = _base_name(node)
            if name in _SIMPLE:
                return [_SIMPLE[name]]
            if name in _LISTS:
                return [{"list": ["any"]}]
            if self.is_enum(name):
                return [{"literal": self.enum_values(name)}]
            if name in self.aliases:
                return self.type_of(self.aliases[name])
            if name in self.classes:
                return [self.model(name)]
            return ["any"]  # a type from another package (e.g. transformers' OptimizerNames)
        if isinstance(node, ast.Subscript):
            head = _base_name(node.value)
            args = list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]
            if head in ("Optional",):
                return _merge(self.type_of(args[0]), ["null"])
            if head == "Union":
                out: Type = []
                for arg in args:
                    out = _merge(out, self.type_of(arg))
                return out
            if head == "Annotated":
                return self.type_of(args[0])
            if head == "Literal":
                return [{"literal": [a.value for a in args if isinstance(a, ast.Constant)]}]
            if head in _LISTS:
                return [{"list": self.type_of(args[0])}]
            if head in _DICTS:
                return ["dict"]
            if head in ("conint",):
                return ["int"]
            return self.type_of(node.value)
        if isinstance(node, ast.Call) and _base_name(node.func) in ("conint", "confloat",
                                                                    "constr", "conlist"):
            return [{"conint": "int", "confloat": "float", "constr": "str",
                     "conlist": {"list": ["any"]}}[_base_name(node.func)]]
        return ["any"]


def _merge(a: Type, b: Type) -> Type:
    out = list(a)
    for item in b:
        if item not in out:
            out.append(item)
    return out


def _base_name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript):
        return _base_name(node.value)
    return ""


def _parse(root: Path, paths: list[Path]) -> list[Module]:
    return [Module(str(p.relative_to(root)), ast.parse(p.read_text(), str(p))) for p in paths]


def extract(src: Path, version: str, sdist_name: str, sha256: str) -> dict[str, Any]:
    """The schema document from an unpacked sdist's top directory."""
    pkg = src / "src" / "axolotl"
    schema_files = sorted((pkg / "utils" / "schemas").rglob("*.py"))
    integration_dirs = sorted(p for p in (pkg / "integrations").iterdir()
                              if (p / "args.py").is_file())
    modules = _parse(src, schema_files + [d / "args.py" for d in integration_dirs])
    ex = Extractor(modules)
    fields = ex.fields(TOP)
    if "base_model" not in fields or "datasets" not in fields:
        raise SystemExit(f"{TOP} not found or incomplete in {pkg}: the layout changed")
    plugins: dict[str, dict[str, Any]] = {}
    for folder in integration_dirs:
        args = _parse(src, [folder / "args.py"])[0]
        plugin = _plugin_class(src, folder)
        keys: dict[str, Type] = {}
        for name in args.classes:
            if name.endswith("Args"):
                keys.update(ex.fields(name))
        if keys and plugin:
            plugins[f"axolotl.integrations.{folder.name}.{plugin}"] = keys
    return {
        "axolotl_version": version,
        "sdist": sdist_name,
        "sha256": sha256,
        "generated_by": "scripts/axolotl_schema.py",
        "source_files": [m.path for m in modules],
        "fields": dict(sorted(fields.items())),
        "plugins": plugins,
        "models": dict(sorted(ex.models.items())),
    }


def _plugin_class(src: Path, folder: Path) -> str | None:
    for path in (folder / "__init__.py", folder / "plugin.py"):
        if not path.is_file():
            continue
        for cls in _parse(src, [path])[0].classes.values():
            if any(_base_name(b) == "BasePlugin" for b in cls.bases):
                return cls.name
    return None


def _pinned_version() -> str:
    for line in (ROOT / "playbooks" / "data" / "images.yaml").read_text().splitlines():
        if line.startswith("version:"):
            return line.split(":", 1)[1].strip().strip('"')
    raise SystemExit("no version: in playbooks/data/images.yaml")


def _download(version: str, into: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary",
                    ":all:", f"axolotl=={version}", "-d", str(into)], check=True,
                   stdout=subprocess.DEVNULL)
    found = sorted(into.glob(f"axolotl-{version}.tar.gz"))
    if not found:
        raise SystemExit(f"pip downloaded no axolotl-{version}.tar.gz into {into}")
    return found[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", default=None, help="axolotl version (images.yaml's)")
    parser.add_argument("--sdist", type=Path, help="a downloaded axolotl-VERSION.tar.gz")
    parser.add_argument("--sha256", help="refuse an sdist with another sha256")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    version = args.version or _pinned_version()
    with tempfile.TemporaryDirectory(prefix="axolotl-schema-") as tmp:
        sdist = args.sdist or _download(version, Path(tmp))
        digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
        if args.sha256 and digest != args.sha256:
            raise SystemExit(f"{sdist}: sha256 {digest}, expected {args.sha256}")
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp, filter="data")
        top = Path(tmp) / f"axolotl-{version}"
        doc = extract(top, version, sdist.name, digest)
    args.out.write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n")
    print(f"{args.out}: {len(doc['fields'])} fields, {len(doc['models'])} nested models, "
          f"{len(doc['plugins'])} plugins from {sdist.name} ({digest[:12]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
