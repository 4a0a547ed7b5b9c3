"""Warm instances (issue 22, docs/warm.md) end to end on the simulated cloud.

Real sshd hosts, real SQLite (and PostgreSQL for the race), real SSH: a job with
`resources.keep_warm` parks its machine; the next queued job that fits takes it (no boot, no
model download) and its record is as complete as a fresh run's; a window that closes is
terminated by the next worker or by `orch reconcile`; exactly one job wins a race for one
machine; a job that does not fit the machine rents a fresh one.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orchfork
import pytest
from conftest import BACKENDS, KeyPair, database_url

from orchestrator.core.spec import load_job
from orchestrator.engine.reconcile import reconcile
from orchestrator.engine.runner import JobRunner, Options, owner_id
from orchestrator.engine.submission import record_job
from orchestrator.engine.warm import end_expired
from orchestrator.records.store import Store, open_store
from providers.sim.compute import SimCloud

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
HOST = {"train_steps": 4, "train_step_seconds": 0.1, "vllm_startup_seconds": 0.2,
        "merge_seconds": 0.05}


@dataclass
class Rig:
    tmp: Path
    store: Store
    key: KeyPair
    cloud: SimCloud

    def job_file(self, keep_warm: str = "10m", extra: str = "") -> Path:
        folder = self.tmp / "jobs"
        if not folder.exists():
            shutil.copytree(EXAMPLES / "data", folder / "data")
        text = (EXAMPLES / "quickstart.yml").read_text()
        text += f"  keep_warm: {keep_warm}\n" + extra
        path = folder / f"job-{len(list(folder.glob('*.yml')))}.yml"
        path.write_text(text)
        return path

    def queue(self, path: Path) -> str:
        job, _ = record_job(self.store, load_job(path))
        return job.id

    def run(self, job_id: str) -> Any:
        owner = owner_id("test")
        options = Options(poll_s=0.2, watch_s=0.2, lease_s=5, boot_deadline_s=30,
                          connect_deadline_s=20, ssh_key=self.key.private)
        assert self.store.claim_job(job_id, owner, 5) is not None
        return JobRunner(self.store, {"sim": self.cloud}, owner, options).run(job_id)

    def kinds(self, job_id: str) -> list[str]:
        return [e.kind for e in self.store.events(job_id)]

    def live(self) -> list[str]:
        return sorted(i.instance_id for i in self.cloud.list())


@pytest.fixture
def rig(request: pytest.FixtureRequest, tmp_path: Path, ssh_keypair: KeyPair,
        monkeypatch: pytest.MonkeyPatch) -> Iterator[Rig]:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    url = database_url(getattr(request, "param", "sqlite"), tmp_path, request)
    monkeypatch.setenv("ORCH_DB_URL", url)
    # Where `orch` finds the simulated cloud (XDG_DATA_HOME/orch/sim): the CLI tests' too.
    cloud = SimCloud(tmp_path / "xdg" / "orch" / "sim", host_options=HOST)
    r = Rig(tmp_path, open_store(url), ssh_keypair, cloud)
    try:
        yield r
    finally:
        cloud.terminate_all()
        r.store.close()


def _record(store: Store, job_id: str) -> dict[str, Any]:
    """What a finished run's record holds, for comparing a warm run with a fresh one."""
    job = store.get_job(job_id)
    metrics = {m.name for m in store.metrics(job_id)}
    return {"status": job.status, "cost": job.cost_micros > 0,
            "artifacts": bool(job.artifacts_dir) and Path(job.artifacts_dir).is_dir(),
            "metrics": {m for m in metrics if not m.startswith("train.")},
            "loss": "train.loss" in metrics, "rows": len(store.instances_of(job_id))}


