"""`resources.max_cost` holds over the whole job, not only over the first plan's estimate.

The documented meaning (docs/job-file.md: "Most USD for the whole job"): a re-placement after
a preemption is judged against what is left of it, and a machine whose bill reaches it is
stopped and released, the job failed naming the budget and the bill (engine/budget.py).
On the simulated cloud's H100 PCIe on-demand ($1.811/h), a job planned at ~$0.004.
"""

from __future__ import annotations

import re
import shutil
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from test_engine import Rig, assert_nothing_left, rig, training_step, when

from orchestrator.core import money
from orchestrator.engine import budget
from orchestrator.engine.jobinputs import artifacts_dir
from orchestrator.engine.runner_core import checkpoint_dir
from orchestrator.records.store import utcnow

__all__ = ["rig"]

PRICE = Decimal("1.811")  # the sim's H100 PCIe on-demand $/h (providers/catalog/cloud.yaml)


def budget_job(r: Rig, max_cost: str) -> str:
    path = r.job_file()
    text = path.read_text().replace("eval:\n  eval_set: data/eval.jsonl\n", "")
    path.write_text(text.replace("  spot: allowed\n",
                                 f"  spot: never\n  max_cost: {max_cost}\n"))
    return r.queue(path)


def spent(r: Rig, job_id: str) -> Decimal:
    """What the job's machines have billed so far, as the engine counts it."""
    from orchestrator.engine.runner_core import instance_cost

    return sum((instance_cost(row)[0] for row in r.store.instances_of(job_id)), Decimal(0))


def billed_before(rig: Rig, job_id: str, seconds: int) -> None:
    """An earlier machine of the job: an H100 PCIe that ran `seconds`, then was lost."""
    row = rig.store.add_instance(job_id, provider="sim", offer_id="h100pcie-x1", gpu="H100 PCIe",
                                 gpu_count=1, billing="per_second", interruptible=False,
                                 price_per_hour=PRICE, attempt=0)
    with rig.store.transaction() as session:
        got = session.get(type(row), row.id)
        assert got is not None
        got.provider_instance_id, got.state, got.end_reason = "i-old", "terminated", "interrupted"
        got.terminated_at = utcnow()
        got.created_at = got.terminated_at - timedelta(seconds=seconds)


def test_a_machine_whose_bill_reaches_max_cost_is_stopped_and_the_job_fails(rig: Rig) -> None:
    # 200 steps of 0.2 s: ~$0.02 of training, five times the plan's estimate.
    cloud = rig.cloud(gpus=["H100 PCIe"],
                      host_options={"train_steps": 200, "train_step_seconds": 0.2})
    job_id = budget_job(rig, "0.006")
    job = rig.run(cloud, job_id)

    assert job.status == "failed"
    assert (job.failure_reason or "").startswith(
        "resources.max_cost $0.0060 reached: this job's machines have billed $0.00"), \
        job.failure_reason
    assert training_step(rig.store, job_id) < 200, "training ran to the end"
    # What it trained and orch had copied home is kept: the newest mirrored checkpoint,
    # moved into the job's artifacts directory, said in the reason and a `delivered` event.
    found = re.search(r"; its newest checkpoint \(step (\d+) of 200\) is kept in (\S+) "
                      r"\(`orch submit JOB_FILE --resume-from (j-[0-9a-f]+)` with a higher "
                      r"max_cost continues from it\)$", job.failure_reason or "")
    assert found, job.failure_reason
    step, kept = int(found[1]), Path(found[2])
    assert kept == artifacts_dir(job_id) / f"checkpoint-{step}" and found[3] == job_id
    assert (kept / "adapter_model.safetensors").is_file()
    assert (kept / "trainer_state.json").is_file()
    assert not any(checkpoint_dir(job_id).glob("checkpoint-*"))  # moved, not copied
    (delivered,) = [e for e in rig.store.events(job_id) if e.kind == "delivered"]
    assert delivered.data().places[0].location == str(kept)
    (row,) = rig.store.instances_of(job_id)
    assert row.end_reason == "failed" and row.terminated_at is not None
    billed = money.from_micros(job.cost_micros)
    assert billed >= Decimal("0.006")
    # Read every budget.EVERY_S: past the budget by those seconds and the release, not more.
    assert billed < Decimal("0.006") + PRICE * Decimal(budget.EVERY_S + 10) / 3600
    assert_nothing_left(rig, cloud, job_id)


