"""The fault-injection suite (issue 10 §2, §3, §4, §7): provider faults through the HTTP
emulators and a black-holed API, and kill -9 of `orch` at each point of a job's life.

Every scenario ends with the same checks (`assert_invariants`): no instance left running at
the provider or open in the database, each job exactly once and either finished or queued
with a reason, no duplicate metric rows. Real parts only: the emulators are real HTTP
servers, the hosts real sshd, the crash tests the real `orch` executable killed for real.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import test_engine
import test_engine_providers
from emulators.blackhole import BlackHole
from emulators.hosts import SimHostBackend
from emulators.runpod import RunPodEmulator
from emulators.tcpfault import FaultyHosts
from emulators.vast import VastEmulator
from test_emulator_hosts import RUNPOD_CATALOG as RUNPOD_GPUS
from test_engine import Rig
from test_engine_crash import (
    lease_lapsed,
    live_instances,
    one_job,
    orch,
    query,
    sim_dir,
    spawn,
    status,
    training,
    wait_for,
)
from test_engine_providers import KEY, job_for, runpod, vast

from orchestrator.engine.reconcile import reconcile
from orchestrator.engine.runner import JobRunner, Options, owner_id
from orchestrator.records.store import Store, open_store, utcnow
from providers.base import Requirements
from providers.sim.compute import SimCloud
from providers.vastai.compute import VastAI

BUNDLES = "/api/v0/bundles"

# The engine tests' fixtures: a database, sim clouds and orch's key under tmp_path; and the
# simulated hosts the emulators' instances boot.
rig = test_engine.rig
hosts = test_engine_providers.hosts


def options(rig: Rig, **over: Any) -> Options:
    base: dict[str, Any] = {"poll_s": 0.2, "watch_s": 0.2, "lease_s": 5,
                            "boot_deadline_s": 30, "connect_deadline_s": 20,
                            "ssh_key": rig.key.private, "backoff_s": 0.3}
    return Options(**{**base, **over})


def run(rig: Rig, providers: dict[str, Any], job_id: str, *, worker: bool = True,
        **over: Any) -> Any:
    """Claim and drive one job as `orch worker` (requeue) or `orch submit` (cancel) does."""
    owner = owner_id("test")
    assert rig.store.claim_job(job_id, owner, 5) is not None
    return JobRunner(rig.store, providers, owner, options(rig, **over),
                     on_signal="requeue" if worker else "cancel").run(job_id)


def work_queue(rig: Rig, providers: dict[str, Any], **over: Any) -> list[str]:
    """`orch worker --once`'s loop: claim whatever may start now, run it, until none."""
    ran = []
    owner = owner_id("worker")
    for _ in range(20):
        job = rig.store.claim_next(owner, 5)
        if job is None:
            break  # the real worker sleeps `--poll` seconds here
        ran.append(job.id)
        JobRunner(rig.store, providers, owner, options(rig, **over),
                  on_signal="requeue").run(job.id)
    return ran


def duplicate_metrics(store: Store) -> list[Any]:
    with store.engine.connect() as conn:
        return list(conn.exec_driver_sql(
            "SELECT job_id, name, coalesce(step, -1), count(*) FROM metric "
            "GROUP BY job_id, name, coalesce(step, -1) HAVING count(*) > 1").all())


def assert_invariants(store: Store, live: list[Any]) -> None:
    """0 leaked instances, every job finished or queued with a reason, 0 duplicate metrics."""
    assert live == [], f"instances left running: {live}"
    assert store.open_instances() == []
    for job in store.list_jobs(limit=1000):
        assert job.status in ("succeeded", "failed", "cancelled", "queued"), job.status
        if job.status == "queued":
            last = [e for e in store.events(job.id) if e.kind == "state"][-1]
            assert last.message, f"{job.id} queued without a reason"
    assert duplicate_metrics(store) == []


def last_state(store: Store, job_id: str) -> str:
    return [e.message for e in store.events(job_id) if e.kind == "state"][-1]


# --- §2: provider outages are transient ------------------------------------------------------


def test_offer_search_outage_requeues_with_a_backoff_then_recovers(
        rig: Rig, hosts: SimHostBackend) -> None:
    with VastEmulator(api_key=KEY, hosts=hosts) as emu:
        emu.add_offer(id=1, gpu_name="RTX 4090", dph_base=0.40, min_bid=0.20)
        emu.fail_next(10_000, 503, method="POST", path=BUNDLES)
        job_id = job_for(rig, "vastai")
        job = run(rig, {"vastai": hosts.serving(vast(emu))}, job_id)
        assert job.status == "queued", job.failure_reason
        message = last_state(rig.store, job_id)
        assert "vastai: provider unavailable" in message and "credentials" not in message
        assert job.not_before is not None and job.not_before > job.updated_at
        assert job.lease_owner is None and rig.store.instances_of(job_id) == []
        assert_invariants(rig.store, list(emu.instances))
        # The outage ends; once the backoff has passed a worker claims it and it succeeds.
        emu.faults.clear()
        owner = owner_id("worker")
        wait_for(lambda: rig.store.claim_job(job_id, owner, 5), timeout=30,
                 what="the backoff to pass")
        done = JobRunner(rig.store, {"vastai": hosts.serving(vast(emu))}, owner, options(rig),
                         on_signal="requeue").run(job_id)
        assert done.status == "succeeded", done.failure_reason
        assert done.outage_since is None and done.not_before is None
        assert_invariants(rig.store, list(emu.instances))


