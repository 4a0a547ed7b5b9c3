"""Evaluation sized and placed like training: vLLM's memory per GPU, placement, plan JSON."""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import replace
from decimal import Decimal
from pathlib import Path

import pytest
from test_cli import env, orch  # noqa: F401 - the fixture and the CLI runner

from orchestrator.core import evalsizing, money, offerbook, scheduler
from orchestrator.core.architectures import lookup
from orchestrator.core.evalsizing import EvalWork, fit, place, serve_estimate
from orchestrator.core.sizing import GIB, Workload
from providers import catalog
from providers.base import Billing, Offer

GPUS = catalog.gpus()
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
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


def test_the_evaluation_is_placed_on_the_training_machine_or_nowhere() -> None:
    # The engine evaluates on the training machine: the plan never prices a serving rental
    # it would not rent (issue 19).
    trains = offer("A100 80GB", 1, "1.50")
    same = place(work(), trains, GPUS["A100 80GB"])
    assert same is not None and same.placement == "same" and same.offer is trains
    assert same.cost == money.metered_cost(Decimal("1.50"), same.hours, Billing.PER_SECOND)
    small = offer("L40S-like", 1, "0.90", 46)  # the 4-bit 70B + KV cache needs ~50 GiB
    assert place(work(), small, None) is None


def test_the_ranking_keeps_machines_that_serve_the_model_and_prices_the_evaluation() -> None:
    # A LoRA 8B with full multi-head attention (32 KV heads) at 16k tokens: one 80 GB GPU
    # trains it, but vLLM's KV cache for 8 such sequences (~69 GB) and the bf16 merged model
    # need two. The old plan chose the single GPU (the engine would then fail evaluating on
    # it) and priced a separate serving rental orch never rents.
    arch = replace(lookup("meta-llama/Llama-3.1-8B").architecture, num_key_value_heads=32)
    w = Workload(arch=arch, method="lora", sequence_len=16384, micro_batch_size=1)
    ev = EvalWork(arch, "lora", 16384, 100, lora_params=arch.lora_params(16, ("q_proj",)))
    one, two = offer("A100 80GB", 1, "1.20", oid="one"), offer("A100 80GB", 2, "2.40", oid="two")
    alone = scheduler.rank(w, 10**6, [one, two], GPUS)
    assert alone.chosen is not None and alone.chosen.offer is one  # training alone fits one
    ranked = scheduler.rank(w, 10**6, [one, two], GPUS, evaluation=ev)
    assert [p.offer for p in ranked.placements] == [two]
    assert ranked.rejected == {scheduler.NO_EVAL_MEMORY: 1}
    chosen = ranked.placements[0]
    served = evalsizing.on_machine(ev, two, GPUS["A100 80GB"])
    assert served is not None and served[0].tensor_parallel == 2
    assert chosen.duration.evaluation == served[1] > 0  # counted once, in the placement
    assert chosen.est_hours == pytest.approx(alone.placements[1].est_hours + served[1])
    # The engine's retry list (the offer book) makes the same decision.
    book = offerbook.OfferBook.of([one, two])
    assert [p.offer for p in offerbook.top(w, 10**6, book, GPUS, 3, evaluation=ev)] == [two]
    with pytest.raises(scheduler.NoFit, match="cannot serve the trained model"):
        scheduler.choose(w, 10**6, [one], GPUS, evaluation=ev)


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
    # Tasks without an eval set run against the same installed vLLM.
    only_tasks = replace(work(rows=0), tasks=1)
    assert evalsizing.eval_hours(only_tasks, est, GPUS["A100 80GB"], rental=True) == (
        pytest.approx(evalsizing.eval_hours(only_tasks, est, GPUS["A100 80GB"])
                      + evalsizing.VLLM_INSTALL_S / 3600))
    trains = offer("A100 80GB", 1, "1.50")
    docker = place(work(rows=10), trains, GPUS["A100 80GB"])
    container = place(replace(work(rows=10), rentals=frozenset({"cloud"})), trains,
                      GPUS["A100 80GB"])
    assert docker is not None and container is not None
    assert container.hours == pytest.approx(docker.hours + evalsizing.VLLM_INSTALL_S / 3600)


def test_plan_json_of_qlora_70b_has_an_evaluation_that_fits_its_gpu(
        env: dict[str, str]) -> None:  # noqa: F811 - the fixture
    out = json.loads(orch(env, "plan", "examples/qlora-70b.yml", "--json").stdout)
    ev = out["evaluation"]
    assert set(ev) >= {"gpu", "gpu_count", "memory_per_gpu_bytes", "hours", "cost",
                       "placement"}
    assert ev["placement"] == "same" and ev["gpu"] == out["placement"]["gpu"]
    # Counted once: the evaluation's hours are the placement's evaluation term (issue 19).
    pl = out["placement"]
    assert pl["est_evaluation_hours"] == ev["hours"]
    assert pl["est_hours"] == pytest.approx(pl["est_training_hours"] + pl["est_overhead_hours"],
                                            abs=1e-3)
    assert ev["memory_per_gpu_bytes"] <= ev["gpu_memory_bytes"]
    assert ev["served"] == "adapter" and ev["gpu_count"] == 1
    assert Decimal(ev["cost"]) > 0 and ev["hours"] > 0
    text = orch(env, "plan", "examples/qlora-70b.yml").stdout
    assert "Evaluation (vLLM, same machine): on the training machine, the 4-bit base with " \
           "the LoRA adapter" in text.replace("\n", " ").replace("  ", " ")


def test_tasks_size_the_served_context_and_its_kv_cache(
        env: dict[str, str], tmp_path: Path) -> None:  # noqa: F811 - the fixture
    # lm-eval's API models send up to 2048 tokens whatever the training sequence_len: vLLM
    # serves that context when eval.tasks run, and the plan counts its KV cache.
    shutil.copytree(EXAMPLES / "data", tmp_path / "data")
    text = (EXAMPLES / "qlora-8b.yml").read_text().replace("sequence_len: 2048",
                                                           "sequence_len: 512")
    (tmp_path / "eval-set.yml").write_text(text)
    (tmp_path / "tasks.yml").write_text(text.replace(
        "  eval_set: data/eval.jsonl\n", "  eval_set: data/eval.jsonl\n  tasks: [gsm8k]\n"))
    plans = {name: json.loads(orch(env, "plan", str(tmp_path / f"{name}.yml"),
                                   "--json").stdout)["evaluation"]
             for name in ("eval-set", "tasks")}
    assert plans["eval-set"]["max_model_len"] == 512  # the eval set: the training context
    ev = plans["tasks"]
    assert ev["max_model_len"] == 2048
    arch = lookup("meta-llama/Llama-3.1-8B").architecture
    assert ev["components"]["kv_cache"] == math.ceil(
        evalsizing.kv_cache_bytes(arch, 2048 * ev["max_num_seqs"]) / ev["tensor_parallel_size"])
    assert ev["components"]["kv_cache"] == 4 * plans["eval-set"]["components"]["kv_cache"]
