"""Evaluation sized and placed like training: vLLM's memory per GPU, hours and dollars (pure).

vLLM serves the fine-tuned model for the eval set and the lm-eval tasks. What it holds on
each GPU (docs/sizing.md, "Evaluation", has every figure and its source):

- the served weights, divided over the tensor-parallel GPUs: the bf16 merged model, or
  for QLoRA the base quantized to 4-bit by bitsandbytes at load plus the adapter (what
  QLoRA trained, ~4x smaller than the merged model);
- the KV cache for `max_model_len` tokens of every concurrent request;
- the profile run's activations (one forward pass over `max_num_batched_tokens`) and
  the sampler's logits, CUDA graphs and the CUDA context;
- all of it within `gpu_memory_utilization` of the GPU's memory, the fraction vLLM
  allows itself (orch passes it explicitly).

The evaluation runs on the training machine (tensor parallel over its GPUs; the model is
on its NVMe; the engine rents nothing else): the scheduler and the offer book keep only
placements whose machine also serves the model (`on_machine`) and count its hours in the
placement's (`throughput.Duration.evaluation`), so the ranking prices training and
evaluation together. `eval_hours` is the one time formula for evaluation; keep it small so
a measured one can replace it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Literal, NamedTuple

from orchestrator.core import money
from orchestrator.core.architectures import Architecture
from orchestrator.core.sizing import BF16, FP32, GIB, NF4, NF4_DOUBLE_QUANT_SCALES, Method
from providers.base import GpuSpec, Offer

Served = Literal["merged", "adapter"]  # bf16 merged model | 4-bit base + LoRA adapter
# "same": on the training machine, the only placement the engine runs (docs/architecture.md,
# "Evaluation"); the plan never prices one it would not rent.
PlacementKind = Literal["same"]

# vLLM's defaults and what orch passes (vllm/config/cache.py, scheduler.py at v0.19.1).
GPU_MEMORY_UTILIZATION = 0.90  # --gpu-memory-utilization (vLLM's default)
MAX_NUM_BATCHED_TOKENS = 8192  # the profile run's tokens (V1 default for `vllm serve`)
CONCURRENCY = 8  # requests in flight: playbooks/evaluate.py's default, passed as --max-num-seqs
MAX_NEW_TOKENS = 64  # the eval set's generation length (playbooks/evaluate.py)
# Non-torch memory vLLM reports after start-up: CUDA graphs of the decode batch sizes
# ("Graph capturing finished ... took 0.3-1.5 GiB" in vLLM's logs for 1-70B models) and
# the CUDA context with cuBLAS/NCCL workspaces.
CUDA_GRAPHS = 1 * GIB
CUDA_CONTEXT = int(0.75 * GIB)  # as training (sizing.CUDA_CONTEXT)
TENSOR_PARALLEL = (1, 2, 4, 8)

# Time (eval_hours): start-up = reading the weights from NVMe + compiling/capturing graphs;
# decoding is memory-bound: every step reads the GPU's share of the weights once.
LOAD_GBPS = 2.0  # NVMe read of safetensors into GPU memory, GB/s
STARTUP_S = 90.0  # torch.compile + CUDA graph capture + server start (vLLM logs, 7-70B)
DECODE_BANDWIDTH_EFFICIENCY = 0.5  # achieved fraction of the HBM bandwidth while decoding
LM_EVAL_TASK_HOURS = 0.25  # per lm-eval task; tasks' sizes are unknown at plan time
# A container rental has no vLLM: `uv pip install vllm` (~4 GB of wheels) first, 1-3 min on
# a data-centre link (docs/playbooks.md, "Evaluation on container rentals"); the middle.
VLLM_INSTALL_S = 120.0


@dataclass(frozen=True)
class EvalWork:
    """What the evaluation serves and how much it generates."""

    arch: Architecture
    method: Method
    max_model_len: int
    eval_rows: int
    tasks: int = 0
    lora_r: int = 16
    lora_params: int = 0
    concurrency: int = CONCURRENCY
    max_new_tokens: int = MAX_NEW_TOKENS
    # Providers whose machines are containers of the trainer image (vLLM is installed first).
    rentals: frozenset[str] = field(default_factory=frozenset)


class ServeEstimate(NamedTuple):
    """vLLM's memory on each of `tensor_parallel` GPUs, by component."""

    served: Served
    tensor_parallel: int
    components: dict[str, int]
    utilization: float = GPU_MEMORY_UTILIZATION

    @property
    def peak_bytes(self) -> int:
        """What vLLM holds on one GPU."""
        return sum(self.components.values())

    @property
    def required_bytes(self) -> int:
        """The GPU memory that holds `peak_bytes` within vLLM's memory fraction."""
        return math.ceil(self.peak_bytes / self.utilization)

    def fits(self, gpu_memory_bytes: int) -> bool:
        """Whether one GPU of this size holds it."""
        return self.required_bytes <= gpu_memory_bytes


def served_weight_bytes(arch: Architecture, served: Served, lora_params: int) -> int:
    """The whole served model: bf16, or 4-bit linear layers (bitsandbytes) + bf16 adapter."""
    if served == "merged":
        return arch.params * BF16
    quantized = arch.linear_params * (NF4 + NF4_DOUBLE_QUANT_SCALES)
    return math.ceil(quantized + (arch.params - arch.linear_params) * BF16 + lora_params * BF16)


def kv_cache_bytes(arch: Architecture, tokens: int) -> int:
    """bf16 K and V of every layer for `tokens` tokens (all heads, before tensor parallel)."""
    return 2 * arch.num_hidden_layers * arch.kv_dim * BF16 * tokens


