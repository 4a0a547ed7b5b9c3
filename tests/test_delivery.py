"""The trained model reaches the user (issue 19 §2): `output:` in the job file.

On the simulated cloud through the engine: `merged: true` copies the merged model back;
`push_to_hub` uploads it from the host with the real `hf upload` (huggingface_hub 1.17.0,
which the simulated host's `hf` runs for uploads) to the Hub emulator, private unless the
job says otherwise; `orch show --json` says where each artifact is.
"""

from __future__ import annotations

import json
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import orchfork
import pytest
from emulators.hub import HubEmulator
from test_engine import Rig, rig  # noqa: F401  (the engine test rig fixture)

from orchestrator.core.spec import SpecError, load_job

WRITER = "hf_writer_token"


def job_with(rig: Rig, output: str, method: str = "qlora") -> Path:  # noqa: F811
    path = rig.job_file(method)
    path.write_text(path.read_text() + f"output: {output}\n")
    return path


def places(rig: Rig, job_id: str) -> list[dict[str, str]]:  # noqa: F811
    found = [json.loads(e.data_json or "{}") for e in rig.store.events(job_id)
             if e.kind == "delivered"]
    assert found, "no delivered event"
    result: list[dict[str, str]] = found[-1]["places"]
    return result


def test_merged_true_returns_the_merged_model(rig: Rig) -> None:  # noqa: F811
    job_id = rig.queue(job_with(rig, "{merged: true}"))
    job = rig.run(rig.cloud(), job_id)
    assert job.status == "succeeded", job.failure_reason
    merged = Path(job.artifacts_dir) / "merged"
    assert (merged / "config.json").is_file()
    assert any(merged.glob("*.safetensors"))
    manifest = json.loads((Path(job.artifacts_dir) / "manifest.json").read_text())
    assert any(f["path"].startswith("merged/") for f in manifest["files"])
    assert {"what": "merged", "where": "local", "location": str(merged)} in places(rig, job_id)


def test_without_output_the_merged_model_stays_on_the_host(rig: Rig) -> None:  # noqa: F811
    job_id = rig.queue(rig.job_file())
    job = rig.run(rig.cloud(), job_id)
    assert job.status == "succeeded", job.failure_reason
    assert not (Path(job.artifacts_dir) / "merged").exists()
    assert (Path(job.artifacts_dir) / "adapter_model.safetensors").is_file()


def run_pushing(rig: Rig, hub: HubEmulator, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
                namespace: str, output: str) -> Any:
    """Run a job with `output` whose HF_TOKEN may write in `namespace` only."""
    monkeypatch.setenv("HF_TOKEN", WRITER)
    hub.namespaces[WRITER] = namespace
    try:
        return rig.run(rig.cloud(), rig.queue(job_with(rig, output)))
    finally:
        hub.namespaces.pop(WRITER, None)


@pytest.mark.skipif(not (Path(sys.executable).parent / "hf").is_file(),
                    reason="the real hf client (huggingface_hub, test extra) is not installed")
