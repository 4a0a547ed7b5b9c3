"""The layers of docs/architecture.md, enforced: imports only point down, and never loop.

Every `import` and `from ... import` in orchestrator/, providers/ and playbooks/ counts,
at module level and inside functions alike (a function-level import that closes a loop
is still a loop; it only fails later). Sizes: no function over MAX_FUNCTION_LINES and no
module over MAX_MODULE_LINES, except where the module's docstring gives a reason in a
line starting "Size:".
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("orchestrator", "providers", "playbooks")
# Bottom to top: a module may import its own layer and the ones before it.
LAYERS = (
    "orchestrator.retrying",  # the one retry policy (tenacity); imports nothing of ours
    "playbooks.ssh",        # SSH/SFTP to a host: argv only, pinned host keys; a leaf
    "providers",            # clouds and monthly servers behind one interface; catalogs
    "playbooks",            # what runs on a GPU host, step by step; the trainer's config
    "orchestrator.core",    # pure: job file, sizing, savers, scheduling, pricing, money
    "orchestrator.records",  # SQLite/PostgreSQL store, history, sweeps' bookkeeping
    "orchestrator.engine",  # running a job: placement, the pipeline, recovery, teardown
    "orchestrator.cli",     # the `orch` commands
)
# Stand-ins for the tools of a GPU host and the migrations are not application layers.
SIZE_EXEMPT = ("providers/simhost/",)
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 600


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path) -> dict[str, Path]:
    return {module_name(p, root): p for pkg in PACKAGES if (root / pkg).is_dir()
            for p in sorted((root / pkg).rglob("*.py"))}


def imports(name: str, path: Path, known: dict[str, Path]) -> Iterator[tuple[str, int]]:
    """(imported module of ours, line) for every import in the file, at any depth."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PACKAGES:
                    yield _ours(alias.name, known), node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")
                up = up[:len(up) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            if base.split(".")[0] not in PACKAGES:
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                yield (sub if sub in known else _ours(base, known)), node.lineno


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
    })
    arrows = backward_arrows(root)
    assert any("orchestrator.core.a (orchestrator.core) imports orchestrator.engine.b" in a
               for a in arrows)
    assert any("playbooks.ssh.c (playbooks.ssh) imports playbooks.train" in a for a in arrows)
    assert sorted(cycles(root)) == [["orchestrator.core.a", "orchestrator.engine.b"],
                                    ["playbooks.ssh.c", "playbooks.train"]]
    assert any("g() is 81 lines" in s for s in oversized(root))


@pytest.mark.parametrize("name, expected", [
    ("playbooks.ssh.sftp", "playbooks.ssh"), ("playbooks.train", "playbooks"),
    ("orchestrator.cli.jobs", "orchestrator.cli"), ("providers.simhost.host", "providers"),
    ("orchestrator.retrying", "orchestrator.retrying"),
])
def test_layers_are_matched_by_the_longest_prefix(name: str, expected: str) -> None:
    assert LAYERS[layer(name)] == expected
