"""The job engine end to end on the simulated cloud: real sshd hosts, real SQLite, real SSH.

Each test queues a job from a real job file, drives it with a JobRunner (as `orch submit`
and `orch worker` do) and checks the database, the cloud and the artifacts afterwards:
success for QLoRA and full, capacity errors fall through to the next offer, a preemption
mid-training resumes on a new instance from the checkpoint, `orch cancel` tears down.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import BACKENDS, KeyPair, database_url
from emulators.hosts import WithHostPaths

from orchestrator.core.spec import load_job
from orchestrator.engine.runner import JobRunner, Options, owner_id
from orchestrator.engine.submission import record_job
from orchestrator.records.store import Store, open_store
from providers.base import Instance
from providers.sim.compute import SimCloud

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
HOST = {"train_steps": 6, "train_step_seconds": 0.15, "vllm_startup_seconds": 0.2,
        "merge_seconds": 0.05}


@dataclass
class Rig:
    """A database, a simulated cloud and orch's key, all under tmp_path."""

    tmp: Path
    store: Store
    key: KeyPair
    clouds: list[SimCloud]

    def cloud(self, **kwargs: Any) -> SimCloud:
        options = {**HOST, **kwargs.pop("host_options", {})}
        cloud = SimCloud(self.tmp / "sim", host_options=options, **kwargs)
        self.clouds.append(cloud)
        return cloud

    def job_file(self, method: str = "qlora", **resources: Any) -> Path:
        folder = self.tmp / "jobs"
        if not folder.exists():
            shutil.copytree(EXAMPLES / "data", folder / "data")
        text = (EXAMPLES / "quickstart.yml").read_text()
        if method == "full":
            text = text.replace("method: qlora", "method: full")
            text = "\n".join(ln for ln in text.splitlines() if not ln.startswith("lora:"))
        path = folder / f"{method}-{len(list(folder.glob('*.yml')))}.yml"
        path.write_text(text)
        return path

    def queue(self, path: Path) -> str:
        job, _ = record_job(self.store, load_job(path))
        return job.id

    def runner(self, cloud: SimCloud, **opts: Any) -> tuple[JobRunner, str]:
        owner = owner_id("test")
        options = Options(**{"poll_s": 0.2, "watch_s": 0.2, "lease_s": 5,
                             "boot_deadline_s": 30, "connect_deadline_s": 20,
                             "ssh_key": self.key.private, **opts})
        return JobRunner(self.store, {"sim": cloud}, owner, options), owner

    def run(self, cloud: SimCloud, job_id: str, **opts: Any) -> Any:
        runner, owner = self.runner(cloud, **opts)
        assert self.store.claim_job(job_id, owner, 5) is not None
        return runner.run(job_id)

    def states(self, job_id: str) -> list[str]:
        return [json.loads(e.data_json or "{}").get("status") for e in self.store.events(job_id)
                if e.kind == "state"]

    def kinds(self, job_id: str) -> list[str]:
        return [e.kind for e in self.store.events(job_id)]


# These also run against a real PostgreSQL server (a team's shared database).
ON_POSTGRES = {"test_claim_is_exclusive_under_a_race", "test_job_succeeds_end_to_end",
               "test_preemption_mid_training_resumes_on_a_new_instance"}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "rig" in metafunc.fixturenames and metafunc.function.__name__ in ON_POSTGRES:
        metafunc.parametrize("rig", BACKENDS, indirect=True)


@pytest.fixture
def rig(request: pytest.FixtureRequest, tmp_path: Path, ssh_keypair: KeyPair,
        monkeypatch: pytest.MonkeyPatch) -> Iterator[Rig]:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    url = database_url(getattr(request, "param", "sqlite"), tmp_path, request)
    monkeypatch.setenv("ORCH_DB_URL", url)
    r = Rig(tmp_path, open_store(url), ssh_keypair, [])
    try:
        yield r
    finally:
        for cloud in r.clouds:
            cloud.terminate_all()
        r.store.close()


def when(predicate: Callable[[], bool], then: Callable[[], None], timeout: float = 600) -> None:
    """Run `then` in a thread as soon as `predicate` holds (polled).

    `timeout` only keeps the thread from outliving a test whose job ended first; it starts
    before the job is even placed, so it is long: a loaded machine takes its time.
    """
    def watch() -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                then()
                return
            time.sleep(0.05)

    threading.Thread(target=watch, daemon=True).start()


