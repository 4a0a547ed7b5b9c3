"""Per-GPU memory of a fine-tune, by named component, for 1..8 GPUs (pure).

Every constant cites its source; docs/sizing.md explains each term and the calibration
against the published "what fits" points of ../shared/reference/seed-facts.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from typing import Literal

from orchestrator.core.architectures import LINEAR_MODULES, Architecture

Method = Literal["qlora", "lora", "full"]
Optimizer = Literal["adamw", "adamw_8bit", "paged_adamw_8bit"]
# How the loss is computed: materialised fp32 logits, Cut Cross Entropy, Liger's fused
# linear cross-entropy (real-hosts.md §3: one cross-entropy optimisation at a time).
CrossEntropy = Literal["plain", "cut", "liger"]
# A job-file setting the planner decides (orchestrator/core/savers.py).
Auto = Literal["auto"]

GIB = 1024**3

# --- bytes per parameter (sizing-facts.md, "Bytes per parameter") ---------------------------
BF16 = 2
FP32 = 4
NF4 = 0.5
# Block scales with double quantization (bitsandbytes default in axolotl/QLoRA): 0.127 bit.
NF4_DOUBLE_QUANT_SCALES = 0.127 / 8
# Full fine-tune optimizer state per parameter depends on who holds the master copy
# (sizing-facts.md, "Bytes per parameter"):
# - one GPU / DDP, model loaded in bf16 (axolotl's default with `bf16`): no fp32 master and
#   torch AdamW keeps its two moments in the parameters' dtype (2 × bf16); 8-bit: 2 × 1 byte.
FULL_OPTIMIZER_BF16 = {"adamw": 2 * BF16, "adamw_8bit": 2, "paged_adamw_8bit": 2}
# - DeepSpeed ZeRO (what orch renders for fsdp/offload layouts, bf16): fp32 master (4) +
#   fp32 moments (8), or 8-bit moments (2); sharded over the GPUs for ZeRO-3.
FULL_OPTIMIZER_ZERO = {"adamw": FP32 + 8, "adamw_8bit": FP32 + 2, "paged_adamw_8bit": FP32 + 2}
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
# Activation offloading (axolotl `activation_offloading: true`) streams each block's
# checkpointed input to host RAM; about two blocks' worth are in flight on the GPU.
OFFLOADED_LAYERS_IN_FLIGHT = 2


class Strategy(StrEnum):
    """How the job uses its GPUs.

    The sharded layouts are rendered as DeepSpeed ZeRO-3 (playbooks/axolotl.py), not FSDP;
    their values keep the old spelling "fsdp" because it is stored in every recorded
    placement, plan JSON and history query (docs/schema.md), where renaming would split one
    layout into two names. The member names say what they are.
    """

    SINGLE = "single"
    DDP = "ddp"  # every GPU holds everything; data parallel
    SHARDED = "fsdp"  # DeepSpeed ZeRO-3: weights, grads, optimizer state divided by G
    SHARDED_OFFLOAD = "fsdp+offload"  # as SHARDED, optimizer state in host RAM
    OFFLOAD = "offload"  # one GPU, optimizer state in host RAM (ZeRO-Offload)


@dataclass(frozen=True)
class Workload:
    """What sizing needs to know about a job; plain values so tests can build them."""

    arch: Architecture
    method: Method
    sequence_len: int = 2048
    micro_batch_size: int = 2
    optimizer: Optimizer | Auto = "adamw_8bit"
    gradient_checkpointing: bool | Auto = True
    lora_r: int = 16
    lora_modules: tuple[str, ...] = LINEAR_MODULES
    lora_dropout: float = 0.05
    headroom: float = 0.2
    cross_entropy: CrossEntropy | Auto = "plain"
    activation_offloading: bool | Auto = False

    @property
    def is_resolved(self) -> bool:
        """True when no setting is left to the planner ("auto")."""
        return "auto" not in (self.optimizer, self.gradient_checkpointing, self.cross_entropy,
                              self.activation_offloading)

    @cached_property
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
    # The settings this estimate was made with (no "auto" left), and the memory savers on.
    workload: Workload | None = field(default=None, compare=False)
    savers: tuple[str, ...] = field(default=())

    @cached_property
    def peak_bytes(self) -> int:
        """Sum of the components on one GPU, before headroom."""
        return sum(self.components.values())

    @cached_property
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
    if w.activation_offloading is True:
        # The checkpointed block inputs live in host RAM; a couple are in flight on the GPU,
        # plus one block recomputed in backward (axolotl requires checkpointing for this).
        return OFFLOADED_LAYERS_IN_FLIGHT * tokens * h * BF16 + one_block
    if w.gradient_checkpointing:
        # Only each block's input survives (2·s·b·h), plus one block recomputed in backward.
        return arch.num_hidden_layers * tokens * h * BF16 + one_block
    return arch.num_hidden_layers * one_block


def logits_bytes(w: Workload) -> int:
    """fp32 logits over the vocabulary and the loss's copies (several GB at 128K vocab)."""
    return FP32 * w.sequence_len * w.micro_batch_size * w.arch.vocab_size * LOGITS_FP32_COPIES


