"""The layers of docs/architecture.md, enforced: imports only point down, and never loop.

Every `import` and `from ... import` in orchestrator/, providers/, playbooks/ and simhost/
counts, at module level and inside functions alike (a function-level import that closes a
loop is still a loop; it only fails later). Within a layer, some siblings must not know
each other: a provider's folder another's, the store the sweep and history modules. Sizes:
no function over MAX_FUNCTION_LINES and no module over MAX_MODULE_LINES, except where the
module's docstring gives a reason in a line starting "Size:".
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("orchestrator", "providers", "playbooks", "simhost")
# Bottom to top: a module may import its own layer and the ones before it.
LAYERS = (
    "providers.retrying",   # the one retry policy (tenacity); imports nothing of ours
    "providers.datacache",  # shipped YAML data read through a compiled cache; nothing of ours
    "simhost",              # the simulated cloud's hosts (sshd + stand-ins); imports nothing
    "playbooks.ssh",        # SSH/SFTP to a host: argv only, pinned host keys; a leaf
    "providers",            # clouds and monthly servers behind one interface; catalogs
    "playbooks",            # what runs on a GPU host, step by step; the trainer's config
    "orchestrator.core",    # pure: job file, sizing, savers, scheduling, pricing, money
    "orchestrator.records",  # SQLite/PostgreSQL store, history, sweeps' bookkeeping
    "orchestrator.engine",  # running a job: placement, the pipeline, recovery, teardown
    "orchestrator.cli",     # the `orch` commands
)
# Packages only some layers may import: the simulated host is the `sim` provider's machinery,
# reached through its adapter; the engine, the playbooks and the CLI never name it.
ONLY_FROM = {"simhost": ("simhost", "providers.sim")}
# Within a layer, packages that may reach only some of their siblings: (importer, scope,
# what in scope it may import). The store is the bottom of records: it imports none of the
# sweep, history or SQL modules, only the sweep's rules (run states and the gate), a leaf
# its claim path shares with `orch sweep show`, and the JSON columns' models (`columns`).
SIBLING_RULES = (
    ("orchestrator.records.store", "orchestrator.records",
     ("orchestrator.records.store", "orchestrator.records.sweep.rules",
      "orchestrator.records.columns")),
)
# Stand-ins for the tools of a GPU host and the migrations are not application layers.
SIZE_EXEMPT = ("simhost/",)
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 600


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path) -> dict[str, Path]:
    return {module_name(p, root): p for pkg in PACKAGES if (root / pkg).is_dir()
            for p in sorted((root / pkg).rglob("*.py"))}


def imported(name: str, path: Path) -> Iterator[tuple[str, list[str], int]]:
    """(module, the names taken from it, line) for every import in module `name`'s file, at any
    depth: `import a.b` is ("a.b", [], line); relative imports are made absolute."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, [], node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")
                up = up[:len(up) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            yield base, [alias.name for alias in node.names], node.lineno


def imports(name: str, path: Path, known: dict[str, Path]) -> Iterator[tuple[str, int]]:
    """(imported module of ours, line) for every import in the file, at any depth."""
    for base, names, line in imported(name, path):
        if base.split(".")[0] not in PACKAGES:
            continue
        if not names:
            yield _ours(base, known), line
        for alias in names:
            sub = f"{base}.{alias}"
            yield (sub if sub in known else _ours(base, known)), line


def _ours(dotted: str, known: dict[str, Path]) -> str:
    """The longest known module that `dotted` names (a.b.c of a.b's attribute c: a.b)."""
    while dotted not in known and "." in dotted:
        dotted = dotted.rpartition(".")[0]
    return dotted


def layer(name: str) -> int:
    best = -1
    for i, prefix in enumerate(LAYERS):
        if (name == prefix or name.startswith(prefix + ".")) and \
                (best < 0 or len(prefix) > len(LAYERS[best])):
            best = i
    return best


def backward_arrows(root: Path) -> list[str]:
    known = modules(root)
    bad = []
    for name, path in known.items():
        here = layer(name)
        for target, line in imports(name, path, known):
            there = layer(target)
            if here < 0 or there < 0:
                bad.append(f"{path.relative_to(root)}:{line}: {name} or {target} is in no layer")
            elif there > here:
                bad.append(f"{path.relative_to(root)}:{line}: {name} ({LAYERS[here]}) imports "
                           f"{target} ({LAYERS[there]}), a layer above it")
            elif not _may_import(name, target):
                bad.append(f"{path.relative_to(root)}:{line}: {name} imports {target}, which "
                           f"only {' and '.join(ONLY_FROM[LAYERS[there]])} may import")
    return bad


def _may_import(name: str, target: str) -> bool:
    allowed = ONLY_FROM.get(LAYERS[layer(target)])
    return allowed is None or any(name == a or name.startswith(a + ".") for a in allowed)


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def provider_folders(root: Path) -> list[str]:
    """providers/<name>/ with a compute.py: one provider each (the adapter and its client)."""
    return sorted(f"providers.{p.parent.name}" for p in (root / "providers").glob("*/compute.py"))


def sideways(root: Path) -> list[str]:
    """Imports between siblings that must not know each other: one provider's folder and
    another's (the shared provider modules name no folder), and SIBLING_RULES."""
    known = modules(root)
    folders = provider_folders(root)

    def folder_of(module: str) -> str | None:
        return next((f for f in folders if _within(module, f)), None)

    bad = []
    for name, path in known.items():
        for target, line in imports(name, path, known):
            why = None
            there = folder_of(target)
            if _within(name, "providers") and there is not None and there != folder_of(name):
                why = ("provider folders are independent of each other, and the shared "
                       "provider modules name none of them")
            for importer, scope, allowed in SIBLING_RULES:
                if _within(name, importer) and _within(target, scope) \
                        and not any(_within(target, a) for a in allowed):
                    why = f"{importer} may reach only {' and '.join(allowed)} in {scope}"
            if why:
                bad.append(f"{path.relative_to(root)}:{line}: {name} imports {target}: {why}")
    return bad


def cycles(root: Path) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan), plus self-imports."""
    known = modules(root)
    graph = {n: sorted({t for t, _ in imports(n, p, known) if t in known and t != n
                        and not n.startswith(t + ".")})  # a package's own __init__ runs first
             for n, p in known.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def oversized(root: Path) -> list[str]:
    bad = []
    for path in modules(root).values():
        rel = path.relative_to(root).as_posix()
        if rel.startswith(SIZE_EXEMPT):
            continue
        tree = ast.parse(path.read_text(), rel)
        doc = ast.get_docstring(tree) or ""
        reason = any(line.strip().startswith("Size:") for line in doc.splitlines())
        lines = len(path.read_text().splitlines())
        if lines > MAX_MODULE_LINES and not reason:
            bad.append(f"{rel}: {lines} lines (over {MAX_MODULE_LINES}; split it or give a "
                       "'Size:' reason in its docstring)")
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    bad.append(f"{rel}:{node.lineno}: {node.name}() is {n} lines "
                               f"(over {MAX_FUNCTION_LINES})")
    return bad


def test_every_module_is_in_a_layer_and_imports_only_downwards() -> None:
    assert backward_arrows(ROOT) == []


def test_siblings_that_must_not_know_each_other_do_not() -> None:
    assert provider_folders(ROOT) == ["providers.dedicated", "providers.runpod", "providers.sim",
                                      "providers.vastai"]
    assert sideways(ROOT) == []


def test_no_import_cycles() -> None:
    assert cycles(ROOT) == []


def test_functions_and_modules_stay_small() -> None:
    assert oversized(ROOT) == []


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        f = tmp_path / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    for pkg in {Path(rel).parent for rel in files}:
        while pkg != Path("."):
            (tmp_path / pkg / "__init__.py").touch()
            pkg = pkg.parent
    return tmp_path


def test_the_checks_catch_a_backward_arrow_a_loop_and_a_long_function(tmp_path: Path) -> None:
    long_body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    root = _tree(tmp_path, {
        # The core reaching up into the engine, inside a function: still an arrow.
        "orchestrator/core/a.py": "def f():\n    from orchestrator.engine import b\n",
        "orchestrator/engine/b.py": "from orchestrator.core import a\n",
        "playbooks/ssh/c.py": "from ..train import t\n",
        "playbooks/train.py": "from playbooks.ssh import c\n\ndef g():\n" + long_body,
        # The engine reaching for the simulated host instead of asking the sim provider.
        "orchestrator/engine/d.py": "from simhost.host import SimHost\n",
        "providers/sim/compute.py": "from simhost import host\n",
        "simhost/host.py": "",
        # One provider reaching into another's folder; the shared interface naming one.
        "providers/vastai/compute.py": "from providers.sim import compute\n"
                                       "from providers import base\n",
        "providers/base.py": "from providers.sim.compute import x\n",
        # The retry policy is below the providers that hold it: it may not import them.
        "providers/retrying.py": "from providers import base\n",
        # The store reaching up to history; its claim path's sweep rules are allowed.
        "orchestrator/records/store/jobs.py": "from orchestrator.records import history\n"
                                              "from orchestrator.records.sweep.rules import g\n",
        "orchestrator/records/history.py": "",
        "orchestrator/records/sweep/rules.py": "",
    })
    arrows = backward_arrows(root)
    assert any("orchestrator.core.a (orchestrator.core) imports orchestrator.engine.b" in a
               for a in arrows)
    assert any("playbooks.ssh.c (playbooks.ssh) imports playbooks.train" in a for a in arrows)
    assert any("providers.retrying (providers.retrying) imports providers.base (providers)" in a
               for a in arrows)
    assert sideways(root) == [
        "orchestrator/records/store/jobs.py:1: orchestrator.records.store.jobs imports "
        "orchestrator.records.history: orchestrator.records.store may reach only "
        "orchestrator.records.store and orchestrator.records.sweep.rules and "
        "orchestrator.records.columns in orchestrator.records",
        "providers/base.py:1: providers.base imports providers.sim.compute: provider folders "
        "are independent of each other, and the shared provider modules name none of them",
        "providers/vastai/compute.py:1: providers.vastai.compute imports providers.sim.compute: "
        "provider folders are independent of each other, and the shared provider modules name "
        "none of them"]
    assert [a for a in arrows if "simhost" in a] == [
        "orchestrator/engine/d.py:1: orchestrator.engine.d imports simhost.host, which only "
        "simhost and providers.sim may import"]
    assert sorted(cycles(root)) == [["orchestrator.core.a", "orchestrator.engine.b"],
                                    ["playbooks.ssh.c", "playbooks.train"]]
    assert any("g() is 81 lines" in s for s in oversized(root))


@pytest.mark.parametrize("name, expected", [
    ("playbooks.ssh.sftp", "playbooks.ssh"), ("playbooks.train", "playbooks"),
    ("orchestrator.cli.jobs", "orchestrator.cli"), ("simhost.host", "simhost"),
    ("providers.sim", "providers"), ("providers.retrying", "providers.retrying"),
    ("providers.retrying.x", "providers.retrying"), ("providers.http", "providers"),
])
def test_layers_are_matched_by_the_longest_prefix(name: str, expected: str) -> None:
    assert LAYERS[layer(name)] == expected