def mirrored_step(store: Store, job_id: str) -> int:
    """The newest checkpoint step copied off the host so far (0: none yet)."""
    steps = [json.loads(e.data_json or "{}").get("step") or 0 for e in store.events(job_id)
             if e.kind == "checkpoint.mirrored"]
    return max(steps, default=0)


def training_step(store: Store, job_id: str) -> int:
    steps = [json.loads(e.data_json or "{}").get("step") or 0 for e in store.events(job_id)
             if e.kind == "train.progress"]
    return max(steps, default=0)


def assert_nothing_left(rig: Rig, cloud: SimCloud, job_id: str) -> None:
    assert cloud.list() == []
    rows = rig.store.instances_of(job_id)
    assert rows and all(r.terminated_at is not None for r in rows)
    # Nothing of the job is kept on this machine either (its local checkpoint copies).
    from orchestrator.engine.runner_core import checkpoint_dir

    assert not checkpoint_dir(job_id).exists()


@pytest.mark.parametrize("method", ["qlora", "full"])
def test_job_succeeds_end_to_end(rig: Rig, method: str) -> None:
    cloud = rig.cloud()
    job_id = rig.queue(rig.job_file(method))
    job = rig.run(cloud, job_id)

    assert job.status == "succeeded", job.failure_reason
    assert rig.states(job_id) == ["provisioning", "provisioning", "connecting", "preparing",
                                  "training", "merging", "evaluating", "releasing", "succeeded"]
    metrics = {m.name: m.value for m in rig.store.metrics(job_id) if m.step is None}
    assert metrics["eval.count"] == 3
    assert any(m.name == "train.loss" for m in rig.store.metrics(job_id))
    artifacts = Path(job.artifacts_dir)
    assert (artifacts / "manifest.json").is_file()
    if method == "qlora":
        assert (artifacts / "adapter_model.safetensors").is_file()
    (row,) = rig.store.instances_of(job_id)
    assert row.end_reason == "released" and row.interruptible  # the cheapest is spot
    assert row.cost_micros > 0 and job.cost_micros >= row.cost_micros
    assert job.cost_micros == row.cost_micros
    # A rental's disk is destroyed with it: nothing is said to stay on its host.
    places = [p for e in rig.store.events(job_id) if e.kind == "delivered"
              for p in json.loads(e.data_json or "{}")["places"]]
    assert places and all(p["where"] != "host" for p in places), places
    # The simulated cloud trains as fast as it is told: it must not teach the planner.
    from orchestrator.records.readonly import measured_throughput

    assert measured_throughput(str(rig.store.engine.url)) == {}
    assert_nothing_left(rig, cloud, job_id)


def test_capacity_error_on_the_cheapest_offer_falls_through(rig: Rig) -> None:
    cloud = rig.cloud(capacity={"RTX 3090": 1})
    # Someone else holds the only RTX 3090: sim still lists it, create refuses.
    (cheapest,) = [o for o in cloud.offers(_req(1)) if o.gpu == "RTX 3090" and o.interruptible]
    other = cloud.create(cheapest, rig.key.public, "j-someoneelse")
    job_id = rig.queue(rig.job_file())
    job = rig.run(cloud, job_id)

    assert job.status == "succeeded", job.failure_reason
    rows = rig.store.instances_of(job_id)
    assert [r.end_reason for r in rows][-1] == "released"
    assert {r.gpu for r in rows if r.end_reason == "capacity"} == {"RTX 3090"}
    assert rows[-1].gpu != "RTX 3090"
    assert "provision.capacity" in rig.kinds(job_id)
    cloud.terminate(other.instance_id)
    assert_nothing_left(rig, cloud, job_id)


