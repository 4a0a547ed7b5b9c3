"""Render the axolotl training config for a job (pure; no SSH).

Keys follow ../shared/reference/pipeline-facts.md ("Training (axolotl in Docker)"). The
engine builds a `TrainConfigInput` from the job spec and placement, so this module depends
on plain values only (playbooks never import the orchestrator core).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import yaml

from playbooks.axolotl_data import (
    TRACKER_FIELDS,
    DatasetEntry,
    DatasetFormat,
    TrackerKeys,
    dataset_keys,
    tracker_keys,
)

# The job spec's optimizer names -> axolotl's.
OPTIMIZERS = {
    "adamw": "adamw_torch_fused",
    "adamw_8bit": "adamw_bnb_8bit",
    "paged_adamw_8bit": "paged_adamw_8bit",
}
# Layouts (orchestrator.core.sizing.Strategy values) rendered as DeepSpeed ZeRO-3 (the JSON
# is uploaded with the job) and as PyTorch FSDP2 (axolotl's own keys, no extra file).
DEEPSPEED = frozenset({"zero3", "zero3_offload"})
FSDP2 = frozenset({"fsdp2", "fsdp2_offload"})
OFFLOADED = frozenset({"zero3_offload", "fsdp2_offload"})
# axolotl 0.18.0 refuses bitsandbytes' 8-bit AdamW under FSDP2 ("FSDP2 not compatible with
# adamw_bnb_8bit, use `adamw_torch_8bit` instead": utils/schemas/validation.py:1140-1153);
# the same 8-bit AdamW from torchao (transformers' `adamw_torch_8bit`) is its replacement.
FSDP2_OPTIMIZERS = {**OPTIMIZERS, "adamw_8bit": "adamw_torch_8bit",
                    "paged_adamw_8bit": "adamw_torch_8bit"}

# Memory savers' exact keys (../shared/reference/real-hosts.md §3). Only one cross-entropy
# optimisation at a time: CCE, Liger's or chunked.
CCE_PLUGIN = "axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin"
LIGER_PLUGIN = "axolotl.integrations.liger.LigerPlugin"
CROSS_ENTROPY_KEYS = {
    "cut": (CCE_PLUGIN, "cut_cross_entropy"),
    "liger": (LIGER_PLUGIN, "liger_fused_linear_cross_entropy"),
}
# Keys that pick a cross-entropy kernel: `trainer.extra` may not add a second one.
_CE_KEYS = frozenset({"cut_cross_entropy", "liger_fused_linear_cross_entropy",
                      "liger_cross_entropy", "chunked_cross_entropy"})

# Keys orch owns: `trainer.extra` may not override them, or resume and artifact copying
# would silently break (e.g. a different output_dir, or save_only_model).
RESERVED = frozenset({"base_model", "output_dir", "datasets", "auto_resume_from_checkpoints",
                      "save_only_model", "dataset_prepared_path", "test_datasets"})
# Keys `render` writes from the job file's validated fields (axolotl key -> job-file field):
# `trainer.extra` may add keys, never replace these, or `learning_rate: -5` would bypass the
# checks and sizing would plan a job other than the one that runs.
FROM_JOB_FILE = {
    "sequence_len": "training.sequence_len", "sample_packing": "training.packing",
    "pad_to_sequence_len": "training.packing", "micro_batch_size": "training.micro_batch_size",
    "gradient_accumulation_steps": "training.gradient_accumulation_steps",
    "num_epochs": "training.epochs", "learning_rate": "training.learning_rate",
    "optimizer": "training.optimizer", "gradient_checkpointing": "training.gradient_checkpointing",
    "adapter": "method", "load_in_4bit": "method", "load_in_8bit": "method",
    "lora_r": "lora.r", "lora_alpha": "lora.alpha", "lora_dropout": "lora.dropout",
    "lora_target_linear": "lora.target", "lora_target_modules": "lora.target",
    "val_set_size": "training.val_set_size", **TRACKER_FIELDS,
}


# axolotl 0.18.0's deprecated attention flags (utils/schemas/enums.py LEGACY_ATTN_FLAG_TO_IMPL):
# with the `attn_implementation` orch renders, axolotl refuses them ("cannot be combined
# with legacy attention flags").
LEGACY_ATTENTION = {"xformers_attention": "xformers", "sage_attention": "sage",
                    "flex_attention": "flex_attention", "flash_attention": "flash_attention_2",
                    "sdp_attention": "sdpa", "eager_attention": "eager"}


def extra_clash(key: str) -> str | None:
    """Why `trainer.extra` may not set `key` (with the fix), or None when it may."""
    if key in LEGACY_ATTENTION:
        return (f"deprecated in axolotl 0.18.0 and refused beside attn_implementation; set "
                f"attn_implementation: {LEGACY_ATTENTION[key]} instead (the image must have "
                "that backend: the 0.18.0 images have no flash-attn)")
    if key in RESERVED:
        return ("set by orch and cannot be overridden (resume and artifacts depend on it); "
                "remove it")
    if key in FROM_JOB_FILE:
        return (f"replaces a value the job file sets and orch validates; set "
                f"{FROM_JOB_FILE[key]} instead")
    return None


@dataclass(frozen=True)
class TrainConfigInput:
    """Everything the trainer config depends on, as plain values."""

    method: Literal["qlora", "lora", "full"]
    base_model_dir: str  # the model on the host's NVMe (inside the container)
    dataset_path: str  # inside the container
    dataset_format: DatasetFormat
    output_dir: str  # inside the container, on the volume or NVMe
    sequence_len: int = 2048
    micro_batch_size: int = 2
    gradient_accumulation_steps: int = 4
    epochs: float = 1
    learning_rate: float = 2.0e-4
    optimizer: str = "adamw_8bit"
    gradient_checkpointing: bool = True
    packing: bool = True
    cross_entropy: Literal["plain", "cut", "liger"] = "plain"
    activation_offloading: bool = False  # needs gradient_checkpointing
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    lora_target: tuple[str, ...] | None = None  # None = all linear layers
    strategy: str = "single"  # single | ddp | zero3 | zero3_offload | fsdp2 | fsdp2_offload
    # The uploaded ZeRO config as the trainer sees it (absolute); set for the zero3 layouts.
    deepspeed_path: str = ""
    save_steps: int = 50
    save_total_limit: int = 3
    extra: dict[str, Any] = field(default_factory=dict)
    # Several datasets, or a Hub dataset's split and subset: when given, these are the
    # `datasets:` (dataset_path/dataset_format are then unused); their paths as for
    # dataset_path. `test_datasets`: evaluated during training (a named split).
    datasets: tuple[DatasetEntry, ...] = ()
    test_datasets: tuple[DatasetEntry, ...] = ()
    val_set_size: float | None = None  # a fraction of the data held out for evaluation
    tracking: TrackerKeys | None = None


class ConfigError(ValueError):
    """`trainer.extra` tried to set a key orch must control."""


def render(c: TrainConfigInput) -> dict[str, Any]:
    """The axolotl config as a mapping (see `dump` for the YAML text)."""
    clash = [f"{key}: {why}" for key in sorted(c.extra) if (why := extra_clash(key))]
    if clash:
        raise ConfigError(f"trainer.extra: {'; '.join(clash)}")
    cfg: dict[str, Any] = {
        "base_model": c.base_model_dir,
        "datasets": _datasets(c),
        "dataset_prepared_path": f"{c.output_dir}/prepared",
        "output_dir": c.output_dir,
        "sequence_len": c.sequence_len,
        "sample_packing": c.packing,
        "pad_to_sequence_len": c.packing,
        "micro_batch_size": c.micro_batch_size,
        "gradient_accumulation_steps": c.gradient_accumulation_steps,
        "num_epochs": c.epochs,
        "learning_rate": c.learning_rate,
        "optimizer": (FSDP2_OPTIMIZERS if c.strategy in FSDP2 else OPTIMIZERS)[c.optimizer],
        "gradient_checkpointing": c.gradient_checkpointing,
        "bf16": "auto",
        # axolotl 0.18.0 deprecates `flash_attention: true` for `attn_implementation`, and its
        # images do not install flash-attn (BASE_EXTRAS = deepspeed, optimizers, ray), so
        # flash_attention_2 would send transformers to the Hub for a kernel. sdpa is built
        # into torch and keeps packed samples apart (`attn_decontaminates_packing`: a block-
        # diagonal mask, or varlen attention on torch >= 2.10). Source: axolotl v0.18.0
        # utils/schemas/config.py (attn_implementation, normalize_attn_implementation),
        # utils/schemas/enums.py, docker/Dockerfile-uv.
        "attn_implementation": "sdpa",
        "save_steps": c.save_steps,
        "save_total_limit": c.save_total_limit,
        # Resume picks the newest checkpoint-N (after orch moved a partial one aside).
        "auto_resume_from_checkpoints": True,
        # Lets orch request a checkpoint soon (touch axolotl_checkpoint.save) on a warning.
        "dynamic_checkpoint": {"enabled": True},
    }
    if c.method in ("lora", "qlora"):
        cfg.update({
            "adapter": c.method,
            "lora_r": c.lora_r,
            # axolotl's schema types lora_alpha as int: 32.0 fails its validation.
            "lora_alpha": _int_alpha(c.lora_alpha),
            "lora_dropout": c.lora_dropout,
        })
        if c.lora_target is None:
            cfg["lora_target_linear"] = True
        else:
            cfg["lora_target_modules"] = list(c.lora_target)
        if c.method == "qlora":
            cfg["load_in_4bit"] = True
    if c.strategy in DEEPSPEED:
        # A relative `deepspeed:` path is looked up from the process's working directory
        # only (real-hosts.md §2), so orch uploads the JSON and names it absolutely.
        if not c.deepspeed_path.startswith("/"):
            raise ConfigError(f"strategy {c.strategy} needs the uploaded DeepSpeed config's "
                              f"absolute path (got {c.deepspeed_path!r})")
        cfg["deepspeed"] = c.deepspeed_path
    if "offload" in c.strategy and "8bit" in cfg["optimizer"]:
        # bitsandbytes 0.49.1 steps 8-bit state on the GPU only (core/sizing.py, layout_problem).
        raise ConfigError(f"optimizer {c.optimizer} cannot run with its state offloaded to "
                          f"the CPU (strategy {c.strategy}); use adamw")
    if c.strategy in FSDP2:
        cfg.update(fsdp2_keys(c))
    _savers(c, cfg)
    _evaluation_and_tracking(c, cfg)
    extra = dict(c.extra)
    if "plugins" in extra and "plugins" in cfg:
        # The user's plugins join the saver's; one list, each plugin once.
        extra["plugins"] = list(dict.fromkeys([*cfg["plugins"], *extra["plugins"]]))
    cfg.update(extra)
    return cfg


def fsdp2_keys(c: TrainConfigInput) -> dict[str, Any]:
    """axolotl's FSDP2 keys (docs/multi-gpu.qmd "Migrating from FSDP1 to FSDP2", 0.18.0)."""
    return {
        "fsdp_version": 2,
        "fsdp_config": {
            # CPUOffloadPolicy: shards, gradients and the optimizer step on the CPU.
            "offload_params": c.strategy in OFFLOADED,
            # Rank 0 reads the checkpoint and broadcasts the shards (one copy in host RAM,
            # not one per GPU), for QLoRA too: axolotl's FSDP + QLoRA examples set it
            # (examples/{llama-3/qlora-fsdp-70b,qwen3/qlora-fsdp,llama-2/qlora-fsdp}.y*ml at
            # v0.18.0, the last linked from docs/fsdp_qlora.qmd), and its FSDP2 loader keeps
            # a 4-bit model's Params4bit off the meta device under it
            # (monkeypatch/accelerate/fsdp2.py:626-634).
            "cpu_ram_efficient_loading": True,
            # Without a policy accelerate wraps nothing (FSDP_AUTO_WRAP_POLICY defaults to
            # NO_WRAP) and the whole model is gathered at once; with it and no class named,
            # accelerate wraps the model's `_no_split_modules` (its decoder layer)
            # [accelerate 1.13.0 utils/dataclasses.py:1885, 2049-2054].
            "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            # Checkpoints and the final save as one unsharded state dict: what orch's
            # checkpoint validation, merge and delivery read.
            "state_dict_type": "FULL_STATE_DICT",
            "reshard_after_forward": True,
        },
    }