def test_the_next_job_takes_the_warm_machine_and_its_record_is_complete(rig: Rig) -> None:
    first, second = rig.queue(rig.job_file()), rig.queue(rig.job_file())
    assert rig.run(first).status == "succeeded"
    (parked,) = rig.store.warm_instances()
    assert parked.state == "parked" and parked.parked_by_job == first
    assert rig.live() == [parked.provider_instance_id]  # kept running, owned by the warm row
    (row_a,) = rig.store.instances_of(first)
    assert row_a.end_reason == "parked" and row_a.terminated_at is not None
    assert "instance.parked" in rig.kinds(first)

    assert rig.run(second).status == "succeeded"
    kinds = rig.kinds(second)
    assert "instance.warm_taken" in kinds and "instance.created" not in kinds
    # Checked when it was rented fresh, not again when taken warm (issue 40).
    assert "host.checked" in rig.kinds(first) and "host.checked" not in kinds
    (row_b,) = rig.store.instances_of(second)
    assert row_b.provider_instance_id == parked.provider_instance_id
    assert row_b.offer_id == f"warm:{parked.id}"
    # No new machine, no download: the model was in the machine's cache.
    skipped = [e.message for e in rig.store.events(second) if e.kind == "step.skipped"]
    assert "model_cache/download" in skipped and "train/pull-image" in skipped, skipped
    assert _record(rig.store, second) == _record(rig.store, first)
    taken = rig.store.get_warm(parked.id)
    assert taken.state == "taken" and taken.taken_by_job == second
    # The second job parked the machine again: one machine served both, still one owner.
    owning = rig.store.warm_instances(("parked", "ending"))
    assert [w.provider_instance_id for w in owning] == rig.live() == [
        parked.provider_instance_id]
    assert len(rig.cloud.billed()) == 1


def test_keep_warm_zero_terminates_as_before(rig: Rig) -> None:
    job = rig.queue(rig.job_file(keep_warm="0"))
    assert rig.run(job).status == "succeeded"
    assert rig.store.warm_instances() == [] and rig.live() == []
    assert rig.store.instances_of(job)[0].end_reason == "released"


def test_a_closed_window_is_terminated_with_its_idle_cost(rig: Rig) -> None:
    job = rig.queue(rig.job_file(keep_warm="1s"))
    assert rig.run(job).status == "succeeded"
    (parked,) = rig.store.warm_instances()
    time.sleep(1.5)
    ended = end_expired(rig.store, {"sim": rig.cloud})
    assert [e.warm.id for e in ended] == [parked.id] and ended[0].error is None
    row = rig.store.get_warm(parked.id)
    assert row.state == "ended" and row.end_reason == "expired" and row.idle_micros > 0
    assert rig.live() == []
    assert end_expired(rig.store, {"sim": rig.cloud}) == []  # once


def test_reconcile_keeps_a_live_window_and_ends_a_closed_one(rig: Rig) -> None:
    job = rig.queue(rig.job_file(keep_warm="2s"))
    assert rig.run(job).status == "succeeded"
    (parked,) = rig.store.warm_instances()
    # The job that rented it is finished: without the warm row, reconcile would kill it.
    kept = reconcile(rig.store, {"sim": rig.cloud})
    assert [a.kind for a in kept.actions] == ["keep"], kept.actions
    assert rig.live() == [parked.provider_instance_id]
    time.sleep(2.5)
    # No orch process ran while the window closed: reconcile terminates it.
    dry = reconcile(rig.store, {"sim": rig.cloud}, dry_run=True)
    assert [a.kind for a in dry.actions] == ["terminate"] and rig.live()
    done = reconcile(rig.store, {"sim": rig.cloud})
    assert [a.kind for a in done.actions] == ["terminate"], done.actions
    assert rig.live() == [] and rig.store.get_warm(parked.id).end_reason == "expired"


@pytest.mark.parametrize("rig", BACKENDS, indirect=True)
def test_reconcile_keeps_a_taken_machine_tagged_with_the_job_that_rented_it(rig: Rig) -> None:
    first, second = rig.queue(rig.job_file()), rig.queue(rig.job_file())
    assert rig.run(first).status == "succeeded"
    (parked,) = rig.store.warm_instances()
    assert rig.store.claim_job(second, "other-worker", 60) is not None
    row = rig.store.take_warm(parked.id, second, 0)
    assert row is not None
    report = reconcile(rig.store, {"sim": rig.cloud})
    assert [(a.kind, a.job_id) for a in report.actions] == [("keep", first)], report.actions
    assert f"job {second}" in report.actions[0].reason
    assert rig.live() == [parked.provider_instance_id]


