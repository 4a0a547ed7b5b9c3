"""The rendered axolotl config: method keys, multi-GPU sections, extra passthrough."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from playbooks.axolotl import ConfigError, TrainConfigInput, deepspeed_config, dump, render


def job(method: str, **kw: Any) -> TrainConfigInput:
    fields: dict[str, Any] = {
        "base_model_dir": "/workspace/models/llama", "dataset_path": "/workspace/data/t.jsonl",
        "dataset_format": "alpaca", "output_dir": "/workspace/data/jobs/j-1/out", **kw}
    return TrainConfigInput(method=method, **fields)  # type: ignore[arg-type]


def test_qlora_keys() -> None:
    cfg = render(job("qlora"))
    assert cfg["adapter"] == "qlora" and cfg["load_in_4bit"] is True
    assert cfg["lora_target_linear"] is True and cfg["lora_r"] == 16
    assert cfg["optimizer"] == "adamw_bnb_8bit"
    assert cfg["datasets"] == [{"path": "/workspace/data/t.jsonl", "type": "alpaca"}]
    assert cfg["auto_resume_from_checkpoints"] is True
    assert "deepspeed" not in cfg


def test_attention_is_sdpa_not_the_deprecated_flash_flag() -> None:
    """axolotl 0.18.0 deprecates `flash_attention` and its images have no flash-attn."""
    cfg = render(job("qlora"))
    assert cfg["attn_implementation"] == "sdpa" and "flash_attention" not in cfg
    with pytest.raises(ConfigError, match="attn_implementation: flash_attention_2 instead"):
        render(job("qlora", extra={"flash_attention": True}))
    assert render(job("qlora", extra={"attn_implementation": "eager"}))[
        "attn_implementation"] == "eager"


def test_lora_without_4bit_and_module_list() -> None:
    cfg = render(job("lora", lora_target=("q_proj", "v_proj")))
    assert cfg["adapter"] == "lora" and "load_in_4bit" not in cfg
    assert cfg["lora_target_modules"] == ["q_proj", "v_proj"]
    assert "lora_target_linear" not in cfg


def test_full_multi_gpu_gets_zero3_and_no_adapter() -> None:
    cfg = render(job("full", strategy="zero3", optimizer="adamw",
                     deepspeed_path="/workspace/data/jobs/j-1/deepspeed.json"))
    assert "adapter" not in cfg and cfg["deepspeed"] == "/workspace/data/jobs/j-1/deepspeed.json"
    assert cfg["optimizer"] == "adamw_torch_fused"


@pytest.mark.parametrize("strategy", ["zero3", "zero3_offload"])
def test_sharded_config_never_names_a_relative_deepspeed_path(strategy: str) -> None:
    # A relative path resolves from the process's working directory only (real-hosts §2).
    with pytest.raises(ConfigError, match="absolute path"):
        render(job("full", strategy=strategy))
    with pytest.raises(ConfigError, match="absolute path"):
        render(job("full", strategy=strategy, deepspeed_path="deepspeed_configs/zero3.json"))
    zero = deepspeed_config(strategy)
    assert zero is not None and zero["zero_optimization"]["stage"] == 3
    assert ("offload_param" in zero["zero_optimization"]) == ("offload" in strategy)


def test_single_and_ddp_need_no_deepspeed() -> None:
    assert deepspeed_config("single") is None and deepspeed_config("ddp") is None
    assert "deepspeed" not in render(job("lora", strategy="ddp"))


def test_lora_alpha_is_an_int_for_axolotl() -> None:
    # axolotl's schema types lora_alpha as int; the job spec once gave it as 32.0.
    cfg = render(job("qlora", lora_alpha=32.0))
    assert cfg["lora_alpha"] == 32 and type(cfg["lora_alpha"]) is int
    assert "lora_alpha: 32\n" in dump(job("qlora", lora_alpha=32.0))
    with pytest.raises(ConfigError, match="whole number"):
        render(job("qlora", lora_alpha=16.5))


def test_chat_template_dataset() -> None:
    cfg = render(job("lora", dataset_format="chat_template"))
    assert cfg["datasets"][0]["type"] == "chat_template"


def test_extra_passes_through_but_cannot_override_reserved_keys() -> None:
    cfg = render(job("qlora", extra={"warmup_steps": 10, "lr_scheduler": "cosine"}))
    assert cfg["warmup_steps"] == 10 and cfg["lr_scheduler"] == "cosine"
    with pytest.raises(ConfigError, match="output_dir.*cannot be overridden"):
        render(job("qlora", extra={"output_dir": "/tmp/x"}))


def test_dump_is_yaml_that_round_trips() -> None:
    c = job("qlora")
    assert yaml.safe_load(dump(c)) == render(c)


@pytest.mark.parametrize("strategy", ["zero3_offload"])
def test_offload_config_lets_deepspeed_take_the_trainers_optimizer(strategy: str) -> None:
    # DeepSpeed's _configure_optimizer raises ZeRORuntimeException for a client optimizer
    # under ZeRO-Offload unless zero_force_ds_cpu_optimizer is false (runtime/engine.py).
    zero = deepspeed_config(strategy)
    assert zero is not None and zero["zero_force_ds_cpu_optimizer"] is False
    assert "zero_force_ds_cpu_optimizer" not in (deepspeed_config("zero3") or {})


@pytest.mark.parametrize("optimizer", ["adamw_8bit", "paged_adamw_8bit"])
@pytest.mark.parametrize("strategy", ["zero3_offload", "fsdp2_offload"])
def test_eight_bit_optimizer_is_never_rendered_with_offload(optimizer: str, strategy: str
                                                            ) -> None:
    # bitsandbytes 0.49.1 has no CPU kernel for 8-bit state: refused before renting.
    with pytest.raises(ConfigError, match="cannot run with its state offloaded"):
        render(job("full", strategy=strategy, optimizer=optimizer,
                   deepspeed_path="/workspace/data/jobs/j-1/deepspeed.json"))
    cfg = render(job("full", strategy=strategy, optimizer="adamw",
                     deepspeed_path="/workspace/data/jobs/j-1/deepspeed.json"))
    assert cfg["optimizer"] == "adamw_torch_fused"
