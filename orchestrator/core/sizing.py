"""Per-GPU memory of a fine-tune, by named component, for 1..8 GPUs (pure).

Every constant cites its source; docs/sizing.md explains each term and the calibration
against the published "what fits" points of ../shared/reference/seed-facts.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from typing import Literal, get_args

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
# Weights per absmax block: bitsandbytes' `quantize_4bit` default blocksize.
NF4_BLOCK = 64
# Full fine-tune optimizer state per parameter depends on who holds the master copy
# (sizing-facts.md, "Bytes per parameter"):
# - one GPU / DDP, model loaded in bf16 (axolotl's default with `bf16`): no fp32 master and
#   torch AdamW keeps its two moments in the parameters' dtype (2 × bf16); 8-bit: 2 × 1 byte.
FULL_OPTIMIZER_BF16 = {"adamw": 2 * BF16, "adamw_8bit": 2, "paged_adamw_8bit": 2}
# - DeepSpeed ZeRO-3 (the zero3 layouts, bf16): fp32 master (4) + fp32 moments (8), or 8-bit
#   moments (2); sharded over the GPUs.
# - FSDP2 as axolotl 0.18.0 sets it up (the fsdp2 layouts, bf16) keeps no master copy: the
#   model is loaded in bf16 and axolotl's own `fsdp2_prepare_model` (which replaces
#   accelerate's, the one that upcasts trainable parameters to fp32) shards it as loaded, so
#   the optimizer steps the bf16 shards and its moments are bf16: FULL_OPTIMIZER_BF16 ÷ G
#   (docs/sizing.md, "FSDP2", has the source lines).
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
# The plain loss, in bytes per logit (token × vocabulary entry): the fp32 logits and the
# copies the loss and its gradient hold beside them ("one or two more", facts). The
# published HF runs hold more: transformers upcast the bf16 logits, shifted them with a
# contiguous copy and log-softmaxed them, and the backward holds the gradient of each:
# four fp32 copies and the bf16 logits at the peak, 4 × 4 + 2 = 18 (was 3 × 4 = 12, which
# left Liger's plain-loss FSDP runs 12-21 % under; docs/sizing.md, "Several GPUs").
LOGITS_BYTES_PER_VALUE = 18
# FSDP2/ZeRO-3 gather one block's full parameters ahead of use and keep the next prefetched.
FSDP_GATHERED_LAYERS = 2
# --- several GPUs (docs/sizing.md, "Several GPUs": each term and the runs it covers) -------
# NCCL's device buffers, which PyTorch's allocator does not see: NCCL_BUFFSIZE (4 MiB) per
# channel, ring neighbour and direction, up to 32 channels: 32 × 2 × 2 × 4 MiB.
COMM_BUFFERS = 32 * 2 * 2 * 4 * 1024**2
# DeepSpeed ZeRO-3 steps the optimizer one sub-group at a time, each on an fp32 copy of its
# gradients [deepspeed 0.18.9 runtime/zero/stage3.py `_prepare_fp32_grad_for_sub_group`];
# `sub_group_size` defaults to 1e9 elements [runtime/zero/config.py] and orch's ZeRO config
# (playbooks/axolotl.py) leaves it at that.
ZERO_SUB_GROUP = 10**9
# Per element of that sub-group: the fp32 gradient copy, and for AdamW an fp32 temporary
# of the same size (torch's foreach AdamW, `_foreach_sqrt`: the HF default of the published
# runs; the fused AdamW orch renders makes none, kept as margin). bitsandbytes' 8-bit
# AdamW updates its blocks in place.
ZERO_STEP_BYTES = {"adamw": FP32 + FP32, "adamw_8bit": FP32, "paged_adamw_8bit": FP32}
# ZeRO-3 keeps up to `stage3_max_live_parameters` elements gathered ("The maximum number of
# parameters resident per GPU before releasing") and does not release one reused within
# `stage3_max_reuse_distance`; both default to 1e9 [deepspeed 0.18.9 runtime/zero/
# config.py:238-248, partitioned_param_coordinator.py:428-430] and orch's ZeRO config
# leaves them. In bf16 (and the bf16 storage of packed 4-bit weights): 2 bytes each.
ZERO_MAX_LIVE = 10**9
# A safety margin for sharded LoRA/QLoRA that no source explains: a fraction of the frozen
# base's per-GPU share (the whole model as loaded ÷ G, whether that share sits on the GPU
# or is offloaded). Published sharded 34B/70B QLoRA runs held up to 5.5 GiB more than
# every named part, in every layout; the QLoRA fraction is the least (rounded up) that
# brings each of those runs (the fitted set) within 2 % of its figure, LoRA's the least for
# Answer.AI's LoRA runs (docs/sizing.md, "Sharded adapters").
ADAPTER_MARGIN = {"qlora": 0.31, "lora": 0.04}
# Activation offloading (axolotl `activation_offloading: true`) streams each block's
# checkpointed input to host RAM; about two blocks' worth are in flight on the GPU.
OFFLOADED_LAYERS_IN_FLIGHT = 2


class Strategy(StrEnum):
    """How the job uses its GPUs: the layout, named for what orch renders for it.

    The values are stored in every recorded plan (`job.placement_json`, docs/schema.md);
    migration 0007 renamed the old spellings (`OLD_NAMES`).
    """

    SINGLE = "single"
    DDP = "ddp"  # every GPU holds everything; data parallel
    ZERO3 = "zero3"  # DeepSpeed ZeRO-3: weights, grads, optimizer state divided by G
    # ZeRO-3 with optimizer state and parameters offloaded to host RAM; on one GPU this is
    # ZeRO-Offload (nothing to divide).
    ZERO3_OFFLOAD = "zero3_offload"
    FSDP2 = "fsdp2"  # PyTorch FSDP2 (axolotl `fsdp_version: 2`): bf16 shards, no fp32 master
    FSDP2_OFFLOAD = "fsdp2_offload"  # FSDP2 with `offload_params`: shards and optimizer on CPU


# The stored names before migration 0007 (they all rendered DeepSpeed ZeRO-3): a query or
# filter that still says them means these.
OLD_NAMES = {"fsdp": Strategy.ZERO3, "fsdp+offload": Strategy.ZERO3_OFFLOAD,
             "offload": Strategy.ZERO3_OFFLOAD}
# Layouts that divide the model's state over the GPUs, and those that offload it.
SHARDED = frozenset({Strategy.ZERO3, Strategy.ZERO3_OFFLOAD, Strategy.FSDP2,
                     Strategy.FSDP2_OFFLOAD})
OFFLOADED = frozenset({Strategy.ZERO3_OFFLOAD, Strategy.FSDP2_OFFLOAD})
# `resources.layout`: a strategy, or "auto" (the planner picks the fastest that fits).
LayoutName = Literal["auto", "single", "ddp", "zero3", "zero3_offload", "fsdp2", "fsdp2_offload"]
LAYOUTS: tuple[str, ...] = get_args(LayoutName)
assert LAYOUTS[1:] == tuple(s.value for s in Strategy), "LayoutName must list every Strategy"
# GPU counts each layout runs on (axolotl runs ZeRO-3 offload on one GPU; the others shard
# or replicate over two or more).
ONE_GPU = frozenset({Strategy.SINGLE, Strategy.ZERO3_OFFLOAD})
MANY_GPUS = frozenset(set(Strategy) - {Strategy.SINGLE})


def strategy_named(name: str) -> Strategy:
    """The strategy a stored or typed name means (old names included)."""
    return OLD_NAMES.get(name) or Strategy(name)


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
    layout: str = "auto"  # resources.layout: "auto" or a Strategy value

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
        # Only each block's input survives (2·s·b·h), and the last block's output, which the
        # final norm keeps (L + 1 in all), plus one block recomputed in backward. The last
        # one is 1 GiB at Liger's 8 × 16,384-token runs (docs/sizing.md, "Several GPUs").
        return (arch.num_hidden_layers + 1) * tokens * h * BF16 + one_block
    return arch.num_hidden_layers * one_block


def logits_bytes(w: Workload) -> int:
    """fp32 logits over the vocabulary and the loss's copies (several GB at 128K vocab)."""
    return LOGITS_BYTES_PER_VALUE * w.sequence_len * w.micro_batch_size * w.arch.vocab_size


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
ZERO_STRATEGIES = frozenset({Strategy.ZERO3, Strategy.ZERO3_OFFLOAD})


