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


def test_the_console_script_is_the_typer_app() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    assert 'orch = "orchestrator.cli.app:main"' in text