def test_preemption_mid_training_resumes_on_a_new_instance(rig: Rig) -> None:
    cloud = rig.cloud(host_options={"train_steps": 10, "train_step_seconds": 0.3})
    job_id = rig.queue(rig.job_file())
    preempted: list[float] = []

    def preempt() -> None:
        (row,) = rig.store.instances_of(job_id)
        assert row.provider_instance_id
        preempted.append(time.monotonic())
        cloud.preempt(row.provider_instance_id)

    when(lambda: training_step(rig.store, job_id) >= 4, preempt)
    job = rig.run(cloud, job_id)

    assert preempted, "the job finished before it could be preempted"
    assert job.status == "succeeded", job.failure_reason
    assert job.interruptions == 1 and job.attempt == 1
    first, second = rig.store.instances_of(job_id)
    assert first.end_reason == "interrupted" and second.end_reason == "released"
    assert first.provider_instance_id != second.provider_instance_id
    assert second.attempt == 1
    resume = [json.loads(e.data_json or "{}") for e in rig.store.events(job_id)
              if e.kind == "resume"]
    assert resume and resume[0]["step"] >= 2, "did not resume from a checkpoint"
    assert job.lost_steps == resume[0]["lost_steps"] <= 3
    states = rig.states(job_id)
    i = states.index("interrupted")
    assert states[i + 1 : i + 3] == ["queued", "provisioning"]
    assert_nothing_left(rig, cloud, job_id)


class DeadSshPort:
    """The simulated cloud, except that its first instance reports a running machine whose
    SSH port refuses every connection (a marketplace machine shown running while its sshd is
    not up yet): only a preemption, which the test makes, ends the wait."""

    def __init__(self, cloud: SimCloud) -> None:
        self.cloud = cloud
        self.first: str | None = None
        # Accepts and hangs up at once (no SSH banner, as an sshd not up behind a port
        # forward), counting the engine's attempts.
        self.refusing = socket.create_server(("127.0.0.1", 0))
        self.attempts = 0
        threading.Thread(target=self._hang_up, daemon=True).start()

    def _hang_up(self) -> None:
        while True:
            try:
                conn, _ = self.refusing.accept()
            except OSError:  # closed: the test is over
                return
            self.attempts += 1
            conn.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cloud, name)

    def create(self, *args: Any, **kwargs: Any) -> Instance:
        inst = self.cloud.create(*args, **kwargs)
        self.first = self.first or inst.instance_id
        return self._dead(inst)

    def get(self, instance_id: str) -> Instance:
        return self._dead(self.cloud.get(instance_id))

    def _dead(self, inst: Instance) -> Instance:
        if inst.instance_id != self.first or inst.ssh_port is None:
            return inst
        return dataclasses.replace(inst, ssh_port=self.refusing.getsockname()[1])


def test_preemption_while_ssh_comes_up_re_places_at_once(rig: Rig) -> None:
    """A machine preempted after the provider reports it running but before its SSH answers
    is an interruption, seen by the monitor: the connect stops at its next attempt instead
    of retrying the dead port for the whole connect deadline and then calling the machine
    unreachable (issue 41's bench lost a deadline to that)."""
    cloud = DeadSshPort(rig.cloud())
    job_id = rig.queue(rig.job_file())

    def connecting() -> bool:
        rows = rig.store.instances_of(job_id)
        return (bool(rows) and rows[0].provider_instance_id is not None
                and rig.store.get_job(job_id).status == "connecting")

    at_preemption: list[int] = []

    def preempt() -> None:
        time.sleep(1.0)  # some refused attempts first
        assert cloud.first is not None
        at_preemption.append(cloud.attempts)
        cloud.preempt(cloud.first)

    when(connecting, preempt)
    # A connect deadline far beyond the test's time: only the monitor's stop ends the wait.
    runner, owner = rig.runner(cloud, connect_deadline_s=120)  # type: ignore[arg-type]
    assert rig.store.claim_job(job_id, owner, 5) is not None
    job = runner.run(job_id)
    cloud.refusing.close()

    assert job.status == "succeeded", job.failure_reason
    first, second = rig.store.instances_of(job_id)
    assert first.provider_instance_id == cloud.first
    assert first.end_reason == "interrupted", first.end_reason  # not "unreachable"
    # The retries stopped at the monitor's signal: an attempt or two after the preemption, not
    # the ~25 that the 120 s connect deadline allows with backoff up to 5 s.
    assert at_preemption and at_preemption[0] >= 1
    assert cloud.attempts - at_preemption[0] <= 3, (at_preemption, cloud.attempts)
    assert second.end_reason == "released"
    assert job.interruptions == 1
    assert_nothing_left(rig, cloud.cloud, job_id)


def test_cancel_mid_training_terminates_the_instance(rig: Rig) -> None:
    cloud = rig.cloud(host_options={"train_steps": 40, "train_step_seconds": 0.3})
    job_id = rig.queue(rig.job_file())
    when(lambda: training_step(rig.store, job_id) >= 2, lambda: rig.store.request_cancel(job_id))
    job = rig.run(cloud, job_id)

    assert job.status == "cancelled"
    # Stopped mid-way, counted in steps rather than wall time (this machine is noisy).
    assert 2 <= training_step(rig.store, job_id) < 40, "training ran to the end"
    (row,) = rig.store.instances_of(job_id)
    assert row.end_reason == "cancelled"
    assert job.cost_micros == row.cost_micros
    assert_nothing_left(rig, cloud, job_id)


