"""Memory savers: what each costs in memory, when "auto" turns it on, how it is rendered."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core import savers, scheduler, sizing
from orchestrator.core.architectures import lookup
from orchestrator.core.planning import make_plan
from orchestrator.core.sizing import GIB, Strategy, Workload, estimate
from orchestrator.core.spec import SpecError, load_job
from playbooks.axolotl import CCE_PLUGIN, LIGER_PLUGIN, ConfigError, TrainConfigInput, render
from providers import catalog

ROOT = Path(__file__).resolve().parent.parent
TOKENS = 6_000_000


def arch(repo: str):  # type: ignore[no-untyped-def]
    return lookup(repo).architecture


def cheapest(w: Workload, **kw: Any) -> scheduler.Placement:
    return scheduler.choose(w, TOKENS, catalog.load().offers, catalog.gpus(), **kw)[0]


def job_file(tmp_path: Path, training: str, resources: str = "spot: allowed") -> Path:
    (tmp_path / "t.jsonl").write_text('{"instruction": "a", "output": "b"}\n')
    path = tmp_path / "job.yml"
    path.write_text(f"""\
name: j
base_model: meta-llama/Llama-3.1-8B
method: qlora
training: {{{training}}}
dataset: {{path: t.jsonl, tokens: {TOKENS}}}
resources: {{{resources}}}
""")
    return path


# --- the loss ---------------------------------------------------------------------------

def test_loss_kernels_need_a_fraction_of_the_logits() -> None:
    w = Workload(arch("meta-llama/Llama-3.1-8B"), "qlora", sequence_len=2048,
                 micro_batch_size=2)
    plain = sizing.loss_bytes(w)
    assert plain == 4096 * 128256 * sizing.LOGITS_BYTES_PER_VALUE  # ~8.8 GiB
    cut = sizing.loss_bytes(replace(w, cross_entropy="cut"))
    liger = sizing.loss_bytes(replace(w, cross_entropy="liger"))
    # CCE: the embedding gradient (bf16) and one fp32 log-sum-exp per token.
    assert cut == 2 * 4096 * 4096 + 4 * 4096
    # Liger: grad_input, one chunk of bf16 logits (4096 tokens / ceil(128256/4096)=32 -> 128
    # rows), fp32 loss per token.
    assert liger == 2 * 4096 * 4096 + 2 * 128 * 128256 + 4 * 4096
    assert cut < liger < plain / 50


def test_estimate_names_the_loss_component_and_lists_savers() -> None:
    w = Workload(arch("meta-llama/Llama-3.1-8B"), "qlora", cross_entropy="cut")
    e = estimate(w)
    assert "cut_cross_entropy" in e.components and "logits" not in e.components
    assert e.savers == ("cut_cross_entropy", "gradient_checkpointing", "adamw_8bit")
    assert "liger_fused_ce" in estimate(replace(w, cross_entropy="liger")).components


def test_auto_settings_must_be_resolved_before_estimating() -> None:
    w = Workload(arch("meta-llama/Llama-3.2-1B"), "lora", cross_entropy="auto")
    with pytest.raises(ValueError, match="resolve"):
        estimate(w)


# --- optimizer state by strategy (acceptance: 3B full fine-tune) ------------------------

def test_single_gpu_full_finetune_is_8_bytes_per_param_plus_activations() -> None:
    a = arch("meta-llama/Llama-3.2-3B")
    w = Workload(a, "full", optimizer="adamw")
    e = estimate(w)
    c = e.components
    # bf16 weights 2 + bf16 grads 2 + AdamW moments in bf16 4: no fp32 master on one GPU.
    assert c["weights"] + c["gradients"] + c["optimizer"] == 8 * a.params
    assert e.peak_bytes == 8 * a.params + c["activations"] + c["logits"] + c["cuda_context"]
    # 8-bit AdamW: 6 bytes/param (axolotl docs: 8B full FT with paged_adamw_8bit, 48 GB).
    e8 = estimate(replace(w, optimizer="paged_adamw_8bit"))
    assert e8.components["weights"] + e8.components["gradients"] + \
        e8.components["optimizer"] == 6 * a.params
    # DDP: the same per GPU.
    ddp = estimate(w, 2, Strategy.DDP).components
    assert ddp["weights"] + ddp["gradients"] + ddp["optimizer"] == 8 * a.params


def test_zero3_on_8_gpus_is_16_bytes_per_param_over_8_plus_unsharded_parts() -> None:
    a = arch("meta-llama/Llama-3.2-3B")
    w = Workload(a, "full", optimizer="adamw")
    e = estimate(w, 8, Strategy.ZERO3)
    c = e.components
    sharded = c["weights"] + c["gradients"] + c["optimizer"]
    # bf16 weights 2 + bf16 grads 2 + fp32 master 4 + fp32 moments 8, divided by 8.
    assert sharded == pytest.approx(16 * a.params / 8, abs=3)
    unsharded = c["activations"] + c["logits"] + c["cuda_context"] + c["fsdp_buffers"] + \
        c["fsdp_root"] + c["comm_buffers"] + c["optimizer_step"]
    assert e.peak_bytes == sharded + unsharded
    assert c["activations"] == estimate(w).components["activations"]


# --- auto: a saver only where it reaches a cheaper placement ----------------------------

def test_acceptance_qlora_8b_auto_cross_entropy_is_cheaper_or_equal_and_says_why(
        tmp_path: Path) -> None:
    common = ("sequence_len: 2048, micro_batch_size: 2, optimizer: adamw_8bit, "
              "gradient_checkpointing: true")
    auto = make_plan(load_job(job_file(tmp_path, common + ", cross_entropy: auto")))
    plain = make_plan(load_job(job_file(tmp_path, common + ", cross_entropy: plain")))
    assert auto.estimate.savers[0] == "cut_cross_entropy"
    assert auto.chosen.est_cost <= plain.chosen.est_cost
    saved = plain.estimate.peak_bytes - auto.estimate.peak_bytes
    assert saved > 8.5 * GIB  # the plain loss's logits of 2 x 2048 tokens x 128,256
    data = auto.to_dict()
    assert "cut_cross_entropy" in data["estimate"]["components"]
    assert "cut_cross_entropy" in data["estimate"]["savers"]
    [ce] = [s for s in data["savers"] if s["setting"] == "training.cross_entropy"]
    assert ce["value"] == "cut" and ce["saved_bytes_per_gpu"] == saved
    assert data["savers_why"][0].startswith("cross-entropy cut: -8.8 GiB per GPU")


def test_cut_cross_entropy_reaches_a_cheaper_gpu() -> None:
    # LoRA 8B at 2 x 2048 tokens: with the logits it needs an 80 GB card; without, a 3090.
    w = Workload(arch("meta-llama/Llama-3.1-8B"), "lora", cross_entropy="plain")
    plain, auto = cheapest(w), cheapest(replace(w, cross_entropy="auto"))
    assert plain.offer.gpu == "A100 80GB" and auto.offer.gpu == "RTX 3090"
    assert auto.est_cost < plain.est_cost
    assert auto.estimate.workload is not None
    assert auto.estimate.workload.cross_entropy == "cut"


@pytest.mark.parametrize(("repo", "method", "seq", "mb"), [
    ("meta-llama/Llama-3.1-8B", "qlora", 2048, 2),
    ("meta-llama/Llama-3.1-8B", "full", 4096, 4),
    ("Qwen/Qwen2.5-14B", "lora", 4096, 1),
    ("meta-llama/Llama-3.2-3B", "full", 2048, 2),
    ("Qwen/Qwen2.5-32B", "full", 2048, 1),
])
def test_auto_is_the_cheapest_of_every_fixed_setting(repo: str, method: str, seq: int,
                                                      mb: int) -> None:
    w = Workload(arch(repo), method, sequence_len=seq, micro_batch_size=mb,  # type: ignore
                 optimizer="auto", gradient_checkpointing="auto", cross_entropy="auto",
                 activation_offloading="auto")
    got = cheapest(w)
    fixed = []
    for v in savers.variants(w):
        try:
            fixed.append(cheapest(v).est_cost)
        except scheduler.NoFit:
            continue
    assert got.est_cost == min(fixed)
    # ... and a saver with a time cost is on only when nothing without it is as cheap.
    chosen = got.estimate.workload
    assert chosen is not None
    if chosen.gradient_checkpointing is True:
        off = replace(w, gradient_checkpointing=False, activation_offloading=False)
        try:
            assert cheapest(off).est_cost > got.est_cost
        except scheduler.NoFit:
            pass


def test_checkpointing_costs_a_forward_pass_in_the_hours() -> None:
    w = Workload(arch("meta-llama/Llama-3.1-8B"), "lora", cross_entropy="cut",
                 gradient_checkpointing=False)
    assert savers.slowdown(replace(w, gradient_checkpointing=True)) == pytest.approx(6 / 4)
    on = replace(w, gradient_checkpointing=True, activation_offloading=True)
    assert savers.slowdown(on) == pytest.approx(6 / 4 * savers.ACTIVATION_OFFLOAD_SLOWDOWN)
    assert sizing.activation_bytes(on) < sizing.activation_bytes(
        replace(on, activation_offloading=False))


def test_fixed_settings_are_kept() -> None:
    w = Workload(arch("meta-llama/Llama-3.1-8B"), "qlora", cross_entropy="liger",
                 gradient_checkpointing=True, optimizer="paged_adamw_8bit")
    assert savers.variants(w) == (w,)
    assert cheapest(w).estimate.workload == w


# --- exact GPU counts ---------------------------------------------------------------------

def test_gpu_count_places_exactly_that_many(tmp_path: Path) -> None:
    plan = make_plan(load_job(job_file(tmp_path, "sequence_len: 2048", "gpu_count: 4")))
    counts = {p.offer.gpu_count for p in plan.ranking.placements}
    assert counts == {4}
    assert plan.ranking.rejected["GPU count is not resources.gpu_count"] > 0


def test_gpu_count_above_max_gpus_is_an_error(tmp_path: Path) -> None:
    path = job_file(tmp_path, "sequence_len: 2048", "gpu_count: 4, max_gpus: 2")
    with pytest.raises(SpecError) as info:
        load_job(path)
    assert info.value.problems == [
        f"{path}:6 resources: gpu_count 4 is above max_gpus 2; raise max_gpus or lower "
        "gpu_count"]


@pytest.mark.parametrize(("field", "value"), [("cross_entropy", "fused"),
                                              ("activation_offloading", "sometimes")])
def test_bad_saver_values_name_the_field(tmp_path: Path, field: str, value: str) -> None:
    path = job_file(tmp_path, f"{field}: {value}")
    with pytest.raises(SpecError) as info:
        load_job(path)
    assert f"training.{field}: must be" in info.value.problems[0]


# --- rendering: exactly the keys of real-hosts.md §3 ------------------------------------

def config(**kw: Any) -> dict[str, Any]:
    return render(TrainConfigInput(method="qlora", base_model_dir="/m", dataset_path="/d",
                                   dataset_format="alpaca", output_dir="/o", **kw))


SAVER_KEYS = {"plugins", "cut_cross_entropy", "liger_fused_linear_cross_entropy",
              "liger_cross_entropy", "chunked_cross_entropy", "activation_offloading"}


@pytest.mark.parametrize(("kw", "expected"), [
    ({}, {}),
    ({"cross_entropy": "cut"}, {"plugins": [CCE_PLUGIN], "cut_cross_entropy": True}),
    ({"cross_entropy": "liger"},
     {"plugins": [LIGER_PLUGIN], "liger_fused_linear_cross_entropy": True}),
    ({"activation_offloading": True}, {"activation_offloading": True}),
])
def test_rendered_saver_keys_are_exactly_these(kw: dict[str, Any],
                                               expected: dict[str, Any]) -> None:
    cfg = config(**kw)
    assert {k: v for k, v in cfg.items() if k in SAVER_KEYS} == expected
    assert CCE_PLUGIN == "axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin"
    assert LIGER_PLUGIN == "axolotl.integrations.liger.LigerPlugin"


def test_rendered_checkpointing_and_optimizer() -> None:
    cfg = config(gradient_checkpointing=False, optimizer="adamw")
    assert cfg["gradient_checkpointing"] is False and cfg["optimizer"] == "adamw_torch_fused"
    assert config(optimizer="paged_adamw_8bit")["optimizer"] == "paged_adamw_8bit"


def test_only_one_cross_entropy_kernel() -> None:
    with pytest.raises(ConfigError, match="one"):
        config(cross_entropy="cut", extra={"liger_fused_linear_cross_entropy": True})
    with pytest.raises(ConfigError, match="needs gradient checkpointing"):
        config(activation_offloading=True, gradient_checkpointing=False)
    # The user's own plugins join the saver's.
    cfg = config(cross_entropy="cut", extra={"plugins": ["my.Plugin"]})
    assert cfg["plugins"] == [CCE_PLUGIN, "my.Plugin"]


def test_plan_json_lists_savers(tmp_path: Path) -> None:
    plan = make_plan(load_job(job_file(tmp_path, "sequence_len: 2048")))
    data = json.loads(json.dumps(plan.to_dict(), default=str))
    assert {s["setting"] for s in data["savers"]} == {
        "training.cross_entropy", "training.optimizer", "training.gradient_checkpointing",
        "training.activation_offloading"}
    assert set(data["estimate"]["savers"]) <= set(sizing.LOSS_COMPONENT.values()) | {
        "gradient_checkpointing", "activation_offloading", "adamw_8bit", "paged_adamw_8bit"}


def test_the_engine_renders_the_planners_choice_for_the_gpu_it_got() -> None:
    w = Workload(arch("meta-llama/Llama-3.1-8B"), "lora", optimizer="auto",
                 gradient_checkpointing="auto", cross_entropy="auto",
                 activation_offloading="auto")
    p = cheapest(w)
    again = savers.fit(w, p.offer.gpu_count, p.offer.gpu_memory_bytes, p.offer.ram_bytes,
                       catalog.gpus()[p.offer.gpu])
    assert again is not None and again.workload == p.estimate.workload
    # A GPU without figures: the settings orch used before deciding them, plus CCE.
    fb = savers.fallback(w)
    assert (fb.cross_entropy, fb.optimizer, fb.gradient_checkpointing,
            fb.activation_offloading) == ("cut", "adamw_8bit", True, False)
    assert savers.fallback(replace(w, cross_entropy="plain")).cross_entropy == "plain"


@pytest.mark.parametrize("kw", [
    {"cross_entropy": "cut"},
    {"cross_entropy": "liger"},
    {"cross_entropy": "cut", "activation_offloading": True, "optimizer": "adamw_8bit"},
    {"cross_entropy": "liger", "gradient_checkpointing": False, "optimizer": "adamw"},
    {"activation_offloading": True, "optimizer": "paged_adamw_8bit"},
])
@pytest.mark.parametrize("strategy", ["single", "ddp", "zero3", "zero3_offload", "fsdp2",
                                      "fsdp2_offload"])
def test_saver_configs_fit_axolotls_schema(kw: dict[str, Any], strategy: str) -> None:
    from playbooks import axolotl_schema
    from playbooks.axolotl import DEEPSPEED

    if strategy.endswith("_offload") and "8bit" in str(kw.get("optimizer", "adamw_8bit")):
        kw = {**kw, "optimizer": "adamw"}  # 8-bit state is never offloaded (layout_problem)
    for method in ("qlora", "lora", "full"):
        cfg = render(TrainConfigInput(
            method=method, base_model_dir="/workspace/data/models/m/main",  # type: ignore[arg-type]
            dataset_path="/workspace/data/jobs/j/data/train.jsonl", dataset_format="alpaca",
            output_dir="/workspace/data/jobs/j/output", strategy=strategy,
            deepspeed_path="/workspace/data/jobs/j/deepspeed.json" if strategy in DEEPSPEED
            else "", **kw))
        assert axolotl_schema.problems(cfg) == [], (method, strategy, kw)