def _state(w: Workload, strategy: Strategy) -> tuple[int, int, int, int]:
    """Whole-model (weights, adapters, gradients, optimizer) bytes under `strategy`."""
    weights = weight_bytes(w)
    if w.optimizer == "auto":
        raise ValueError("optimizer 'auto' is not resolved")
    if w.method == "full":
        n = w.arch.params
        table = FULL_OPTIMIZER_ZERO if strategy in ZERO_STRATEGIES else FULL_OPTIMIZER_BF16
        return weights, 0, n * FULL_GRADIENT, n * table[w.optimizer]
    n = w.trainable_params
    return weights, n * ADAPTER_WEIGHT, n * ADAPTER_GRADIENT, n * ADAPTER_OPTIMIZER[w.optimizer]


def checkpoint_bytes(w: Workload, strategy: Strategy = Strategy.SINGLE) -> int:
    """Bytes one training checkpoint writes: the trained weights (a full fine-tune's model,
    else the adapters) and their optimizer state, in the sizes the GPU holds them. The
    frozen base model of LoRA/QLoRA is not in it."""
    weights, adapters, _, optimizer = _state(w, strategy)
    return (weights if w.method == "full" else adapters) + optimizer


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


def layout_problem(strategy: Strategy, gpu_count: int, optimizer: str) -> str | None:
    """Why `strategy` cannot run on `gpu_count` GPUs with `optimizer`, or None when it can."""
    if gpu_count == 1 and strategy not in ONE_GPU:
        return f"{strategy} needs two or more GPUs"
    if gpu_count > 1 and strategy not in MANY_GPUS:
        return f"{strategy} is for one GPU"
    if strategy in OFFLOADED and optimizer in EIGHT_BIT_OPTIMIZERS:
        # See EIGHT_BIT_OPTIMIZERS; for FSDP2 also axolotl 0.18.0
        # examples/gpt-oss/gpt-oss-20b-fft-fsdp2-offload.yaml:40.
        return f"{strategy} needs training.optimizer adamw (8-bit optimizers cannot step " \
               "state offloaded to the CPU)"
    return None


