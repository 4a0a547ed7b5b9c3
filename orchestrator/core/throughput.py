"""How long a job takes on a given GPU: FLOPs over sustained throughput, plus set-up (pure)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import NamedTuple

from orchestrator.core.sizing import Strategy, Workload, weight_bytes
from providers.base import GpuSpec, Offer
from providers.datacache import read_yaml

# The published points the efficiencies below are fitted on (read by throughputcal.py too).
PUBLISHED = Path(__file__).with_name("data") / "throughput.yaml"

# Throughput cost of each saver, as a factor on training time (docs/sizing.md, "Savers"):
# - Cut Cross Entropy: "without sacrificing training speed" (apple/ml-cross-entropy README);
#   torchtune's chunked loss measured +2 % tokens/s (torchtune@1814feb17 README "Optimization
#   flags", 8998 -> 9174), counted as no change.
# - Liger fused linear CE: its README reports +20 % throughput for the whole kernel set on
#   8×A100 FSDP; orch enables only the loss kernel and claims no gain it cannot pin down.
# - 8-bit AdamW: on adapters the optimizer step is a negligible part of a step (Dettmers et al.
#   2022, Table 2: 8-bit Adam runs at 32-bit Adam's speed). On a full fine-tune it is not:
#   torchtune measured 7309 -> 6960 tokens/s on Llama-3.2-3B (same table), a 1.05 factor.
# - Gradient checkpointing: one more forward pass (+2N FLOPs per token), below; measured
#   9174 -> 7210 (0.79; the formula says 0.75 for a full fine-tune).
# - Activation offloading: measured 7309 -> 7301 tokens/s (-0.1 %, same table): no cost.
CE_SLOWDOWN = {"plain": 1.0, "cut": 1.0, "liger": 1.0}
OPTIMIZER_SLOWDOWN = {"adamw": 1.0, "adamw_8bit": 1.0, "paged_adamw_8bit": 1.0}
EIGHT_BIT_FULL_SLOWDOWN = 7309 / 6960
ACTIVATION_OFFLOAD_SLOWDOWN = 1.0

# Training FLOPs per token per parameter (sizing-facts.md, "Throughput and time"):
# forward 2N; backward 4N for full fine-tunes, ~2N for adapters (input gradients only);
# gradient checkpointing recomputes the forward (+2N).
FORWARD = 2
BACKWARD = {"full": 4, "lora": 2, "qlora": 2}
RECOMPUTE = 2
# The sustained fraction of bf16 peak (gpus.yaml `mfu`, counted with the FLOPs above) is for
# a tuned stack at hidden size 4,096, and grows with width: wider matmuls keep the tensor
# cores busier. Fitted on the published points of data/throughput.yaml (docs/sizing.md,
# "Throughput"): A100 3B (h 3,072) ~0.55, 70B (h 8,192) ~0.67, 405B (h 16,384) ~0.82 -> 0.25.
REFERENCE_WIDTH = 4096
WIDTH_EXPONENT = 0.25
# QLoRA dequantizes every 4-bit weight on each use: measured at 0.78 (8B, RTX 4090) and 0.98
# (3B, A100) of LoRA's tokens/s with the same config (torchtune READMEs): 0.88.
QLORA_SPEED = 0.88
# orch renders axolotl without torch.compile; torchtune measured compile at +27 % tokens/s
# (1814feb17 "Optimization flags": + Compile, 7075 -> 8998). Tuned-stack points (compiled)
# are compared without this factor, everything orch runs gets it.
UNCOMPILED_SPEED = 7075 / 8998
# Which scaling figure of the GPU's interconnect (providers/catalog/gpus.yaml) applies.
STRATEGY_SCALING = {
    Strategy.SINGLE: (),
    Strategy.DDP: ("ddp",),
    # ZeRO-3 and FSDP2 move the same bytes (all-gather weights, reduce-scatter gradients):
    # one figure, named "fsdp" in gpus.yaml, for both.
    Strategy.ZERO3: ("fsdp",),
    Strategy.FSDP2: ("fsdp",),
    Strategy.FSDP2_OFFLOAD: ("fsdp", "offload"),
}


def scaling_kinds(strategy: Strategy, gpu_count: int) -> tuple[str, ...]:
    """The interconnect figures (providers/catalog/gpus.yaml) `strategy` pays on `gpu_count`."""
    if strategy is Strategy.ZERO3_OFFLOAD:
        # One GPU: ZeRO-Offload pays only the host round trip; more: sharding as well.
        return ("offload",) if gpu_count == 1 else ("fsdp", "offload")
    return STRATEGY_SCALING[strategy]
# Weight reads per optimizer micro-step (forward, backward, recompute): the bandwidth floor.
WEIGHT_PASSES = 3
# Merging the adapter: reading the bf16 base and writing the merged model at NVMe speed (an
# assumption; docs/sizing.md, "Set-up time"). The evaluation's time is evalsizing's alone.
MERGE_GBPS = 1.0

# Published model sizes that measured throughput is grouped by (label, parameters). A model
# takes the label nearest in log space, so 7.6B (Qwen2.5-7B) and 8.0B (Llama-3.1-8B) share
# "8B": within a class, tokens/s differs by the size ratio (tens of percent at most), far
# less than between classes or between the formula and reality.
SIZE_CLASSES: tuple[tuple[str, float], ...] = (
    ("0.5B", 0.5e9), ("1B", 1e9), ("3B", 3e9), ("8B", 8e9), ("14B", 14e9),
    ("32B", 32e9), ("70B", 70e9), ("405B", 405e9),
)

# What learned throughput is keyed by: (GPU model, GPU count, method, size class).
MeasuredKey = tuple[str, int, str, str]


@dataclass(frozen=True)
class Measured:
    """Tokens per second learned from finished jobs: the median, and how many it is over."""

    tokens_per_s: float  # the whole job's rate, over all its GPUs
    count: int  # observations (one per finished job)

    def describe(self) -> str:
        """How `orch plan` names the figure it used."""
        jobs = "job" if self.count == 1 else "jobs"
        return f"measured {self.tokens_per_s:,.0f} tokens/s ({self.count} {jobs})"


def size_class(params: int) -> str:
    """The label of SIZE_CLASSES nearest to `params` in log space (e.g. 8_030_261_248 -> 8B)."""
    if params <= 0:
        raise ValueError(f"parameter count must be > 0 (got {params})")
    target = math.log(params)
    return min(SIZE_CLASSES, key=lambda c: abs(math.log(c[1]) - target))[0]


def measured_key(w: Workload, gpu: str, gpu_count: int) -> MeasuredKey:
    """The history key a job of `w` on `gpu_count` x `gpu` is measured and looked up by."""
    return (gpu, gpu_count, w.method, size_class(w.arch.params))


class Duration(NamedTuple):
    """Estimated wall time of a job on one placement, by phase, in hours."""

    boot: float
    model_pull: float
    training: float
    merge: float
    source: str  # formula_source(...) or Measured.describe()
    # vLLM serving the eval set and eval.tasks on this machine (evalsizing.eval_hours; 0 for
    # a job without an evaluation): the one estimate of evaluation time.
    evaluation: float = 0.0
    # The host sending the results (core.delivery: copy back, Hub upload), billed like the
    # rest: a full 70B model takes hours to copy to this machine (issue 36 §4).
    delivery: float = 0.0

    @property
    def total(self) -> float:
        return (self.boot + self.model_pull + self.training + self.merge + self.evaluation
                + self.delivery)

    @property
    def overhead(self) -> float:
        """Hours billed that are not training."""
        return self.boot + self.model_pull + self.merge + self.evaluation + self.delivery

    def phases(self) -> dict[str, float]:
        """Every billed phase's hours, in the order the host bills them."""
        return {"boot": self.boot, "model download": self.model_pull,
                "training": self.training, "merge": self.merge,
                "evaluation": self.evaluation, "delivery": self.delivery}