# The loss component's name in `MemoryEstimate.components`, by cross-entropy kernel.
LOSS_COMPONENT = {"plain": "logits", "cut": "cut_cross_entropy", "liger": "liger_fused_ce"}


def loss_bytes(w: Workload) -> int:
    """Memory of the LM head's loss for `w.cross_entropy` (docs/sizing.md, "Loss")."""
    tokens = w.sequence_len * w.micro_batch_size
    h, v = w.arch.hidden_size, w.arch.vocab_size
    if w.cross_entropy == "cut":
        # CCE never materialises logits: the backward's embedding gradient (bf16, tokens × h)
        # and the forward's log-sum-exp per token (fp32) [apple/ml-cross-entropy cce.py,
        # cce_backward.py: `de = zeros_like(e)`; the classifier gradient is the LM head's
        # own gradient, counted under gradients for a full fine-tune].
        return BF16 * tokens * h + FP32 * tokens
    if w.cross_entropy == "liger":
        # Liger's fused linear cross-entropy: grad_input (tokens × h, bf16), one chunk of
        # bf16 logits of next_pow2(ceil(tokens / ceil(v / h))) rows, fp32 loss per token
        # [Liger-Kernel ops/fused_linear_cross_entropy.py].
        chunk = 1 << max(0, math.ceil(tokens / math.ceil(v / h)) - 1).bit_length()
        return BF16 * tokens * h + BF16 * chunk * v + FP32 * tokens
    if w.cross_entropy == "plain":
        return logits_bytes(w)
    raise ValueError(f"cross_entropy {w.cross_entropy!r} is not resolved")


# Layouts orch renders with a DeepSpeed ZeRO config (playbooks/axolotl.py): fp32 master.
ZERO_STRATEGIES = frozenset({Strategy.SHARDED, Strategy.SHARDED_OFFLOAD, Strategy.OFFLOAD})


def _state(w: Workload, strategy: Strategy) -> tuple[int, int, int, int]:
    """Whole-model (weights, adapters, gradients, optimizer) bytes under `strategy`."""
    weights = weight_bytes(w)
    if w.optimizer == "auto":
        raise ValueError("optimizer 'auto' is not resolved")
    if w.method == "full":
        n = w.arch.params
        table = FULL_OPTIMIZER_ZERO if strategy.value in ZERO_STRATEGIES else FULL_OPTIMIZER_BF16
        return weights, 0, n * FULL_GRADIENT, n * table[w.optimizer]
    n = w.trainable_params
    return weights, n * ADAPTER_WEIGHT, n * ADAPTER_GRADIENT, n * ADAPTER_OPTIMIZER[w.optimizer]


def savers_on(w: Workload) -> tuple[str, ...]:
    """The memory savers `w` turns on, in the names `orch plan` shows."""
    on = []
    if w.cross_entropy in ("cut", "liger"):
        on.append(LOSS_COMPONENT[str(w.cross_entropy)])
    if w.gradient_checkpointing is True:
        on.append("gradient_checkpointing")
    if w.activation_offloading is True:
        on.append("activation_offloading")
    if w.optimizer in ("adamw_8bit", "paged_adamw_8bit"):
        on.append(str(w.optimizer))
    return tuple(on)


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

    if not w.is_resolved:
        raise ValueError("resolve the workload's 'auto' settings first (savers.fit)")
    weights, adapters, grads, optim = _state(w, strategy)
    sharded = strategy in (Strategy.SHARDED, Strategy.SHARDED_OFFLOAD)
    offload = strategy in (Strategy.SHARDED_OFFLOAD, Strategy.OFFLOAD)
    div = gpu_count if sharded else 1
    components = {
        "weights": math.ceil(weights / div),
        "adapters": math.ceil(adapters / div),
        "gradients": math.ceil(grads / div),
        "optimizer": 0 if offload else math.ceil(optim / div),
        "activations": activation_bytes(w),
        LOSS_COMPONENT[str(w.cross_entropy)]: loss_bytes(w),
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
        workload=w,
        savers=savers_on(w),
    )


def method_is_adapter(method: Method) -> bool:
    """LoRA and QLoRA train adapters over a frozen base."""
    return method in ("lora", "qlora")


# bitsandbytes' 8-bit optimizers step only on GPU tensors: 0.49.1 (axolotl 0.18.0's pin)
# registers `optimizer_update_8bit_blockwise` for CUDA and XPU only and its `is_on_gpu`
# refuses CPU tensors, which is where ZeRO-Offload keeps the optimizer state. CPU support
# came later (bitsandbytes PR #1901, 2026-03). So the planner never combines them.
EIGHT_BIT_OPTIMIZERS = frozenset({"adamw_8bit", "paged_adamw_8bit"})
OFFLOAD_STRATEGIES = frozenset({Strategy.OFFLOAD, Strategy.SHARDED_OFFLOAD})


def compatible(w: Workload, strategy: Strategy) -> bool:
    """Whether `w`'s optimizer can run under `strategy` (8-bit state cannot be offloaded)."""
    return not (strategy in OFFLOAD_STRATEGIES and w.optimizer in EIGHT_BIT_OPTIMIZERS)


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
        if not compatible(w, strategy):
            continue
        est = estimate(w, gpu_count, strategy)
        if est.fits(gpu_memory_bytes, host_ram_bytes):
            return est
    return None
