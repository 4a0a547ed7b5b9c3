"""Sizing: parameter arithmetic, calibration against published points, property checks."""

from __future__ import annotations

import json
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
    e = estimate(Workload(arch(repo), "full", optimizer="adamw"), 8, Strategy.SHARDED)
    state = e.components["weights"] + e.components["gradients"] + e.components["optimizer"]
    assert low <= state * 8 <= high


def test_8bit_optimizer_saves_six_bytes_per_param_under_zero_two_on_one_gpu() -> None:
    a = arch("meta-llama/Llama-3.1-8B")

    def optimizer(opt: str, *layout: object) -> int:
        w = Workload(a, "full", optimizer=opt)  # type: ignore[arg-type]
        return estimate(w, *layout).components["optimizer"]  # type: ignore[arg-type]

    # ZeRO: fp32 moments (8) -> 8-bit (2). One GPU, bf16 params: bf16 moments (4) -> 2.
    assert optimizer("adamw", 8, Strategy.SHARDED) - optimizer("adamw_8bit", 8, Strategy.SHARDED) \
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
    assert sizing.logits_bytes(w) == 4 * 4096 * 152064 * sizing.LOGITS_FP32_COPIES
    assert sizing.logits_bytes(w) > 5 * GIB


def test_sharding_divides_state_but_not_activations() -> None:
    w = Workload(arch("Qwen/Qwen2.5-32B"), "full", optimizer="adamw")
    one = estimate(w, 1, Strategy.OFFLOAD)  # one GPU under DeepSpeed ZeRO: the same state
    eight = estimate(w, 8, Strategy.SHARDED)
    assert eight.components["optimizer"] == pytest.approx(12 * w.arch.params / 8, abs=1)
    for part in ("weights", "gradients"):
        assert eight.components[part] == pytest.approx(one.components[part] / 8, abs=1)
    assert eight.components["activations"] == one.components["activations"]
    assert "fsdp_buffers" in eight.components


def test_offload_moves_optimizer_to_host_ram() -> None:
    w = Workload(arch("meta-llama/Llama-3.1-70B"), "full", optimizer="adamw")
    e = estimate(w, 8, Strategy.SHARDED_OFFLOAD)
    assert e.components["optimizer"] == 0
    assert e.host_ram_bytes == 12 * w.arch.params
    assert not e.fits(200 * GIB, host_ram_bytes=None)  # unknown RAM: offload not assumed
    assert e.fits(200 * GIB, host_ram_bytes=2048 * 10**9)


def test_fit_prefers_fastest_strategy() -> None:
    w = Workload(arch("meta-llama/Llama-3.1-8B"), "qlora")
    assert sizing.fit(w, 2, 24 * GIB).strategy is Strategy.DDP  # type: ignore[union-attr]
    big = Workload(arch("meta-llama/Llama-3.1-70B"), "lora")
    got = sizing.fit(big, 4, 80 * GIB)
    assert got is not None and got.strategy is Strategy.SHARDED
    assert sizing.fit(big, 1, 80 * GIB) is None


def test_invalid_layouts_are_refused() -> None:
    w = Workload(arch("meta-llama/Llama-3.2-1B"), "lora")
    with pytest.raises(ValueError):
        estimate(w, 9)
    with pytest.raises(ValueError):
        estimate(w, 1, Strategy.SHARDED)
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
    sharded = estimate(w, gpus, Strategy.SHARDED)
    more = estimate(w, 8, Strategy.SHARDED)
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


@pytest.mark.parametrize("optimizer", ["adamw_8bit", "paged_adamw_8bit"])
def test_eight_bit_optimizer_state_is_never_offloaded(optimizer: str) -> None:
    # bitsandbytes 0.49.1 (axolotl 0.18.0) steps 8-bit state on the GPU only; ZeRO-Offload
    # keeps it on the CPU. An 8B full fine-tune on one 48 GiB GPU fits only by offloading,
    # and then with plain AdamW: with an 8-bit optimizer nothing may offload its state.
    from orchestrator.core import savers
    from providers import catalog

    w = Workload(arch("meta-llama/Llama-3.1-8B"), "full", optimizer=optimizer)  # type: ignore[arg-type]
    assert not sizing.compatible(w, Strategy.OFFLOAD)
    assert not sizing.compatible(w, Strategy.SHARDED_OFFLOAD)
    for count in (1, 2, 8):
        got = sizing.fit(w, count, 48 * GIB, host_ram_bytes=4096 * GIB)
        assert got is None or got.strategy not in sizing.OFFLOAD_STRATEGIES
    auto = replace(w, optimizer="auto")
    h100 = catalog.gpus()["H100 SXM"]
    for count in (1, 2, 8):
        for lay in savers.layouts(auto, count, h100.scaling):
            est = lay.estimate
            assert est.workload is not None
            assert sizing.compatible(est.workload, est.strategy)
    assert savers.fit(w, 1, 48 * GIB, 4096 * GIB, h100) is None
    one = savers.fit(auto, 1, 48 * GIB, 4096 * GIB, h100)
    assert one is not None and one.strategy is Strategy.OFFLOAD
    assert one.workload is not None and one.workload.optimizer == "adamw"