def pin_problem(layout: str, gpu_count: int | None, max_gpus: int, optimizer: str
                ) -> str | None:
    """Why a job file's `resources.layout` cannot run with its GPU counts and optimizer."""
    if layout == "auto":
        return None
    pinned = strategy_named(layout)
    n, field = (gpu_count, "gpu_count") if gpu_count is not None else (max_gpus, "max_gpus")
    if all(layout_problem(pinned, c, "adamw") for c in {1 if gpu_count is None else n, n}):
        return (f"resources.layout {layout} cannot run with resources.{field} {n}: "
                f"{layout_problem(pinned, n, 'adamw')}; set resources.layout: auto, or "
                "another layout or GPU count")
    problem = layout_problem(pinned, 1 if pinned in ONE_GPU else 2, optimizer)
    if problem and optimizer != "auto":
        return (f"resources.layout {problem}; set training.optimizer: adamw (or auto), or "
                "another resources.layout")
    return None


def root_bytes(w: Workload) -> int:
    """What a sharded layout holds unsharded on every GPU for the whole step, besides the
    gathered blocks: the embeddings, LM head and final norm in bf16, and for a full
    fine-tune the LM head's unsharded gradient (docs/sizing.md, "Several GPUs")."""
    a = w.arch
    # FSDP2 groups these in the root module (only the decoder layers get their own group:
    # axolotl 0.18.0 monkeypatch/accelerate/fsdp2.py:758-766), whose forward spans the
    # whole model, and frees them after the root's backward; ZeRO-3 keeps the LM head
    # gathered while it is reused within `stage3_max_reuse_distance` (1e9 elements).
    root = (a.embedding_params + a.hidden_size) * BF16
    if w.method == "full":
        # Reduce-scattered with the root group at the end of backward; Liger's fused loss
        # allocates it in forward already (`grad_weight = torch.zeros_like(weight)`).
        root += a.vocab_size * a.hidden_size * BF16
    return root


def multi_gpu_bytes(w: Workload, gpu_count: int, strategy: Strategy) -> dict[str, int]:
    """The per-GPU parts only a run on several GPUs has (none on one GPU)."""
    if gpu_count == 1:
        return {}
    parts = {"comm_buffers": COMM_BUFFERS}
    if strategy not in SHARDED:
        return parts
    parts["fsdp_buffers"] = gathered_bytes(w, gpu_count, strategy)
    parts["fsdp_root"] = root_bytes(w)
    if w.method != "full":
        parts["adapter_margin"] = math.ceil(ADAPTER_MARGIN[w.method] * weight_bytes(w)
                                            / gpu_count)
    if strategy is Strategy.ZERO3:
        # ZeRO-Offload steps on the CPU instead (zero3_offload: nothing of this on the GPU).
        sub_group = min(ZERO_SUB_GROUP, math.ceil(w.trainable_params / gpu_count))
        parts["optimizer_step"] = ZERO_STEP_BYTES[str(w.optimizer)] * sub_group
    return parts