def _savers(c: TrainConfigInput, cfg: dict[str, Any]) -> None:
    """The memory savers' keys: a cross-entropy kernel and activation offloading."""
    if c.cross_entropy != "plain":
        clash = sorted(_CE_KEYS & set(c.extra))
        if clash:
            raise ConfigError(f"trainer.extra: {', '.join(clash)} picks a second cross-entropy "
                              f"kernel besides training.cross_entropy {c.cross_entropy} (axolotl "
                              "allows one); remove it or set training.cross_entropy: plain")
        plugin, key = CROSS_ENTROPY_KEYS[c.cross_entropy]
        cfg["plugins"] = [plugin]
        cfg[key] = True
    if c.activation_offloading:
        if not c.gradient_checkpointing:
            raise ConfigError("activation offloading needs gradient checkpointing (axolotl); "
                              "set training.gradient_checkpointing: true or auto")
        cfg["activation_offloading"] = True


def _int_alpha(alpha: float) -> int:
    if float(alpha) != int(alpha):
        raise ConfigError(f"lora.alpha must be a whole number for axolotl (got {alpha})")
    return int(alpha)


def deepspeed_config(strategy: str) -> dict[str, Any] | None:
    """The DeepSpeed ZeRO-3 config uploaded for a zero3 layout (None for the others).

    "auto" values are filled in by the HF Trainer from the axolotl config, so batch sizes
    are stated once. Offloading strategies move optimizer state and parameters to CPU RAM.
    """
    if strategy not in DEEPSPEED:
        return None
    zero: dict[str, Any] = {
        "stage": 3,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_bucket_size": "auto",
        "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto",
        # Saves a usable (unsharded) model at the end, not only ZeRO shards.
        "gather_16bit_weights_on_model_save": True,
    }
    config: dict[str, Any] = {"zero_optimization": zero}
    if strategy in OFFLOADED:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
        # The optimizer is the HF Trainer's (a client optimizer, not DeepSpeedCPUAdam):
        # DeepSpeed's `_configure_optimizer` raises ZeRORuntimeException for it under
        # ZeRO-Offload unless this is false [deepspeed runtime/engine.py; axolotl 0.18.0
        # deepspeed_configs/zero3_bf16_cpuoffload_all.json sets it]. 8-bit optimizers never
        # get here: bitsandbytes 0.49.1 has no CPU kernel for them (core/sizing.py).
        config["zero_force_ds_cpu_optimizer"] = False
        config["zero_allow_untested_optimizer"] = True
    config.update({
        "bf16": {"enabled": "auto"},
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
    })
    return config


def _datasets(c: TrainConfigInput) -> list[dict[str, Any]]:
    if c.datasets:
        return [dataset_keys(e) for e in c.datasets]
    return [dataset_keys(DatasetEntry(c.dataset_path, c.dataset_format))]


def _evaluation_and_tracking(c: TrainConfigInput, cfg: dict[str, Any]) -> None:
    """The eval split during training and the trackers' keys."""
    if c.test_datasets and c.val_set_size:
        # axolotl 0.18.0 utils/schemas/validation.py:114-118 refuses the pair.
        raise ConfigError("non-zero val_set_size should not be used with test_datasets "
                          "configuration: set training.val_set_size or a dataset's "
                          "validation_split, not both")
    if c.test_datasets:
        cfg["test_datasets"] = [dataset_keys(e) for e in c.test_datasets]
    if c.val_set_size:
        cfg["val_set_size"] = c.val_set_size
    if c.tracking is not None:
        cfg.update(tracker_keys(c.tracking))


def dump(c: TrainConfigInput) -> str:
    """The axolotl config as YAML text, keys in a stable order."""
    return yaml.safe_dump(render(c), sort_keys=False, default_flow_style=False)
