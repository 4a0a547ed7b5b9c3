"""A `tpe` sweep with early stopping through the product (issue 38, phase B): `orch sweep`
proposes trials under the sweep row's lock, the engine prunes losing runs at their rungs and
records each decision once, a pruned run ends `pruned` with what it paid.

The CLI runs as real processes against SQLite and PostgreSQL; the runs train on the simulated
cloud (real sshd on loopback, the stand-in trainer following docs/sim-landscape.md).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import orchfork
import pytest
from conftest import BACKENDS, database_url
from sqlmodel import col, select
from test_report import chart, load

from orchestrator.core.jobstatus import FINAL_STATUSES, JobStatus, allowed
from orchestrator.core.search import Continue, Prune, RungRecord
from orchestrator.core.states import EventKind, RungDecision
from orchestrator.records.store import Event, Job, Metric, Store, SweepRung, open_store
from orchestrator.records.sweep.trials import record_rungs, stored_prune, trials_of
from providers.sim.compute import SimCloud

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"

SWEEP = """\
name: ts
base: jobs/quickstart.yml
grid:
  training.learning_rate: [1.0e-4, 2.0e-4, 5.0e-4]
  lora.r: [8, 16, 32]
search: {{sampler: tpe, trials: {trials}, seed: 0}}
early_stop: {{metric: train.loss, min_fraction: 0.1, reduction_factor: 3}}
max_parallel: 2
objective: {{metric: eval.exact_match, goal: max}}
"""


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "env" in metafunc.fixturenames and metafunc.function.__name__ not in SQLITE_ONLY:
        metafunc.parametrize("env", BACKENDS, indirect=True)


# Whole simulated runs: once, on the default database (the store paths are the same code).
SQLITE_ONLY = {"test_a_tpe_sweep_prunes_losing_runs_and_keeps_what_they_paid",
               "test_a_recorded_prune_is_completed_by_the_next_worker",
               "test_a_diverged_trial_is_pruned_at_its_first_rung",
               "test_a_diverged_trial_is_pruned_before_a_late_rung_and_parks_its_machine",
               "test_a_diverged_run_without_early_stop_fails_and_its_retry_takes_the_edit"}


@pytest.fixture
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, str]]:
    backend = getattr(request, "param", "sqlite")
    e = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "xdg"), "ORCH_LEASE_S": "3",
         "ORCH_SIM_TRAIN_STEPS": "30", "ORCH_SIM_STEP_S": "0.1",
         "ORCH_DB_URL": database_url(backend, tmp_path, request)}
    for key in ("VAST_API_KEY", "RUNPOD_API_KEY", "ORCH_FAILPOINT"):
        e.pop(key, None)
    yield e
    SimCloud(Path(e["XDG_DATA_HOME"]) / "orch" / "sim").terminate_all()


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    shutil.copy(EXAMPLES / "quickstart.yml", jobs / "quickstart.yml")
    shutil.copytree(EXAMPLES / "data", jobs / "data")
    return tmp_path


@pytest.fixture
def store(env: dict[str, str]) -> Iterator[Store]:
    s = open_store(env["ORCH_DB_URL"])
    try:
        yield s
    finally:
        s.close()


def sweep_file(folder: Path, trials: int = 4) -> Path:
    path = folder / "sweep.yml"
    path.write_text(SWEEP.format(trials=trials))
    return path


def exe() -> str:
    return shutil.which("orch", path=str(Path(sys.executable).parent)) or "orch"


def orch(env: dict[str, str], *args: str, timeout: float = 180) -> str:
    proc = orchfork.run(list(args), env=env, cwd=ROOT, timeout=timeout)
    assert proc.returncode == 0, f"orch {' '.join(args)} -> {proc.returncode}\n{proc.stderr}"
    return proc.stdout


def jobs_of(store: Store) -> list[Job]:
    with store.session() as s:
        return list(s.exec(select(Job).order_by(col(Job.trial_number), col(Job.id))))


def live(env: dict[str, str]) -> list[object]:
    return list(SimCloud(Path(env["XDG_DATA_HOME"]) / "orch" / "sim").list())


# --- records ---------------------------------------------------------------------------------


def test_pruned_is_a_final_state_an_active_job_may_enter() -> None:
    assert JobStatus.PRUNED in FINAL_STATUSES
    assert allowed(JobStatus.TRAINING, JobStatus.PRUNED)
    assert allowed(JobStatus.PROVISIONING, JobStatus.PRUNED)  # a takeover completes it
    assert not allowed(JobStatus.QUEUED, JobStatus.PRUNED)
    assert not any(allowed(JobStatus.PRUNED, s) for s in JobStatus)


def test_the_rendered_config_holds_out_the_eval_split(env: dict[str, str],
                                                     folder: Path) -> None:
    # train.eval_loss exists only when axolotl gets val_set_size (and eval_steps): the
    # rendered config left val_set_size out, so no run ever reported an eval loss.
    job = folder / "jobs" / "held.yml"
    job.write_text((folder / "jobs" / "quickstart.yml").read_text().replace(
        "  learning_rate: 2.0e-4\n",
        "  learning_rate: 2.0e-4\n  val_set_size: 0.05\ntrainer: {extra: {eval_steps: 3}}\n"))
    rendered = orch(env, "render", str(job))
    assert "\nval_set_size: 0.05\n" in rendered and "\neval_steps: 3\n" in rendered


# --- orch sweep proposes -----------------------------------------------------------------------


def test_overlapping_tpe_ticks_propose_the_free_slots_once(env: dict[str, str], folder: Path,
                                                           store: Store) -> None:
    path = sweep_file(folder)
    procs = [subprocess.Popen([exe(), "sweep", str(path), "--json"], env=env, cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [err for _, err in outs]
    reports = [json.loads(out) for out, _ in outs]
    assert sum(r["counts"]["new"] for r in reports) == 2  # max_parallel: 2 free slots
    jobs = jobs_of(store)
    assert [j.trial_number for j in jobs] == [0, 1]
    assert [j.name for j in jobs] == ["ts-000", "ts-001"]
    assert len({j.sweep_key for j in jobs}) == 2
    params = [t.record.params for t in trials_of(store, jobs[0].sweep_id or "", None)]
    assert params[0] != params[1]
    with store.session() as s:
        assert len(list(s.exec(select(Event).where(Event.kind == EventKind.QUEUED)))) == 2
    # Nothing free: a tick proposes nothing. One trial ends: the next tick proposes one,
    # numbered after the recorded ones.
    assert json.loads(orch(env, "sweep", str(path), "--json"))["counts"]["new"] == 0
    with store.transaction() as s:
        job = s.get(Job, jobs[0].id)
        assert job is not None
        job.status = JobStatus.FAILED
    again = json.loads(orch(env, "sweep", str(path), "--json"))
    assert again["counts"]["new"] == 1
    assert [j.trial_number for j in jobs_of(store)] == [0, 1, 2]


# --- rung decisions are made once ----------------------------------------------------------------


def test_a_rung_is_decided_once(env: dict[str, str], folder: Path, store: Store) -> None:
    orch(env, "sweep", str(sweep_file(folder)))
    first, second = (j.id for j in jobs_of(store))
    points = [(s, 2.0 - s / 100) for s in range(1, 31)]
    kept = Continue((RungRecord(0, 100, 1.97),))
    assert record_rungs(store, first, kept, "train.loss", points, 30) is None
    # A replay that would prune at the same rung (another worker, a takeover) finds the
    # decision made: it goes on.
    late = Prune(0, 100, 3, "train.loss", 1.97, 1.5, (RungRecord(0, 100, 1.97),))
    assert record_rungs(store, first, late, "train.loss", points, 30) is None
    prune = Prune(0, 100, 3, "train.loss", 1.97, 1.5, (RungRecord(0, 100, 1.97),))
    row = record_rungs(store, second, prune, "train.loss", points, 30)
    assert row is not None and row.decision == RungDecision.PRUNE and row.cutoff == 1.5
    assert record_rungs(store, second, kept, "train.loss", points, 30) == row
    with store.session() as s:
        rows = list(s.exec(select(SweepRung)))
    assert sorted((r.job_id == first, r.decision) for r in rows) == [
        (False, RungDecision.PRUNE), (True, RungDecision.CONTINUE)]


def test_a_diverged_trials_rung_is_null_and_reads_back_as_nan(env: dict[str, str], folder: Path,
                                                               store: Store) -> None:
    # A diverged run's losses are `nan` (NULL rows): the rung's mean is NaN, which optuna
    # prunes; before 0014 the NOT NULL rung (and metric) columns refused it mid-poll.
    import math

    from orchestrator.records.sweep.trials import curve, prune_record

    path = sweep_file(folder)
    orch(env, "sweep", str(path))
    job = jobs_of(store)[0].id
    store.add_metrics(job, {"train.loss": 2.0}, step=1)
    for step in range(2, 10):
        store.add_metrics(job, {"train.loss": float("nan")}, step=step)
    points = curve(store, job, "train.loss")
    assert points[0] == (1, 2.0) and all(math.isnan(v) for _, v in points[1:])
    nan = float("nan")
    row = record_rungs(store, job, Prune(0, 100, 3, "train.loss", nan, 1.5,
                                         (RungRecord(0, 100, nan),)), "train.loss", points, 30)
    assert row is not None and row.value is None
    assert math.isnan(prune_record(row).value)
    sweep_id = jobs_of(store)[0].sweep_id
    assert sweep_id is not None
    trial = next(t for t in trials_of(store, sweep_id, None) if t.job.id == job)
    assert [math.isnan(r.value) for r in trial.record.rungs] == [True]
    # `orch sweep show --json` parses: JSON has no NaN, the rung's value is null.
    shown = json.loads(orch(env, "sweep", "show", "ts", "--json"))
    run = next(r for r in shown["runs"] if r["job_id"] == job)
    assert [g["value"] for g in run["rungs"]] == [None]


# --- the engine prunes -------------------------------------------------------------------------


def _run_sweep(env: dict[str, str], path: Path, ticks: int) -> None:
    for _ in range(ticks):
        orch(env, "sweep", str(path), "-q")
        orch(env, "worker", "--once", "-q", timeout=300)


def test_a_tpe_sweep_prunes_losing_runs_and_keeps_what_they_paid(
        env: dict[str, str], folder: Path, store: Store) -> None:
    path = sweep_file(folder, trials=5)
    base = folder / "jobs" / "quickstart.yml"  # a pruned run's machine waits for the next
    base.write_text(base.read_text().replace("  spot: allowed\n",
                                             "  spot: never\n  keep_warm: 120s\n"))
    _run_sweep(env, path, 4)
    jobs = jobs_of(store)
    assert len(jobs) == 5 and all(j.status in FINAL_STATUSES for j in jobs), \
        [(j.name, j.status) for j in jobs]
    pruned = [j for j in jobs if j.status == JobStatus.PRUNED]
    assert pruned and any(j.status == JobStatus.SUCCEEDED for j in jobs)
    for job in pruned:
        row = stored_prune(store, job.id)
        assert row is not None and row.metric == "train.loss" and row.cutoff is not None
        assert job.cost_micros > 0 and job.failure_reason is None
        ends = [e for e in store.events(job.id) if e.kind == EventKind.STATE]
        decided = ends[-1].data().pruned
        assert decided is not None and (decided.resource, decided.step) == (row.resource,
                                                                           row.step)
        assert not [e for e in store.events(job.id) if e.kind == EventKind.DELIVERED]
        with store.session() as s:
            metrics = list(s.exec(select(Metric).where(Metric.job_id == job.id)))
        assert {m.name for m in metrics} == {"train.loss"}  # no evaluation ran
    # A pruned run's machine was parked (its training stopped), and a later trial took it.
    parked = [j for j in pruned if any(e.kind == "instance.parked" for e in store.events(j.id))]
    assert parked, "no pruned run parked its machine"
    machines = {r.provider_instance_id for j in jobs for r in store.instances_of(j.id)}
    assert len(machines) < len(jobs)
    orch(env, "warm", "release", "--all")
    assert live(env) == []
    with store.session() as s:
        rows = list(s.exec(select(SweepRung)))
    assert {r.job_id for r in rows} == {j.id for j in jobs}  # every run checked at a rung
    # `orch sweep show`: the trials, their rungs, the pruned ones and why, the best so far.
    shown = json.loads(orch(env, "sweep", "show", "ts", "--json"))
    assert shown["search"] == {"sampler": "tpe", "trials": 5, "seed": 0}
    assert shown["counts"]["pruned"] == len(pruned) and shown["best"] is not None
    by_id = {r["job_id"]: r for r in shown["runs"]}
    for job in pruned:
        decided = [g for g in by_id[job.id]["rungs"] if g["decision"] == "prune"]
        assert len(decided) == 1 and decided[0]["metric"] == "train.loss"
    assert Decimal(shown["pruned_spent"]) == sum(
        Decimal(j.cost_micros) for j in pruned) / 10**6
    text = orch(env, "sweep", "show", "ts")
    assert "tpe: 5 of 5 trials" in text and "of which pruned runs $" in text
    assert text.count("pruned at ") == len(pruned)
    # `orch report --sweep`: the loss curves, pruned ones dashed (a line and its legend
    # entry each) with the rungs as lines; the objective against each parameter.
    page = folder / "report.html"
    orch(env, "report", "--sweep", "ts", "-o", str(page))
    dom, errors = load(page)
    assert errors == []
    loss = chart(dom, "loss-chart")
    assert len(re.findall(r"stroke-dasharray: ?9px", loss)) == 2 * len(pruned)
    assert "(pruned)" in loss and "<path data-index" in loss  # the rungs' lines
    for i in (0, 1):  # learning rate, rank
        assert re.findall(r'class="point"', chart(dom, f"objective-chart-{i}"))
    # `orch cost` counts the pruned runs' money with the rest.
    total = json.loads(orch(env, "cost", "--json"))["total"]
    assert total["jobs"] == 5
    assert Decimal(total["cost"]) == sum(Decimal(j.cost_micros) for j in jobs) / 10**6


DIVERGING = """\
name: dv
base: jobs/quickstart.yml
grid:
  training.learning_rate: [5.0e-2, 2.0e-4]