def gathered_bytes(w: Workload, gpu_count: int, strategy: Strategy) -> int:
    """Unsharded parameters a sharded layout holds besides the root: two blocks (the one in
    use and the one prefetched), more under offload and ZeRO-3 (docs/sizing.md)."""
    block = w.arch.layer_linear_params + w.arch.layer_other_params
    per_param = weight_bytes(w) / max(1, w.arch.params)
    gathered = FSDP_GATHERED_LAYERS * block * per_param
    if strategy in OFFLOADED:
        # The CPU shard is copied to the GPU before the all-gather reads it [torch
        # distributed/fsdp/_flat_param.py FlatParamHandle.pre_unshard: `flat_param_to(
        # self.device)`; FSDP2: fsdp/_fully_shard/_fsdp_param.py `all_gather_inputs`].
        gathered *= 1 + 1 / gpu_count
    if strategy in ZERO_STRATEGIES:
        # The 4-bit statistics are not parameters: ZeRO-3 does not gather them.
        whole = weight_bytes(w) - quant_state_bytes(w)
        gathered = max(gathered, min(whole, ZERO_MAX_LIVE * BF16))
    return math.ceil(gathered)


def quant_state_bytes(w: Workload) -> int:
    """bitsandbytes' statistics of every 4-bit weight (QLoRA; 0 otherwise): one double-
    quantized scale per 64-weight block, which FSDP and ZeRO-3 neither shard nor offload."""
    # `Params4bit.quant_state` and the `Linear4bit.quant_state` it is restored from are plain
    # attributes [bitsandbytes 0.49.1 nn/modules.py:295,311 and 405-419
    # `fix_4bit_weight_quant_state_from_module`: "the quant state got lost when the
    # parameter got converted. This happens for example for fsdp"]; loaders quantize each
    # weight on the GPU, then move only its data to CPU or meta and keep `__dict__`
    # (transformers `_load_state_dict_into_meta_model`: "For quantized modules with
    # FSDP/DeepSpeed Stage 3, we need to quantize the parameter on the GPU and then cast it
    # to CPU"; axolotl 15f7910d3 and Answer.AI train.py `load_and_quantize`: "FSDP only
    # syncs parameters and buffers, so the quant_state isn't copied").
    if w.method != "qlora":
        return 0
    return math.ceil(w.arch.linear_params * NF4_DOUBLE_QUANT_SCALES)


def dequantize_bytes(w: Workload) -> int:
    """The bf16 copy of the largest 4-bit weight (and its fp32 block scales) that
    bitsandbytes' MatMul4Bit makes in forward and again in backward (QLoRA; 0 otherwise)."""
    # bitsandbytes 0.49.1 autograd/_functions.py:315 `F.dequantize_4bit(B, quant_state)` in
    # forward and :346 in backward (and in the recompute under checkpointing), one weight
    # at a time; functional.py:983-986 first expands the double-quantized scales to fp32.
    if w.method != "qlora":
        return 0
    largest = max(d_in * d_out for d_in, d_out in w.arch.linear_shapes().values())
    return math.ceil(largest * (BF16 + FP32 / NF4_BLOCK))