def test_outage_gives_up_after_the_limit_with_a_clear_reason(rig: Rig,
                                                             hosts: SimHostBackend) -> None:
    with VastEmulator(api_key=KEY, hosts=hosts) as emu:
        emu.add_offer(id=1, gpu_name="RTX 4090", dph_base=0.40, min_bid=0.20)
        emu.fail_next(10_000, 502, method="POST", path=BUNDLES)
        job_id = job_for(rig, "vastai")
        assert run(rig, {"vastai": hosts.serving(vast(emu))}, job_id).status == "queued"
        # The outage began long ago (as if the job had been retried for hours).
        rig.store.update_job_fields(job_id, not_before=None,
                                    outage_since=utcnow() - timedelta(hours=7))
        job = run(rig, {"vastai": hosts.serving(vast(emu))}, job_id)
        assert job.status == "failed"
        assert "provider unavailable" in (job.failure_reason or "")
        assert "gave up after" in (job.failure_reason or "")
        assert_invariants(rig.store, list(emu.instances))


def test_worker_does_not_drain_the_queue_during_an_outage(rig: Rig,
                                                          hosts: SimHostBackend) -> None:
    with VastEmulator(api_key=KEY, hosts=hosts) as emu:
        emu.add_offer(id=1, gpu_name="RTX 4090", dph_base=0.40, min_bid=0.20)
        emu.fail_next(10_000, 503, method="POST", path=BUNDLES)
        ids = [job_for(rig, "vastai") for _ in range(3)]
        ran = work_queue(rig, {"vastai": hosts.serving(vast(emu))}, backoff_s=60)
        assert sorted(ran) == sorted(ids)  # each claimed once, then left to its backoff
        assert {rig.store.get_job(j).status for j in ids} == {"queued"}
        # Only the first job waited out the adapter's retries; the worker remembered the
        # outage for the others instead of asking again.
        assert len(emu.requests_to("POST", BUNDLES)) == 4
        assert rig.store.claim_next(owner_id("worker"), 5) is None  # nothing to spin on
        assert_invariants(rig.store, list(emu.instances))


def test_foreground_submit_waits_out_a_short_outage(rig: Rig, hosts: SimHostBackend) -> None:
    with VastEmulator(api_key=KEY, hosts=hosts) as emu:
        emu.add_offer(id=1, gpu_name="RTX 4090", dph_base=0.40, min_bid=0.20)
        emu.fail_next(8, 502, method="POST", path=BUNDLES)  # two searches' worth of retries
        job_id = job_for(rig, "vastai")
        job = run(rig, {"vastai": hosts.serving(vast(emu))}, job_id, worker=False)
        assert job.status == "succeeded", job.failure_reason
        notes = [e.message for e in rig.store.events(job_id) if e.kind == "offers.note"]
        assert notes and all("unavailable" in n for n in notes)
        assert "queued" in rig.states(job_id)
        assert_invariants(rig.store, list(emu.instances))


def test_other_providers_offers_are_used_during_an_outage(rig: Rig,
                                                          hosts: SimHostBackend) -> None:
    with VastEmulator(api_key=KEY, hosts=hosts) as vemu, \
            RunPodEmulator(api_key=KEY, gpus=json.loads(json.dumps(RUNPOD_GPUS)),
                           hosts=hosts) as remu:
        vemu.add_offer(id=1, gpu_name="RTX 4090", dph_base=0.01, min_bid=0.01)
        vemu.fail_next(10_000, 503, method="POST", path=BUNDLES)
        job_id = job_for(rig, "vastai, runpod")
        job = run(rig, {"vastai": hosts.serving(vast(vemu)),
                        "runpod": hosts.serving(runpod(remu))}, job_id)
        assert job.status == "succeeded", job.failure_reason
        assert [r.provider for r in rig.store.instances_of(job_id)] == ["runpod"]
        assert_invariants(rig.store, list(vemu.instances) + remu.pod_ids)


def test_429_with_a_long_retry_after_requeues_instead_of_blocking(
        rig: Rig, hosts: SimHostBackend) -> None:
    with VastEmulator(api_key=KEY, hosts=hosts) as emu:
        emu.add_offer(id=1, gpu_name="RTX 4090", dph_base=0.40, min_bid=0.20)
        emu.fail_next(10_000, 429, method="POST", path=BUNDLES,
                      headers={"Retry-After": "3600"})
        job_id = job_for(rig, "vastai")
        job = run(rig, {"vastai": hosts.serving(vast(emu))}, job_id)
        assert job.status == "queued"
        assert len(emu.requests_to("POST", BUNDLES)) == 1  # not slept through, not hammered
        # Not claimed again before the hour the provider asked for.
        assert job.not_before is not None
        assert job.not_before - job.updated_at >= timedelta(minutes=59)
        assert_invariants(rig.store, list(emu.instances))


@pytest.mark.parametrize(("code", "says"), [(401, "API key was refused"), (402, "credit")])
def test_auth_and_balance_errors_fail_at_once(rig: Rig, hosts: SimHostBackend, code: int,
                                              says: str) -> None:
    with VastEmulator(api_key=KEY, hosts=hosts) as emu:
        emu.add_offer(id=1, gpu_name="RTX 4090", dph_base=0.40, min_bid=0.20)
        emu.fail_next(10_000, code, method="POST", path=BUNDLES)
        job_id = job_for(rig, "vastai")
        job = run(rig, {"vastai": hosts.serving(vast(emu))}, job_id)
        assert job.status == "failed"  # not an outage: waiting would not fix it
        assert says in (job.failure_reason or "")
        assert_invariants(rig.store, list(emu.instances))