def serve_estimate(work: EvalWork, served: Served, tensor_parallel: int) -> ServeEstimate:
    """Per-GPU memory of serving `work` as `served` over `tensor_parallel` GPUs."""
    a, tp = work.arch, tensor_parallel
    tokens = MAX_NUM_BATCHED_TOKENS  # the profile run: one batch of this many tokens
    # One layer's largest intermediates (gate+up, attention q/k/v) over the batched tokens,
    # plus the residual stream; the sampler's fp32 logits for every running request.
    per_token = BF16 * (2 * a.intermediate_size + a.q_dim + 2 * a.kv_dim) / tp
    activations = math.ceil(tokens * (per_token + 2 * BF16 * a.hidden_size))
    logits = FP32 * a.vocab_size * max(work.concurrency, 1) * 2
    components = {
        "weights": math.ceil(served_weight_bytes(a, served, work.lora_params) / tp),
        "kv_cache": math.ceil(kv_cache_bytes(a, work.max_model_len * work.concurrency) / tp),
        "activations": activations + logits,
        "cuda_graphs": CUDA_GRAPHS,
        "cuda_context": CUDA_CONTEXT,
    }
    return ServeEstimate(served, tp, components)


def served_options(method: Method) -> tuple[Served, ...]:
    """How a job's result can be served, preferred first.

    QLoRA: the 4-bit base + adapter evaluates exactly what was trained, at a quarter of the
    merged model's memory. LoRA and full fine-tunes: the merged bf16 model (no adapter
    overhead per token).
    """
    return ("adapter", "merged") if method == "qlora" else ("merged",)


def tensor_parallel_sizes(arch: Architecture, gpu_count: int) -> tuple[int, ...]:
    """The tensor-parallel sizes vLLM accepts on `gpu_count` GPUs (heads must divide)."""
    return tuple(tp for tp in TENSOR_PARALLEL
                 if tp <= gpu_count and arch.num_attention_heads % tp == 0)


def fit(work: EvalWork, gpu_count: int, gpu_memory_bytes: int) -> ServeEstimate | None:
    """The preferred way to serve `work` on `gpu_count` GPUs of this size (fewest GPUs)."""
    for served in served_options(work.method):
        for tp in tensor_parallel_sizes(work.arch, gpu_count):
            est = serve_estimate(work, served, tp)
            if est.fits(gpu_memory_bytes):
                return est
    return None


def eval_hours(work: EvalWork, est: ServeEstimate, gpu: GpuSpec | None,
               rental: bool = False) -> float:
    """Hours the evaluation takes: (on a container `rental`, installing vLLM), load,
    generate the eval set, lm-eval tasks."""
    weights = est.components["weights"]
    load_s = STARTUP_S + weights * est.tensor_parallel / (LOAD_GBPS * 1e9)
    if rental:  # the eval set and the tasks alike are served by the installed vLLM
        load_s += VLLM_INSTALL_S
    bandwidth = (gpu.bandwidth_tbps if gpu is not None else 1.0) * 1e12
    step_s = weights / (bandwidth * DECODE_BANDWIDTH_EFFICIENCY)
    steps = math.ceil(work.eval_rows / max(1, work.concurrency)) * work.max_new_tokens
    return (load_s + steps * step_s) / 3600 + work.tasks * LM_EVAL_TASK_HOURS


class EvalPlan(NamedTuple):
    """Where and how the evaluation runs, and what it costs."""

    placement: PlacementKind
    offer: Offer
    estimate: ServeEstimate
    hours: float
    cost: Decimal
    why: str
    max_model_len: int
    concurrency: int

    def to_dict(self) -> dict[str, object]:
        """The `evaluation` object of `orch plan --json`."""
        est, o = self.estimate, self.offer
        return {
            "placement": self.placement,
            "provider": o.provider,
            "gpu": o.gpu,
            "gpu_count": est.tensor_parallel,
            "machine_gpu_count": o.gpu_count,
            "gpu_memory_bytes": o.gpu_memory_bytes,
            "served": est.served,
            "tensor_parallel_size": est.tensor_parallel,
            "memory_per_gpu_bytes": est.required_bytes,
            "peak_bytes": est.peak_bytes,
            "gpu_memory_utilization": est.utilization,
            "components": dict(est.components),
            "max_model_len": self.max_model_len,
            "max_num_seqs": self.concurrency,
            "hours": round(self.hours, 4),
            "cost": str(self.cost),
            "why": self.why,
        }


def on_machine(work: EvalWork, offer: Offer, gpu: GpuSpec | None
               ) -> tuple[ServeEstimate, float] | None:
    """How `offer`'s machine serves the evaluation and its hours; None when it cannot hold
    the model (the scheduler then leaves the offer out)."""
    est = fit(work, offer.gpu_count, offer.gpu_memory_bytes)
    if est is None:
        return None
    return est, eval_hours(work, est, gpu, offer.provider in work.rentals)


def place(work: EvalWork, training: Offer, gpu: GpuSpec | None) -> EvalPlan | None:
    """The evaluation on the training machine (the plan's chosen offer), or None when it
    cannot hold the model (a ranking given the evaluation never chooses such an offer)."""
    found = on_machine(work, training, gpu)
    if found is None:
        return None
    est, hours = found
    return EvalPlan("same", training, est, hours, money.job_cost(training, hours),
                    f"on the training machine, {_how(est)}", work.max_model_len,
                    work.concurrency)


def _how(est: ServeEstimate) -> str:
    what = ("the 4-bit base with the LoRA adapter" if est.served == "adapter"
            else "the bf16 merged model")
    tp = f" over {est.tensor_parallel} GPUs (tensor parallel)" if est.tensor_parallel > 1 else ""
    return f"{what}{tp}, {est.required_bytes / GIB:.1f} GiB per GPU"