def test_training_failure_fails_the_job_with_the_log_and_tears_down(rig: Rig) -> None:
    cloud = rig.cloud(host_options={"train_crash_at_step": 2, "train_crash_repeats": True})
    job_id = rig.queue(rig.job_file())
    job = rig.run(cloud, job_id)

    assert job.status == "failed"
    assert "training exited with" in (job.failure_reason or "")
    assert_nothing_left(rig, cloud, job_id)


def test_claim_is_exclusive_under_a_race(rig: Rig) -> None:
    job_id = rig.queue(rig.job_file())
    wins: list[str] = []
    barrier = threading.Barrier(6)

    def claim(n: int) -> None:
        store = open_store(str(rig.store.engine.url))
        barrier.wait()
        if store.claim_job(job_id, f"w{n}", 30) is not None:
            wins.append(f"w{n}")
        store.close()

    threads = [threading.Thread(target=claim, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1
    assert rig.store.get_job(job_id).lease_owner == wins[0]


def _req(count: int) -> Any:
    from providers.base import Requirements

    return Requirements(gpu_count=count, min_gpu_memory_bytes=0)


def run_on_server(rig: Rig, host: Any) -> tuple[str, Any]:
    """Register simulated `host` as monthly server box1 and run a job there: (job id, job)."""
    from decimal import Decimal

    from providers.dedicated.compute import Dedicated

    rig.store.add_server(name="box1", host=host.host, port=host.port, user=host.user,
                         gpu="H100 SXM", gpu_count=1, monthly_price=Decimal(2190))
    path = rig.job_file()
    path.write_text(path.read_text().replace("providers: [sim]", "providers: [dedicated]"))
    job_id = rig.queue(path)
    owner = owner_id("test")
    options = Options(poll_s=0.2, watch_s=0.2, lease_s=5, ssh_key=rig.key.private)
    assert rig.store.claim_job(job_id, owner, 5) is not None
    # The registered server is a simulated host: its server paths live under host.root.
    dedicated = WithHostPaths(Dedicated(rig.store), lambda _instance_id: str(host.root))
    return job_id, JobRunner(rig.store, {"dedicated": dedicated}, owner, options).run(job_id)


def test_registered_server_runs_the_job_at_zero_marginal_cost(rig: Rig, simhost: Any) -> None:
    host = simhost(**HOST)  # H100 SXM, authorizes rig.key
    job_id, job = run_on_server(rig, host)

    assert job.status == "succeeded", job.failure_reason
    assert job.cost_micros == 0 and job.amortised_micros > 0  # rent share, already paid
    # Issue 12 §4: a registered server is claimed at no marginal cost, never "rented".
    messages = [e.message for e in rig.store.events(job_id)]
    assert not [m for m in messages if m.startswith("renting")], messages
    assert any(m.startswith("claiming registered server box1") and "no marginal cost" in m
               for m in messages), messages
    # Host-checked at its first use, under its name, and used (issue 40 §1: not rejected):
    # before anything, then the GPUs once the job's set-up gave Docker the GPUs and the image.
    assert rig.kinds(job_id).count("host.checked") == 2
    (row,) = rig.store.instances_of(job_id)
    assert (row.provider, row.end_reason, row.cost_micros) == ("dedicated", "released", 0)
    (server,) = rig.store.list_servers()
    assert server.status == "idle" and server.claimed_by_job is None  # released, not destroyed
    assert server.host_key and host.running  # key pinned at first contact; the box lives on
    # The server is kept, so the eval's vLLM server was stopped (its GPU is free again).
    removed = [e["container"] for e in host.events("docker-rm")]
    assert any(c.startswith("orch-vllm") or "vllm" in c for c in removed), removed
    # Its disk outlives the job: where the outputs stay on it is recorded (issue 19 §2).
    (delivered,) = [json.loads(e.data_json or "{}") for e in rig.store.events(job_id)
                    if e.kind == "delivered"]
    (kept,) = [p for p in delivered["places"] if p["where"] == "host"]
    server, _, folder = kept["location"].partition(":")
    assert server == "box1" and kept["what"] == "outputs"
    assert (Path(folder) / "adapter_model.safetensors").is_file()  # on the server's disk


def test_workers_starting_together_share_one_new_ssh_key(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "xdg")}
    code = "from orchestrator.engine.runner import ensure_key; print(ensure_key()[1])"
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    keys = {p.communicate(timeout=60)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert len(keys) == 1 and next(iter(keys)).startswith("ssh-ed25519 ")
    key = tmp_path / "xdg" / "orch" / "ssh" / "id_ed25519"
    assert key.stat().st_mode & 0o777 == 0o600


def test_a_training_that_makes_no_progress_is_stopped_by_the_watchdog_and_torn_down(
        rig: Rig) -> None:
    # The training hangs: its first step never ends. The lease stays renewed all along (the
    # worker is alive); only the watchdog can see that the job is not.
    cloud = rig.cloud(host_options={"train_steps": 4, "train_step_seconds": 3600})
    job_id = rig.queue(rig.job_file())
    job = rig.run(cloud, job_id, stall_s={"training": 3.0}, stall_retries=1)

    assert job.status == "failed"
    assert "watchdog" in (job.failure_reason or "")
    assert "ORCH_STALL_TRAINING_S" in (job.failure_reason or "")
    # One re-placement on a fresh instance, then the job fails; both machines are gone.
    first, second = rig.store.instances_of(job_id)
    assert first.provider_instance_id != second.provider_instance_id
    # Given up by orch, not taken by the provider: not an interruption for the learned rate.
    assert first.end_reason == "replaced" and second.end_reason == "failed"
    assert rig.kinds(job_id).count("watchdog.stalled") == 2
    assert_nothing_left(rig, cloud, job_id)


@pytest.mark.parametrize("outcome", ["succeeded", "failed"])
def test_a_kept_server_has_no_secret_left_after_the_job(
        rig: Rig, simhost: Any, monkeypatch: pytest.MonkeyPatch, outcome: str) -> None:
    # Issue 10 §6: a monthly server is never destroyed, so HF_TOKEN's file (hf.env for the
    # download; since issue 23 §10 training gets no token) and any temporary copy must go.
    token = "hf_" + "s3cr3t" * 6
    monkeypatch.setenv("HF_TOKEN", token)
    crash = {"train_crash_at_step": 2, "train_crash_repeats": True} if outcome == "failed" else {}
    # The model is gated on this host's hub: the download needed the token.
    host = simhost(**HOST, **crash, hf_gated_repos=("meta-llama/Llama-3.2-1B",))
    job_id, job = run_on_server(rig, host)

    assert job.status == outcome, job.failure_reason
    assert outcome == "succeeded" or "training exited" in (job.failure_reason or "")
    small = [p for p in host.root.rglob("*") if p.is_file() and p.stat().st_size < 1 << 20]
    left = [p for p in small if token.encode() in p.read_bytes()
            or p.name.endswith(("hf.env", "secrets.env")) or ".env." in p.name]
    assert left == [], left
    assert host.running  # the box lives on


def test_a_pinned_layout_is_what_the_host_trains_with(rig: Rig) -> None:
    # resources.layout reaches the trainer: the engine sizes the job again on the GPU it got
    # (savers.fit), with the pin, and renders FSDP2's keys (DDP would render none).
    cloud = rig.cloud()
    path = rig.job_file("full")
    path.write_text(path.read_text().replace(
        "  providers: [sim]", "  providers: [sim]\n  gpu_count: 2\n  layout: fsdp2"))
    job_id = rig.queue(path)
    seen: list[dict[str, Any]] = []

    def uploaded() -> list[Path]:  # the config on the host, while it exists
        return [p for p in (rig.tmp / "sim").rglob("config.yml") if job_id in str(p)]

    when(lambda: training_step(rig.store, job_id) > 0,
         lambda: seen.extend(yaml.safe_load(p.read_text()) for p in uploaded()))
    job = rig.run(cloud, job_id)
    assert job.status == "succeeded", job.failure_reason
    assert json.loads(job.placement_json or "{}")["placement"]["strategy"] == "fsdp2"
    assert seen and seen[0]["fsdp_version"] == 2 and "deepspeed" not in seen[0]
    assert seen[0]["fsdp_config"]["auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"
    assert_nothing_left(rig, cloud, job_id)
