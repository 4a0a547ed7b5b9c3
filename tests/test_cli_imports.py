"""The command-line modules' import graph: no cycle, no reaching into another's private names.

Reads the sources (module- and function-level imports alike) rather than importing them, so
a cycle that only closes inside a command body is found too.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "orchestrator" / "cli"
PREFIX = "orchestrator.cli."


def cli_modules() -> dict[str, ast.Module]:
    found = {p.stem: ast.parse(p.read_text(), str(p)) for p in sorted(PACKAGE.glob("*.py"))
             if p.stem != "__init__"}
    assert len(found) > 5, f"no command-line modules found in {PACKAGE}"
    return found


def imports(tree: ast.Module) -> list[tuple[str, list[str]]]:
    """(module, imported names) for every import of an orchestrator module in `tree`."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "orchestrator.cli":  # from orchestrator.cli import jobs
                found += [(f"{PREFIX}{a.name}", []) for a in node.names]
            elif node.module.startswith("orchestrator."):
                found.append((node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names if a.name.startswith("orchestrator.")]
    return found


def test_cli_modules_import_no_cycle() -> None:
    modules = cli_modules()
    graph = {name: {m.removeprefix(PREFIX) for m, _ in imports(tree)} & set(modules)
             for name, tree in modules.items()}
    state: dict[str, int] = {}  # 1 visiting, 2 done

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for nxt in sorted(graph[name]):
            assert state.get(nxt) != 1, f"import cycle: {' -> '.join([*path, name, nxt])}"
            if nxt not in state:
                visit(nxt, [*path, name])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [])


def test_cli_modules_take_no_private_name_from_another() -> None:
    modules = cli_modules()
    for name, tree in modules.items():
        for module, names in imports(tree):
            other = module.removeprefix(PREFIX)
            if other in modules and other != name:
                private = [n for n in names if n.startswith("_")]
                assert not private, f"{name} imports {private} from {other}"
        # `cli._store()` style reaches through a module object, under its name or an alias
        # (`from orchestrator.cli import jobs as cli_jobs`).
        bound = {m: m for m in modules}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "orchestrator.cli":
                bound.update({a.asname: a.name for a in node.names if a.asname})
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and bound.get(node.value.id, name) != name):
                assert not node.attr.startswith("_"), f"{name} uses {node.value.id}.{node.attr}"


def test_python_dash_m_runs_the_cli(tmp_path: Path) -> None:
    # `python -m orchestrator.cli.app` (its `__main__` block) once died in the cli <-> cli_servers
    # import cycle with "partially initialized module".
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "orchestrator.cli.app", "--help"], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "servers" in out.stdout and "Traceback" not in out.stderr
