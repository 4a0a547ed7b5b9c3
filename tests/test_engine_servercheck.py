"""A registered monthly server's host check in the engine (issue 40 §1): checked when a job
first uses it and again when due, on the server as the job's own steps run there (a Docker
host: a real sshd on loopback); its result kept under the server's name and shown by
`orch servers list`; never released nor replaced: a blocking finding fails the job naming the
server, the check and the fix, a slow one warns and the job runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from datetime import timedelta
from decimal import Decimal
from typing import Any

from emulators.hosts import WithHostPaths
from sqlalchemy import text
from test_engine import HOST, Rig, rig  # the same rig fixture (SQLite)
from test_engine_hostchecks import ORCH

from orchestrator.core.hostmemory import Source
from orchestrator.engine import hostchecks
from orchestrator.engine.runner import JobRunner, Options, owner_id
from orchestrator.records.store import open_store, utcnow
from providers.dedicated.compute import Dedicated
from providers.sim.compute import SimCloud

__all__ = ["rig"]  # test_engine's fixture, used here


def on_server(rig: Rig, host: Any, cloud: SimCloud | None = None) -> tuple[str, Any]:
    """Run a job that may use registered server box1 (simulated `host`), and `cloud`'s
    rentals when given: (job id, job)."""
    if not rig.store.list_servers():
        rig.store.add_server(name="box1", host=host.host, port=host.port, user=host.user,
                             gpu="H100 SXM", gpu_count=1, monthly_price=Decimal(2190))
    path = rig.job_file()
    allowed = "[dedicated, sim]" if cloud is not None else "[dedicated]"
    path.write_text(path.read_text().replace("providers: [sim]", f"providers: {allowed}"))
    job_id = rig.queue(path)
    owner = owner_id("test")
    assert rig.store.claim_job(job_id, owner, 5) is not None
    providers: dict[str, Any] = {"dedicated": WithHostPaths(Dedicated(rig.store),
                                                            lambda _iid: str(host.root))}
    if cloud is not None:
        providers["sim"] = cloud
    options = Options(poll_s=0.2, watch_s=0.2, lease_s=5, ssh_key=rig.key.private)
    return job_id, JobRunner(rig.store, providers, owner, options).run(job_id)


def servers_json() -> list[dict[str, Any]]:
    out = subprocess.run([ORCH, "servers", "list", "--json"], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    rows: list[dict[str, Any]] = json.loads(out)
    return rows


def servers_text() -> str:
    return subprocess.run([ORCH, "servers", "list"], capture_output=True, text=True,
                          timeout=120, check=True).stdout


def checks(rig: Rig, job_id: str) -> list[dict[str, Any]]:
    return [json.loads(e.data_json or "{}") for e in rig.store.events(job_id)
            if e.kind == "host.checked"]


def test_a_registered_server_is_checked_at_first_use_and_again_when_due(
        rig: Rig, simhost: Any) -> None:
    host = simhost(**HOST)  # a Docker host: the job's steps run in containers there
    job_id, job = on_server(rig, host)

    assert job.status == "succeeded", job.failure_reason
    (due,) = [e.message for e in rig.store.events(job_id) if e.kind == "server.check_due"]
    assert "registered server box1" in due and "never checked" in due
    # Twice: before anything else, then (the matmul) once the job's set-up installed the
    # Container Toolkit, pulling the trainer image, before training.
    early, check = checks(rig, job_id)
    assert early["report"]["matmul"]["verdict"] == "unknown"
    assert (check["instance"], check["machine_id"], check["passed"]) == ("box1", "box1", True)
    report = check["report"]
    assert {report[c]["verdict"] for c in ("inventory", "driver", "disk", "hub",
                                           "matmul")} == {"pass"}
    # Checked before the model download; the job's own steps then ran on the same host.
    messages = [e.message for e in rig.store.events(job_id)]
    checked = messages.index(next(m for m in messages if m.startswith("host check of")))
    assert checked < min(i for i, m in enumerate(messages) if m.startswith("model_cache/"))
    # Nothing of the check is left on the server (it outlives the job).
    left = [p for p in host.root.rglob("*") if ".hostcheck-" in p.name
            or p.name == "hostcheck.env"]
    assert left == []
    rows = rig.store.host_observations("dedicated")
    assert [(r.machine_id, r.source, r.failed, r.job_id) for r in rows] == [
        ("box1", "check", False, job_id)] * 2
    assert rows[-1].delivered is not None and rows[-1].delivered > 0.9
    (listed,) = servers_json()
    shown = listed["host_check"]
    assert (shown["outcome"], shown["job_id"], shown["findings"]) == ("passed", job_id, [])
    assert shown["at"].endswith("Z") and shown["next_due"] is None
    assert "passed 20" in servers_text()

    # Checked a minute ago: the next job is not checked again...
    second, again = on_server(rig, host)
    assert again.status == "succeeded", again.failure_reason
    assert checks(rig, second) == [] and "server.check_due" not in rig.kinds(second)
    # ...until the check is a week old (data/hostmemory.yaml server.recheck_after_hours).
    assert hostchecks.server_due(rig.store, "dedicated", "box1") is None
    from sqlalchemy import text

    with rig.store.engine.begin() as conn:
        conn.execute(text("UPDATE host_observation SET at = :at"),
                     {"at": (utcnow() - timedelta(days=8)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")})
    why = hostchecks.server_due(rig.store, "dedicated", "box1")
    assert why is not None and "older than 7 days" in why
    assert "older than 7 days" in servers_json()[0]["host_check"]["next_due"]


def test_a_registered_server_that_fails_its_check_fails_the_job_naming_the_fix(
        rig: Rig, simhost: Any) -> None:
    # An R570 driver (CUDA 12.8) on the server; the trainer image needs CUDA 13.0. A sim
    # rental is allowed too: the job must not move to it.
    host = simhost(**HOST, driver_version="570.124.06", cuda_version="12.8")
    cloud = SimCloud(rig.tmp / "sim", gpus=["H100 SXM"], host_options=HOST)
    rig.clouds.append(cloud)
    job_id, job = on_server(rig, host, cloud)

    assert job.status == "failed"
    reason = job.failure_reason or ""
    assert "registered server box1 failed its host check" in reason
    assert "driver: the driver supports CUDA 12.8" in reason
    assert "fix: install an NVIDIA driver >= 580.65.06 (CUDA 13.0) on box1" in reason
    assert "orch servers check box1" in reason and "nor moved to another machine" in reason
    # Not moved: the server was the only machine, and nothing was downloaded on it.
    assert [(r.provider, r.end_reason) for r in rig.store.instances_of(job_id)] == [
        ("dedicated", "failed")]
    assert cloud.list() == []
    assert not [e for e in rig.store.events(job_id) if e.message.startswith("model_cache/")]
    failed = [json.loads(e.data_json or "{}") for e in rig.store.events(job_id)
              if e.kind == "server.check_failed"]
    assert [f["check"] for f in failed[0]["findings"]] == ["driver"]
    # Not blacklisted: still registered, idle and offered; the next job checks it again.
    (server,) = rig.store.list_servers()
    assert (server.status, server.claimed_by_job, server.check_error) == ("idle", None, None)
    why = hostchecks.server_due(rig.store, "dedicated", "box1")
    assert why is not None and "found: driver" in why
    (listed,) = servers_json()
    shown = listed["host_check"]
    assert shown["outcome"] == "failed" and shown["job_id"] == job_id
    assert [(f["check"], f["severity"]) for f in shown["findings"]] == [("driver", "blocks")]
    text = servers_text()
    assert "failed 20" in text and "box1: its last host check" in text
    assert "fix: install an NVIDIA driver >= 580.65.06" in text
    # `orch plan` still plans the server (it is never left out) and says it is checked first.
    path = rig.job_file()
    path.write_text(path.read_text().replace("providers: [sim]", "providers: [dedicated]"))
    plan = json.loads(subprocess.run([ORCH, "plan", str(path), "--json"], capture_output=True,
                                     text=True, timeout=120, check=True).stdout)
    assert plan["placement"]["offer_id"] == "server:box1"
    (note,) = plan["host_memory"]
    assert note.startswith("registered server box1: its last host check") and "driver" in note
    assert "checked again first" in note


def test_a_slow_registered_server_warns_and_runs_the_job(rig: Rig, simhost: Any) -> None:
    # Its disk writes at 40 MB/s, under the check's 125 MB/s: slower, not broken.
    host = simhost(**HOST, disk_write_bytes_per_second=40e6)
    job_id, job = on_server(rig, host)

    assert job.status == "succeeded", job.failure_reason
    (slow,) = [e for e in rig.store.events(job_id) if e.kind == "server.slow"]
    assert "registered server box1 is slower than the plan assumes" in slow.message
    assert "disk: writes at 40 MB/s" in slow.message or "disk: writing" in slow.message
    assert [f["check"] for f in json.loads(slow.data_json or "{}")["findings"]] == ["disk"]
    # Not released, so checked in full: past the slow disk, the Hub and (after the job's
    # set-up) the GPUs were measured too, and passed.
    first, late = checks(rig, job_id)
    assert first["report"]["hub"]["verdict"] == "pass"
    assert late["report"]["disk"]["verdict"] == "fail"
    assert late["report"]["matmul"]["verdict"] == "pass"
    (listed,) = servers_json()
    shown = listed["host_check"]
    assert shown["outcome"] == "slow"
    assert [(f["check"], f["severity"]) for f in shown["findings"]] == [("disk", "slow")]
    assert "found it slow" in servers_text()


def test_a_registered_server_whose_gpu_memory_is_held_fails_the_job_naming_the_process(
        rig: Rig, simhost: Any) -> None:
    # The user's own notebook holds 21 GiB of box1's H100: the quickstart's training would
    # fit, its evaluation's vLLM (0.9 of the card) would be refused after the training was
    # done. The job fails before anything is downloaded, naming the process and the fix.
    host = simhost(**HOST, gpu_memory_held_mib=21504)
    job_id, job = on_server(rig, host)

    assert job.status == "failed"
    reason = job.failure_reason or ""
    assert "registered server box1 failed its host check" in reason
    assert "GPU 0: 21504 of 81559 MiB in use" in reason
    assert "held by pid 4242 (python3, 21504 MiB)" in reason
    assert "fix: stop what holds the GPUs' memory on box1" in reason
    assert not [e for e in rig.store.events(job_id) if e.message.startswith("model_cache/")]
    why = hostchecks.server_due(rig.store, "dedicated", "box1")
    assert why is not None and "found: inventory" in why  # checked again before the next job


def test_a_takeover_on_a_registered_server_does_not_check_what_the_job_runs_there(
        rig: Rig, simhost: Any) -> None:
    # box1's check passed 6 days before the job, so the job's first run does not check it.
    # That worker is killed (SIGKILL: no teardown) while the job trains; by the takeover the
    # check is due (8 days old). The next worker reattaches to the running trainer without
    # checking the server: a check then would measure the job's own trainer, its GPU memory
    # most of all, as another process's (a real nvidia-smi reports it in use).
    host = simhost(**{**HOST, "train_steps": 60, "train_step_seconds": 0.3})
    rig.store.record_host_observation("dedicated", "box1", Source.CHECK, failed=False,
                                      delivered=1.0, why="", at=utcnow() - timedelta(days=6))
    rig.store.add_server(name="box1", host=host.host, port=host.port, user=host.user,
                         gpu="H100 SXM", gpu_count=1, monthly_price=Decimal(2190))
    path = rig.job_file()
    path.write_text(path.read_text().replace("providers: [sim]", "providers: [dedicated]"))
    job_id = rig.queue(path)
    url = os.environ["ORCH_DB_URL"]
    options = Options(poll_s=0.2, watch_s=0.2, lease_s=3, ssh_key=rig.key.private)

    def work(owner: str) -> Any:
        store = open_store(url)  # a process of its own has a store of its own
        assert store.claim_job(job_id, owner, 3) is not None
        dedicated = WithHostPaths(Dedicated(store), lambda _iid: str(host.root))
        return JobRunner(store, {"dedicated": dedicated}, owner, options).run(job_id)

    child = os.fork()
    if child == 0:  # pragma: no cover (the killed worker)
        try:
            work("first")
        finally:
            os._exit(0)
    try:
        deadline = time.monotonic() + 120
        while not any(e.kind == "train.progress" for e in rig.store.events(job_id)):
            assert time.monotonic() < deadline, "the first worker never trained"
            time.sleep(0.2)
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
    with rig.store.engine.begin() as db:  # the check ages past its week meanwhile
        db.execute(text("UPDATE host_observation SET at = :at"),
                    {"at": utcnow() - timedelta(days=8)})
    assert hostchecks.server_due(rig.store, "dedicated", "box1") is not None
    time.sleep(3.5)  # the killed worker's lease lapses; the next worker requeues, claims
    assert [j.id for j in rig.store.requeue_lapsed()] == [job_id]
    job = work(owner_id("second"))

    assert job.status == "succeeded", job.failure_reason
    kinds = [e.kind for e in rig.store.events(job_id)]
    assert "instance.adopted" in kinds
    assert "host.checked" not in kinds and "server.check_due" not in kinds
    (row,) = rig.store.instances_of(job_id)
    assert row.provider == "dedicated"


def test_memory_taken_on_a_registered_server_since_its_check_fails_before_training(
        rig: Rig, simhost: Any) -> None:
    # box1 passed its check yesterday (not due); the user's notebook has since taken 21 GiB.
    # The job is told before its trainer starts, not after a training it paid for.
    host = simhost(**HOST, gpu_memory_held_mib=21504)
    rig.store.record_host_observation("dedicated", "box1", Source.CHECK, failed=False,
                                      delivered=1.0, why="", at=utcnow() - timedelta(days=1))
    job_id, job = on_server(rig, host)

    assert job.status == "failed"
    reason = job.failure_reason or ""
    assert "gpu/memory-free: GPU memory is already in use" in reason, reason
    assert "GPU 0: 21504 of 81559 MiB in use" in reason
    assert "held by pid 4242 (python3, 21504 MiB)" in reason
    assert "Nothing was trained" in reason
    kinds = rig.kinds(job_id)
    assert "host.checked" not in kinds  # not due: the step before training found it
    assert not [c for c in host.ssh_commands() if "axolotl" in c and " train" in c]
    assert not [e for e in rig.store.events(job_id) if e.message.startswith("train/")]