def estimate(w: Workload, gpu_count: int = 1, strategy: Strategy | None = None) -> MemoryEstimate:
    """Per-GPU memory of `w` on `gpu_count` GPUs with `strategy` (default: no sharding)."""
    if not 1 <= gpu_count <= 8:
        raise ValueError(f"gpu_count must be 1..8 (got {gpu_count})")
    if strategy is None:
        strategy = Strategy.SINGLE if gpu_count == 1 else Strategy.DDP
    if not w.is_resolved:
        raise ValueError("resolve the workload's 'auto' settings first (savers.fit)")
    problem = layout_problem(strategy, gpu_count, str(w.optimizer))
    if problem:
        raise ValueError(problem)
    weights, adapters, grads, optim = _state(w, strategy)
    sharded = strategy in SHARDED and gpu_count > 1
    div = gpu_count if sharded else 1
    # The 4-bit statistics are module attributes, not parameters: sharded or offloaded, every
    # GPU keeps all of them (`quant_state_bytes`).
    stats = quant_state_bytes(w) if sharded else 0
    weights -= stats
    # ZeRO-3 offload is sized with only the optimizer state in host RAM (the parameters it
    # also offloads are counted on the GPU: conservative); FSDP2's CPUOffloadPolicy keeps
    # the sharded parameters, gradients and optimizer state on the CPU and the GPU holds
    # only what it gathers (torch fully_shard `offload_policy`).
    on_host = {"optimizer": optim}
    if strategy is Strategy.FSDP2_OFFLOAD:
        on_host = {"weights": weights, "adapters": adapters, "gradients": grads,
                   "optimizer": optim}
    if strategy not in OFFLOADED:
        on_host = {}
    state = {"weights": weights, "adapters": adapters, "gradients": grads, "optimizer": optim}
    components = {name: 0 if name in on_host else math.ceil(b / div)
                  for name, b in state.items()}
    components.update({
        "activations": activation_bytes(w),
        LOSS_COMPONENT[str(w.cross_entropy)]: loss_bytes(w),
        "cuda_context": CUDA_CONTEXT,
    })
    if stats:
        components["quant_state"] = stats
    if w.method == "qlora":
        components["dequantize"] = dequantize_bytes(w)
    components.update(multi_gpu_bytes(w, gpu_count, strategy))
    notes: list[str] = []
    if sharded:
        notes.append(f"weights, gradients and optimizer state sharded over {gpu_count} GPUs")
    if on_host:
        notes.append(f"{', '.join(on_host)} offloaded to host RAM")
    if w.method == "full" and w.gradient_checkpointing is False:
        notes.append("no gradient checkpointing: activations grow with every layer")
    if w.method == "lora" and sharded:
        notes.append("frozen bf16 base sharded as axolotl/torchtune do for large models")
    if "adapter_margin" in components:
        notes.append("adapter_margin: a safety margin for sharded LoRA/QLoRA that published "
                     "runs need and no source explains (docs/sizing.md, \"Sharded adapters\")")
    return MemoryEstimate(
        method=w.method,
        gpu_count=gpu_count,
        strategy=strategy,
        components=components,
        headroom=w.headroom,
        host_ram_bytes=sum(on_host.values()),
        notes=tuple(notes),
        workload=w,
        savers=savers_on(w),
    )


# bitsandbytes' 8-bit optimizers step only on GPU tensors: 0.49.1 (axolotl 0.18.0's pin)
# registers `optimizer_update_8bit_blockwise` for CUDA and XPU only and its `is_on_gpu`
# refuses CPU tensors, which is where ZeRO-Offload keeps the optimizer state. CPU support
# came later (bitsandbytes PR #1901, 2026-03). FSDP2's offload steps on the CPU too (and
# axolotl's example says "8bit optimizers do not work with FSDP2 offload"). So the planner
# never combines them (`layout_problem`).
EIGHT_BIT_OPTIMIZERS = frozenset({"adamw_8bit", "paged_adamw_8bit"})


# Tried in this order, fastest first; at equal speed the earlier wins, so `auto` keeps
# ZeRO-3 where it fits and picks FSDP2 where only FSDP2 fits (its full fine-tune keeps
# 8 bytes per parameter against ZeRO-3's 16: a smaller, cheaper GPU).
ORDER = (Strategy.SINGLE, Strategy.DDP, Strategy.ZERO3, Strategy.FSDP2, Strategy.ZERO3_OFFLOAD,
         Strategy.FSDP2_OFFLOAD)


def candidate_strategies(gpu_count: int, w: Workload | None = None) -> tuple[Strategy, ...]:
    """Strategies to try on `gpu_count` GPUs, fastest first: `w`'s `resources.layout` and
    those its optimizer runs under ("auto" settings are resolved per variant later)."""
    layout = "auto" if w is None else w.layout
    optimizer = "auto" if w is None else str(w.optimizer)
    allowed = ORDER if layout == "auto" else (Strategy(layout),)
    return tuple(s for s in allowed if layout_problem(s, gpu_count, optimizer) is None)


def fit(
    w: Workload, gpu_count: int, gpu_memory_bytes: int, host_ram_bytes: int | None = None
) -> MemoryEstimate | None:
    """The fastest strategy under which `w` fits these GPUs, or None."""
    for strategy in candidate_strategies(gpu_count, w):
        est = estimate(w, gpu_count, strategy)
        if est.fits(gpu_memory_bytes, host_ram_bytes):
            return est
    return None