def test_persistent_5xx_on_create_rents_nothing_and_requeues(rig: Rig,
                                                             hosts: SimHostBackend) -> None:
    with VastEmulator(api_key=KEY, hosts=hosts) as emu:
        emu.add_offer(id=1, gpu_name="RTX 4090", dph_base=0.40, min_bid=0.20)
        emu.add_offer(id=2, gpu_name="RTX 5090", gpu_ram=32768, dph_base=0.60, min_bid=0.30)
        emu.fail_next(10_000, 500, method="PUT")
        job_id = job_for(rig, "vastai")
        job = run(rig, {"vastai": hosts.serving(vast(emu))}, job_id)
        assert job.status == "queued"
        assert "providers are unavailable" in last_state(rig.store, job_id)
        assert_invariants(rig.store, list(emu.instances))


def test_foreground_submit_retries_the_offers_after_a_create_outage(
        rig: Rig, hosts: SimHostBackend) -> None:
    with VastEmulator(api_key=KEY, hosts=hosts) as emu:
        emu.add_offer(id=1, gpu_name="RTX 4090", dph_base=0.40, min_bid=0.20)
        emu.add_offer(id=2, gpu_name="RTX 5090", gpu_ram=32768, dph_base=0.60, min_bid=0.30)
        # Every create of the first round (2 machines, spot and on-demand), all retries.
        emu.fail_next(16, 500, method="PUT")
        job_id = job_for(rig, "vastai")
        job = run(rig, {"vastai": hosts.serving(vast(emu))}, job_id, worker=False)
        assert job.status == "succeeded", job.failure_reason
        assert [r.end_reason for r in rig.store.instances_of(job_id)] == ["failed"] * 4 + [
            "released"]
        assert "providers are unavailable" in " ".join(
            e.message for e in rig.store.events(job_id) if e.kind == "state")
        assert_invariants(rig.store, list(emu.instances))


@pytest.mark.parametrize("fault", ["dropped", "stalled"])
def test_lost_create_answers_never_rent_twice(rig: Rig, hosts: SimHostBackend,
                                              fault: str) -> None:
    with VastEmulator(api_key=KEY, hosts=hosts) as emu:
        emu.add_offer(id=1, gpu_name="RTX 4090", dph_base=0.40, min_bid=0.20)
        if fault == "dropped":
            emu.drop_next_create()
        else:
            emu.stall_next_create(3.0)  # the adapter's read timeout is 1 s
        adapter = VastAI(KEY, base_url=emu.url, attempts=4, initial_s=0.01, max_wait_s=0.05,
                         timeout_s=1.0)
        job_id = job_for(rig, "vastai")
        job = run(rig, {"vastai": hosts.serving(adapter)}, job_id)
        assert job.status == "succeeded", job.failure_reason
        assert len(emu.requests_to("PUT", "/api/v0/asks")) == 1
        assert len(rig.store.instances_of(job_id)) == 1
        assert_invariants(rig.store, list(emu.instances))


# --- §3: an unreachable provider stalls nobody else -----------------------------------------


def test_a_black_holed_provider_is_not_asked_on_a_sim_jobs_path(rig: Rig) -> None:
    cloud = rig.cloud()
    with BlackHole() as hole:
        dead = VastAI(KEY, base_url=hole.url, timeout_s=2.0, attempts=2, initial_s=0.01)
        job_id = rig.queue(rig.job_file())
        job = run(rig, {"sim": cloud, "vastai": dead}, job_id)
        assert job.status == "succeeded", job.failure_reason
        assert hole.connections == 0
    assert_invariants(rig.store, cloud.list())


def test_reconcile_reports_a_black_holed_provider_and_sweeps_the_others(
        rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.engine.wiring import QUICK_HTTP, configured_providers

    cloud = rig.cloud()
    [offer] = cloud.offers(Requirements(1, 0, gpus=frozenset({"RTX 3090"}),
                                        interruptible=True))
    orphan = cloud.create(offer, rig.key.public, "j-neverrecorded")
    with BlackHole() as hole:
        monkeypatch.setenv("VAST_API_KEY", KEY)
        monkeypatch.setenv("ORCH_VASTAI_URL", hole.url)
        monkeypatch.delenv("RUNPOD_API_KEY", raising=False)
        providers, _ = configured_providers(rig.store, sim=False, quick=True)
        report = reconcile(rig.store, {**providers, "sim": cloud})
        assert [a.provider for a in report.of("error")] == ["vastai"]
        assert [a.instance_id for a in report.of("terminate")] == [orphan.instance_id]
        assert hole.connections <= QUICK_HTTP["attempts"]
    assert_invariants(rig.store, cloud.list())


# --- §4 + §7: kill -9 at each point of a job's life ------------------------------------------


@pytest.fixture
def env(tmp_path: Path) -> Iterator[dict[str, str]]:
    import os

    e = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "xdg"), "ORCH_LEASE_S": "2",
         "ORCH_SIM_TRAIN_STEPS": "4", "ORCH_SIM_STEP_S": "0.1"}
    for key in ("ORCH_DB_URL", "VAST_API_KEY", "RUNPOD_API_KEY", "ORCH_FAILPOINT",
                "ORCH_IDLE_GRACE_S"):
        e.pop(key, None)
    yield e
    SimCloud(sim_dir(e)).terminate_all()


def db_invariants(env: dict[str, str]) -> None:
    path = Path(env["XDG_DATA_HOME"]) / "orch" / "orch.db"
    store = open_store(f"sqlite:///{path}")
    try:
        assert_invariants(store, live_instances(env))
    finally:
        store.close()


def count(env: dict[str, str], sql: str, *args: object) -> int:
    return int(query(env, sql, *args)[0][0])


