"""`orch show` summarises the whole loss curve `orch logs --train` shows (issue 25, item 6).

A real run on the simulated cloud whose trainer logs steps faster than the engine polls (as a
real trainer does against a 10-second poll): every step's loss in the log must become a
`train.loss` metric, so that the summary starts at step 1.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import orchfork

ROOT = Path(__file__).resolve().parent.parent
ORCH = str(Path(sys.executable).parent / "orch")


def test_show_summarises_every_logged_step(tmp_path: Path) -> None:
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "ORCH_SIM_TRAIN_STEPS": "12",
           "ORCH_SIM_STEP_S": "0.1", "ORCH_POLL_S": "1"}

    def orch(*args: str) -> str:
        return orchfork.run(list(args), env=env, cwd=ROOT, check=True, timeout=300).stdout

    job_id = json.loads(orch("submit", "examples/quickstart.yml", "--json"))["job_id"]
    log = orch("logs", job_id, "--train")
    losses = [float(x) for x in re.findall(r"\{'loss': ([0-9.]+)", log)]
    assert len(losses) == 12
    summary = re.search(r"train loss: (\S+) -> (\S+) \(min (\S+)\), steps (\d+)-(\d+)",
                        orch("show", job_id))
    assert summary, "no loss summary in `orch show`"
    assert summary.group(1) == f"{losses[0]:.4g}" and summary.group(2) == f"{losses[-1]:.4g}"
    assert (summary.group(4), summary.group(5)) == ("1", "12")
    shown = json.loads(orch("show", job_id, "--json"))
    curve = [m for m in shown["metrics_all"] if m["name"] == "train.loss"]
    assert [(m["step"], m["value"]) for m in curve] == list(enumerate(losses, start=1))