def test_a_re_placement_is_allowed_and_the_cap_holds_the_whole_bill(rig: Rig) -> None:
    """Planned on one H100 PCIe (~$0.0040) under max_cost $0.010 and preempted once it has
    billed $0.0022: the job is placed again (two H100 PCIe, ~$0.0080: the one-GPU offer was
    tried; the work up to the last checkpoint is not paid again, so what is left is not
    judged against the whole job's estimate), and the cap stops the second machine when
    the two together have billed $0.010 (without it, the job ran to the end at ~$0.05)."""
    cloud = rig.cloud(gpus=["H100 PCIe"],
                      host_options={"train_steps": 200, "train_step_seconds": 0.2})
    job_id = budget_job(rig, "0.010")
    preempted: list[Decimal] = []

    def preempt() -> None:
        (row,) = rig.store.instances_of(job_id)
        assert row.provider_instance_id
        preempted.append(spent(rig, job_id))
        cloud.preempt(row.provider_instance_id)

    when(lambda: bool(rig.store.instances_of(job_id))
         and spent(rig, job_id) >= Decimal("0.0022"), preempt)
    job = rig.run(cloud, job_id)

    assert preempted and preempted[0] < Decimal("0.010")
    assert job.status == "failed"
    assert (job.failure_reason or "").startswith(
        "resources.max_cost $0.0100 reached: this job's machines have billed"), \
        job.failure_reason
    first, second = rig.store.instances_of(job_id)
    assert (first.gpu_count, first.end_reason) == (1, "interrupted")
    assert (second.gpu_count, second.end_reason) == (2, "failed")
    billed = money.from_micros(job.cost_micros)
    assert Decimal("0.010") <= billed < Decimal("0.010") + 2 * PRICE * Decimal(
        budget.EVERY_S + 10) / 3600
    assert_nothing_left(rig, cloud, job_id)


def test_nothing_is_rented_for_a_job_whose_bill_has_reached_max_cost(rig: Rig) -> None:
    """A job resumed (a worker's takeover, a requeue) after its machines billed the budget:
    refused before renting, naming the budget and the bill."""
    cloud = rig.cloud(gpus=["H100 PCIe"])
    job_id = budget_job(rig, "0.006")
    billed_before(rig, job_id, 20)  # $0.0101
    job = rig.run(cloud, job_id)

    assert job.status == "failed"
    assert job.failure_reason == (
        "resources.max_cost $0.0060 is spent: this job's machines have billed $0.0101, "
        "nothing is left to place it again; raise resources.max_cost and submit it again; "
        "nothing delivered: no checkpoint had been copied off the machine (orch copies those "
        "up to 2 GiB, LoRA and QLoRA adapters, as training saves them)")
    assert [r.provider_instance_id for r in rig.store.instances_of(job_id)] == ["i-old"]
    assert cloud.list() == []


def test_a_cap_reached_once_the_model_is_home_keeps_the_model_not_an_older_checkpoint(
        rig: Rig) -> None:
    """Stopped in evaluation (billed too: here a vLLM that takes 90 s to load), after an
    earlier machine of the job had billed 80 s ($0.0402 of the $0.06 cap, the plan's
    estimate $0.054): the trained model was copied home and delivered before; the reason
    says so, no older checkpoint lands beside it, and its `delivered` event (what `orch show`
    lists) stays the last one."""
    cloud = rig.cloud(gpus=["H100 PCIe"], host_options={
        "train_steps": 10, "train_step_seconds": 0.1, "vllm_startup_seconds": 90})
    path = rig.job_file()  # with its eval set
    path.write_text(path.read_text().replace("  spot: allowed\n",
                                             "  spot: never\n  max_cost: 0.06\n"))
    job_id = rig.queue(path)
    billed_before(rig, job_id, 80)
    job = rig.run(cloud, job_id)

    assert job.status == "failed" and job.phase_done == "artifacts", job.failure_reason
    assert (job.failure_reason or "").endswith(
        f"; the trained model had been copied home: it is kept in {artifacts_dir(job_id)}")
    assert not any(artifacts_dir(job_id).glob("checkpoint-*"))
    delivered = [e for e in rig.store.events(job_id) if e.kind == "delivered"]
    assert [p.what for p in delivered[-1].data().places] == ["adapter"]
    assert_nothing_left(rig, cloud, job_id)


def test_a_checkpoint_that_cannot_be_moved_is_left_in_the_mirror(
        rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    cloud = rig.cloud(gpus=["H100 PCIe"],
                      host_options={"train_steps": 200, "train_step_seconds": 0.2})
    job_id = budget_job(rig, "0.006")

    def refused(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(shutil, "move", refused)
    job = rig.run(cloud, job_id)

    assert job.status == "failed"
    found = re.search(r"; keeping checkpoint-(\d+) in \S+ failed \(\[Errno 13\] Permission "
                      r"denied\): it is left in (\S+)$", job.failure_reason or "")
    assert found, job.failure_reason
    assert Path(found[2]) == checkpoint_dir(job_id) / f"checkpoint-{found[1]}"
    assert (Path(found[2]) / "trainer_state.json").is_file()
    assert not any(artifacts_dir(job_id).glob("checkpoint-*"))
    assert not [e for e in rig.store.events(job_id) if e.kind == "delivered"]
