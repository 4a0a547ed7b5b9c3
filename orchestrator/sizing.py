"""Per-GPU memory of a fine-tune, by named component, for 1..8 GPUs (pure).

Every constant cites its source; docs/sizing.md explains each term and the calibration
against the published "what fits" points of ../shared/reference/seed-facts.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

from orchestrator.architectures import LINEAR_MODULES, Architecture

Method = Literal["qlora", "lora", "full"]
Optimizer = Literal["adamw", "adamw_8bit", "paged_adamw_8bit"]

GIB = 1024**3

# --- bytes per parameter (sizing-facts.md, "Bytes per parameter") ---------------------------
BF16 = 2
FP32 = 4
NF4 = 0.5
# Block scales with double quantization (bitsandbytes default in axolotl/QLoRA): 0.127 bit.
NF4_DOUBLE_QUANT_SCALES = 0.127 / 8
# Full fine-tune, mixed precision: fp32 master copy (4) + Adam moments (8, or 2 in 8 bit).
FULL_OPTIMIZER = {"adamw": FP32 + 8, "adamw_8bit": FP32 + 2, "paged_adamw_8bit": FP32 + 2}
# LoRA adapters are kept in fp32 by PEFT (autocast_adapter_dtype), so they are their own
# master copy: only the moments add to them.
ADAPTER_OPTIMIZER = {"adamw": 8, "adamw_8bit": 2, "paged_adamw_8bit": 2}
FULL_GRADIENT = BF16
ADAPTER_WEIGHT = FP32
ADAPTER_GRADIENT = FP32

# --- other terms (sizing-facts.md, "Other terms") ------------------------------------------
# CUDA context and library workspaces: "roughly 0.5–1 GB per GPU"; the middle of that.
CUDA_CONTEXT = int(0.75 * GIB)
# fp32 logits (4·s·b·v) plus the copies the loss and its gradient hold ("one or two more").
LOGITS_FP32_COPIES = 3
# FSDP/ZeRO-3 gather one block's full parameters ahead of use and keep the next prefetched.
FSDP_GATHERED_LAYERS = 2


class Strategy(StrEnum):
    """How the job uses its GPUs."""

    SINGLE = "single"
    DDP = "ddp"  # every GPU holds everything; data parallel
    SHARDED = "fsdp"  # FSDP / DeepSpeed ZeRO-3: weights, grads, optimizer state divided by G
    SHARDED_OFFLOAD = "fsdp+offload"  # as SHARDED, optimizer state in host RAM
    OFFLOAD = "offload"  # one GPU, optimizer state in host RAM (ZeRO-Offload)


@dataclass(frozen=True)
class Workload:
    """What sizing needs to know about a job; plain values so tests can build them."""

    arch: Architecture
    method: Method
    sequence_len: int = 2048
    micro_batch_size: int = 2
    optimizer: Optimizer = "adamw_8bit"
    gradient_checkpointing: bool = True
    lora_r: int = 16
    lora_modules: tuple[str, ...] = LINEAR_MODULES
    lora_dropout: float = 0.05
    headroom: float = 0.2

    @property
    def trainable_params(self) -> int:
        """Parameters that get gradients."""
        if self.method == "full":
            return self.arch.params
        return self.arch.lora_params(self.lora_r, self.lora_modules)


@dataclass(frozen=True)
class MemoryEstimate:
    """Per-GPU bytes by component; `required_bytes` adds the headroom."""

    method: Method
    gpu_count: int
    strategy: Strategy
    components: dict[str, int]
    headroom: float
    host_ram_bytes: int = 0  # state offloaded to the node's RAM (whole node)
    notes: tuple[str, ...] = field(default=())

    @property
    def peak_bytes(self) -> int:
        """Sum of the components on one GPU, before headroom."""
        return sum(self.components.values())

    @property
    def required_bytes(self) -> int:
        """What a GPU must have free: peak plus headroom for fragmentation and buffers."""
        return math.ceil(self.peak_bytes * (1 + self.headroom))

    def fits(self, gpu_memory_bytes: int, host_ram_bytes: int | None = None) -> bool:
        """True when one GPU of this size (and the node's RAM, if offloading) suffices."""
        if self.required_bytes > gpu_memory_bytes:
            return False
        if self.host_ram_bytes:
            return host_ram_bytes is not None and self.host_ram_required <= host_ram_bytes
        return True

    @property
    def host_ram_required(self) -> int:
        """Host RAM the offloaded state needs, with the same headroom."""
        return math.ceil(self.host_ram_bytes * (1 + self.headroom))


def weight_bytes(w: Workload) -> int:
    """The whole model's weights as loaded for this method (not sharded)."""
    arch = w.arch
    if w.method == "qlora":
        # bitsandbytes quantizes the linear layers only; embeddings, LM head, norms and
        # biases stay in bf16.
        quantized = arch.linear_params * (NF4 + NF4_DOUBLE_QUANT_SCALES)
        rest = arch.params - arch.linear_params
        return math.ceil(quantized + rest * BF16)
    return arch.params * BF16


def activation_bytes(w: Workload) -> int:
    """Activations kept for backward on one GPU (FlashAttention: no s×s matrix)."""
    arch = w.arch
    tokens = w.sequence_len * w.micro_batch_size
    h, i = arch.hidden_size, arch.intermediate_size
    # Per token, per block, in bf16 (Korthikanti et al. 2022 re-derived for RMSNorm + GQA +
    # SwiGLU without dropout): both norm inputs and outputs (4h), Q and the attention output
    # (2·q_dim), K and V (2·kv_dim), gate, SiLU, up and their product (4i).
    per_token = BF16 * (4 * h + 2 * arch.q_dim + 2 * arch.kv_dim + 4 * i)
    if w.method != "full" and w.lora_dropout > 0:
        # PEFT applies dropout to each adapted layer's input separately and keeps the result.
        shapes = arch.linear_shapes()
        per_token += BF16 * sum(shapes[m][0] for m in w.lora_modules)
    one_block = tokens * per_token
    if w.gradient_checkpointing:
        # Only each block's input survives (2·s·b·h), plus one block recomputed in backward.
        return arch.num_hidden_layers * tokens * h * BF16 + one_block
    return arch.num_hidden_layers * one_block


def logits_bytes(w: Workload) -> int:
    """fp32 logits over the vocabulary and the loss's copies (several GB at 128K vocab)."""
    return FP32 * w.sequence_len * w.micro_batch_size * w.arch.vocab_size * LOGITS_FP32_COPIES


def _state(w: Workload) -> tuple[int, int, int, int]:
    """Whole-model (weights, adapters, gradients, optimizer) bytes."""
    weights = weight_bytes(w)
    if w.method == "full":
        n = w.arch.params
        return weights, 0, n * FULL_GRADIENT, n * FULL_OPTIMIZER[w.optimizer]
    n = w.trainable_params
    return weights, n * ADAPTER_WEIGHT, n * ADAPTER_GRADIENT, n * ADAPTER_OPTIMIZER[w.optimizer]


def estimate(w: Workload, gpu_count: int = 1, strategy: Strategy | None = None) -> MemoryEstimate:
    """Per-GPU memory of `w` on `gpu_count` GPUs with `strategy` (default: no sharding)."""
    if not 1 <= gpu_count <= 8:
        raise ValueError(f"gpu_count must be 1..8 (got {gpu_count})")
    if strategy is None:
        strategy = Strategy.SINGLE if gpu_count == 1 else Strategy.DDP
    if gpu_count == 1 and strategy not in (Strategy.SINGLE, Strategy.OFFLOAD):
        raise ValueError(f"strategy {strategy} needs more than one GPU")
    if gpu_count > 1 and strategy in (Strategy.SINGLE, Strategy.OFFLOAD):
        raise ValueError(f"strategy {strategy} is for one GPU")

    weights, adapters, grads, optim = _state(w)
    sharded = strategy in (Strategy.SHARDED, Strategy.SHARDED_OFFLOAD)
    offload = strategy in (Strategy.SHARDED_OFFLOAD, Strategy.OFFLOAD)
    div = gpu_count if sharded else 1
    components = {
        "weights": math.ceil(weights / div),
        "adapters": math.ceil(adapters / div),
        "gradients": math.ceil(grads / div),
        "optimizer": 0 if offload else math.ceil(optim / div),
        "activations": activation_bytes(w),
        "logits": logits_bytes(w),
        "cuda_context": CUDA_CONTEXT,
    }
    notes: list[str] = []
    if sharded:
        block = w.arch.layer_linear_params + w.arch.layer_other_params
        per_param = weights / max(1, w.arch.params)
        components["fsdp_buffers"] = math.ceil(FSDP_GATHERED_LAYERS * block * per_param)
        notes.append(f"weights, gradients and optimizer state sharded over {gpu_count} GPUs")
    if offload:
        notes.append("optimizer state offloaded to host RAM")
    if w.method == "full" and w.gradient_checkpointing is False:
        notes.append("no gradient checkpointing: activations grow with every layer")
    if method_is_adapter(w.method) and w.method == "lora" and sharded:
        notes.append("frozen bf16 base sharded as axolotl/torchtune do for large models")
    return MemoryEstimate(
        method=w.method,
        gpu_count=gpu_count,
        strategy=strategy,
        components=components,
        headroom=w.headroom,
        host_ram_bytes=optim if offload else 0,
        notes=tuple(notes),
    )


def method_is_adapter(method: Method) -> bool:
    """LoRA and QLoRA train adapters over a frozen base."""
    return method in ("lora", "qlora")


def candidate_strategies(gpu_count: int) -> tuple[Strategy, ...]:
    """Strategies to try on `gpu_count` GPUs, fastest first."""
    if gpu_count == 1:
        return (Strategy.SINGLE, Strategy.OFFLOAD)
    return (Strategy.DDP, Strategy.SHARDED, Strategy.SHARDED_OFFLOAD)


def fit(
    w: Workload, gpu_count: int, gpu_memory_bytes: int, host_ram_bytes: int | None = None
) -> MemoryEstimate | None:
    """The fastest strategy under which `w` fits these GPUs, or None."""
    for strategy in candidate_strategies(gpu_count):
        est = estimate(w, gpu_count, strategy)
        if est.fits(gpu_memory_bytes, host_ram_bytes):
            return est
    return None
