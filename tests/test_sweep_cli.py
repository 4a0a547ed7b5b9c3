"""`orch sweep`, `orch sweep show`, `orch sweeps` and the sweep gates, against a real SQLite file.

The sweeps run over a copy of examples/quickstart.yml (the simulated cloud), so planning needs
no account; the CLI runs as real processes, the gates are exercised in-process on the store.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import orchfork
import pytest
from conftest import BACKENDS, database_url
from sqlmodel import col, select

from orchestrator.core.sweepspec import load_sweep
from orchestrator.records.store import Event, Job, Store, Sweep, open_store, utcnow
from orchestrator.records.sweep.store import (
    claim_next_gated,
    submit_sweep,
    sweep_gate,
    sweep_status,
)
from providers.sim.compute import SimCloud

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"

SWEEP = """\
name: qs
base: jobs/quickstart.yml
grid:
  training.learning_rate: [1.0e-4, 2.0e-4]
  lora.r: [8, 16]
max_parallel: {max_parallel}
{budget}objective: {{metric: eval_loss, goal: min}}
"""


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # Every sweep test runs on SQLite and on PostgreSQL, except those about the SQLite file.
    if "env" in metafunc.fixturenames and metafunc.function.__name__ not in SQLITE_ONLY:
        metafunc.parametrize("env", BACKENDS, indirect=True)


SQLITE_ONLY = {"test_sweep_show_and_sweeps_do_not_import_sqlalchemy"}  # the stdlib path


@pytest.fixture
def env(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    import os

    backend = getattr(request, "param", "sqlite")
    e = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "xdg"),
         "ORCH_DB_URL": database_url(backend, tmp_path, request)}
    return e


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """tmp/jobs/quickstart.yml with its data next to it."""
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    shutil.copy(EXAMPLES / "quickstart.yml", jobs / "quickstart.yml")
    shutil.copytree(EXAMPLES / "data", jobs / "data")
    return tmp_path


def sweep_file(folder: Path, max_parallel: int = 2, budget: str | None = None,
               name: str = "sweep.yml", text: str | None = None) -> Path:
    path = folder / name
    path.write_text(text if text is not None else SWEEP.format(
        max_parallel=max_parallel, budget=f"budget: {budget}\n" if budget else ""))
    return path


@pytest.fixture
def store(env: dict[str, str]) -> Iterator[Store]:
    s = open_store(env["ORCH_DB_URL"])
    try:
        yield s
    finally:
        s.close()


def exe() -> str:
    return shutil.which("orch", path=str(Path(sys.executable).parent)) or "orch"


def orch(env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = orchfork.run(list(args), env=env, cwd=ROOT, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"orch {' '.join(args)} -> {proc.returncode}\n{proc.stderr}")
    return proc


def jobs_of(store: Store) -> list[Job]:
    with store.session() as s:
        return list(s.exec(select(Job).order_by(col(Job.created_at), col(Job.id))))


def set_fields(store: Store, job_id: str, **fields: Any) -> None:
    with store.transaction() as s:
        job = s.get(Job, job_id)
        assert job is not None
        for k, v in fields.items():
            setattr(job, k, v)


def finish(store: Store, job_id: str, status: str = "succeeded", **fields: Any) -> None:
    set_fields(store, job_id, status=status, finished_at=utcnow(), lease_owner=None,
               lease_expires_at=None, **fields)


# --- orch sweep FILE ---------------------------------------------------------------------------


def test_sweep_queues_each_run_once(env: dict[str, str], folder: Path, store: Store) -> None:
    path = sweep_file(folder, budget="25")
    first = orch(env, "sweep", str(path))
    assert first.stdout.strip().startswith("qs: 4 runs: 4 new (budget $25.00, spent $0.0000, "
                                           "estimated $0.0")
    jobs = jobs_of(store)
    assert len(jobs) == 4 and {j.status for j in jobs} == {"queued"}
    assert len({j.sweep_key for j in jobs}) == 4 and all(j.sweep_key for j in jobs)
    with store.session() as s:
        sweep = s.exec(select(Sweep)).one()
        events = list(s.exec(select(Event).order_by(col(Event.id))))
    assert {j.sweep_id for j in jobs} == {sweep.id} and sweep.name == "qs"
    assert sweep.budget_micros == 25_000_000
    assert json.loads(sweep.spec_json)["max_parallel"] == 2
    assert json.loads(sweep.spec_json)["objective"] == {"metric": "eval_loss", "goal": "min"}
    # The worker re-resolves the spec against the BASE job file.
    from orchestrator.engine.jobinputs import load_inputs

    for job in jobs:
        assert json.loads(job.placement_json or "{}")["job_file"] == str(
            folder / "jobs" / "quickstart.yml")
        loaded = load_inputs(job).loaded
        assert loaded.spec.name == job.name and job.provider == "sim"
    assert [j.name for j in jobs] == [f"qs-{i:03d}" for i in range(4)]
    params = [json.loads(e.data_json or "{}")["params"] for e in events]
    assert params == [{"training.learning_rate": lr, "lora.r": r}
                      for lr in (1.0e-4, 2.0e-4) for r in (8, 16)]

    again = json.loads(orch(env, "sweep", str(path), "--json").stdout)
    assert again["counts"]["new"] == 0 and again["counts"]["queued"] == 4
    assert [r["job_id"] for r in again["runs"]] == [j.id for j in jobs]
    assert again["idle"] is True and again["over_budget"] is False
    assert len(jobs_of(store)) == 4
    text = orch(env, "sweep", str(path)).stdout.strip()
    assert text.startswith("qs: 4 runs: 4 queued (budget $25.00")


def test_overlapping_ticks_never_duplicate_a_run(env: dict[str, str], folder: Path,
                                                 store: Store) -> None:
    path = sweep_file(folder)
    procs = [subprocess.Popen([exe(), "sweep", str(path), "--json"], env=env, cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [err for _, err in outs]
    reports = [json.loads(out) for out, _ in outs]
    assert sum(r["counts"]["new"] for r in reports) == 4
    assert all(sum(r["counts"].values()) == 4 for r in reports)
    jobs = jobs_of(store)
    assert len(jobs) == 4 and len({j.sweep_key for j in jobs}) == 4
    with store.session() as s:
        assert len(list(s.exec(select(Sweep)))) == 1
        assert len(list(s.exec(select(Event)))) == 4  # one first event per job


def test_retry_failed_requeues_only_failed_runs(env: dict[str, str], folder: Path,
                                                store: Store) -> None:
    path = sweep_file(folder)
    orch(env, "sweep", str(path))
    jobs = jobs_of(store)
    finish(store, jobs[0].id, "failed", failure_reason="CUDA out of memory")
    finish(store, jobs[1].id, "cancelled")
    finish(store, jobs[2].id, "succeeded", cost_micros=1000)

    plain = json.loads(orch(env, "sweep", str(path), "--json").stdout)
    assert [r["state"] for r in plain["runs"]] == ["failed", "cancelled", "succeeded", "queued"]
    assert store.get_job(jobs[0].id).status == "failed"

    retried = orch(env, "sweep", str(path), "--retry-failed")
    assert "1 requeued" in retried.stdout and "1 cancelled" in retried.stdout
    assert "1 succeeded" in retried.stdout and "1 queued" in retried.stdout
    job = store.get_job(jobs[0].id)
    assert (job.status, job.attempt, job.failure_reason, job.finished_at) == (
        "queued", 1, None, None)
    assert store.events(job.id)[-1].kind == "requeued"
    assert "CUDA out of memory" in store.events(job.id)[-1].message
    assert store.get_job(jobs[1].id).status == "cancelled"
    assert store.get_job(jobs[2].id).status == "succeeded"
    assert len(jobs_of(store)) == 4
    # Nothing failed any more: a second retry requeues nothing.
    again = json.loads(orch(env, "sweep", str(path), "--retry-failed", "--json").stdout)
    assert again["counts"]["requeued"] == 0 and again["counts"]["queued"] == 2


def test_retry_failed_runs_the_job_with_an_edit_that_keeps_its_identity(
        env: dict[str, str], folder: Path, store: Store) -> None:
    # A run failed as diverged; its reason says `training.stop_on_nan: false` trains on.
    # That edit keeps the run's identity (and so its failed job): the retry must run with
    # it. An edit that changes the identity is a new run, never written over an old one.
    path = sweep_file(folder)
    orch(env, "sweep", str(path))
    jobs = jobs_of(store)
    finish(store, jobs[0].id, "failed", failure_reason="diverged: train.loss was nan ...")
    before = {j.id: (j.spec_json, j.spec_hash) for j in jobs}
    base = folder / "jobs" / "quickstart.yml"
    base.write_text(base.read_text().replace("learning_rate: 2.0e-4",
                                             "learning_rate: 2.0e-4\n  stop_on_nan: false"))
    orch(env, "sweep", str(path), "--retry-failed")
    retried = store.get_job(jobs[0].id)
    assert retried.status == "queued" and retried.spec_hash == before[jobs[0].id][1]
    spec = json.loads(retried.spec_json)
    assert spec["training"]["stop_on_nan"] is False and spec["name"] == jobs[0].name
    for job in jobs[1:]:  # not failed: not requeued, not rewritten
        assert (store.get_job(job.id).spec_json, job.spec_hash) == before[job.id]
    assert len(jobs_of(store)) == 4


def test_quiet_prints_nothing_on_an_idle_tick(env: dict[str, str], folder: Path) -> None:
    path = sweep_file(folder)
    first = orch(env, "sweep", str(path), "--quiet")
    assert "4 new" in first.stdout
    for args in (["--quiet"], ["-q", "--retry-failed"], ["-q", "--json"]):
        idle = orch(env, "sweep", str(path), *args)
        assert (idle.stdout, idle.stderr, idle.returncode) == ("", "", 0)


def test_invalid_sweep_file_exits_2_and_writes_nothing(env: dict[str, str],
                                                       folder: Path) -> None:
    path = sweep_file(folder, text=textwrap.dedent("""\
        name: bad
        base: jobs/quickstart.yml
        grid:
          training.learning_rat: [1.0e-4]
        max_paralel: 2
    """))
    proc = orch(env, "sweep", str(path), check=False)
    assert proc.returncode == 2
    assert f"{path}:4 grid.training.learning_rat: not a job-file key; did you mean " \
           "'training.learning_rate'?" in proc.stderr
    assert f"{path}:5 max_paralel: unknown key; did you mean 'max_parallel'?" in proc.stderr
    assert f"{path}: 2 problems; nothing was done" in proc.stderr
    assert proc.stdout == ""
    assert not Path(env["ORCH_DB_URL"].removeprefix("sqlite:///")).exists()


def test_a_run_that_fits_nowhere_is_reported_and_the_rest_queued(env: dict[str, str],
                                                                  folder: Path,
                                                                  store: Store) -> None:
    path = sweep_file(folder, text=textwrap.dedent("""\
        name: fit
        base: jobs/quickstart.yml
        grid:
          resources.max_price_per_hour: [0.000001, 50]
    """))
    proc = orch(env, "sweep", str(path), check=False)
    assert proc.returncode == 3
    assert "fit: 2 runs: 1 new, 1 nofit" in proc.stdout
    assert "run 0 (resources.max_price_per_hour=1e-06) fits nowhere:" in proc.stderr
    assert len(jobs_of(store)) == 1
    again = json.loads(orch(env, "sweep", str(path), "--json", check=False).stdout)
    assert again["counts"]["queued"] == 1 and again["counts"]["nofit"] == 1
    assert again["runs"][0]["message"]


def test_dry_run_writes_nothing(env: dict[str, str], folder: Path, store: Store) -> None:
    path = sweep_file(folder)
    out = orch(env, "sweep", str(path), "--dry-run").stdout
    assert "qs: 4 runs: 4 new" in out and "[dry run: nothing written]" in out
    assert jobs_of(store) == []
    with store.session() as s:
        assert list(s.exec(select(Sweep))) == []


def test_over_budget_estimate_is_submitted_and_said(env: dict[str, str], folder: Path,
                                                    store: Store) -> None:
    # A budget of two and a half runs' estimate pays for two of four (the estimate itself is
    # the planner's, read from a dry run, so a better estimate does not break this test).
    dry = json.loads(orch(env, "sweep", str(sweep_file(folder)), "--dry-run", "--json").stdout)
    # (Runs of rank 16 cost a little more: their adapter takes longer to copy home.)
    per_run = [Decimal(run["est_cost"]) for run in dry["runs"]]
    assert len(per_run) == 4 and min(per_run) > 0 and max(per_run) < min(per_run) * Decimal(
        "1.1")
    path = sweep_file(folder, budget=str(Decimal(dry["estimated"]) / 4 * Decimal("2.5")))
    proc = orch(env, "sweep", str(path))
    assert proc.returncode == 0
    assert proc.stdout.splitlines()[0].endswith("; over budget: 2 runs held back")
    assert len(jobs_of(store)) == 4
    report = json.loads(orch(env, "sweep", str(path), "--json").stdout)
    assert (report["over_budget"], report["held_back"]) == (True, 2)


# --- gates -------------------------------------------------------------------------------------


def submit(store: Store, path: Path) -> list[Job]:
    report = submit_sweep(store, load_sweep(path), listed=SimCloud.price_list())
    assert report.counts["new"] == len(report.runs)
    return jobs_of(store)


def test_max_parallel_gate(folder: Path, store: Store) -> None:
    jobs = submit(store, sweep_file(folder, max_parallel=2))
    plain = store.create_job(
        name="plain", status="queued", method="qlora", base_model="m", spec_json="{}",
        spec_hash="0" * 64, placement=None, provider=None, gpu=None, gpu_count=None,
        billing=None, interruptible=None, est_hours=None, est_cost=None, event_kind="queued",
        event_message="", event_data=None)
    first = claim_next_gated(store, "w1", 60)
    second = claim_next_gated(store, "w2", 60)
    assert first is not None and second is not None
    assert [first.id, second.id] == [jobs[0].id, jobs[1].id]
    assert first.status == "provisioning" and first.lease_owner == "w1"
    assert sweep_gate(store, store.get_job(jobs[2].id)) == "max_parallel"
    # The gated sweep jobs are skipped, not a wall: the next job outside the sweep starts.
    third = claim_next_gated(store, "w3", 60)
    assert third is not None and third.id == plain.id
    assert claim_next_gated(store, "w4", 60) is None
    status = sweep_status(store, "qs")
    assert [r["waiting"] for r in status["runs"]] == [None, None, "max_parallel",
                                                      "max_parallel"]
    finish(store, jobs[0].id)
    assert sweep_gate(store, store.get_job(jobs[2].id)) is None
    claimed = claim_next_gated(store, "w5", 60)
    assert claimed is not None and claimed.id == jobs[2].id
    # A queued job its worker still leases (re-placing after an interruption) is running:
    # it counts against max_parallel and no other worker takes it.
    finish(store, jobs[1].id)
    set_fields(store, jobs[2].id, status="queued")
    assert sweep_status(store, "qs")["runs"][2]["state"] == "running"
    set_fields(store, jobs[3].id, status="provisioning", lease_owner="w0")
    assert sweep_gate(store, store.get_job(jobs[3].id)) is None  # itself is not counted
    set_fields(store, jobs[3].id, status="queued", lease_owner=None)
    assert sweep_gate(store, store.get_job(jobs[3].id)) is None  # 1 running of 2
    got = claim_next_gated(store, "w6", 60)
    assert got is not None and got.id == jobs[3].id
    assert claim_next_gated(store, "w7", 60) is None
    assert store.get_job(jobs[2].id).lease_owner == "w5"


def test_budget_gate_uses_estimates_and_spending(folder: Path, store: Store) -> None:
    jobs = submit(store, sweep_file(folder, max_parallel=4, budget="12"))
    for job in jobs:
        set_fields(store, job.id, est_cost_micros=5_000_000)
    a = claim_next_gated(store, "w", 60)
    b = claim_next_gated(store, "w", 60)
    assert a is not None and b is not None
    # 0 spent + 10 running (estimated) + 5 > 12.
    assert sweep_gate(store, store.get_job(jobs[2].id)) == "budget"
    assert claim_next_gated(store, "w", 60) is None
    # The first run finished cheaper than estimated: 1 spent + 5 running + 5 <= 12.
    finish(store, a.id, cost_micros=1_000_000)
    assert sweep_gate(store, store.get_job(jobs[2].id)) is None
    c = claim_next_gated(store, "w", 60)
    assert c is not None and c.id == jobs[2].id
    # 1 spent + 10 running + 5 > 12; spending while running counts too.
    assert sweep_gate(store, store.get_job(jobs[3].id)) == "budget"
    finish(store, b.id, cost_micros=4_000_000)
    finish(store, c.id, cost_micros=4_000_000)
    # 9 spent + 5 > 12: the last run never starts.
    assert sweep_gate(store, store.get_job(jobs[3].id)) == "budget"
    assert claim_next_gated(store, "w", 60) is None
    status = sweep_status(store, "qs")
    assert status["spent"] == "9.000000" and status["budget"] == "12.000000"
    assert status["runs"][3]["waiting"] == "budget"


# --- orch sweep show / orch sweeps -------------------------------------------------------------


def test_sweep_show_picks_the_best_run_by_the_objective(env: dict[str, str], folder: Path,
                                                        store: Store) -> None:
    jobs = submit(store, sweep_file(folder, budget="25"))
    losses = {0: 0.9, 1: 0.4, 2: 0.6}
    for i, loss in losses.items():
        finish(store, jobs[i].id, cost_micros=1_000_000 * (i + 1))
        store.add_metrics(jobs[i].id, {"eval_loss": loss})
    store.add_metrics(jobs[0].id, {"eval_loss": 0.01}, step=10)  # a training step: not final
    finish(store, jobs[3].id, "failed", failure_reason="boom\ndetails")
    store.add_metrics(jobs[3].id, {"eval_loss": 0.1})  # a failed run never wins

    shown = json.loads(orch(env, "sweep", "show", "qs", "--json").stdout)
    assert shown["best"]["job_id"] == jobs[1].id
    assert shown["best"]["params"] == {"training.learning_rate": 1.0e-4, "lora.r": 16}
    assert [r["metric"] for r in shown["runs"]] == [0.9, 0.4, 0.6, 0.1]
    assert [r["state"] for r in shown["runs"]] == ["succeeded", "succeeded", "succeeded", "failed"]
    assert [r["cost"] for r in shown["runs"]][:3] == ["1.000000", "2.000000", "3.000000"]
    assert shown["spent"] == "6.000000" and shown["counts"]["succeeded"] == 3

    text = orch(env, "sweep", "show", "qs").stdout
    assert f"best (min eval_loss): {jobs[1].id} qs-001 eval_loss=0.4" in text
    assert "training.learning_rate=0.0001, lora.r=16" in text
    assert f"{jobs[3].id} failed: boom" in text
    assert orch(env, "sweep-show", "qs").stdout == text

    listed = json.loads(orch(env, "sweeps", "--json").stdout)
    assert [s["sweep"] for s in listed] == ["qs"] and listed[0]["best"]["job_id"] == jobs[1].id
    table = orch(env, "sweeps").stdout
    assert "qs" in table and f"{jobs[1].id} eval_loss=0.4" in table and "$6.00 / $25.00" in table


def test_sweep_show_tells_a_nan_objective_from_none(env: dict[str, str], folder: Path,
                                                     store: Store) -> None:
    # A diverged run reports its objective as `nan` (a NULL row): shown as `nan`, not as `-`
    # (reported nothing), and the best line says why there is none.
    jobs = submit(store, sweep_file(folder))
    finish(store, jobs[0].id)
    store.add_metrics(jobs[0].id, {"eval_loss": float("nan")})
    finish(store, jobs[1].id)  # finished without reporting it
    shown = json.loads(orch(env, "sweep", "show", "qs", "--json").stdout)
    assert [r["metric"] for r in shown["runs"]] == [None] * 4  # JSON has no NaN
    assert [r["metric_nan"] for r in shown["runs"]] == [True, False, False, False]
    assert [r["metric_nan"] for r in sweep_status(store, "qs")["runs"]] == \
        [True, False, False, False]  # the store's path agrees with the read-only one
    text = orch(env, "sweep", "show", "qs").stdout
    header, *rows = text.splitlines()[1:6]
    at = header.split("\t").index("eval_loss")
    assert [r.split("\t")[at] for r in rows] == ["nan", "-", "-", "-"]
    assert ("best: none yet (no finished run reported eval_loss as a number; 1 reported nan: "
            "diverged?)") in text
    store.add_metrics(jobs[1].id, {"eval_loss": 0.5})
    text = orch(env, "sweep", "show", "qs").stdout
    assert f"best (min eval_loss): {jobs[1].id} {jobs[1].name} eval_loss=0.5" in text


def test_sweep_show_has_the_last_rung_each_run_reached(env: dict[str, str], folder: Path,
                                                       store: Store) -> None:
    from orchestrator.core.search import Continue, Prune, RungRecord
    from orchestrator.records.sweep.trials import record_rungs

    jobs = submit(store, sweep_file(folder))
    assert "last rung" not in orch(env, "sweep", "show", "qs").stdout  # no rung checked yet
    curve = [(s, 2.0 - s / 30) for s in range(1, 31)]
    passed = Continue((RungRecord(0, 100, 1.9), RungRecord(1, 300, 1.7), RungRecord(2, 900, 1.1)))
    assert record_rungs(store, jobs[0].id, passed, "train.loss", curve, 30) is None
    lost = Prune(1, 300, 9, "train.loss", 1.8, 1.7, (RungRecord(0, 100, 1.95),))
    assert record_rungs(store, jobs[1].id, lost, "train.loss", curve, 30) is not None
    finish(store, jobs[1].id, "pruned")

    shown = json.loads(orch(env, "sweep", "show", "qs", "--json").stdout)
    assert [r["last_rung"] for r in shown["runs"]] == [0.9, 0.3, None, None]
    header, *rows = orch(env, "sweep", "show", "qs").stdout.splitlines()[1:6]
    at = header.split("\t").index("last rung")
    assert [r.split("\t")[at] for r in rows] == ["90 %", "30 %", "-", "-"]
    assert "pruned at 30 % (train.loss 1.8 > 1.7)" in rows[1]


def test_sweep_show_errors(env: dict[str, str], folder: Path) -> None:
    missing = orch(env, "sweep", "show", "nope", check=False)
    assert missing.returncode == 4 and "sweep 'nope' not found" in missing.stderr
    bare = orch(env, "sweep", "show", check=False)
    assert bare.returncode == 2 and "orch sweep show NAME" in bare.stderr
    extra = orch(env, "sweep", str(sweep_file(folder)), "more", check=False)
    assert extra.returncode == 2
    assert "no sweeps yet" in orch(env, "sweeps").stdout


def test_a_run_inserted_by_another_process_meanwhile_is_reported_not_duplicated(
        folder: Path, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """The race itself: both ticks looked before either inserted; the unique index decides."""
    from orchestrator.records.sweep import store as sweepstore

    path = sweep_file(folder)
    jobs = submit(store, path)
    finish(store, jobs[0].id)
    monkeypatch.setattr(sweepstore, "_jobs_by_key", lambda _store, _keys: {})
    report = submit_sweep(store, load_sweep(path), listed=SimCloud.price_list())
    assert [r.state for r in report.runs] == ["succeeded", "queued", "queued", "queued"]
    assert [r.job_id for r in report.runs] == [j.id for j in jobs]
    assert len(jobs_of(store)) == 4


# --- the stdlib read path ----------------------------------------------------------------------


def _both(store: Store, env: dict[str, str], name: str) -> tuple[Any, Any]:
    from orchestrator.records.history import open_reader
    from orchestrator.records.sweep.view import sweep_status as sqlite_status

    reader = open_reader(env["ORCH_DB_URL"])
    assert reader is not None
    try:
        return sweep_status(store, name), sqlite_status(reader, name)
    finally:
        reader.close()


def test_sqlite_status_is_the_store_status(env: dict[str, str], folder: Path,
                                           store: Store) -> None:
    jobs = submit(store, sweep_file(folder, max_parallel=2, budget="25"))
    claimed = claim_next_gated(store, "w1", 600)  # running, leased
    assert claimed is not None and claimed.id == jobs[0].id
    finish(store, jobs[1].id, cost_micros=2_500_000)
    store.add_metrics(jobs[1].id, {"eval_loss": 0.5})
    store.add_metrics(jobs[1].id, {"eval_loss": 0.4})  # the newest final value wins
    finish(store, jobs[2].id, "failed", failure_reason="boom")
    set_fields(store, jobs[3].id, est_cost_micros=30_000_000)  # held back by the budget
    by_store, by_sqlite = _both(store, env, "qs")
    assert by_sqlite == by_store
    assert json.dumps(by_sqlite, default=str) == json.dumps(by_store, default=str)
    assert [r["state"] for r in by_sqlite["runs"]] == ["running", "succeeded", "failed", "queued"]
    assert by_sqlite["runs"][3]["waiting"] == "budget"
    assert by_sqlite["best"]["job_id"] == jobs[1].id and by_sqlite["best"]["metric"] == 0.4

    from orchestrator.records.history import open_reader
    from orchestrator.records.sweep.store import list_sweeps
    from orchestrator.records.sweep.view import list_sweeps as sqlite_list

    reader = open_reader(env["ORCH_DB_URL"])
    try:
        assert sqlite_list(reader) == list_sweeps(store)
    finally:
        assert reader is not None
        reader.close()


def test_sqlite_status_objective_matches_pydantic(env: dict[str, str], folder: Path,
                                                  store: Store) -> None:
    from orchestrator.core.sweepspec import Objective
    from orchestrator.records.columns import sweep_spec_record

    for raw in ({"metric": "m"}, {"metric": "m", "goal": "min"}, {"metric": ""},
                {"metric": "m", "goal": "up"}, {"metric": 1}, {"metric": "m", "x": 1},
                {"goal": "max"}, ["m"], "m", None, {}):
        try:
            expected: Any = Objective.model_validate(raw).model_dump() if raw else None
        except ValueError:
            expected = None
        # The status views read a stored sweep file's objective through its column's model.
        read = sweep_spec_record(json.dumps({"objective": raw})).objective
        assert (None if read is None else read.model_dump()) == expected, raw


def test_active_statuses_copy_matches_the_store() -> None:
    from orchestrator.core.jobstatus import in_order
    from orchestrator.records.store import ACTIVE_STATUSES
    from orchestrator.records.sweep.view import ACTIVE_STATUSES as copy

    # The copy is now an import; what can drift is its meaning. A sweep counts a run as
    # active while a worker drives it: docs/schema.md's job-states table (lifecycle order)
    # lists those between `planned` and the first final state, `succeeded`.
    doc = (ROOT / "docs" / "schema.md").read_text()
    table = doc.split("#### Job states", 1)[1].split("\n\n", 2)[1]
    states = [line.split("|")[1].strip(" `") for line in table.splitlines()[2:]]
    driven = states[states.index("planned") + 1:states.index("succeeded")]
    assert copy == ACTIVE_STATUSES == frozenset(driven)
    assert in_order(ACTIVE_STATUSES) == tuple(driven)


def test_sweep_show_and_sweeps_do_not_import_sqlalchemy(env: dict[str, str], folder: Path,
                                                        store: Store) -> None:
    submit(store, sweep_file(folder))
    code = textwrap.dedent(f"""
        import os, sys
        os.environ["ORCH_DB_URL"] = {env["ORCH_DB_URL"]!r}
        from orchestrator.cli.app import app
        for args in (["sweep", "show", "qs"], ["sweep", "show", "qs", "--json"],
                     ["sweep-show", "qs"], ["sweeps"], ["sweeps", "--json"]):
            try:
                app(args)
            except SystemExit as exc:
                assert not exc.code, (args, exc.code)
        print("sqlalchemy" in sys.modules, "sqlmodel" in sys.modules, file=sys.stderr)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True, env=env)
    assert done.stderr.strip().splitlines()[-1] == "False False"
    assert "qs-000" in done.stdout


