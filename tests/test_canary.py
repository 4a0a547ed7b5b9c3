"""examples/canary.yml (issue 19 §3): the smallest job through every phase, planned under
$0.10, run here on the simulated cloud and on the Vast.ai and RunPod emulators (container
rentals), each time returning the adapter and the merged model and scoring the eval rows.
"""

from __future__ import annotations

import json
import shutil
from decimal import Decimal
from pathlib import Path
from typing import Any

import orchfork
import pytest
from emulators.hosts import SimHostBackend
from emulators.runpod import RunPodEmulator
from emulators.vast import VastEmulator
from test_emulator_hosts import RUNPOD_CATALOG as RUNPOD_GPUS
from test_engine import EXAMPLES, Rig, rig  # noqa: F401  (the engine test rig fixture)
from test_engine_providers import KEY, drive, hosts, runpod, vast  # noqa: F401

from orchestrator.core.planning import make_plan
from orchestrator.core.spec import load_job

CANARY = EXAMPLES / "canary.yml"


def canary_for(rig: Rig, provider: str) -> str:  # noqa: F811
    folder = rig.tmp / "canary"
    if not folder.exists():
        shutil.copytree(EXAMPLES / "data", folder / "data")
    path = folder / f"canary-{provider}.yml"
    path.write_text(CANARY.read_text().replace(
        "  spot: allowed\n", f"  spot: allowed\n  providers: [{provider}]\n"))
    return rig.queue(path)


def check_delivered(rig: Rig, job: Any) -> None:  # noqa: F811
    assert job.status == "succeeded", job.failure_reason
    out = Path(job.artifacts_dir)
    assert (out / "adapter_model.safetensors").is_file()
    assert (out / "merged" / "config.json").is_file()
    metrics = {m.name: m.value for m in rig.store.metrics(job.id) if m.step is None}
    assert metrics["eval.count"] == 3
    states = rig.states(job.id)
    for phase in ("preparing", "training", "merging", "evaluating", "succeeded"):
        assert phase in states


def test_the_canary_is_planned_under_ten_cents() -> None:
    loaded = load_job(CANARY)
    assert loaded.spec.base_model.repo == "Qwen/Qwen2.5-0.5B"
    assert loaded.spec.method == "lora" and loaded.spec.output.merged
    plan = make_plan(loaded, ())
    assert plan.chosen.est_cost + plan.delivery.cost < Decimal("0.10")
    assert loaded.dataset.rows is not None
    steps = loaded.dataset.rows * loaded.spec.training.epochs  # batch 1, no packing
    assert 20 <= steps <= 60  # a few dozen optimizer steps


def test_the_canary_runs_on_sim(rig: Rig) -> None:  # noqa: F811
    job_id = canary_for(rig, "sim")
    check_delivered(rig, rig.run(rig.cloud(), job_id))


def test_the_canary_runs_on_the_vast_emulator(rig: Rig, hosts: SimHostBackend) -> None:  # noqa: F811
    with VastEmulator(api_key=KEY, hosts=hosts) as emu:
        emu.add_offer(id=1, gpu_name="RTX 3090", gpu_ram=24576, dph_base=0.20, min_bid=0.07)
        job_id = canary_for(rig, "vastai")
        check_delivered(rig, drive(rig, {"vastai": hosts.serving(vast(emu))}, job_id))
        assert emu.instances == {}


def test_the_canary_runs_on_the_runpod_emulator(rig: Rig, hosts: SimHostBackend) -> None:  # noqa: F811
    with RunPodEmulator(api_key=KEY, gpus=json.loads(json.dumps(RUNPOD_GPUS)),
                        hosts=hosts) as emu:
        job_id = canary_for(rig, "runpod")
        check_delivered(rig, drive(rig, {"runpod": hosts.serving(runpod(emu))}, job_id))
        assert emu.pod_ids == []


@pytest.mark.parametrize("doc", ["docs/providers.md"])
def test_the_docs_tell_a_new_user_to_run_it_first(doc: str) -> None:
    text = (EXAMPLES.parent / doc).read_text()
    assert "orch submit examples/canary.yml" in text and "first" in text
    # The command shown runs as written (no key needed to plan).

    shown = orchfork.run(["plan", "examples/canary.yml"], cwd=EXAMPLES.parent, timeout=120)
    assert shown.returncode == 0 and "Delivery:" in shown.stdout, shown.stderr