def extra_slowdown(w: Workload) -> float:
    """The savers' time factor beyond checkpointing's recompute (which is in the FLOPs)."""
    factor = CE_SLOWDOWN[str(w.cross_entropy)] * OPTIMIZER_SLOWDOWN[str(w.optimizer)]
    if w.method == "full" and str(w.optimizer) != "adamw":
        factor *= EIGHT_BIT_FULL_SLOWDOWN
    return factor * (ACTIVATION_OFFLOAD_SLOWDOWN if w.activation_offloading is True else 1.0)


def flops_per_token(w: Workload) -> float:
    """Training FLOPs for one token of `w`."""
    per_param = FORWARD + BACKWARD[w.method] + (RECOMPUTE if w.gradient_checkpointing else 0)
    return per_param * w.arch.params


def efficiency(w: Workload, gpu: GpuSpec, compiled: bool = False) -> float:
    """The fraction of `gpu`'s bf16 peak one GPU sustains on `w` (FLOPs as counted here).

    `compiled` is for published points measured with torch.compile; orch's runs are not.
    """
    width: float = (w.arch.hidden_size / REFERENCE_WIDTH) ** WIDTH_EXPONENT
    e = min(1.0, gpu.mfu * width)  # no GPU beats its peak, however wide the model
    if w.method == "qlora":
        e *= QLORA_SPEED
    return e if compiled else e * UNCOMPILED_SPEED


