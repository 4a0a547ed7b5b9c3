"""Evaluation sized and placed like training: vLLM's memory per GPU, placement, plan JSON."""

from __future__ import annotations

import json
from dataclasses import replace
from decimal import Decimal

import pytest
from test_cli import env, orch  # noqa: F401 - the fixture and the CLI runner

from orchestrator.core import evalsizing, money
from orchestrator.core.architectures import lookup
from orchestrator.core.evalsizing import EvalWork, fit, place, serve_estimate
from orchestrator.core.sizing import GIB
from providers import catalog
from providers.base import Billing, Offer

GPUS = catalog.gpus()
L70 = lookup("meta-llama/Llama-3.1-70B").architecture


def offer(gpu: str, count: int, price: str, memory_gib: float = 80, oid: str = "o") -> Offer:
    return Offer("cloud", f"{oid}-{gpu}-{count}", gpu, count, int(memory_gib * GIB),
                 Billing.PER_SECOND, False, Decimal(price))


def work(method: str = "qlora", rows: int = 200) -> EvalWork:
    return EvalWork(L70, method, 2048, rows, lora_params=L70.lora_params(16, (
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")))


def test_the_merged_70b_does_not_fit_one_80gb_gpu_the_4bit_base_with_adapter_does() -> None:
    merged = serve_estimate(work(), "merged", 1)
    assert merged.components["weights"] == L70.params * 2  # ~141 GB of bf16
    assert not merged.fits(80 * GIB)
    got = fit(work(), 1, 80 * GIB)
    assert got is not None and (got.served, got.tensor_parallel) == ("adapter", 1)
    assert got.required_bytes <= 80 * GIB
    # KV cache: K and V, 80 layers, 8 KV heads x 128, bf16, 2048 tokens x 8 requests.
    assert got.components["kv_cache"] == 2 * 80 * 1024 * 2 * 2048 * 8
    assert got.required_bytes == pytest.approx(got.peak_bytes / 0.9, abs=1)


def test_a_lora_70b_is_served_merged_with_tensor_parallelism() -> None:
    # ~141 GB of bf16 over two 80 GB GPUs (as vLLM serves a 70B on 2 x H100), not one; on
    # 48 GB cards it takes four.
    got = fit(work("lora"), 4, 80 * GIB)
    assert got is not None and got.served == "merged" and got.tensor_parallel == 2
    assert got.components["weights"] == L70.params  # halved by tensor parallelism
    assert fit(work("lora"), 1, 80 * GIB) is None  # only the merged model: no 4-bit path
    four = fit(work("lora"), 8, 48 * GIB)
    assert four is not None and four.tensor_parallel == 4


def test_tensor_parallel_sizes_divide_the_heads() -> None:
    odd = replace(L70, num_attention_heads=40, num_key_value_heads=8)
    assert evalsizing.tensor_parallel_sizes(odd, 8) == (1, 2, 4, 8)
    assert evalsizing.tensor_parallel_sizes(replace(L70, num_attention_heads=28), 8) == (1, 2, 4)


def test_on_the_training_machine_when_it_fits_else_the_cheapest_serving_rental() -> None:
    trains = offer("A100 80GB", 1, "1.50")
    same = place(work(), trains, [offer("RTX 4090", 1, "0.40", 24)], GPUS)
    assert same is not None and same.placement == "same" and same.offer is trains
    assert same.cost == money.metered_cost(Decimal("1.50"), same.hours, Billing.PER_SECOND)
    small = offer("L40S-like", 1, "0.90", 46)  # the 4-bit 70B + KV cache needs ~50 GiB
    offers = [offer("A100 80GB", 1, "1.50", oid="a"), offer("A100 80GB", 1, "1.20", oid="b"),
              offer("A100 80GB", 2, "2.00", oid="c")]
    sep = place(work(), small, offers, GPUS)
    assert sep is not None and sep.placement == "separate"
    assert sep.offer.offer_id.startswith("b-") and sep.estimate.tensor_parallel == 1
    assert "does not rent one yet" in sep.why
    assert place(work(), small, [], GPUS) is None


def test_hours_grow_with_rows_and_tasks() -> None:
    est = fit(work(), 1, 80 * GIB)
    assert est is not None
    few = evalsizing.eval_hours(work(rows=10), est, GPUS["A100 80GB"])
    many = evalsizing.eval_hours(work(rows=10_000), est, GPUS["A100 80GB"])
    tasks = evalsizing.eval_hours(replace(work(rows=10), tasks=2), est, GPUS["A100 80GB"])
    assert 0 < few < many and tasks == pytest.approx(few + 2 * evalsizing.LM_EVAL_TASK_HOURS)
    # A container rental installs vLLM first (docs/playbooks.md: 1-3 min).
    rental = evalsizing.eval_hours(work(rows=10), est, GPUS["A100 80GB"], rental=True)
    assert rental == pytest.approx(few + evalsizing.VLLM_INSTALL_S / 3600)
    trains = offer("A100 80GB", 1, "1.50")
    docker = place(work(rows=10), trains, [], GPUS)
    container = place(work(rows=10), trains, [], GPUS, lambda o: o is trains)
    assert docker is not None and container is not None
    assert container.hours == pytest.approx(docker.hours + evalsizing.VLLM_INSTALL_S / 3600)


def test_plan_json_of_qlora_70b_has_an_evaluation_that_fits_its_gpu(
        env: dict[str, str]) -> None:  # noqa: F811 - the fixture
    out = json.loads(orch(env, "plan", "examples/qlora-70b.yml", "--json").stdout)
    ev = out["evaluation"]
    assert set(ev) >= {"gpu", "gpu_count", "memory_per_gpu_bytes", "hours", "cost",
                       "placement"}
    assert ev["placement"] == "same" and ev["gpu"] == out["placement"]["gpu"]
    assert ev["memory_per_gpu_bytes"] <= ev["gpu_memory_bytes"]
    assert ev["served"] == "adapter" and ev["gpu_count"] == 1
    assert Decimal(ev["cost"]) > 0 and ev["hours"] > 0
    text = orch(env, "plan", "examples/qlora-70b.yml").stdout
    assert "Evaluation (vLLM, same machine): on the training machine, the 4-bit base with " \
           "the LoRA adapter" in text.replace("\n", " ").replace("  ", " ")
