"""The user's install brings no test tools; `scripts/test` (CI's entry) brings them (issue
25, item 17). scripts/install runs for real in a copy of the repository's layout; only its pip
and the uv that pip installs are recorders (a real install downloads for minutes), and what
each extra pulls in is read from pyproject.toml, the file pip and uv read."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEST_TOOLS = ("pytest", "hypothesis", "ruff", "mypy")


def fake_checkout(tmp_path: Path, uv: bool) -> Path:
    """`uv`: whether `pip install uv` brings a (recording) uv; else it fails, as with no
    index uv can reach, and pip installs orch."""
    root = tmp_path / "orch"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "install", root / "scripts" / "install")
    shutil.copy(ROOT / "scripts" / "test", root / "scripts" / "test")
    bin_dir = root / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    log = tmp_path / "install.log"
    brings_uv = (f'cp "$0" {bin_dir}/uv; sed -i \'s/"pip /"uv /\' {bin_dir}/uv; exit 0' if uv
                 else "exit 1")
    for name, body in (("python", "exit 0"), ("orch", "exit 0"), ("ruff", "exit 0"),
                       ("mypy", "exit 0"), ("pytest", "exit 0"),
                       ("pip", f'echo "pip $*" >> {log}\n'
                               f'case "$*" in *" uv") {brings_uv};; esac')):
        exe = bin_dir / name
        exe.write_text(f"#!/bin/sh\n{body}\n")
        exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return root


def extras_installed(tmp_path: Path, *command: str, uv: bool = True) -> set[str]:
    tmp_path.mkdir()
    root = fake_checkout(tmp_path, uv)
    subprocess.run(["bash", *command], cwd=root, check=True, capture_output=True, timeout=120,
                   env={"PATH": os.environ["PATH"], "HOME": str(tmp_path)})
    found = re.findall(r"^(pip|uv) .*-e \.\[([a-z,]+)\]$",
                       (tmp_path / "install.log").read_text(), re.M)
    # One install of orch, by uv where it could be installed, else by pip.
    assert [tool for tool, _ in found] == ["uv" if uv else "pip"], found
    return set(found[0][1].split(","))


def requirements(extras: set[str]) -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = [*project["dependencies"],
             *(r for e in extras for r in project["optional-dependencies"][e])]
    return {re.split(r"[<>=\[ ;]", n, maxsplit=1)[0].lower() for n in names}


def test_the_users_install_has_no_test_tools(tmp_path: Path) -> None:
    user = extras_installed(tmp_path / "user", "scripts/install")
    assert not requirements(user) & set(TEST_TOOLS), user
    # CI's entry (.ci/run -> scripts/test) still gets every test tool.
    ci = extras_installed(tmp_path / "ci", "scripts/test")
    assert set(TEST_TOOLS) <= requirements(ci)
    assert (ROOT / ".ci" / "run").read_text().rstrip().endswith("exec bash scripts/test")


def test_without_uv_pip_installs_the_same(tmp_path: Path) -> None:
    assert extras_installed(tmp_path / "user", "scripts/install", uv=False) == \
        extras_installed(tmp_path / "user-uv", "scripts/install")
    assert extras_installed(tmp_path / "ci", "scripts/test", uv=False) == \
        extras_installed(tmp_path / "ci-uv", "scripts/test")


def test_the_distribution_is_not_the_index_s_unrelated_orch() -> None:
    # `orch` on the package index is someone else's project (orch 0.0.2); `pip download
    # --no-deps orch-finetune` found no distribution (checked 2026-12-03). The command is `orch`.
    import sys
    from importlib.metadata import version

    from orchestrator.cli.app import DISTRIBUTION

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == DISTRIBUTION == "orch-finetune"
    assert project["scripts"] == {"orch": "orchestrator.cli.entry:main"}
    out = subprocess.run([str(Path(sys.executable).parent / "orch"), "--version"],
                         capture_output=True, text=True, check=True).stdout
    assert out == f"orch {version(DISTRIBUTION)}\n"


def test_every_package_orch_imports_is_one_it_declares() -> None:
    """A package imported only because another one brings it breaks when that one stops
    (typer 0.26 stopped installing click, which cli/app.py imports)."""
    import sys
    from importlib.metadata import packages_distributions

    from test_layers import imported, module_name

    declared = {d.replace("_", "-") for d in requirements({"report", "postgres"})}
    ours = {"orchestrator", "providers", "playbooks", "simhost", "migrations"}
    dists = packages_distributions()
    undeclared = set()
    for folder in sorted(ours):
        for path in (ROOT / folder).rglob("*.py"):
            if path.is_relative_to(ROOT / "playbooks" / "remote"):
                continue  # scripts run on the GPU host, by the image's python (its torch)
            for module, _, _ in imported(module_name(path, ROOT), path):
                top = module.split(".")[0]
                if top in sys.stdlib_module_names or top in ours or top.startswith("_"):
                    continue
                if folder == "simhost" and (ROOT / "simhost" / top).is_dir():
                    continue  # a simulated image's python has simhost/ on its path
                owners = {d.lower().replace("_", "-") for d in dists.get(top, [top])}
                if not owners & declared:
                    undeclared.add(f"{top} ({path.relative_to(ROOT)})")
    assert sorted(undeclared) == []