def training_seconds(
    w: Workload, tokens: int, gpu: GpuSpec, gpu_count: int, strategy: Strategy,
    measured_tokens_per_s: float | None = None, compiled: bool = False,
) -> float:
    """Seconds of training for `tokens` (all epochs), compute- or bandwidth-bound."""
    if measured_tokens_per_s:
        return tokens / measured_tokens_per_s
    rate = gpu.bf16_tflops * 1e12 * efficiency(w, gpu, compiled) * gpu_count
    for kind in scaling_kinds(strategy, gpu_count):
        rate *= gpu.efficiency(kind)
    compute = tokens * flops_per_token(w) / rate * extra_slowdown(w)
    # Each micro-step streams all the weights a few times on every GPU: sharded layouts
    # gather each layer in full before using it, so sharding does not lower this floor.
    microsteps = tokens / (w.sequence_len * w.micro_batch_size * gpu_count)
    memory = microsteps * WEIGHT_PASSES * weight_bytes(w) / (gpu.bandwidth_tbps * 1e12)
    return max(compute, memory)


# The mildest slowdown any saver choice leaves (the floor's factor; constants, so once).
_MILDEST = (min(CE_SLOWDOWN.values()) * min(OPTIMIZER_SLOWDOWN.values())
            * min(1.0, EIGHT_BIT_FULL_SLOWDOWN) * min(1.0, ACTIVATION_OFFLOAD_SLOWDOWN))


def training_seconds_floor(w: Workload, tokens: int, gpu: GpuSpec, gpu_count: int) -> float:
    """A lower bound on `training_seconds` of `w` on `gpu_count` x `gpu` under any layout
    and saver choice: its compute term with perfect scaling, no recompute and the mildest
    slowdowns (the offer book ranks groups by it before sizing them). `efficiency` depends
    on the model's width and the method, which no saver changes."""
    rate = gpu.bf16_tflops * 1e12 * efficiency(w, gpu) * gpu_count
    return tokens * (FORWARD + BACKWARD[w.method]) * w.arch.params / rate * _MILDEST


def model_download_bytes(w: Workload) -> int:
    """The base model as published: bf16 safetensors (QLoRA quantizes at load time)."""
    return w.arch.params * 2


@cache
def _published_runs() -> dict[str, int]:
    """Asserted points of data/throughput.yaml per GPU model: what its `mfu` rests on."""
    out: dict[str, int] = {}
    for raw in read_yaml(PUBLISHED)["points"]:
        if raw["asserted"]:
            out[raw["gpu"]] = out.get(raw["gpu"], 0) + 1
    return out


def formula_source(gpu: str) -> str:
    """How `orch plan` names a formula estimate on `gpu`: what it rests on."""
    n = _published_runs().get(gpu, 0)
    basis = (f"calibrated on {n} published runs on {gpu}" if n else
             f"no published run on {gpu}: its efficiency is assumed (docs/sizing.md)")
    return f"formula, {basis}; no finished job of yours with this GPU, count, method and size"


def merge_seconds(w: Workload) -> float:
    """Seconds merging an adapter into the base after training (read the bf16 base and write
    the merged model: 2 x its bytes); a full fine-tune has nothing to merge.

    Merge only: the evaluation is timed by `evalsizing.eval_hours` on the machine
    (`Duration.evaluation`), so it is counted once.
    """
    return 0.0 if w.method == "full" else model_download_bytes(w) * 2 / (MERGE_GBPS * 1e9)


def duration(
    w: Workload, tokens: int, offer: Offer, gpu: GpuSpec, strategy: Strategy,
    model_cached: bool = False, measured: Measured | None = None,
) -> Duration:
    """Wall time of the job on `offer`: boot, model pull, training, merge (the evaluation is
    added by the scheduler, `Duration.evaluation`)."""
    bf16 = model_download_bytes(w)
    pull = 0.0 if model_cached else bf16 * 8 / (offer.pull_gbps * 1e9)
    # A non-positive figure is a bad observation, not a GPU that never finishes.
    use = measured if measured is not None and measured.tokens_per_s > 0 else None
    train = training_seconds(w, tokens, gpu, offer.gpu_count, strategy,
                             use.tokens_per_s if use else None)
    source = use.describe() if use else formula_source(offer.gpu)
    return Duration(
        boot=offer.boot_minutes / 60,
        model_pull=pull / 3600,
        training=train / 3600,
        merge=merge_seconds(w) / 3600,
        source=source,
    )
