"""`orch worker`'s loop is the engine's (`orchestrator.engine.worker`, issue 37 §2): the
command parses, calls `work` and prints what it reports; the timing a job runs with is
chosen by what its providers declare (`Simulated`), never by their names."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from orchestrator.engine.runner_core import Options
from orchestrator.engine.worker import Timings, simulated_only
from orchestrator.records.store import Job
from providers.dedicated.compute import Dedicated
from providers.sim.compute import SimCloud

ROOT = Path(__file__).resolve().parent.parent
TIMINGS = Timings(normal=Options(lease_s=60.0), quick=Options(poll_s=0.5, lease_s=15.0))


def _job(providers: list[str] | None) -> Job:
    return Job(name="j", status="queued", method="qlora", base_model="m", spec_hash="0" * 64,
               spec_json=json.dumps({"resources": {"providers": providers}}))


def test_a_job_on_simulated_providers_only_runs_with_quick_timing(tmp_path: Path) -> None:
    sim = SimCloud(tmp_path / "sim")
    # Whatever name a simulated provider is configured under, it is what it declares.
    assert TIMINGS.of(_job(["local"]), {"local": sim}) is TIMINGS.quick
    assert simulated_only(_job(["local", "other"]), {"local": sim, "other": sim})
    # A real provider among them, one not configured here, or any provider: normal timing.
    dedicated = Dedicated(None)  # type: ignore[arg-type]  # never asked for its servers
    assert TIMINGS.of(_job(["local", "dedicated"]), {"local": sim, "dedicated": dedicated}) \
        is TIMINGS.normal
    assert TIMINGS.of(_job(["sim"]), {"sim": dedicated}) is TIMINGS.normal
    assert TIMINGS.of(_job(["local"]), {}) is TIMINGS.normal
    assert TIMINGS.of(_job(None), {"local": sim}) is TIMINGS.normal


def test_the_worker_command_holds_no_loop() -> None:
    """The CLI's `worker` parses and calls the engine's `work`: no job loop of its own."""
    tree = ast.parse((ROOT / "orchestrator" / "cli" / "jobs.py").read_text())
    functions = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    assert "_work" not in functions
    assert [n for n in ast.walk(functions["worker"]) if isinstance(n, ast.While)] == []
    calls = {n.func.id for n in ast.walk(functions["worker"])
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert "work" in calls