@pytest.mark.parametrize("verb", ["show", "cancel"])
@pytest.mark.parametrize("flag", ["--help", "-h"])
@pytest.mark.parametrize("name", [[], ["qs"]])
def test_a_sweep_verb_prints_its_own_help(tmp_path: Path, verb: str, flag: str,
                                          name: list[str]) -> None:
    """Issue 36 §6: `orch sweep cancel --help` printed `orch sweep FILE`'s help."""
    import os

    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "xdg")}
    out = orch(env, "sweep", verb, *name, flag).stdout
    assert out.startswith(f"Usage: orch sweep {verb} [OPTIONS] NAME\n"), out
    assert "--retry-failed" not in out and "--json" in out
    assert not (tmp_path / "xdg").exists()  # help opens no database


def test_sweep_states_are_the_jobs_words() -> None:
    """Issue 36 §6: `orch sweep show` said `done` where `orch jobs` says `succeeded`. A run's
    state is a job status, or `running` (what `orch jobs --status running` means), or what
    `orch sweep` did with it (`new`, `requeued`, `nofit`)."""
    from orchestrator.core.jobstatus import JOB_STATUSES
    from orchestrator.records.sweep.store import STATES

    assert "done" not in STATES
    assert set(STATES) - set(JOB_STATUSES) == {"new", "requeued", "running", "nofit"}