def test_a_job_that_needs_another_image_rents_a_fresh_machine(rig: Rig) -> None:
    first = rig.queue(rig.job_file())
    other = rig.queue(rig.job_file(keep_warm="0", extra=(
        "trainer:\n  image: axolotlai/axolotl:0.18.0-py3.12-cu130-2.11.0\n")))
    assert rig.run(first).status == "succeeded"
    assert rig.run(other).status == "succeeded"
    assert "instance.warm_taken" not in rig.kinds(other)
    (parked,) = rig.store.warm_instances()
    assert parked.state == "parked"  # still waiting for a job that fits it


@pytest.mark.parametrize("rig", BACKENDS, indirect=True)
def test_exactly_one_job_wins_a_race_for_one_machine(rig: Rig) -> None:
    first = rig.queue(rig.job_file())
    assert rig.run(first).status == "succeeded"
    (parked,) = rig.store.warm_instances()
    takers = [rig.queue(rig.job_file()) for _ in range(8)]
    won: list[str] = []
    barrier = threading.Barrier(len(takers))

    def take(job_id: str) -> None:
        barrier.wait()
        if rig.store.take_warm(parked.id, job_id, 0) is not None:
            won.append(job_id)

    threads = [threading.Thread(target=take, args=(j,)) for j in takers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1
    open_rows = [r for j in takers for r in rig.store.instances_of(j)]
    assert [r.job_id for r in open_rows] == won
    assert rig.store.get_warm(parked.id).taken_by_job == won[0]
    assert json.loads(parked.offer_json)["provider"] == "sim"


def _orch(*args: str) -> subprocess.CompletedProcess[str]:
    return orchfork.run(list(args), timeout=300)


def test_plan_cost_and_warm_show_the_warm_machine_and_release_ends_it(rig: Rig) -> None:
    first = rig.queue(rig.job_file())
    assert rig.run(first).status == "succeeded"
    (parked,) = rig.store.warm_instances()
    nxt = rig.job_file()

    shown = _orch("plan", str(nxt))
    assert shown.returncode == 0, shown.stderr
    text = " ".join(shown.stdout.split())
    assert f"Warm: sim instance {parked.provider_instance_id}, kept warm by job {first}" in text
    assert "saves $" in text and "base model already on its disk" in text
    assert "sim (warm)" in shown.stdout
    plan = json.loads(_orch("plan", "--json", str(nxt)).stdout)
    assert plan["warm"]["warm_id"] == parked.id and plan["warm"]["model_cached"] is True
    assert float(plan["warm"]["saves"]) > 0
    assert plan["placement"]["offer_id"] == f"warm:{parked.id}"

    listed = json.loads(_orch("warm", "--json").stdout)["warm"]
    assert [(w["id"], w["state"], w["parked_by"]) for w in listed] == [
        (parked.id, "parked", first)]
    assert "idle (warm):" in _orch("cost").stdout
    cost = json.loads(_orch("cost", "--json").stdout)
    assert cost["idle_warm"]["windows"] == 1 and cost["idle_warm"]["parked_now"] == 1

    released = _orch("warm", "release", "--all")
    assert released.returncode == 0, released.stdout + released.stderr
    assert f"warm instance {parked.id}" in released.stdout and "terminated" in released.stdout
    assert rig.live() == []
    ended = rig.store.get_warm(parked.id)
    assert ended.state == "ended" and ended.end_reason == "released"
    # Nothing warm any more: the plan rents fresh, and says nothing about warm machines.
    again = json.loads(_orch("plan", "--json", str(nxt)).stdout)
    assert again["warm"] is None and not again["placement"]["offer_id"].startswith("warm:")
    assert _orch("warm", "release", str(parked.id)).returncode == 1
