"""Sizing: parameter arithmetic, calibration against published points, property checks."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.core import sizing
from orchestrator.core.architectures import (
    ArchitectureError,
    from_config_json,
    known_models,
    lookup,
)
from orchestrator.core.sizing import GIB, Strategy, Workload, estimate


def arch(repo: str):  # type: ignore[no-untyped-def]
    return lookup(repo).architecture


@pytest.mark.parametrize("repo", sorted({m.repo for m in known_models().values()}))
def test_parameter_totals_match_published(repo: str) -> None:
    m = lookup(repo)
    assert m.architecture.params == m.published_params


# Published "what fits" points for QLoRA (seed-facts.md), in GiB with headroom, at the
# calibration condition documented in docs/sizing.md: sequence_len 1024, micro-batch 1,
# r=16 all-linear, 8-bit AdamW, gradient checkpointing, 20 % headroom.
PUBLISHED_QLORA = {
    "meta-llama/Llama-3.1-8B": 11,
    "Qwen/Qwen2.5-14B": 17,
    "Qwen/Qwen2.5-32B": 26,
    "meta-llama/Llama-3.1-70B": 48,
}


@pytest.mark.parametrize(("repo", "published"), PUBLISHED_QLORA.items())
def test_qlora_calibration_points(repo: str, published: float) -> None:
    w = Workload(arch(repo), "qlora", sequence_len=1024, micro_batch_size=1)
    got = estimate(w).required_bytes / GIB
    assert got == pytest.approx(published, rel=0.10), f"{repo}: {got:.1f} GiB"


def test_qlora_70b_weights_about_40gb() -> None:
    w = Workload(arch("meta-llama/Llama-3.1-70B"), "qlora")
    assert 36e9 <= sizing.weight_bytes(w) <= 41e9


@pytest.mark.parametrize(("repo", "low", "high"), [
    ("Qwen/Qwen2.5-32B", 510e9, 640e9),
    ("meta-llama/Llama-3.1-70B", 1.1e12, 1.4e12),
])
def test_full_finetune_training_state(repo: str, low: float, high: float) -> None:
    # The seed's totals are mixed-precision (fp32 master) state: DeepSpeed ZeRO, summed
    # over the 8 GPUs it is sharded on.
    e = estimate(Workload(arch(repo), "full", optimizer="adamw"), 8, Strategy.ZERO3)
    state = e.components["weights"] + e.components["gradients"] + e.components["optimizer"]
    assert low <= state * 8 <= high


def test_8bit_optimizer_saves_six_bytes_per_param_under_zero_two_on_one_gpu() -> None:
    a = arch("meta-llama/Llama-3.1-8B")

    def optimizer(opt: str, *layout: object) -> int:
        w = Workload(a, "full", optimizer=opt)  # type: ignore[arg-type]
        return estimate(w, *layout).components["optimizer"]  # type: ignore[arg-type]

    # ZeRO: fp32 moments (8) -> 8-bit (2). One GPU, bf16 params: bf16 moments (4) -> 2.
    assert optimizer("adamw", 8, Strategy.ZERO3) - optimizer("adamw_8bit", 8, Strategy.ZERO3) \
        == pytest.approx(6 * a.params / 8, abs=1)
    assert optimizer("adamw") - optimizer("adamw_8bit") == 2 * a.params


def test_lora_adapter_params() -> None:
    a = arch("meta-llama/Llama-3.1-8B")
    # r·(d_in+d_out) summed over q,k,v,o,gate,up,down, times 32 layers.
    assert a.lora_params(16, sizing.LINEAR_MODULES) == 41_943_040
    assert a.lora_params(16, ("q_proj",)) == 32 * 16 * (4096 + 4096)


def test_lora_keeps_bf16_base() -> None:
    a = arch("Qwen/Qwen2.5-14B")
    e = estimate(Workload(a, "lora"))
    assert e.components["weights"] == a.params * 2


def test_gradient_checkpointing_cuts_activations() -> None:
    a = arch("meta-llama/Llama-3.1-8B")
    on = sizing.activation_bytes(Workload(a, "lora", gradient_checkpointing=True))
    off = sizing.activation_bytes(Workload(a, "lora", gradient_checkpointing=False))
    assert off > 10 * on


def test_logits_term_is_large_for_big_vocabularies() -> None:
    w = Workload(arch("Qwen/Qwen2.5-7B"), "qlora", sequence_len=4096, micro_batch_size=1)
    # Four fp32 copies and the bf16 logits: 18 bytes per logit (docs/sizing.md, "Loss").
    assert sizing.logits_bytes(w) == 4096 * 152064 * sizing.LOGITS_BYTES_PER_VALUE == \
        4096 * 152064 * (4 * 4 + 2)
    assert sizing.logits_bytes(w) > 10 * GIB


def test_sharding_divides_state_but_not_activations() -> None:
    w = Workload(arch("Qwen/Qwen2.5-32B"), "full", optimizer="adamw")
    one = estimate(w, 1, Strategy.ZERO3_OFFLOAD)  # one GPU under DeepSpeed ZeRO: the same state
    eight = estimate(w, 8, Strategy.ZERO3)
    assert eight.components["optimizer"] == pytest.approx(12 * w.arch.params / 8, abs=1)
    for part in ("weights", "gradients"):
        assert eight.components[part] == pytest.approx(one.components[part] / 8, abs=1)
    assert eight.components["activations"] == one.components["activations"]
    assert "fsdp_buffers" in eight.components


def test_offload_moves_optimizer_to_host_ram() -> None:
    w = Workload(arch("meta-llama/Llama-3.1-70B"), "full", optimizer="adamw")
    e = estimate(w, 8, Strategy.ZERO3_OFFLOAD)
    assert e.components["optimizer"] == 0
    assert e.host_ram_bytes == 12 * w.arch.params
    assert not e.fits(200 * GIB, host_ram_bytes=None)  # unknown RAM: offload not assumed
    assert e.fits(200 * GIB, host_ram_bytes=2048 * 10**9)


def test_fit_prefers_fastest_strategy() -> None:
    w = Workload(arch("meta-llama/Llama-3.1-8B"), "qlora")
    assert sizing.fit(w, 2, 24 * GIB).strategy is Strategy.DDP  # type: ignore[union-attr]
    big = Workload(arch("meta-llama/Llama-3.1-70B"), "lora")
    got = sizing.fit(big, 4, 80 * GIB)
    assert got is not None and got.strategy is Strategy.ZERO3
    assert sizing.fit(big, 1, 80 * GIB) is None


def test_invalid_layouts_are_refused() -> None:
    w = Workload(arch("meta-llama/Llama-3.2-1B"), "lora")
    with pytest.raises(ValueError):
        estimate(w, 9)
    with pytest.raises(ValueError):
        estimate(w, 1, Strategy.ZERO3)
    with pytest.raises(ValueError):
        estimate(w, 2, Strategy.SINGLE)


def test_config_json_errors(tmp_path: Path) -> None:
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"hidden_size": 64, "num_hidden_layers": 2,
                             "num_attention_heads": 4, "intermediate_size": 128,
                             "vocab_size": 100, "num_local_experts": 8}))
    with pytest.raises(ArchitectureError, match="mixture-of-experts"):
        from_config_json(p)
    p.write_text("{not json")
    with pytest.raises(ArchitectureError, match="not a readable JSON"):
        from_config_json(p)
    p.write_text(json.dumps({"text_config": {"hidden_size": 64, "num_hidden_layers": 2,
                                             "num_attention_heads": 4, "intermediate_size": 128,
                                             "vocab_size": 100, "num_key_value_heads": 3}}))
    with pytest.raises(ArchitectureError, match="multiple of num_key_value_heads"):
        from_config_json(p)


workloads = st.builds(
    Workload,
    arch=st.sampled_from(sorted({m.repo for m in known_models().values()})).map(arch),
    method=st.sampled_from(["qlora", "lora", "full"]),
    sequence_len=st.integers(16, 32768),
    micro_batch_size=st.integers(1, 16),
    optimizer=st.sampled_from(["adamw", "adamw_8bit", "paged_adamw_8bit"]),
    gradient_checkpointing=st.booleans(),
    lora_r=st.integers(1, 256),
    headroom=st.floats(0, 1),
)


@settings(max_examples=200, deadline=None)
@given(workloads, st.sampled_from([2, 4, 8]))
def test_properties(w: Workload, gpus: int) -> None:
    one = estimate(w, 1)
    assert one.required_bytes >= one.peak_bytes > 0
    assert all(v >= 0 for v in one.components.values())
    # Sharding never needs more per GPU than replicating, once the state outweighs the
    # gathered-layer buffers; and more GPUs never need more per GPU.
    sharded = estimate(w, gpus, Strategy.ZERO3)
    more = estimate(w, 8, Strategy.ZERO3)
    assert more.peak_bytes <= sharded.peak_bytes
    # Longer sequences never need less memory.
    longer = replace(w, sequence_len=w.sequence_len * 2)
    assert estimate(longer, 1).peak_bytes > one.peak_bytes
    # QLoRA never needs more than LoRA; LoRA at a usual rank and without dropout never more
    # than full (a huge rank on a tiny model can: its adapters outgrow the model; and PEFT's
    # per-module dropout copies can too, without checkpointing).
    by_method = {m: estimate(replace(w, method=m, lora_dropout=0.0), 1).peak_bytes
                 for m in ("qlora", "lora", "full")}
    assert by_method["qlora"] < by_method["lora"]
    if w.lora_r <= 64:
        assert by_method["lora"] <= by_method["full"]


# --- FSDP2 (axolotl 0.18.0, bf16): what each GPU keeps (docs/sizing.md, "FSDP2") ------------

def test_fsdp2_full_fine_tune_keeps_bf16_shards_and_no_fp32_master() -> None:
    w = Workload(arch("Qwen/Qwen2.5-32B"), "full", optimizer="adamw")
    n, g = w.arch.params, 4
    fsdp2 = estimate(w, g, Strategy.FSDP2).components
    zero3 = estimate(w, g, Strategy.ZERO3).components
    assert fsdp2["weights"] == zero3["weights"] == pytest.approx(2 * n / g, abs=1)
    assert fsdp2["gradients"] == pytest.approx(2 * n / g, abs=1)  # the bf16 shard's dtype
    assert fsdp2["optimizer"] == pytest.approx(4 * n / g, abs=1)  # two bf16 moments
    assert zero3["optimizer"] == pytest.approx(12 * n / g, abs=1)  # fp32 master + moments
    # Two blocks gathered in bf16; ZeRO-3 keeps up to stage3_max_live_parameters (1e9) of
    # them, which is more than two blocks of this model.
    assert fsdp2["fsdp_buffers"] < zero3["fsdp_buffers"] == sizing.ZERO_MAX_LIVE * 2


def test_fsdp2_adapters_stay_fp32_like_under_zero3() -> None:
    w = Workload(arch("meta-llama/Llama-3.1-70B"), "qlora", optimizer="adamw")
    fsdp2 = estimate(w, 2, Strategy.FSDP2)
    zero3 = estimate(w, 2, Strategy.ZERO3)
    # The same everywhere but ZeRO-3's optimizer step (its fp32 copy of a sub-group) and the
    # parameters it keeps live (up to 1e9 elements, more than FSDP2's two blocks).
    differ = {"optimizer_step", "fsdp_buffers"}
    assert {k: v for k, v in fsdp2.components.items() if k not in differ} == \
        {k: v for k, v in zero3.components.items() if k not in differ}
    assert fsdp2.components["fsdp_buffers"] < zero3.components["fsdp_buffers"]
    assert fsdp2.components["adapters"] == pytest.approx(4 * w.trainable_params / 2, abs=1)


def test_fsdp2_offload_keeps_only_what_it_gathers_on_the_gpu() -> None:
    w = Workload(arch("meta-llama/Llama-3.1-70B"), "full", optimizer="adamw")
    e = estimate(w, 8, Strategy.FSDP2_OFFLOAD)
    for part in ("weights", "adapters", "gradients", "optimizer"):
        assert e.components[part] == 0
    assert e.host_ram_bytes == (2 + 2 + 4) * w.arch.params
    with pytest.raises(ValueError, match="needs training.optimizer adamw"):
        estimate(replace(w, optimizer="adamw_8bit"), 8, Strategy.FSDP2_OFFLOAD)


def test_a_pinned_layout_is_the_only_one_tried() -> None:
    w = Workload(arch("meta-llama/Llama-3.1-8B"), "qlora")
    assert sizing.fit(w, 2, 24 * GIB).strategy is Strategy.DDP  # type: ignore[union-attr]
    pinned = sizing.fit(replace(w, layout="fsdp2"), 2, 24 * GIB)
    assert pinned is not None and pinned.strategy is Strategy.FSDP2
    assert sizing.fit(replace(w, layout="single"), 2, 80 * GIB) is None
    assert sizing.candidate_strategies(1, replace(w, layout="zero3_offload")) == ()  # 8-bit
    assert sizing.candidate_strategies(1, replace(w, layout="zero3_offload",
                                                  optimizer="adamw")) == (Strategy.ZERO3_OFFLOAD,)
    assert sizing.candidate_strategies(4, replace(w, layout="single")) == ()


def test_old_stored_names_mean_the_zero3_layouts() -> None:
    assert sizing.strategy_named("fsdp") is Strategy.ZERO3
    assert sizing.strategy_named("fsdp+offload") is Strategy.ZERO3_OFFLOAD
    assert sizing.strategy_named("offload") is Strategy.ZERO3_OFFLOAD
    assert sizing.strategy_named("fsdp2") is Strategy.FSDP2


@pytest.mark.parametrize("optimizer", ["adamw_8bit", "paged_adamw_8bit"])
def test_eight_bit_optimizer_state_is_never_offloaded(optimizer: str) -> None:
    # bitsandbytes 0.49.1 (axolotl 0.18.0) steps 8-bit state on the GPU only; ZeRO-Offload
    # keeps it on the CPU. An 8B full fine-tune on one 48 GiB GPU fits only by offloading,
    # and then with plain AdamW: with an 8-bit optimizer nothing may offload its state.
    from orchestrator.core import savers
    from providers import catalog

    # With the loss kernel auto would pick: plain fp32 logits (8.8 GiB) would not fit 48 GiB.
    w = Workload(arch("meta-llama/Llama-3.1-8B"), "full", optimizer=optimizer,  # type: ignore[arg-type]
                 cross_entropy="cut")
    for strategy in sizing.OFFLOADED:
        problem = sizing.layout_problem(strategy, 2, optimizer)
        assert "needs training.optimizer adamw" in str(problem)
    for count in (1, 2, 8):
        got = sizing.fit(w, count, 48 * GIB, host_ram_bytes=4096 * GIB)
        assert got is None or got.strategy not in sizing.OFFLOADED
    auto = replace(w, optimizer="auto")
    h100 = catalog.gpus()["H100 SXM"]
    for count in (1, 2, 8):
        for lay in savers.layouts(auto, count, h100.scaling):
            est = lay.estimate
            assert est.workload is not None
            assert sizing.layout_problem(est.strategy, count, str(est.workload.optimizer)) is None
    assert savers.fit(w, 1, 48 * GIB, 4096 * GIB, h100) is None
    one = savers.fit(auto, 1, 48 * GIB, 4096 * GIB, h100)
    assert one is not None and one.strategy is Strategy.ZERO3_OFFLOAD
    assert one.workload is not None and one.workload.optimizer == "adamw"


# --- several GPUs: what a sharded run holds besides its shards (issue 36) -----------------

@pytest.mark.parametrize("strategy", sorted(sizing.SHARDED))
@pytest.mark.parametrize("method", ["full", "lora", "qlora"])
def test_sharded_layouts_hold_embeddings_and_lm_head_unsharded(strategy: Strategy,
                                                                method: str) -> None:
    a = arch("Qwen/Qwen2.5-7B")
    optimizer = "adamw" if strategy in sizing.OFFLOADED else "adamw_8bit"
    w = Workload(a, method, optimizer=optimizer)  # type: ignore[arg-type]
    c = estimate(w, 4, strategy).components
    # FSDP2's root group (embeddings, LM head, final norm) stays gathered in bf16 for the
    # whole step; a full fine-tune also holds the LM head's unsharded bf16 gradient.
    root = (2 * a.vocab_size * a.hidden_size + a.hidden_size) * 2
    head_grad = a.vocab_size * a.hidden_size * 2 if method == "full" else 0
    assert c["fsdp_root"] == root + head_grad
    assert c["comm_buffers"] == 512 * 1024**2
    for unsharded in (estimate(w, 1), estimate(w, 4, Strategy.DDP)):
        assert "fsdp_root" not in unsharded.components
    assert "comm_buffers" not in estimate(w, 1).components
    assert estimate(w, 4, Strategy.DDP).components["comm_buffers"] == 512 * 1024**2


def test_zero3_steps_the_optimizer_on_an_fp32_copy_of_one_sub_group() -> None:
    w = Workload(arch("Qwen/Qwen2.5-32B"), "full", optimizer="adamw")
    # DeepSpeed's sub_group_size is 1e9 elements: a 32B model has 4.1e9 per GPU even over
    # 8 GPUs, so the step copies one full sub-group (fp32 gradients and AdamW's temporary)...
    for g in (2, 8):
        assert estimate(w, g, Strategy.ZERO3).components["optimizer_step"] == 8 * 10**9
    # ...and a 7B model's shard over 8 GPUs (0.95e9) is one smaller sub-group.
    small = Workload(arch("Qwen/Qwen2.5-7B"), "full", optimizer="adamw")
    assert estimate(small, 8, Strategy.ZERO3).components["optimizer_step"] == \
        8 * -(-small.arch.params // 8)
    # bitsandbytes' 8-bit AdamW updates in place: only the fp32 gradient copy.
    eight = replace(w, optimizer="adamw_8bit")
    assert estimate(eight, 8, Strategy.ZERO3).components["optimizer_step"] == 4 * 10**9
    # FSDP2 steps each shard in place (fused AdamW), ZeRO-Offload on the CPU.
    assert "optimizer_step" not in estimate(w, 8, Strategy.FSDP2).components
    assert "optimizer_step" not in estimate(w, 8, Strategy.ZERO3_OFFLOAD).components


def test_checkpointing_keeps_every_block_input_and_the_last_output() -> None:
    a = arch("meta-llama/Llama-3.1-8B")
    w = Workload(a, "full", sequence_len=4096, micro_batch_size=1, optimizer="adamw",
                 gradient_checkpointing=True)
    block = replace(w, gradient_checkpointing=False)
    one_block = sizing.activation_bytes(block) // a.num_hidden_layers
    assert sizing.activation_bytes(w) == (a.num_hidden_layers + 1) * 4096 * a.hidden_size * 2 \
        + one_block


# --- sharded LoRA/QLoRA (docs/sizing.md, "Sharded adapters") -------------------------------

def test_4bit_statistics_stay_whole_on_every_gpu_sharded_or_offloaded() -> None:
    a = arch("meta-llama/Llama-3.1-70B")
    w = Workload(a, "qlora", optimizer="adamw")
    stats = math.ceil(a.linear_params * 0.127 / 8)  # one double-quantized scale per 64 weights
    assert stats > GIB  # about 1 GiB for 70B: not a rounding matter
    one = estimate(w).components
    assert "quant_state" not in one and one["weights"] == sizing.weight_bytes(w)
    for g in (2, 8):
        sharded = estimate(w, g, Strategy.FSDP2).components
        assert sharded["quant_state"] == stats  # not divided by g
        assert sharded["weights"] == math.ceil((sizing.weight_bytes(w) - stats) / g)
        assert estimate(w, g, Strategy.ZERO3).components["quant_state"] == stats
    offloaded = estimate(w, 2, Strategy.FSDP2_OFFLOAD)
    assert offloaded.components["weights"] == 0
    assert offloaded.components["quant_state"] == stats  # on the GPU, not in host RAM
    assert offloaded.host_ram_bytes == sizing.weight_bytes(w) - stats + \
        (4 + 4 + 8) * w.trainable_params
    assert "quant_state" not in estimate(replace(w, method="lora"), 2,
                                         Strategy.FSDP2).components


def test_qlora_holds_a_bf16_copy_of_its_largest_weight_while_it_multiplies() -> None:
    a = arch("meta-llama/Llama-3.1-70B")
    w = Workload(a, "qlora")
    largest = a.hidden_size * a.intermediate_size  # gate/up/down: 8,192 x 28,672
    for g, strategy in ((1, Strategy.SINGLE), (2, Strategy.FSDP2), (4, Strategy.DDP)):
        # bf16 weight + its fp32 block scales (4 bytes per 64 weights), on every GPU
        assert estimate(w, g, strategy).components["dequantize"] == \
            math.ceil(largest * (2 + 4 / 64))
    for method in ("lora", "full"):
        assert "dequantize" not in estimate(replace(w, method=method), 1).components


def test_zero3_keeps_up_to_its_live_parameter_limit_gathered() -> None:
    big = Workload(arch("meta-llama/Llama-3.1-70B"), "lora", optimizer="adamw")
    small = Workload(arch("Qwen/Qwen2.5-7B"), "full", optimizer="adamw")
    for w in (big, small):
        fsdp2 = estimate(w, 4, Strategy.FSDP2).components["fsdp_buffers"]
        zero3 = estimate(w, 4, Strategy.ZERO3).components["fsdp_buffers"]
        # stage3_max_live_parameters: 1e9 bf16 elements, or two blocks if those are more
        assert zero3 == max(fsdp2, 2 * 10**9)
    assert estimate(big, 4, Strategy.ZERO3).components["fsdp_buffers"] > 2 * 10**9
    assert estimate(small, 4, Strategy.ZERO3).components["fsdp_buffers"] == 2 * 10**9


def test_offload_copies_the_shard_to_the_gpu_before_gathering() -> None:
    w = Workload(arch("meta-llama/Llama-3.1-70B"), "full", optimizer="adamw")
    for g in (2, 8):
        on_gpu = estimate(w, g, Strategy.FSDP2).components["fsdp_buffers"]
        offloaded = estimate(w, g, Strategy.FSDP2_OFFLOAD).components["fsdp_buffers"]
        assert offloaded == pytest.approx(on_gpu * (1 + 1 / g), abs=2)


def test_sharded_adapters_carry_a_margin_on_the_frozen_base_share() -> None:
    a = arch("meta-llama/Llama-3.1-70B")
    for method, fraction in (("qlora", 0.31), ("lora", 0.04)):
        w = Workload(a, method, optimizer="adamw")
        for g, strategy in ((2, Strategy.FSDP2), (4, Strategy.ZERO3),
                            (2, Strategy.FSDP2_OFFLOAD), (8, Strategy.ZERO3_OFFLOAD)):
            assert estimate(w, g, strategy).components["adapter_margin"] == \
                math.ceil(fraction * sizing.weight_bytes(w) / g)
        # Not where nothing is sharded, nor for full fine-tunes (their terms are named).
        assert "adapter_margin" not in estimate(w, 1).components
        assert "adapter_margin" not in estimate(w, 4, Strategy.DDP).components
    full = Workload(a, "full", optimizer="adamw")
    assert "adapter_margin" not in estimate(full, 8, Strategy.FSDP2).components