early_stop: {metric: train.loss, min_fraction: 0.1, reduction_factor: 3}
max_parallel: 1
objective: {metric: eval.exact_match, goal: max}
"""


def _good_and_diverged(env: dict[str, str], path: Path, store: Store) -> tuple[Job, Job]:
    """Run DIVERGING's two trials: the good one succeeded, the diverged one was pruned."""
    _run_sweep(env, path, 2)
    by_lr = {json.loads(j.spec_json)["training"]["learning_rate"]: j for j in jobs_of(store)}
    good, diverged = by_lr[2.0e-4], by_lr[5.0e-2]
    assert good.status == JobStatus.SUCCEEDED, good.failure_reason
    assert diverged.status == JobStatus.PRUNED, diverged.failure_reason
    return good, diverged


def test_a_diverged_trial_is_pruned_at_its_first_rung(env: dict[str, str], folder: Path,
                                                      store: Store) -> None:
    # 5e-2 diverges at a tenth of its steps (docs/sim-landscape.md): transformers then logs
    # `'loss': 0.0` beside `'grad_norm': nan`. Read as 0.0, the diverged run was the best at
    # every rung (it went on, and cut the cutoff for the runs after it); read as `nan`, it is
    # pruned at its first rung, as optuna prunes a NaN. It runs first: its NaN rung, once
    # recorded, must not be a competitor of the good run after it (it pruned it).
    path = folder / "dv.yml"
    path.write_text(DIVERGING)
    good, diverged = _good_and_diverged(env, path, store)
    row = stored_prune(store, diverged.id)
    assert row is not None and row.value is None and row.resource == 100
    text = orch(env, "sweep", "show", "dv")
    assert "pruned at 10 % (train.loss nan)" in text
    told = [e for e in store.events(diverged.id) if e.kind == EventKind.TRAIN_NOT_FINITE]
    assert [e.data().metric for e in told] == ["train.loss"]


