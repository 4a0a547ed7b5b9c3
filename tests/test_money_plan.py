"""What a job costs counts everything the host bills (issue 36 §4): the plan's whole-job cost,
the budget check (`resources.max_cost`, at plan time and when the engine places the job) and
the bill (`orch show`) count the same things: the machine from boot through the model
download, training, merge, evaluation and the delivery of the results.

`orch plan` runs as a real process on the price catalogs; the engine runs a real job on the
simulated cloud (real sshd hosts, real SQLite).
"""

from __future__ import annotations

import json
import os
import shutil
from decimal import Decimal
from pathlib import Path

import orchfork
from test_engine import Rig, rig  # noqa: F401  (the engine test rig fixture)

from orchestrator.core import money
from orchestrator.core.planning import make_plan
from orchestrator.core.spec import load_job
from orchestrator.engine.submission import record_job
from providers.base import Billing, Offer

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

# A 70B full fine-tune: its weights (141 GB in bf16) come back to this machine.
FULL_70B = """\
name: llama31-70b-full
base_model: meta-llama/Llama-3.1-70B
method: full
training:
  sequence_len: 2048
  micro_batch_size: 1
  gradient_accumulation_steps: 16
  learning_rate: 1.0e-5
  optimizer: adamw_8bit
dataset:
  path: data/train.jsonl
  tokens: 2000000
resources:
  max_gpus: 8
"""


def _folder(tmp_path: Path, text: str) -> Path:
    shutil.copytree(EXAMPLES / "data", tmp_path / "data")
    path = tmp_path / "job.yml"
    path.write_text(text)
    return path


def _orch(tmp_path: Path, *args: str) -> tuple[int, str, str]:
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path / "home")}
    done = orchfork.run(list(args), env=env, cwd=tmp_path, timeout=120)
    return done.returncode, done.stdout, done.stderr


def test_the_plan_of_a_70b_full_fine_tune_counts_its_delivery(tmp_path: Path) -> None:
    path = _folder(tmp_path, FULL_70B)
    code, out, err = _orch(tmp_path, "plan", "--json", str(path))
    assert code == 0, err
    plan = json.loads(out)
    p, delivery = plan["placement"], plan["delivery"]
    # 141 GB copied here at the assumed 12.5 MB/s: ~3.1 h of the host's time.
    assert delivery["local_bytes"] > 140 * 10**9 and delivery["hours"] > 3
    assert p["est_delivery_hours"] == delivery["hours"]
    assert p["est_hours"] > p["est_training_hours"] + delivery["hours"]
    # The whole bill of the machine: every hour it runs, the delivery's included.
    whole = money.job_cost(_offer(p), Decimal(str(p["est_hours"])))
    assert Decimal(p["est_cost"]) == whole
    assert Decimal(p["est_cost"]) > Decimal(delivery["cost"]) > Decimal(5)
    # The cheaper route is named, and why orch does not take it by itself.
    assert delivery["cheaper"].startswith("Cheaper: output.push_to_hub: ORG/NAME with "
                                          "output.local: false")
    code, text, _ = _orch(tmp_path, "plan", str(path))
    assert "delivery 3.14 h" in text and "(in the cost)" in text
    cost_line = next(line for line in text.splitlines() if line.startswith("Cost: "))
    assert cost_line.startswith(f"Cost: {money.usd(Decimal(p['est_cost']))} for ")


def test_a_budget_below_the_whole_cost_is_refused_with_the_breakdown(tmp_path: Path) -> None:
    # $2 would pay the training (the plan said $0.95 before delivery counted), not the copy.
    path = _folder(tmp_path, FULL_70B.replace("max_gpus: 8", "max_gpus: 8\n  max_cost: 2"))
    code, out, err = _orch(tmp_path, "plan", str(path))
    assert code == 3, out
    assert "no placement fits resources.max_cost: the cheapest that fits costs $6.8" in err
    assert "> max_cost $2 (cloud: 3.64 h of A100 80GB x8 at $1.87/h (boot 5 min, " in err
    assert "training 16 min, delivery 3.14 h))" in err
    assert "Cheaper: output.push_to_hub: ORG/NAME with output.local: false" in err