def test_push_to_hub_uploads_the_merged_model_with_the_real_hf_client(
        rig: Rig, session_hub: HubEmulator, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    try:
        job = run_pushing(rig, session_hub, monkeypatch, "my-org",
                          "{merged: true, push_to_hub: my-org/tuned}")
        job_id = job.id
        assert job.status == "succeeded", job.failure_reason
        repo = session_hub.repos[("model", "my-org/tuned")]
        assert repo.private and repo.owner == WRITER
        assert "config.json" in repo.files
        shards = [name for name in repo.files if name.endswith(".safetensors")]
        assert shards and all(session_hub.blobs.get(_sha(repo.files[n])) for n in shards)
        # The 4 GB-class merged model went host -> Hub: nothing merged came to this machine.
        assert not (Path(job.artifacts_dir) / "merged").exists()
        url = f"{session_hub.url}/my-org/tuned"
        assert {"what": "merged", "where": "hub", "location": url} in places(rig, job_id)
        shown = orchfork.run(["show", job_id, "--json"], timeout=120)
        assert shown.returncode == 0, shown.stderr
        assert {"what": "merged", "where": "hub", "location": url} in \
            json.loads(shown.stdout)["delivered"]
        history = orchfork.run(["history", "--json"], timeout=120)
        assert history.returncode == 0, history.stderr
        (row,) = [r for r in json.loads(history.stdout) if r["job_id"] == job_id]
        assert {"what": "merged", "where": "hub", "location": url} in row["delivered"]
    finally:
        session_hub.repos.pop(("model", "my-org/tuned"), None)


def test_a_push_the_hub_refuses_fails_the_job_saying_why(
        rig: Rig, session_hub: HubEmulator, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    # A token whose role orch cannot judge before renting (so the check only notes it), and
    # that the Hub then refuses at the upload.
    session_hub.roles[WRITER] = "someNewRole"
    try:
        job = run_pushing(rig, session_hub, monkeypatch, "my-org",
                          "{push_to_hub: my-org/adapter, private: false}")
    finally:
        session_hub.roles.pop(WRITER, None)
    assert job.status == "failed"
    reason: Any = job.failure_reason
    assert "refused to write my-org/adapter" in reason and "write access" in reason
    assert ("model", "my-org/adapter") not in session_hub.repos
    assert "hub.unchecked" in rig.kinds(job.id)


def test_a_namespace_the_token_cannot_write_fails_before_renting(
        rig: Rig, session_hub: HubEmulator, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """Issue 36 §2: found by the upload, after every paid hour; now before renting."""
    job = run_pushing(rig, session_hub, monkeypatch, "someone-else",
                      "{push_to_hub: my-org/adapter, private: false}")
    assert job.status == "failed"
    reason: Any = job.failure_reason
    assert reason.startswith("before renting: output.push_to_hub: ") and \
        "(someone-else) has no write access to my-org" in reason
    assert rig.store.instances_of(job.id) == []


def _sha(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize(("output", "words"), [
    ("{merged: true}", None),
    ("{local: false}", "would go nowhere"),
    ("{push_to_hub: no-owner}", "has no owner"),
    ("{push_to_hub: org/bad..name}", "'..' are not allowed"),
])
def test_output_is_checked_before_anything_runs(rig: Rig, output: str,  # noqa: F811
                                                words: str | None) -> None:
    path = job_with(rig, output)
    if words is None:
        assert load_job(path).spec.output.merged_local()
        return
    with pytest.raises(SpecError) as info:
        load_job(path)
    assert words in str(info.value) and "output" in str(info.value)


def test_a_merged_70b_model_is_never_copied_here_unasked(tmp_path: Path) -> None:
    examples = Path(__file__).resolve().parent.parent / "examples"
    text = (examples / "qlora-70b.yml").read_text() + "output: {merged: true}\n"
    (tmp_path / "data").mkdir()
    for name in ("train.jsonl", "eval.jsonl"):
        (tmp_path / "data" / name).write_text((examples / "data" / name).read_text())
    path = tmp_path / "job.yml"
    path.write_text(text)
    with pytest.raises(SpecError, match=r"~141 GB: say where it goes"):
        load_job(path)
    path.write_text(text.replace("{merged: true}", "{merged: true, local: true}"))
    assert load_job(path).spec.output.merged_local()


def test_the_plan_shows_the_deliverys_size_time_and_cost(tmp_path: Path) -> None:
    from orchestrator.core.planning import make_plan

    examples = Path(__file__).resolve().parent.parent / "examples"
    (tmp_path / "data").mkdir()
    for name in ("train.jsonl", "eval.jsonl"):
        (tmp_path / "data" / name).write_text((examples / "data" / name).read_text())
    text = (examples / "qlora-70b.yml").read_text()
    path = tmp_path / "job.yml"
    path.write_text(text)
    plain = make_plan(load_job(path), ()).to_dict()["delivery"]
    assert plain["merged_bytes"] == 0 and plain["hub_bytes"] == 0
    assert 0 < plain["local_bytes"] < 10**9  # the adapter only
    path.write_text(text + "output: {merged: true, push_to_hub: my-org/big}\n")
    plan = make_plan(load_job(path), ())
    d = plan.to_dict()["delivery"]
    assert d["merged_bytes"] == d["hub_bytes"] > 140 * 10**9  # bf16, 70.6B parameters
    assert d["local_bytes"] == plain["local_bytes"]  # never 140 GB here unasked
    hourly = plan.chosen.est_cost / Decimal(str(plan.chosen.est_hours))
    assert d["hours"] > 0.35 and Decimal(d["cost"]) == pytest.approx(
        hourly * Decimal(str(d["hours"])), rel=Decimal("0.01"))
    assert "141.1 GB from the host to my-org/big" in plan.delivery.describe()


def test_runpod_volume_is_sized_for_the_model_and_holds_its_cache(
        rig: Rig, tmp_path: Path) -> None:  # noqa: F811
    """Issue 19 §4.4: a 70B model (141 GB in bf16) cannot land on the 50 GB container disk
    or a 100 GB volume; the volume is sized by the job and the cache goes on it."""
    from emulators.hosts import SimHostBackend
    from emulators.runpod import RunPodEmulator
    from test_emulator_hosts import RUNPOD_CATALOG
    from test_engine import HOST
    from test_engine_providers import KEY, drive, runpod

    examples = Path(__file__).resolve().parent.parent / "examples"
    folder = rig.tmp / "big"
    folder.mkdir()
    (folder / "data").mkdir()
    for name in ("train.jsonl", "eval.jsonl"):
        (folder / "data" / name).write_text((examples / "data" / name).read_text())
    text = (examples / "qlora-70b.yml").read_text()
    path = folder / "job.yml"
    path.write_text(text + "resources:\n  providers: [runpod]\n")
    job_id = rig.queue(path)
    hosts = SimHostBackend(tmp_path / "emu-hosts", dict(HOST))
    try:
        with RunPodEmulator(api_key=KEY, gpus=json.loads(json.dumps(RUNPOD_CATALOG)),
                            hosts=hosts) as emu:
            job = drive(rig, {"runpod": hosts.serving(runpod(emu))}, job_id)
            (instance,) = hosts.instance_ids
            volume = hosts.host(instance).options.disk_total_bytes
    finally:
        hosts.stop_all()
    # Before: a 100 GB volume and "need 155.2 GB free on /workspace/data, have 100.0 GB".
    assert job.status == "succeeded", job.failure_reason
    assert volume >= (141 * 1.1 + 141) * 10**9


def test_the_disk_asked_of_a_provider_fits_the_model(tmp_path: Path) -> None:
    """The offer search (Vast.ai `allocated_storage`, RunPod's volume, sim) asks for this."""
    from orchestrator.engine.jobinputs import Inputs

    examples = Path(__file__).resolve().parent.parent / "examples"
    small = Inputs(load_job(examples / "quickstart.yml"), 1, None, {})
    big = Inputs(load_job(examples / "qlora-70b.yml"), 1, None, {})
    assert small.disk_gb(100) == 100  # a 1B model: the configured default
    assert big.disk_gb(100) >= 141 * 1.1 + 141 + 10  # cache, merged model, checkpoints
