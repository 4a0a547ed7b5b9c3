"""`orch plan` skips typer: same output, same exit codes, and typer still answers the rest."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.cli.entry import plan_args

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(("argv", "expected"), [
    (["plan", "job.yml"], (Path("job.yml"), False, False)),
    (["plan", "--json", "job.yml", "--all"], (Path("job.yml"), True, True)),
    (["plan"], None),
    (["plan", "a.yml", "b.yml"], None),
    (["plan", "--help"], None),
    (["plan", "job.yml", "--jsn"], None),
    (["jobs"], None),
    ([], None),
])
def test_only_a_plain_plan_command_line_skips_typer(argv: list[str],
                                                    expected: object) -> None:
    assert plan_args(argv) == expected


def _run(module: str, args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path)}
    env.pop("ORCH_DB_URL", None)
    code = f"import sys; sys.argv = ['orch', *sys.argv[1:]]; from {module} import main; main()"
    return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args", [
    ["plan", "examples/qlora-8b.yml"],
    ["plan", "--json", "examples/lora-14b.yml"],
    ["plan", "examples/missing.yml"],
])
def test_fast_path_prints_what_the_typer_command_prints(args: list[str],
                                                        tmp_path: Path) -> None:
    fast = _run("orchestrator.cli.entry", args, tmp_path)
    typer = _run("orchestrator.cli.app", args, tmp_path)
    assert (fast.returncode, fast.stdout, fast.stderr) == \
        (typer.returncode, typer.stdout, typer.stderr)


def _after_plan(expr: str, tmp_path: Path) -> str:
    """What `expr` (over `sys.modules`) prints after `orch plan` ran in a fresh interpreter."""
    code = ("import sys; sys.argv = ['orch', 'plan', 'examples/qlora-8b.yml']; "
            f"from orchestrator.cli.entry import main; main(); print({expr}, file=sys.stderr)")
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stderr.strip()


def test_plan_imports_neither_typer_nor_plugin_discovery(tmp_path: Path) -> None:
    assert _after_plan("'typer' in sys.modules, 'orchestrator.cli.jobs' in sys.modules, "
                       "'importlib.metadata' in sys.modules", tmp_path) == "False False False"


def test_plan_imports_no_pydantic(tmp_path: Path) -> None:
    # The job file's models are schema.Model for this: pydantic's import and model building
    # were half of `orch plan`'s start-up (issue 11 §4; bench/startup.py measures it).
    assert _after_plan("sorted(m for m in sys.modules if m.split('.')[0] in "
                       "('pydantic', 'pydantic_core', 'annotated_types'))", tmp_path) == "[]"