def _offer(p: dict[str, object]) -> Offer:
    return Offer(provider=str(p["provider"]), offer_id=str(p["offer_id"]), gpu=str(p["gpu"]),
                 gpu_count=int(str(p["gpu_count"])), gpu_memory_bytes=0,
                 billing=Billing(str(p["billing"])), interruptible=bool(p["interruptible"]),
                 price_per_hour=Decimal(str(p["price_per_hour"])))


def test_plan_budget_check_and_bill_count_the_same_things(rig: Rig) -> None:  # noqa: F811
    """A sim job: the plan prices the machine for every phase; the engine's placement (the
    budget check while running) prices it the same; the bill counts the same thing, at the
    rate the plan used. (`sim` keeps no volume, like Vast.ai and RunPod: nothing else.)"""
    cloud = rig.cloud()
    path = rig.job_file()
    loaded = load_job(path)
    plan = make_plan(loaded, [], listed=cloud.price_list())
    chosen = plan.chosen
    hours = Decimal(str(chosen.est_hours))
    assert chosen.duration.delivery > 0
    assert chosen.est_cost == money.job_cost(chosen.offer, hours)

    job_id = rig.queue(path)
    job = rig.run(cloud, job_id)
    assert job.status == "succeeded", job.failure_reason
    # The engine ranked the live offers with the plan's prices: the same whole-job cost.
    placed = [json.loads(e.data_json or "{}")["placement"] for e in rig.store.events(job_id)
              if e.kind == "state" and "placement" in json.loads(e.data_json or "{}")
              and json.loads(e.data_json or "{}").get("status") == "provisioning"][-1]
    assert Decimal(placed["est_cost"]) == chosen.est_cost
    # The bill: the machine from create to terminate (the delivery happened in it).
    (row,) = rig.store.instances_of(job_id)
    assert row.terminated_at is not None
    delivered = [e.at for e in rig.store.events(job_id) if e.kind == "delivered"]
    assert delivered and row.created_at < delivered[0] <= row.terminated_at
    billed = money.hours_between(row.created_at, row.terminated_at)
    assert money.dollars(row.cost_micros) == money.metered_cost(
        chosen.offer.price_per_hour or Decimal(0), billed, Billing.PER_SECOND)
    assert job.cost_micros == row.cost_micros and job.storage_micros == 0
    shown = json.loads(orchfork.run(["show", "--json", job_id], timeout=120).stdout)
    assert Decimal(shown["cost"]) == money.dollars(job.cost_micros)


def test_the_engine_refuses_a_budget_the_whole_cost_exceeds(rig: Rig) -> None:  # noqa: F811
    """resources.max_cost between the machine's training-and-eval hours and the whole bill
    (the delivery too): the engine's placement refuses it, as `orch plan` does."""
    cloud = rig.cloud()
    path = rig.job_file()
    plan = make_plan(load_job(path), [], listed=cloud.price_list())
    whole = plan.chosen
    partial = money.job_cost(whole.offer, Decimal(str(whole.est_hours - plan.delivery.hours)))
    assert partial < whole.est_cost
    budget = money.money((partial + whole.est_cost) / 2)
    path.write_text(path.read_text() + f"  max_cost: {budget}\n")
    loaded = load_job(path)
    # Queued with the plan of the same job without the budget (a market that moved).
    lenient = load_job(rig.job_file())
    job, _ = record_job(rig.store, loaded, plan=make_plan(lenient, [],
                                                          listed=cloud.price_list()))
    done = rig.run(cloud, job.id)
    assert done.status == "failed"
    assert done.failure_reason is not None
    assert done.failure_reason.startswith("no placement fits resources.max_cost: the cheapest "
                                          f"that fits costs {money.usd(whole.est_cost)}")
    assert rig.store.instances_of(job.id) == [] and cloud.list() == []