def test_a_diverged_trial_is_pruned_before_a_late_rung_and_parks_its_machine(
        env: dict[str, str], folder: Path, store: Store) -> None:
    # The first rung at half the steps, the divergence at a tenth: three `nan` logs later
    # the trial is pruned (as optuna prunes a NaN report at any step), not failed, so the
    # search ranks it below every other trial and its machine is parked for the next.
    path = folder / "dv.yml"
    path.write_text(DIVERGING.replace("min_fraction: 0.1", "min_fraction: 0.5"))
    base = folder / "jobs" / "quickstart.yml"
    base.write_text(base.read_text().replace("  spot: allowed\n",
                                             "  spot: never\n  keep_warm: 120s\n"))
    good, diverged = _good_and_diverged(env, path, store)
    # Recorded before the stop, as a rung's prune is (a takeover completes it), where it
    # stopped: before the rung at half its steps, with no value to rank it by.
    row = stored_prune(store, diverged.id)
    assert row is not None and row.value is None and row.cutoff is None
    assert row.step < 15 and row.resource == -(-row.step * 1000 // 30) and row.rung == 0
    said = [e for e in store.events(diverged.id) if e.kind == "sweep.pruned"]
    assert len(said) == 1 and "diverged" in said[0].message, said
    assert f"pruned at {row.resource / 10:g} % (train.loss nan)" in orch(env, "sweep", "show",
                                                                        "dv")
    sweep_id = diverged.sweep_id
    assert sweep_id is not None
    states = {t.job.id: t.record.state for t in trials_of(store, sweep_id, None)}
    assert states[diverged.id] == "pruned"
    assert any(e.kind == "instance.parked" for e in store.events(diverged.id))
    machines = {r.provider_instance_id for j in (good, diverged) for r in store.instances_of(j.id)}
    assert len(machines) == 1  # the good trial took the diverged one's parked machine
    orch(env, "warm", "release", "--all")
    assert live(env) == []


def test_a_diverged_run_without_early_stop_fails_and_its_retry_takes_the_edit(
        env: dict[str, str], folder: Path, store: Store) -> None:
    # Without early_stop a diverged run fails (`diverged: ...`); the search reads it as
    # pruned, evidence against its params. Its reason names `training.stop_on_nan: false`:
    # that edit leaves the run's identity (and its failed job) as it was, so
    # `--retry-failed` must run the job with it, not with the spec it failed with.
    path = folder / "dv.yml"
    path.write_text(DIVERGING.replace(
        "early_stop: {metric: train.loss, min_fraction: 0.1, reduction_factor: 3}\n", "")
        .replace("[5.0e-2, 2.0e-4]", "[5.0e-2]"))
    _run_sweep(env, path, 1)
    (job,) = jobs_of(store)
    assert job.status == JobStatus.FAILED and job.failure_reason is not None
    assert job.failure_reason.startswith("diverged: train.loss was nan"), job.failure_reason
    assert job.sweep_id is not None
    assert [t.record.state for t in trials_of(store, job.sweep_id, None)] == ["pruned"]
    base = folder / "jobs" / "quickstart.yml"
    base.write_text(base.read_text().replace("learning_rate: 2.0e-4",
                                             "learning_rate: 2.0e-4\n  stop_on_nan: false"))
    orch(env, "sweep", str(path), "--retry-failed", "-q")
    orch(env, "worker", "--once", "-q", timeout=300)
    (again,) = jobs_of(store)
    assert again.id == job.id and again.spec_hash == job.spec_hash
    assert json.loads(again.spec_json)["training"]["stop_on_nan"] is False
    assert again.status == JobStatus.SUCCEEDED, again.failure_reason  # trained on


def test_a_recorded_prune_is_completed_by_the_next_worker(
        env: dict[str, str], folder: Path, store: Store) -> None:
    # A worker that recorded a prune and died before it stopped the run (kill -9): the
    # decision is in the database, and the next worker ends the job pruned, training nothing.
    orch(env, "sweep", str(sweep_file(folder)))
    first = jobs_of(store)[0]
    prune = Prune(1, 300, 9, "train.loss", 1.9, 1.7, (RungRecord(1, 300, 1.9),))
    assert record_rungs(store, first.id, prune, "train.loss", [(9, 1.9)], 30) is not None
    orch(env, "worker", "--once", "--max-jobs", "1", "-q", timeout=300)
    job = store.get_job(first.id)
    assert job.status == JobStatus.PRUNED
    assert not [e for e in store.events(job.id) if e.kind == EventKind.TRAIN_PROGRESS]
    decided = [e for e in store.events(job.id) if e.kind == EventKind.STATE][-1].data().pruned
    assert decided is not None and decided.resource == 300
    assert live(env) == []
