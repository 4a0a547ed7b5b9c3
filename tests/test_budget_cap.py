"""`resources.max_cost` holds over the whole job, not only over the first plan's estimate.

The documented meaning (docs/job-file.md: "Most USD for the whole job"): a re-placement after
a preemption is judged against what is left of it, and a machine whose bill reaches it is
stopped and released, the job failed naming the budget and the bill (engine/budget.py).
On the simulated cloud's H100 PCIe on-demand ($1.811/h), a job planned at ~$0.004.
"""

from __future__ import annotations

from decimal import Decimal

from test_engine import Rig, assert_nothing_left, rig, training_step, when

from orchestrator.core import money
from orchestrator.engine import budget

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
    assert "nothing delivered" in (job.failure_reason or "")
    assert training_step(rig.store, job_id) < 200, "training ran to the end"
    (row,) = rig.store.instances_of(job_id)
    assert row.end_reason == "failed" and row.terminated_at is not None
    billed = money.from_micros(job.cost_micros)
    assert billed >= Decimal("0.006")
    # Read every budget.EVERY_S: past the budget by those seconds and the release, not more.
    assert billed < Decimal("0.006") + PRICE * Decimal(budget.EVERY_S + 10) / 3600
    assert_nothing_left(rig, cloud, job_id)


def test_a_re_placement_is_judged_against_what_is_left_of_max_cost(rig: Rig) -> None:
    """Planned on one H100 PCIe (~$0.0040) under max_cost $0.010, preempted once it has
    billed over $0.002: the next placement, two H100 PCIe (~$0.0080; the one-GPU offer was
    tried), fits the budget but not what is left of it, so the job fails naming both
    instead of spending past it."""
    cloud = rig.cloud(gpus=["H100 PCIe"],
                      host_options={"train_steps": 200, "train_step_seconds": 0.2})
    job_id = budget_job(rig, "0.010")
    preempted: list[Decimal] = []

    def past_a_fifth() -> bool:
        return training_step(rig.store, job_id) >= 1 and spent(rig, job_id) >= Decimal("0.0022")

    def preempt() -> None:
        (row,) = rig.store.instances_of(job_id)
        assert row.provider_instance_id
        preempted.append(spent(rig, job_id))
        cloud.preempt(row.provider_instance_id)

    when(past_a_fifth, preempt)
    job = rig.run(cloud, job_id)

    assert preempted, "the job ended before it could be preempted"
    assert job.status == "failed"
    reason = job.failure_reason or ""
    assert " of resources.max_cost $0.01" in reason and "is spent on this job's earlier " \
        "machines" in reason, reason
    assert "is left: no placement left to try within it" in reason, reason
    (row,) = rig.store.instances_of(job_id)  # nothing rented again
    assert row.gpu_count == 1 and row.end_reason == "interrupted"
    assert_nothing_left(rig, cloud, job_id)
