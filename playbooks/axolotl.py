"""Render the axolotl training config for a job (pure; no SSH).

Keys follow ../shared/reference/pipeline-facts.md ("Training (axolotl in Docker)"). The
engine builds a `TrainConfigInput` from the job spec and placement, so this module depends
on plain values only (playbooks never import the orchestrator core).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import yaml

# The job spec's optimizer names -> axolotl's.
OPTIMIZERS = {
    "adamw": "adamw_torch_fused",
    "adamw_8bit": "adamw_bnb_8bit",
    "paged_adamw_8bit": "paged_adamw_8bit",
}
# Strategies that shard with DeepSpeed ZeRO-3 (the config is uploaded with the job).
SHARDED = frozenset({"fsdp", "fsdp+offload", "offload"})

# Keys orch owns: `trainer.extra` may not override them, or resume and artifact copying
# would silently break (e.g. a different output_dir, or save_only_model).
RESERVED = frozenset({"base_model", "output_dir", "datasets", "auto_resume_from_checkpoints",
                      "save_only_model", "dataset_prepared_path"})


@dataclass(frozen=True)
class TrainConfigInput:
    """Everything the trainer config depends on, as plain values."""

    method: Literal["qlora", "lora", "full"]
    base_model_dir: str  # the model on the host's NVMe (inside the container)
    dataset_path: str  # inside the container
    dataset_format: Literal["alpaca", "chat_template"]
    output_dir: str  # inside the container, on the volume or NVMe
    sequence_len: int = 2048
    micro_batch_size: int = 2
    gradient_accumulation_steps: int = 4
    epochs: float = 1
    learning_rate: float = 2.0e-4
    optimizer: str = "adamw_8bit"
    gradient_checkpointing: bool = True
    packing: bool = True
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    lora_target: tuple[str, ...] | None = None  # None = all linear layers
    strategy: str = "single"  # single | ddp | fsdp | fsdp+offload | offload
    # The uploaded ZeRO config as the trainer sees it (absolute); set for sharded strategies.
    deepspeed_path: str = ""
    save_steps: int = 50
    save_total_limit: int = 3
    extra: dict[str, Any] = field(default_factory=dict)


class ConfigError(ValueError):
    """`trainer.extra` tried to set a key orch must control."""


def render(c: TrainConfigInput) -> dict[str, Any]:
    """The axolotl config as a mapping (see `dump` for the YAML text)."""
    clash = sorted(RESERVED & set(c.extra))
    if clash:
        raise ConfigError(f"trainer.extra: {', '.join(clash)} are set by orch and cannot be "
                          "overridden; remove them")
    cfg: dict[str, Any] = {
        "base_model": c.base_model_dir,
        "datasets": [_dataset(c)],
        "dataset_prepared_path": f"{c.output_dir}/prepared",
        "output_dir": c.output_dir,
        "sequence_len": c.sequence_len,
        "sample_packing": c.packing,
        "pad_to_sequence_len": c.packing,
        "micro_batch_size": c.micro_batch_size,
        "gradient_accumulation_steps": c.gradient_accumulation_steps,
        "num_epochs": c.epochs,
        "learning_rate": c.learning_rate,
        "optimizer": OPTIMIZERS[c.optimizer],
        "gradient_checkpointing": c.gradient_checkpointing,
        "bf16": "auto",
        "flash_attention": True,
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
    if c.strategy in SHARDED:
        # A relative `deepspeed:` path is looked up from the process's working directory
        # only (real-hosts.md §2), so orch uploads the JSON and names it absolutely.
        if not c.deepspeed_path.startswith("/"):
            raise ConfigError(f"strategy {c.strategy} needs the uploaded DeepSpeed config's "
                              f"absolute path (got {c.deepspeed_path!r})")
        cfg["deepspeed"] = c.deepspeed_path
    cfg.update(c.extra)
    return cfg


def _int_alpha(alpha: float) -> int:
    if float(alpha) != int(alpha):
        raise ConfigError(f"lora.alpha must be a whole number for axolotl (got {alpha})")
    return int(alpha)


def deepspeed_config(strategy: str) -> dict[str, Any] | None:
    """The DeepSpeed ZeRO-3 config uploaded for a sharded strategy (None for single/ddp).

    "auto" values are filled in by the HF Trainer from the axolotl config, so batch sizes
    are stated once. Offloading strategies move optimizer state and parameters to CPU RAM.
    """
    if strategy not in SHARDED:
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
    if strategy in ("fsdp+offload", "offload"):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
        # 8-bit and paged optimizers are not on DeepSpeed's tested list with offload.
        config["zero_allow_untested_optimizer"] = True
    config.update({
        "bf16": {"enabled": "auto"},
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
    })
    return config


def _dataset(c: TrainConfigInput) -> dict[str, Any]:
    if c.dataset_format == "alpaca":
        return {"path": c.dataset_path, "type": "alpaca"}
    return {"path": c.dataset_path, "type": "chat_template", "field_messages": "messages"}


def dump(c: TrainConfigInput) -> str:
    """The axolotl config as YAML text, keys in a stable order."""
    return yaml.safe_dump(render(c), sort_keys=False, default_flow_style=False)
