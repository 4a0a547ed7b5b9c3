"""A run stopped on a monthly server (a machine orch keeps, never destroys) has its training
stopped before the server is released: a cancel and a prune mean the same there as on a
rental, whose training ends with the machine (issue 38, round C).

Real parts: a simulated host (real sshd on loopback, the Docker stand-in) registered as the
server, the engine's JobRunner, SQLite, and for the prune `orch sweep` as a real process.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import orchfork
import pytest
from conftest import KeyPair
from emulators.hosts import WithHostPaths
from sqlmodel import col, select
from test_engine import training_step, when

from orchestrator.core.jobstatus import JobStatus
from orchestrator.core.search import Continue, RungRecord
from orchestrator.core.spec import load_job
from orchestrator.engine.runner import JobRunner, Options, owner_id
from orchestrator.engine.submission import record_job
from orchestrator.records.store import Job, Store, open_store
from orchestrator.records.sweep.trials import record_rungs
from providers.dedicated.compute import Dedicated

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
# 40 steps of 0.3 s: a run stopped at its first steps would still train for ~10 s.
HOST = {"train_steps": 40, "train_step_seconds": 0.3, "vllm_startup_seconds": 0.2,
        "merge_seconds": 0.05}
SWEEP = """\
name: kept
base: jobs/quickstart.yml
grid:
  training.learning_rate: [1.0e-4, 2.0e-4, 5.0e-4]
  lora.r: [8, 16, 32]
search: {sampler: tpe, trials: 2, seed: 0}
early_stop: {metric: train.loss, min_fraction: 0.1, reduction_factor: 3}
max_parallel: 2
objective: {metric: eval.exact_match, goal: max}
"""


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    url = f"sqlite:///{tmp_path / 'orch.db'}"
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("ORCH_DB_URL", url)
    e = {**os.environ}
    for key in ("VAST_API_KEY", "RUNPOD_API_KEY", "ORCH_FAILPOINT"):
        e.pop(key, None)
    return e


@pytest.fixture
def store(env: dict[str, str]) -> Iterator[Store]:
    s = open_store(env["ORCH_DB_URL"])
    try:
        yield s
    finally:
        s.close()


def on_server(tmp_path: Path, store: Store, host: Any) -> Path:
    """Register `host` as monthly server box1; the quickstart job placed on it."""
    store.add_server(name="box1", host=host.host, port=host.port, user=host.user,
                     gpu="H100 SXM", gpu_count=1, monthly_price=Decimal(2190))
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    shutil.copytree(EXAMPLES / "data", jobs / "data")
    path = jobs / "quickstart.yml"
    path.write_text((EXAMPLES / "quickstart.yml").read_text()
                    .replace("providers: [sim]", "providers: [dedicated]"))
    return path


def run(store: Store, key: KeyPair, host: Any, job_id: str) -> Job:
    """Claim and run `job_id` on the registered server, as `orch worker` would."""
    owner = owner_id("test")
    options = Options(poll_s=0.2, watch_s=0.2, lease_s=5, ssh_key=key.private)
    assert store.claim_job(job_id, owner, 5) is not None
    dedicated = WithHostPaths(Dedicated(store), lambda _instance_id: str(host.root))
    return JobRunner(store, {"dedicated": dedicated}, owner, options).run(job_id)


def assert_stopped(store: Store, host: Any, job: Job) -> None:
    """The job's training no longer runs on the server, which is free and lives on."""
    running = {name: c["State"] for name, c in host.containers().items()
               if c["State"]["Running"]}
    assert running == {}, f"left running on the released server: {running}"
    assert training_step(store, job.id) < HOST["train_steps"], "training ran to the end"
    removed = [e["container"] for e in host.events("docker-rm")]
    assert any(job.id in c and "train" in c for c in removed), removed
    (server,) = store.list_servers()
    assert server.status == "idle" and server.claimed_by_job is None
    assert host.running


def test_a_cancel_while_training_on_a_kept_server_stops_its_training(
        tmp_path: Path, env: dict[str, str], store: Store, ssh_keypair: KeyPair,
        simhost: Any) -> None:
    host = simhost(**HOST)
    job, _ = record_job(store, load_job(on_server(tmp_path, store, host)))
    when(lambda: training_step(store, job.id) >= 2, lambda: store.request_cancel(job.id))
    done = run(store, ssh_keypair, host, job.id)

    assert done.status == JobStatus.CANCELLED, done.failure_reason
    assert_stopped(store, host, done)
    (row,) = store.instances_of(job.id)
    assert (row.provider, row.end_reason) == ("dedicated", "cancelled")


def test_a_run_pruned_on_a_kept_server_has_its_training_stopped(
        tmp_path: Path, env: dict[str, str], store: Store, ssh_keypair: KeyPair,
        simhost: Any) -> None:
    host = simhost(**HOST)
    on_server(tmp_path, store, host)
    (tmp_path / "sweep.yml").write_text(SWEEP)
    tick = orchfork.run(["sweep", str(tmp_path / "sweep.yml"), "-q"], env=env, cwd=tmp_path,
                        timeout=180)
    assert tick.returncode == 0, tick.stderr
    with store.session() as s:
        first, second = s.exec(select(Job).order_by(col(Job.trial_number))).all()
    # Trial 0 passed every rung at a loss no run reaches: trial 1 loses its first rung
    # (the best third of 2 values is trial 0's alone) and is pruned at step 4 of 40.
    best = Continue(tuple(RungRecord(k, r, 0.0) for k, r in enumerate((100, 300, 900))))
    assert record_rungs(store, first.id, best, "train.loss", [(40, 0.0)], 40) is None
    done = run(store, ssh_keypair, host, second.id)

    assert done.status == JobStatus.PRUNED, done.failure_reason
    assert_stopped(store, host, done)
    (row,) = store.instances_of(second.id)
    assert (row.provider, row.end_reason) == ("dedicated", "released")