# Where `orch submit` dies, and how many instances the whole job may have rented: a crash
# before the instance's id is written, or during training, merge, evaluation or the copy
# back, is resumed on the same instance; after the terminate, nothing new is rented.
CRASH_POINTS = ["after-create", "training", "merging", "evaluating", "releasing",
                "after-terminate"]


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_kill_9_at_each_point_is_recovered_without_waste(env: dict[str, str],
                                                         point: str) -> None:
    crashed = orch({**env, "ORCH_FAILPOINT": point}, "submit", "examples/quickstart.yml")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    job_id = one_job(env)
    # Until its terminate, the instance outlives the killed process...
    alive = point != "after-terminate"
    assert bool(live_instances(env)) == alive, point
    lease_lapsed(env)
    taken = orch(env, "worker", "--once", timeout=180)
    assert taken.returncode == 0, taken.stderr
    assert status(env, job_id) == "succeeded"
    # ...and the worker taking the lapsed lease over reattaches to it, never rents anew.
    kinds = [r[0] for r in query(env, "SELECT kind FROM event WHERE job_id = ?", job_id)]
    assert "requeued" in kinds and ("instance.adopted" in kinds) == alive, (point, kinds)
    assert count(env, "SELECT count(*) FROM job") == 1
    assert count(env, "SELECT count(*) FROM instance WHERE job_id = ?", job_id) == 1
    events = query(env, "SELECT message, data_json FROM event WHERE job_id = ? AND "
                        "kind = 'state' ORDER BY id", job_id)
    takeover = next(i for i, (m, _) in enumerate(events) if "claimed by worker" in str(m))
    resumed = [json.loads(str(d or "{}")).get("status") for _, d in events[takeover:]]
    # Phases finished before the crash are not done again.
    for phase in ("training", "merging", "evaluating"):
        if CRASH_POINTS.index(point) > CRASH_POINTS.index(phase):
            assert phase not in resumed, (point, resumed)
    assert count(env, "SELECT count(*) FROM metric WHERE job_id = ? AND name = 'eval.count'",
                 job_id) == 1
    db_invariants(env)


# --- the same kill -9 matrix with warm reuse on (issue 22) -----------------------------------
# A job with `resources.keep_warm` parks its machine; the next job takes it. Kill -9 at each
# point of the first job's life, at the park and at the take, and while a window is ended:
# every machine rented is owned by exactly one row at the end of each step (never two, never
# none), nothing is left running once the windows are released, nothing is rented twice.


def warm_job(tmp: Path, keep: str = "10m") -> str:
    import shutil

    folder = tmp / "warmjobs"
    if not folder.exists():
        shutil.copytree(Path("examples/data").resolve(), folder / "data")
    path = folder / f"warm-{keep}.yml"
    path.write_text(Path("examples/quickstart.yml").read_text() + f"  keep_warm: {keep}\n")
    return str(path)


def owners(env: dict[str, str]) -> dict[str, int]:
    """Live machine -> how many rows own it (open instance rows + parked/ending warm rows;
    a row whose create crashed before its id was written owns the machine by its tag)."""
    live = live_instances(env)
    found = {str(i.instance_id): 0 for i in live}
    unnamed = {str(j) for (j,) in query(env, "SELECT job_id FROM instance WHERE terminated_at "
                                             "IS NULL AND provider_instance_id IS NULL")}
    for i in live:
        if i.job_id in unnamed:
            found[str(i.instance_id)] += 1
    for (iid,) in query(env, "SELECT provider_instance_id FROM instance WHERE terminated_at "
                             "IS NULL AND provider_instance_id IS NOT NULL") + query(
            env, "SELECT provider_instance_id FROM warm_instance WHERE state IN "
                 "('parked', 'ending')"):
        found[str(iid)] = found.get(str(iid), 0) + 1
    return found


def job_lapsed(env: dict[str, str], job_id: str) -> None:
    # NULL: a reconcile already requeued it.
    wait_for(lambda: query(env, "SELECT coalesce(lease_expires_at < strftime("
                                "'%Y-%m-%dT%H:%M:%fZ', 'now'), 1) FROM job WHERE id = ?",
                           job_id)[0][0], timeout=15, what="lease expiry")


def warm_finish(env: dict[str, str], rented_at_most: int) -> None:
    """Release the windows still open; then nothing runs, and each job rented at most once."""
    assert all(n == 1 for n in owners(env).values()), owners(env)
    released = orch(env, "warm", "release", "--all")
    assert released.returncode == 0, released.stdout + released.stderr
    assert len(SimCloud(sim_dir(env)).billed()) <= rented_at_most
    for (job_id, n) in query(env, "SELECT job_id, count(*) FROM instance GROUP BY job_id"):
        assert n == 1, (job_id, n)
    db_invariants(env)


@pytest.mark.parametrize("point", [*CRASH_POINTS, "after-park"])
def test_kill_9_with_warm_reuse_on_leaks_and_duplicates_nothing(env: dict[str, str],
                                                                tmp_path: Path,
                                                                point: str) -> None:
    job = warm_job(tmp_path)
    crashed = orch({**env, "ORCH_FAILPOINT": point}, "submit", job)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    first = one_job(env)
    assert all(n == 1 for n in owners(env).values()), owners(env)
    lease_lapsed(env)
    assert orch(env, "worker", "--once", timeout=180).returncode == 0
    assert status(env, first) == "succeeded"
    parked = query(env, "SELECT count(*) FROM warm_instance WHERE parked_by_job = ?", first)
    # The next job takes the machine the first one parked (a takeover that adopted the
    # machine terminates it instead: it cannot vouch for what it did not rent).
    second = orch(env, "submit", job, "--json", timeout=180)
    assert second.returncode == 0, second.stderr
    second_id = json.loads(second.stdout)["job_id"]
    took = query(env, "SELECT count(*) FROM event WHERE job_id = ? AND kind = "
                      "'instance.warm_taken'", second_id)[0][0]
    assert took == parked[0][0]
    warm_finish(env, rented_at_most=1 if took else 2)


