"""The console script is the typer app; `orch plan` loads no database, SSH or HTTP library."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_plan_loads_neither_the_database_nor_ssh_nor_http(tmp_path: Path) -> None:
    # DESIGN.md: heavy modules are imported only inside the commands that need them; and
    # pydantic-settings only where an ORCH_* variable is set for it to read (core/settings.py).
    code = ("import atexit, sys\n"
            "atexit.register(lambda: print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'sqlmodel', 'sqlalchemy', 'alembic', 'fabric', 'paramiko', 'httpx', "
            "'pydantic_settings'}), "
            "file=sys.stderr))\n"
            "sys.argv = ['orch', 'plan', 'examples/qlora-8b.yml']\n"
            "from orchestrator.cli.app import main\n"
            "main()\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    env["XDG_DATA_HOME"] = str(tmp_path)
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

    for module, helps in LAZY:
        commands = registered(module)
        assert tuple(commands) == tuple(helps), module
        for name, command in commands.items():
            first = "" if command.hidden else (command.help or "").split("\n\n")[0]
            assert helps[name] == first, name


def test_help_lists_every_command_without_importing_its_module(tmp_path: Path) -> None:
    from orchestrator.cli.lazycommands import LAZY

    code = ("import sys\n"
            "sys.argv = ['orch', '--help']\n"
            "from orchestrator.cli.app import main\n"
            "try:\n"
            "    main()\n"
            "finally:\n"
            "    print(sorted(m for m in sys.modules if m.startswith('orchestrator.cli.')), "
            "file=sys.stderr)\n")
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert set(eval(out.stderr.strip().splitlines()[-1])) & {m for m, _ in LAZY} == set()
    listed = [line.split()[0] for line in out.stdout.split("Commands:")[1].splitlines()
              if line.strip()]
    assert listed == ["plan", "offers", "prices", "jobs", "reconcile",
                      *[n for _m, helps in LAZY for n, h in helps.items() if h]]
    # The same text as with every module loaded (each command's own help).
    import click
    import typer

    from orchestrator.cli.app import app

    def helped(load: bool) -> str:
        root = typer.main.get_command(app)
        if load:
            assert len(root.commands) == len(listed) + 1  # type: ignore[attr-defined]
        with click.Context(root, info_name="orch", terminal_width=100) as ctx:
            return root.get_help(ctx)

    assert helped(False) == helped(True)


def test_the_collector_is_off_for_a_plan_and_back_on_for_other_commands(tmp_path: Path) -> None:
    """cli/entry.py: start-up runs without the cyclic collector; `orch plan` to its end, every
    other command (a worker runs for days) with it back on."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    env["XDG_DATA_HOME"] = str(tmp_path)
    said = {}
    for argv in (["plan", "examples/qlora-8b.yml"], ["jobs"]):
        code = ("import atexit, gc, sys\n"
                "atexit.register(lambda: print('collector on:', gc.isenabled(), "
                "file=sys.stderr))\n"
                f"sys.argv = ['orch', *{argv!r}]\n"
                "from orchestrator.cli.entry import main\n"
                "main()\n")
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        said[argv[0]] = out.stderr.strip().splitlines()[-1]
    assert said == {"plan": "collector on: False", "jobs": "collector on: True"}
