"""The console script is the typer app; `orch plan` loads no database, SSH or HTTP library."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_plan_loads_neither_the_database_nor_ssh_nor_http(tmp_path: Path) -> None:
    # DESIGN.md: heavy modules are imported only inside the commands that need them.
    code = ("import atexit, sys\n"
            "atexit.register(lambda: print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'sqlmodel', 'sqlalchemy', 'alembic', 'fabric', 'paramiko', 'httpx'}), "
            "file=sys.stderr))\n"
            "sys.argv = ['orch', 'plan', 'examples/qlora-8b.yml']\n"
            "from orchestrator.cli.app import main\n"
            "main()\n")
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path)}
    env.pop("ORCH_DB_URL", None)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "llama31-8b-alpaca-qlora" in out.stdout
    assert out.stderr.strip().splitlines()[-1] == "[]"


def test_plan_imports_no_other_command_module(tmp_path: Path) -> None:
    from orchestrator.cli.lazycommands import LAZY

    code = ("import atexit, sys\n"
            "atexit.register(lambda: print(sorted(m for m in sys.modules "
            "if m.startswith('orchestrator.cli.')), file=sys.stderr))\n"
            "sys.argv = ['orch', 'plan', 'examples/qlora-8b.yml']\n"
            "from orchestrator.cli.app import main\n"
            "main()\n")
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    loaded = set(eval(out.stderr.strip().splitlines()[-1]))  # a list of module names
    assert "orchestrator.cli.plan" in loaded
    assert loaded & {module for module, _names in LAZY} == set()


def test_lazy_commands_name_what_each_module_registers() -> None:
    from orchestrator.cli.lazycommands import LAZY, registered

    for module, names in LAZY:
        assert tuple(registered(module)) == names, module


def test_the_console_script_is_the_typer_app() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    assert 'orch = "orchestrator.cli.app:main"' in text


def test_command_modules_keep_their_annotations_evaluated() -> None:
    # typer reads every command's annotations when `orch` starts (any command, even -h), and
    # evaluates string annotations twice (inspect.signature(eval_str=True), get_type_hints):
    # `from __future__ import annotations` in the modules that define commands made that ~6%
    # of `orch plan`'s start-up (75 M of its 1,270 M instructions). Helpers there quote the
    # names they import only for type checking.
    defining = [p for p in sorted((ROOT / "orchestrator" / "cli").glob("*.py"))
                if ".command(" in p.read_text()]
    assert len(defining) > 5, "no module defines commands: did the CLI move?"
    lazy = [p.name for p in defining if "from __future__ import annotations" in p.read_text()]
    assert lazy == [], f"string annotations in command modules: {lazy}"