def test_kill_9_right_after_taking_a_warm_machine(env: dict[str, str],
                                                  tmp_path: Path) -> None:
    job = warm_job(tmp_path)
    first = orch(env, "submit", job, timeout=180)
    assert first.returncode == 0, first.stderr
    assert "kept warm: sim-" in first.stdout and "orch warm release 1" in first.stdout
    crashed = orch({**env, "ORCH_FAILPOINT": "after-take"}, "submit", job)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    (second,) = [r[0] for r in query(env, "SELECT id FROM job WHERE status != 'succeeded'")]
    assert all(n == 1 for n in owners(env).values()), owners(env)  # the taker's row owns it
    # While the taker's lease is live, reconcile keeps its machine (tagged with the first job).
    kept = json.loads(orch(env, "reconcile", "--json").stdout)
    assert "terminate" not in [a["kind"] for a in kept["actions"]], kept
    job_lapsed(env, str(second))
    assert orch(env, "worker", "--once", timeout=180).returncode == 0
    assert status(env, str(second)) == "succeeded"
    warm_finish(env, rented_at_most=1)


def test_kill_9_while_ending_a_window_is_finished_by_the_next_reconcile(
        env: dict[str, str], tmp_path: Path) -> None:
    assert orch(env, "submit", warm_job(tmp_path, "1s"), timeout=180).returncode == 0
    time.sleep(1.5)
    crashed = orch({**env, "ORCH_FAILPOINT": "warm-ending"}, "reconcile")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert query(env, "SELECT state FROM warm_instance") == [("ending",)]
    assert live_instances(env)  # still owned by the `ending` row: terminated next
    done = json.loads(orch(env, "reconcile", "--json").stdout)
    assert [a["kind"] for a in done["actions"]] == ["terminate"], done
    assert query(env, "SELECT state, end_reason FROM warm_instance") == [("ended", "expired")]
    db_invariants(env)


def kill_foreground_submit_while_training(env: dict[str, str]) -> str:
    """`orch submit` killed -9 mid-training; returns its job id once its lease lapsed."""
    proc = spawn(env, "submit", "examples/quickstart.yml")
    try:
        wait_for(lambda: training(env), what="training")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        proc.kill()
    job_id = one_job(env)
    lease_lapsed(env)
    return job_id


def test_killed_foreground_submit_instance_is_torn_down_after_the_grace(
        env: dict[str, str]) -> None:
    env = {**env, "ORCH_SIM_TRAIN_STEPS": "400"}
    job_id = kill_foreground_submit_while_training(env)
    first = json.loads(orch(env, "reconcile", "--json").stdout)
    assert [a["kind"] for a in first["actions"]] == ["keep", "requeue"]
    assert live_instances(env)  # kept for a worker to adopt within the grace period
    second = json.loads(orch({**env, "ORCH_IDLE_GRACE_S": "0"}, "reconcile", "--json").stdout)
    assert [a["kind"] for a in second["actions"]] == ["terminate"]
    assert "waited" in second["actions"][0]["reason"]
    assert live_instances(env) == []
    assert query(env, "SELECT end_reason FROM instance") == [("idle",)]
    assert status(env, job_id) == "queued"  # it resumes when a worker claims it
    db_invariants(env)


def test_cancel_of_a_requeued_job_terminates_its_instance(env: dict[str, str]) -> None:
    env = {**env, "ORCH_SIM_TRAIN_STEPS": "400"}
    job_id = kill_foreground_submit_while_training(env)
    assert orch(env, "reconcile").returncode == 0
    assert status(env, job_id) == "queued" and live_instances(env)
    out = orch(env, "cancel", job_id, "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {
        "job_id": job_id, "status": "cancelled", "instances_left": [],
        "message": "cancelled while queued to resume"}
    assert live_instances(env) == []
    db_invariants(env)


# --- database faults (issue 23) -------------------------------------------------------------
# A locked SQLite file, a clock that runs ahead, a full disk: transient or local faults of the
# database never fail a job nor kill a worker; the job ends succeeded (or requeued with a
# reason), with 0 leaked instances and 0 duplicate rows.

def training_started(store: Store, job_id: str) -> bool:
    return any(e.kind == "train.progress" for e in store.events(job_id))


def long_training(rig: Rig) -> SimCloud:
    """A sim cloud whose jobs train ~10 s: long enough to hold a lock in the middle."""
    return rig.cloud(host_options={"train_steps": 40, "train_step_seconds": 0.25})


def test_a_write_lock_held_past_the_busy_timeout_is_waited_out(rig: Rig) -> None:
    from emulators.machinefaults import SqliteLock
    from test_engine import when

    from orchestrator.records.store import BUSY_TIMEOUT_MS

    cloud = long_training(rig)
    job_id = rig.queue(rig.job_file())
    db = Path(str(rig.store.engine.url.database))
    held: list[Any] = []
    when(lambda: training_started(rig.store, job_id),
         lambda: held.append(SqliteLock(db, BUSY_TIMEOUT_MS / 1000 + 5)))
    job = run(rig, {"sim": cloud}, job_id)
    assert held, "the lock was never taken"
    released = held[0].released()
    # The job's end was recorded after the lock was let go: its writes waited it out.
    assert job.finished_at is not None and job.finished_at > released
    assert job.status == "succeeded", job.failure_reason
    assert_invariants(rig.store, cloud.list())


