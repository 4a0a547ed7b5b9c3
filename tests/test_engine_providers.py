"""The engine through the Vast.ai and RunPod adapters, against their HTTP emulators whose
instances are simulated GPU hosts: success, capacity fall-through, retried 429/5xx, a 402
that stops with a clear message, and a Vast.ai outbid resumed elsewhere. The hosts are
container rentals as strict as the real ones (no Docker; the image's environment only where
the provider persists it; sshd only for images that honour PUBLIC_KEY), so these jobs prove
the native pipeline on them.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import KeyPair
from emulators.hosts import SimHostBackend
from emulators.runpod import RunPodEmulator
from emulators.vast import VastEmulator
from test_emulator_hosts import RUNPOD_CATALOG as RUNPOD_GPUS
from test_engine import HOST, Rig, mirrored_step, run_on_server, when

from orchestrator.engine.runner import JobRunner, Options, owner_id
from orchestrator.records.store import open_store
from providers.runpod.compute import RunPod
from providers.vastai.compute import VastAI

KEY = "engine-emulator-key-0123456789"


@pytest.fixture
def rig(tmp_path: Path, ssh_keypair: KeyPair, monkeypatch: pytest.MonkeyPatch) -> Iterator[Rig]:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    url = f"sqlite:///{tmp_path / 'orch.db'}"
    monkeypatch.setenv("ORCH_DB_URL", url)
    r = Rig(tmp_path, open_store(url), ssh_keypair, [])
    yield r
    r.store.close()


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[SimHostBackend]:
    backend = SimHostBackend(tmp_path / "emu-hosts", dict(HOST))
    yield backend
    backend.stop_all()


def job_for(rig: Rig, provider: str, method: str = "qlora") -> str:
    path = rig.job_file(method)
    path.write_text(path.read_text().replace("providers: [sim]", f"providers: [{provider}]"))
    return rig.queue(path)


def drive(rig: Rig, providers: dict[str, Any], job_id: str) -> Any:
    owner = owner_id("test")
    opts = Options(poll_s=0.2, watch_s=0.2, lease_s=5, boot_deadline_s=30,
                   connect_deadline_s=20, ssh_key=rig.key.private)
    assert rig.store.claim_job(job_id, owner, 5) is not None
    return JobRunner(rig.store, providers, owner, opts).run(job_id)


def vast(emu: VastEmulator) -> VastAI:
    return VastAI(KEY, base_url=emu.url, attempts=4, initial_s=0.01, max_wait_s=0.05)


def runpod(emu: RunPodEmulator) -> RunPod:
    return RunPod(KEY, base_url=emu.url, attempts=4, deadline_s=10, initial_backoff_s=0.01,
                  max_backoff_s=0.05)


def test_vast_spot_job_succeeds_and_is_destroyed(rig: Rig, hosts: SimHostBackend) -> None:
    with VastEmulator(api_key=KEY, hosts=hosts) as emu:
        emu.add_offer(id=1, gpu_name="RTX 4090", dph_base=0.40, min_bid=0.20)
        emu.add_offer(id=2, gpu_name="A100 SXM4", gpu_ram=81920, dph_base=1.20, min_bid=0.70)
        job_id = job_for(rig, "vastai")
        job = drive(rig, {"vastai": hosts.serving(vast(emu))}, job_id)
        assert job.status == "succeeded", job.failure_reason
        (row,) = rig.store.instances_of(job_id)
        assert (row.gpu, row.interruptible, row.end_reason) == ("RTX 4090", True, "released")
        # The price charged is what Vast.ai reported (bid + storage), not the catalog's.
        assert row.price_per_hour_micros > 200_000
        assert emu.instances == {}
        # The job was queued on the catalog's estimate: the engine says the market differs.
        moved = [e.message for e in rig.store.events(job_id) if e.kind == "placement.changed"]
        assert len(moved) == 1 and moved[0].startswith("the market moved since the plan: "
                                                       "planned vastai ")
        assert "now vastai RTX 4090 x1 at $" in moved[0]
        # What the search saw is price history (`orch prices`), spot and on-demand.
        from orchestrator.records import prices

        seen = prices.history(rig.store, ["RTX 4090", "A100 80GB"])
        assert {(s.gpu, s.interruptible) for s in seen} == {
            (g, spot) for g in ("RTX 4090", "A100 80GB") for spot in (True, False)}
        # A finished run on a real provider teaches the planner its throughput.
        from orchestrator.records.readonly import measured_throughput

        learned = measured_throughput(str(rig.store.engine.url))
        assert [k for k in learned if k[0] == "RTX 4090" and k[2] == "qlora"], learned
    assert hosts.instance_ids == [] or all(not hosts.host(i).running for i in hosts.instance_ids)


def test_vast_capacity_error_and_rate_limits_fall_through(rig: Rig,
                                                         hosts: SimHostBackend) -> None:
    with VastEmulator(api_key=KEY, hosts=hosts) as emu:
        emu.add_offer(id=1, gpu_name="RTX 4090", dph_base=0.40, min_bid=0.20)
        emu.add_offer(id=2, gpu_name="RTX 5090", gpu_ram=32768, dph_base=0.60, min_bid=0.30)
        emu.fail_next(2, 429, method="PUT")  # retried by the adapter
        emu.fail_next(1, 500, method="GET")  # a 5xx while polling, retried too
        emu.remove_offer(1)  # gone between search and create: a capacity error
        emu.add_offer(id=1, gpu_name="RTX 4090", dph_base=0.40, min_bid=0.20)
        emu.fail_contract(1)  # success:false + new_contract: destroyed, next offer
        job_id = job_for(rig, "vastai")
        job = drive(rig, {"vastai": hosts.serving(vast(emu))}, job_id)
        assert job.status == "succeeded", job.failure_reason
        rows = rig.store.instances_of(job_id)
        assert [r.end_reason for r in rows] == ["capacity", "released"]
        assert rows[-1].gpu == "RTX 5090"
        assert emu.instances == {}


def test_vast_outbid_mid_training_resumes_from_the_mirrored_checkpoint(rig: Rig,
                                                           hosts: SimHostBackend) -> None:
    backend = SimHostBackend(rig.tmp / "slow-hosts", {**HOST, "train_steps": 20,
                                                      "train_step_seconds": 0.3})
    try:
        with VastEmulator(api_key=KEY, hosts=backend) as emu:
            emu.add_offer(id=1, gpu_name="RTX 4090", dph_base=0.40, min_bid=0.20)
            emu.add_offer(id=2, gpu_name="RTX 5090", gpu_ram=32768, dph_base=0.60,
                          min_bid=0.30)
            job_id = job_for(rig, "vastai")

            def outbid() -> None:
                (row,) = rig.store.instances_of(job_id)
                emu.preempt(row.provider_instance_id or "")

            # Outbid once a checkpoint is safely copied off the host, not at a training step:
            # on a busy machine step 3 can be reported before checkpoint-2 is mirrored.
            when(lambda: mirrored_step(rig.store, job_id) >= 1, outbid)
            job = drive(rig, {"vastai": backend.serving(vast(emu))}, job_id)
            assert job.status == "succeeded", job.failure_reason
            first, second = rig.store.instances_of(job_id)
            assert first.end_reason == "interrupted" and second.end_reason == "released"
            assert job.interruptions == 1
            # Vast.ai has no volume: the checkpoint copied off the first instance was put on
            # the second one, and training resumed from it.
            kinds = rig.kinds(job_id)
            assert "checkpoint.mirrored" in kinds and "checkpoint.restored" in kinds
            resume = [json.loads(e.data_json or "{}") for e in rig.store.events(job_id)
                      if e.kind == "resume"]
            assert resume and resume[0]["step"] >= 1  # not from scratch
            assert job.lost_steps == resume[0]["lost_steps"]
            assert emu.instances == {}
            assert not (rig.tmp / "xdg" / "orch" / "checkpoints" / job_id).exists()
    finally:
        backend.stop_all()


def test_vast_402_stops_with_a_clear_message(rig: Rig, hosts: SimHostBackend) -> None:
    with VastEmulator(api_key=KEY, hosts=hosts) as emu:
        emu.add_offer(id=1, gpu_name="RTX 4090", dph_base=0.40, min_bid=0.20)
        emu.fail_next(1, 402, method="PUT")
        job_id = job_for(rig, "vastai")
        job = drive(rig, {"vastai": hosts.serving(vast(emu))}, job_id)
        assert job.status == "failed"
        assert "vastai" in (job.failure_reason or "")
        assert "credit" in (job.failure_reason or "").lower()
        (row,) = rig.store.instances_of(job_id)
        assert row.terminated_at is not None and row.provider_instance_id is None
        assert emu.instances == {}


@pytest.mark.parametrize("method", ["qlora", "full"])
def test_runpod_on_demand_job_succeeds(rig: Rig, hosts: SimHostBackend, method: str) -> None:
    with RunPodEmulator(api_key=KEY, gpus=json.loads(json.dumps(RUNPOD_GPUS)),
                        hosts=hosts) as emu:
        emu.fail_next(503, 1, method="POST", path="/v2/pods")  # retried
        job_id = job_for(rig, "runpod", method)
        job = drive(rig, {"runpod": hosts.serving(runpod(emu))}, job_id)
        assert job.status == "succeeded", job.failure_reason
        (row,) = rig.store.instances_of(job_id)
        assert row.interruptible is False and row.end_reason == "released"
        assert emu.pod_ids == []  # released: the pod was deleted, nothing left billing


def test_a_parked_runpod_pod_is_priced_with_its_disks(rig: Rig, hosts: SimHostBackend) -> None:
    """RunPod bills the container disk and the volume disk per second while a pod runs
    ($0.10/GB/month each, docs.runpod.io/pods/pricing): a pod kept warm costs its GPUs
    plus its disks an hour, and so does the rental recorded for the job."""
    from decimal import Decimal

    from orchestrator.records.store import to_micros

    with RunPodEmulator(api_key=KEY, gpus=json.loads(json.dumps(RUNPOD_GPUS)),
                        hosts=hosts) as emu:
        path = rig.job_file("qlora")
        path.write_text(path.read_text().replace("providers: [sim]", "providers: [runpod]")
                        + "  keep_warm: 10m\n")
        job = drive(rig, {"runpod": hosts.serving(runpod(emu))}, rig.queue(path))
        assert job.status == "succeeded", job.failure_reason
        (post,) = [c.body for c in emu.calls("POST", "/v2/pods")]
        gb = post["disk"] + post["mounts"]["persistent"]["size"]
        (pod_id,) = emu.pod_ids
        gpus = Decimal(str(emu.pod(pod_id)["cost"]))  # the GPUs alone, as RunPod reports
        hourly = to_micros((gpus + gb * Decimal("0.10") / 720).quantize(Decimal("1e-6")))
        (row,) = rig.store.instances_of(job.id)
        (warm,) = rig.store.warm_instances()
        assert abs(row.price_per_hour_micros - hourly) <= 1
        assert warm.price_per_hour_micros == row.price_per_hour_micros > to_micros(gpus)


def test_runpod_402_stops(rig: Rig, hosts: SimHostBackend) -> None:
    with RunPodEmulator(api_key=KEY, gpus=json.loads(json.dumps(RUNPOD_GPUS)),
                        hosts=hosts) as emu:
        emu.fail_next(402, 1, method="POST", path="/v2/pods", detail="insufficient balance")
        job_id = job_for(rig, "runpod")
        job = drive(rig, {"runpod": hosts.serving(runpod(emu))}, job_id)
        assert job.status == "failed"
        assert "runpod" in (job.failure_reason or "") and "balance" in (job.failure_reason or "")


# --- issue 23 §10: the HF token is on a host's disk only while the model downloads ---------

GATED = ("meta-llama/Llama-3.2-1B",)  # the quickstart's model; the hosts' hub wants a token


def token_files(root: Path, token: bytes) -> list[Path]:
    """Files under `root` that hold `token` (or are named like orch's secret files)."""
    found = []
    # os.walk, not rglob: a folder removed while it is walked is skipped, where rglob raised
    # and ended the watching thread (DiskWatch) for the rest of the job.
    paths = (Path(top) / name for top, _, names in os.walk(root) for name in names)
    for path in paths:
        try:
            if not path.is_file() or path.stat().st_size > 1 << 20:
                continue
            if path.name.endswith(("hf.env", "secrets.env")) or token in path.read_bytes():
                found.append(path)
        except OSError:  # written or removed while we looked
            continue
    return found


class DiskWatch:
    """Looks for the token on disk under `root` while the job runs, after its download."""

    def __init__(self, rig: Rig, root: Path, token: str) -> None:
        self.rig, self.root, self.token = rig, root, token.encode()
        self.seen: list[tuple[str, str]] = []  # (job status, file) found after the download
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self.stop.wait(0.1):
            jobs = self.rig.store.list_jobs(limit=10)
            if not jobs or jobs[0].status not in ("training", "merging", "evaluating",
                                                  "releasing"):
                continue
            self.seen += [(jobs[0].status, str(p)) for p in token_files(self.root, self.token)]

    def __enter__(self) -> DiskWatch:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=10)


