"""How long a job takes on a given GPU: FLOPs over sustained throughput, plus set-up (pure)."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.sizing import Strategy, Workload, weight_bytes
from providers.base import GpuSpec, Offer

# Training FLOPs per token per parameter (sizing-facts.md, "Throughput and time"):
# forward 2N; backward 4N for full fine-tunes, ~2N for adapters (input gradients only);
# gradient checkpointing recomputes the forward (+2N).
FORWARD = 2
BACKWARD = {"full": 4, "lora": 2, "qlora": 2}
RECOMPUTE = 2
# QLoRA dequantizes every 4-bit weight on each use: slower per FLOP than bf16 LoRA.
# Calibrated with the GPUs' mfu so QLoRA 8B over 6M tokens ≈ 1.5 h on one RTX 4090.
QLORA_DEQUANT_SLOWDOWN = 1.25
# Which scaling figure of the GPU's interconnect (providers/catalog/gpus.yaml) applies.
STRATEGY_SCALING = {
    Strategy.SINGLE: (),
    Strategy.DDP: ("ddp",),
    Strategy.SHARDED: ("fsdp",),
    Strategy.SHARDED_OFFLOAD: ("fsdp", "offload"),
    Strategy.OFFLOAD: ("offload",),
}
# Weight reads per optimizer micro-step (forward, backward, recompute): the bandwidth floor.
WEIGHT_PASSES = 3
# Merging the adapter and starting vLLM for the eval: reading/writing the bf16 model a few
# times at NVMe speed, plus a fixed allowance for the eval requests.
MERGE_EVAL_GBPS = 1.0
MERGE_EVAL_FIXED_MIN = 5.0


@dataclass(frozen=True)
class Duration:
    """Estimated wall time of a job on one placement, by phase, in hours."""

    boot: float
    model_pull: float
    training: float
    merge_eval: float
    source: str  # "formula" or "measured ... tokens/s"

    @property
    def total(self) -> float:
        return self.boot + self.model_pull + self.training + self.merge_eval

    @property
    def overhead(self) -> float:
        """Hours billed that are not training."""
        return self.boot + self.model_pull + self.merge_eval


def flops_per_token(w: Workload) -> float:
    """Training FLOPs for one token of `w`."""
    per_param = FORWARD + BACKWARD[w.method] + (RECOMPUTE if w.gradient_checkpointing else 0)
    return per_param * w.arch.params


def training_seconds(
    w: Workload, tokens: int, gpu: GpuSpec, gpu_count: int, strategy: Strategy,
    measured_tokens_per_s: float | None = None,
) -> float:
    """Seconds of training for `tokens` (all epochs), compute- or bandwidth-bound."""
    if measured_tokens_per_s:
        return tokens / measured_tokens_per_s
    rate = gpu.bf16_tflops * 1e12 * gpu.mfu * gpu_count
    for kind in STRATEGY_SCALING[strategy]:
        rate *= gpu.efficiency(kind)
    if w.method == "qlora":
        rate /= QLORA_DEQUANT_SLOWDOWN
    compute = tokens * flops_per_token(w) / rate
    # Each micro-step streams all the weights a few times on every GPU: sharded layouts
    # gather each layer in full before using it, so sharding does not lower this floor.
    microsteps = tokens / (w.sequence_len * w.micro_batch_size * gpu_count)
    memory = microsteps * WEIGHT_PASSES * weight_bytes(w) / (gpu.bandwidth_tbps * 1e12)
    return max(compute, memory)


def model_download_bytes(w: Workload) -> int:
    """The base model as published: bf16 safetensors (QLoRA quantizes at load time)."""
    return w.arch.params * 2


def duration(
    w: Workload, tokens: int, offer: Offer, gpu: GpuSpec, strategy: Strategy,
    model_cached: bool = False, measured_tokens_per_s: float | None = None,
) -> Duration:
    """Wall time of the whole job on `offer`: boot, model pull, training, merge + eval."""
    bf16 = model_download_bytes(w)
    pull = 0.0 if model_cached else bf16 * 8 / (offer.pull_gbps * 1e9)
    merge = 0.0 if w.method == "full" else bf16 * 2 / (MERGE_EVAL_GBPS * 1e9)
    train = training_seconds(w, tokens, gpu, offer.gpu_count, strategy, measured_tokens_per_s)
    source = f"measured {measured_tokens_per_s:,.0f} tokens/s" if measured_tokens_per_s \
        else "formula"
    return Duration(
        boot=offer.boot_minutes / 60,
        model_pull=pull / 3600,
        training=train / 3600,
        merge_eval=(merge + MERGE_EVAL_FIXED_MIN * 60) / 3600,
        source=source,
    )