def test_a_lock_held_past_the_whole_wait_requeues_the_job_and_tears_down(
        rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    from emulators.machinefaults import SqliteLock
    from test_engine import when

    from orchestrator.records.store import StoreError

    # The runner's first write blocked within 9 s of the lock meets DatabaseBusy after 3 s;
    # the two tear-downs' row writes and then the requeue wait 3 s each, so the requeue is
    # recorded once the 12 s lock is let go, however slow the machine.
    monkeypatch.setenv("ORCH_DB_LOCK_WAIT_S", "3")
    cloud = long_training(rig)
    job_id = rig.queue(rig.job_file())
    db = Path(str(rig.store.engine.url.database))
    held: list[Any] = []
    when(lambda: training_started(rig.store, job_id),
         lambda: held.append(SqliteLock(db, 12)))
    owner = owner_id("worker")
    assert rig.store.claim_job(job_id, owner, 5) is not None
    with pytest.raises(StoreError, match="stayed locked") as raised:
        JobRunner(rig.store, {"sim": cloud}, owner, options(rig),
                  on_signal="requeue").run(job_id)
    assert raised.type.__name__ == "DatabaseBusy"
    assert cloud.list() == []  # the rented machine went at once, not after the lock
    held[0].released()
    job = rig.store.get_job(job_id)
    assert job.status == "queued", job.status
    states = [e.message for e in rig.store.events(job_id) if e.kind == "state"]
    assert "database unavailable" in states[-2] and "stayed locked" in states[-2]
    assert rig.store.open_instances() == []
    # A worker resumes it and it ends like any other job.
    assert work_queue(rig, {"sim": cloud}) == [job_id]
    assert rig.store.get_job(job_id).status == "succeeded"
    assert_invariants(rig.store, cloud.list())


@pytest.mark.parametrize("rig", ["postgresql"], indirect=True)
def test_reconcile_on_a_machine_whose_clock_runs_ahead_keeps_a_live_job(rig: Rig,
                                                                       tmp_path: Path) -> None:
    import os
    import subprocess
    import sys
    import time

    from emulators.machinefaults import skewed_clock_env
    from test_engine import when

    skew = skewed_clock_env(tmp_path / "skew", 120)
    env = {**os.environ, **skew}
    ahead = float(subprocess.run([sys.executable, "-c", "import time; print(time.time())"],
                                 env=env, capture_output=True, text=True).stdout)
    assert ahead - time.time() > 100  # the fault is real: that process's clock runs ahead
    cloud = long_training(rig)
    job_id = rig.queue(rig.job_file())
    reports: list[Any] = []
    when(lambda: training_started(rig.store, job_id),
         lambda: reports.append(orch(env, "reconcile", "--json")))
    # A 30 s lease: live however slow this machine, and still far inside the 120 s skew.
    job = run(rig, {"sim": cloud}, job_id, lease_s=30)
    assert reports and reports[0].returncode == 0, reports and reports[0].stderr
    actions = json.loads(reports[0].stdout)["actions"]
    assert [a for a in actions if a["kind"] == "requeue"] == []
    assert job.status == "succeeded", job.failure_reason
    assert "requeued" not in rig.kinds(job_id)
    assert_invariants(rig.store, cloud.list())


def test_a_full_disk_under_the_database_tears_down_and_the_next_orch_repairs(
        env: dict[str, str], tmp_path: Path) -> None:
    import shutil
    import sqlite3
    import subprocess

    from emulators.machinefaults import SmallDisk
    from test_engine_crash import ORCH, ROOT

    disk = SmallDisk(tmp_path / "dbfs")
    try:
        # orch runs inside the disk's mount namespace; the test reads the file from outside.
        env = {**env, "ORCH_DB_URL": f"sqlite:///{disk.mount / 'orch.db'}",
               "ORCH_SIM_TRAIN_STEPS": "60"}

        def orch_in(*args: str, timeout: float = 180) -> Any:
            return subprocess.run([*disk.enter(ROOT), ORCH, *args], env=env, cwd=ROOT,
                                  capture_output=True, text=True, timeout=timeout)

        def ask(sql: str) -> list[Any]:
            copy = tmp_path / "copy"
            shutil.rmtree(copy, ignore_errors=True)
            copy.mkdir()
            for name in ("orch.db", "orch.db-wal"):
                if (disk.path / name).exists():
                    shutil.copy(disk.path / name, copy / name)
            con = sqlite3.connect(copy / "orch.db", timeout=10)
            try:
                return con.execute(sql).fetchall()
            finally:
                con.close()

        out = orch_in("submit", "examples/quickstart.yml", "--detach", "--json")
        job_id = json.loads(out.stdout)["job_id"]
        worker = subprocess.Popen([*disk.enter(ROOT), ORCH, "worker", "--once"], env=env, cwd=ROOT,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            wait_for(lambda: ask("SELECT count(*) FROM event WHERE kind = 'train.progress'")
                     [0][0] >= 1, what="training")
            disk.fill()
            _, err = worker.communicate(timeout=120)
        finally:
            worker.kill()
        assert worker.returncode == 1, err
        assert "Traceback" not in err, err
        assert "is full" in err.strip().splitlines()[-1], err
        assert live_instances(env) == []  # torn down although nothing could be recorded
        assert ask(f"SELECT status FROM job WHERE id = '{job_id}'") == [("training",)]
        disk.free()
        wait_for(lambda: ask("SELECT lease_expires_at < strftime('%Y-%m-%dT%H:%M:%fZ', 'now') "
                             "FROM job")[0][0], timeout=30, what="lease expiry")
        # The next orch command that opens the database (any: here `orch jobs`) repairs it.
        listed = orch_in("jobs", "--json")
        assert listed.returncode == 0, listed.stderr
        assert ask(f"SELECT status FROM job WHERE id = '{job_id}'") == [("queued",)]
        assert "lost its lease" in ask("SELECT message FROM event WHERE kind = 'requeued'")[0][0]
        resumed = orch_in("worker", "--once")
        assert resumed.returncode == 0, resumed.stderr
        ask("SELECT 1")  # a consistent copy of the final state, read through the store
        store = open_store(f"sqlite:///{tmp_path / 'copy' / 'orch.db'}")
        try:
            assert store.get_job(job_id).status == "succeeded"
            assert_invariants(store, live_instances(env))
        finally:
            store.close()
    finally:
        disk.close()


READER = """
import sqlite3, sys, time
from pathlib import Path
db, stop = sys.argv[1], Path(sys.argv[2])
reads = errors = 0
while not stop.exists():
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
        con.execute("SELECT status, count(*) FROM job GROUP BY status").fetchall()
        con.execute("SELECT count(*) FROM event").fetchall()
        con.close()
        reads += 1
    except sqlite3.Error as exc:
        errors += 1
        print(exc, file=sys.stderr, flush=True)
    time.sleep(0.05)
print(reads, errors, flush=True)
"""


def test_sixteen_workers_and_readers_on_one_sqlite_file_fail_nothing_for_a_lock(
        env: dict[str, str], tmp_path: Path) -> None:
    """The acceptance's concurrency test: 16 `orch worker` processes and readers on one
    SQLite file, 32 jobs: each runs once and succeeds, no worker dies, no read fails."""
    import subprocess
    import sys

    env = {**env, "ORCH_SIM_TRAIN_STEPS": "2", "ORCH_SIM_STEP_S": "0.05", "ORCH_LEASE_S": "30"}
    from test_engine_crash import ROOT

    from orchestrator.core.spec import load_job
    from orchestrator.engine.submission import record_job

    db = Path(env["XDG_DATA_HOME"]) / "orch" / "orch.db"
    db.parent.mkdir(parents=True)
    store = open_store(f"sqlite:///{db}")  # queued as `orch submit --detach` does, 32 times
    try:
        for _ in range(32):
            record_job(store, load_job(ROOT / "examples" / "quickstart.yml"))
    finally:
        store.close()
    stop = tmp_path / "stop"
    readers = [subprocess.Popen([sys.executable, "-c", READER, str(db), str(stop)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for _ in range(2)]
    workers = [spawn(env, "worker", "--once", "--poll", "0.2") for _ in range(16)]
    results = [w.communicate(timeout=1500) for w in workers]
    stop.touch()
    seen = [r.communicate(timeout=60) for r in readers]
    for w, (_, err) in zip(workers, results, strict=True):
        assert w.returncode == 0, err
        assert "Traceback" not in err and "locked" not in err, err
    for out, err in seen:
        reads, errors = (int(x) for x in out.split())
        assert reads > 0 and errors == 0, err
    statuses = query(env, "SELECT status, count(*) FROM job GROUP BY status")
    assert statuses == [("succeeded", 32)], query(
        env, "SELECT failure_reason FROM job WHERE status != 'succeeded'")
    claims = query(env, "SELECT job_id, count(*) FROM event WHERE kind = 'state' AND "
                        "message LIKE 'provisioning (claimed by %' GROUP BY job_id")
    assert len(claims) == 32 and {n for _, n in claims} == {1}  # 0 duplicate claims
    db_invariants(env)
# --- network and provider faults (issue 23) --------------------------------------------------
# Injected for real: a TCP proxy on loopback in front of each emulated host's sshd
# (`emulators.tcpfault`), and emulator routes that drip bytes or move a price.


def big_dataset(rig: Rig, rows: int = 4000) -> str:
    """A job whose dataset is ~0.5 MB, so an upload is many SFTP writes long."""
    job_id_path = rig.job_file()
    data = rig.tmp / "jobs" / "data" / "train.jsonl"
    line = json.dumps({"instruction": "Repeat the number.", "input": "", "output": "x" * 100})
    data.write_text("".join(f"{line}\n" for _ in range(rows)))
    job_id_path.write_text(job_id_path.read_text().replace("providers: [sim]",
                                                           "providers: [vastai]"))
    return rig.queue(job_id_path)


# Bytes sent to the host on the session's connection before the proxy resets it: past what
# the steps before the dataset upload send, inside the ~0.5 MB upload (measured: the whole
# job sends ~0.7 MB; the test checks which step the reset hit).
RESET_AT = 200_000


def test_ssh_reset_mid_upload_reconnects_and_finishes(rig: Rig, hosts: SimHostBackend) -> None:
    # The host key is read over a first connection; the session's connection is reset (RST)
    # in the middle of the dataset upload.
    faulty = FaultyHosts(hosts, [[None, ("reset", RESET_AT)]])
    with VastEmulator(api_key=KEY, hosts=faulty) as emu:
        emu.add_offer(id=1, gpu_name="RTX 4090", dph_base=0.40, min_bid=0.20)
        emu.add_offer(id=2, gpu_name="RTX 5090", gpu_ram=32768, dph_base=0.60, min_bid=0.30)
        job_id = big_dataset(rig)
        job = run(rig, {"vastai": faulty.serving(vast(emu))}, job_id)
        assert job.status == "succeeded", job.failure_reason
        [proxy] = faulty.proxies.values()
        assert proxy.resets == 1
        # Reconnected to the same instance and ran the step again; nothing re-placed.
        retried = [e.message for e in rig.store.events(job_id) if e.kind == "ssh.reconnect"]
        assert retried and "upload-dataset" in retried[0], retried
        assert [r.end_reason for r in rig.store.instances_of(job_id)] == ["released"]
        assert job.interruptions == 0
        assert_invariants(rig.store, list(emu.instances))


def test_host_that_never_sends_a_banner_is_replaced(rig: Rig, hosts: SimHostBackend) -> None:
    # The cheapest offer's host accepts TCP and never speaks SSH; the second offer is fine.
    faulty = FaultyHosts(hosts, [["silent"] * 100])
    with VastEmulator(api_key=KEY, hosts=faulty) as emu:
        emu.add_offer(id=1, gpu_name="RTX 4090", dph_base=0.40, min_bid=0.20)
        emu.add_offer(id=2, gpu_name="RTX 5090", gpu_ram=32768, dph_base=0.60, min_bid=0.30)
        job_id = job_for(rig, "vastai")
        job = run(rig, {"vastai": faulty.serving(vast(emu))}, job_id, connect_deadline_s=4)
        assert job.status == "succeeded", job.failure_reason
        rows = rig.store.instances_of(job_id)
        assert [(r.gpu, r.end_reason) for r in rows] == [("RTX 4090", "unreachable"),
                                                         ("RTX 5090", "released")]
        assert "unreachable" in " ".join(e.message for e in rig.store.events(job_id)
                                         if e.kind == "state")
        assert_invariants(rig.store, list(emu.instances))


def test_slow_dripping_offer_search_hits_a_total_deadline(rig: Rig,
                                                          hosts: SimHostBackend) -> None:
    with VastEmulator(api_key=KEY, hosts=hosts) as emu:
        emu.add_offer(id=1, gpu_name="RTX 4090", dph_base=0.40, min_bid=0.20)
        # One byte every 0.2 s: each read is well within the 1 s read timeout, and the
        # ~1.5 KB answer would take ~5 minutes.
        emu.drip_next(10_000, 0.2, method="POST", path=BUNDLES)
        adapter = VastAI(KEY, base_url=emu.url, attempts=2, initial_s=0.01, max_wait_s=0.05,
                         timeout_s=1.0, deadline_s=3.0)
        job_id = job_for(rig, "vastai")
        job = run(rig, {"vastai": hosts.serving(adapter)}, job_id)
        assert job.status == "queued", job.failure_reason
        message = last_state(rig.store, job_id)
        assert "vastai: provider unavailable" in message and "within 3s" in message, message
        assert rig.store.instances_of(job_id) == []
        assert_invariants(rig.store, list(emu.instances))
        # The provider answers promptly again: the job is placed and succeeds.
        emu.drips.clear()
        owner = owner_id("worker")
        wait_for(lambda: rig.store.claim_job(job_id, owner, 5), timeout=30,
                 what="the backoff to pass")
        done = JobRunner(rig.store, {"vastai": hosts.serving(adapter)}, owner, options(rig),
                         on_signal="requeue").run(job_id)
        assert done.status == "succeeded", done.failure_reason
        assert_invariants(rig.store, list(emu.instances))


def test_price_changed_between_search_and_create_searches_again(
        rig: Rig, hosts: SimHostBackend) -> None:
    with VastEmulator(api_key=KEY, hosts=hosts) as emu:
        emu.add_offer(id=1, gpu_name="RTX 4090", dph_base=0.40, min_bid=0.20)
        emu.add_offer(id=2, gpu_name="RTX 5090", gpu_ram=32768, dph_base=0.60, min_bid=0.30)
        # Between orch's search and its create the 4090's minimum bid rises: the bid orch
        # computed from the search is refused with HTTP 400 invalid_price.
        emu.reprice_before_create(1, min_bid=0.25)
        job_id = job_for(rig, "vastai")
        job = run(rig, {"vastai": hosts.serving(vast(emu))}, job_id)
        assert job.status == "succeeded", job.failure_reason
        rows = rig.store.instances_of(job_id)
        assert [(r.gpu, r.end_reason) for r in rows] == [("RTX 4090", "price_changed"),
                                                         ("RTX 4090", "released")]
        creates = emu.requests_to("PUT", "/api/v0/asks")
        assert [c.json["price"] for c in creates] == [0.2, 0.25]  # bid again at the new price
        assert any(e.kind == "provision.price_changed" for e in rig.store.events(job_id))
        assert_invariants(rig.store, list(emu.instances))


def test_price_changed_beyond_the_budget_uses_the_next_offer(rig: Rig,
                                                             hosts: SimHostBackend) -> None:
    with VastEmulator(api_key=KEY, hosts=hosts) as emu:
        emu.add_offer(id=1, gpu_name="RTX 4090", dph_base=0.40, min_bid=0.20)
        emu.add_offer(id=2, gpu_name="RTX 5090", gpu_ram=32768, dph_base=0.60, min_bid=0.30)
        # The 4090's bid now costs more than the job's max_price_per_hour allows.
        emu.reprice_before_create(1, min_bid=0.90, dph_base=1.50)
        path = rig.job_file()
        path.write_text(path.read_text().replace(
            "  providers: [sim]", "  providers: [vastai]\n  max_price_per_hour: 0.50"))
        job_id = rig.queue(path)
        job = run(rig, {"vastai": hosts.serving(vast(emu))}, job_id)
        assert job.status == "succeeded", job.failure_reason
        rows = rig.store.instances_of(job_id)
        assert [(r.gpu, r.end_reason) for r in rows] == [("RTX 4090", "price_changed"),
                                                         ("RTX 5090", "released")]
        assert_invariants(rig.store, list(emu.instances))