@pytest.mark.parametrize("kind", ["sim", "vastai", "dedicated"])
def test_the_hf_token_leaves_the_disk_once_the_model_is_downloaded(
        rig: Rig, simhost: Any, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    token = "hf_" + "t0ken" * 7
    monkeypatch.setenv("HF_TOKEN", token)
    gated = {**HOST, "hf_gated_repos": GATED}
    with DiskWatch(rig, rig.tmp, token) as watch:
        if kind == "sim":
            cloud = rig.cloud(host_options={"hf_gated_repos": GATED})
            job = rig.run(cloud, rig.queue(rig.job_file()))
        elif kind == "dedicated":
            _, job = run_on_server(rig, simhost(**gated))
        else:
            backend = SimHostBackend(rig.tmp / "gated-hosts", gated)
            try:
                with VastEmulator(api_key=KEY, hosts=backend) as emu:
                    emu.add_offer(id=1, gpu_name="RTX 4090", dph_base=0.40, min_bid=0.20)
                    job = drive(rig, {"vastai": backend.serving(vast(emu))},
                                job_for(rig, "vastai"))
            finally:
                backend.stop_all()
    assert job.status == "succeeded", job.failure_reason  # the gated download had the token
    assert watch.seen == []
    assert token_files(rig.tmp, token.encode()) == []


def test_runpod_pod_runs_the_image_the_job_names_and_finds_hf_in_it(
        rig: Rig, hosts: SimHostBackend) -> None:
    # Issue 23 §12: a RunPod job failed once because the emulated pod's image had no `hf`
    # where the job looked for it. Follow the job's image through: the job file names a tag
    # (not the default), the pod is created from that tag's cloud image, the simulated pod
    # IS that image, and the model download ran the `hf` of that image's venv.
    from playbooks import images

    tag = "0.18.0-py3.12-cu130-2.11.0"
    assert images.default_image("docker") != f"axolotlai/axolotl:{tag}"
    path = rig.job_file()
    path.write_text(path.read_text().replace("  providers: [sim]", "  providers: [runpod]")
                    + f"trainer:\n  image: axolotlai/axolotl:{tag}\n")
    with RunPodEmulator(api_key=KEY, gpus=json.loads(json.dumps(RUNPOD_GPUS)),
                        hosts=hosts) as emu:
        job = drive(rig, {"runpod": hosts.serving(runpod(emu))}, rig.queue(path))
        assert job.status == "succeeded", job.failure_reason
        [create] = emu.calls("POST", "/v2/pods")
    assert create.body["image"] == f"axolotlai/axolotl-cloud:{tag}"
    [pod] = hosts.instance_ids
    host = hosts.host(pod)
    assert host.options.container_image == create.body["image"]
    venv = host.path(images.layout().venv) / "bin"
    assert (venv / "hf").is_file()
    downloads = [c for c in host.ssh_commands() if " download " in f" {c} "]
    assert downloads and all(str(venv) in c for c in downloads), downloads
    assert [e["ok"] for e in host.events("hf-download")] == [True]
