"""`orch hosts`: what orch remembers of each machine, the stance it takes now, and why (issue
40), from a real database through the real command."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from orchestrator.core.hostmemory import Source
from orchestrator.records.store import open_store, utcnow

ROOT = Path(__file__).resolve().parent.parent
ORCH = shutil.which("orch", path=str(Path(sys.executable).parent)) or "orch"


def orch(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XDG_DATA_HOME": str(tmp / "xdg")}
    env.pop("ORCH_DB_URL", None)
    return subprocess.run([ORCH, *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)


def test_hosts_lists_each_machine_with_its_stance_and_why(tmp_path: Path) -> None:
    assert orch(tmp_path, "hosts").stdout.startswith("no machine remembered yet")
    store = open_store(f"sqlite:///{tmp_path / 'xdg' / 'orch' / 'orch.db'}")
    now = utcnow()
    store.record_host_observation("sim", "sim-rtx-4090-07", Source.CHECK, failed=True,
                                  delivered=None, why="hub: no route to huggingface.co",
                                  at=now - timedelta(hours=1))
    store.record_host_observation("vastai", "41234", Source.RUN, failed=False, delivered=0.7,
                                  why="trained at 70% of its plan", at=now - timedelta(hours=2))
    store.record_host_observation("sim", "sim-rtx-4090-04", Source.CHECK, failed=False,
                                  delivered=0.98, why="passed", at=now)
    store.close()

    done = orch(tmp_path, "hosts", "--json")
    assert done.returncode == 0, done.stderr
    found: dict[str, Any] = {m["machine_id"]: m for m in json.loads(done.stdout)["hosts"]}
    bad, slow, good = found["sim-rtx-4090-07"], found["41234"], found["sim-rtx-4090-04"]
    assert bad["stance"] == "avoid" and bad["until"] and "no route" in bad["why"]
    assert (slow["stance"], slow["provider"]) == ("price", "vastai")
    assert 0.7 < slow["delivered"] < 0.9 and "priced as delivering" in slow["why"]
    assert good["stance"] == "use"
    only = json.loads(orch(tmp_path, "hosts", "--provider", "vastai", "--json").stdout)
    assert [m["machine_id"] for m in only["hosts"]] == ["41234"]
    text = orch(tmp_path, "hosts").stdout
    assert "sim-rtx-4090-07" in text and "avoid" in text and "price" in text
