"""The rendered axolotl config: method keys, multi-GPU sections, extra passthrough."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from playbooks.axolotl import ZERO3, ConfigError, TrainConfigInput, dump, render


def job(method: str, **kw: Any) -> TrainConfigInput:
    fields: dict[str, Any] = {
        "base_model_dir": "/workspace/models/llama", "dataset_path": "/workspace/data/t.jsonl",
        "dataset_format": "alpaca", "output_dir": "/workspace/jobs/j-1/out", **kw}
    return TrainConfigInput(method=method, **fields)  # type: ignore[arg-type]


def test_qlora_keys() -> None:
    cfg = render(job("qlora"))
    assert cfg["adapter"] == "qlora" and cfg["load_in_4bit"] is True
    assert cfg["lora_target_linear"] is True and cfg["lora_r"] == 16
    assert cfg["optimizer"] == "adamw_bnb_8bit"
    assert cfg["datasets"] == [{"path": "/workspace/data/t.jsonl", "type": "alpaca"}]
    assert cfg["auto_resume_from_checkpoints"] is True
    assert "deepspeed" not in cfg


def test_lora_without_4bit_and_module_list() -> None:
    cfg = render(job("lora", lora_target=("q_proj", "v_proj")))
    assert cfg["adapter"] == "lora" and "load_in_4bit" not in cfg
    assert cfg["lora_target_modules"] == ["q_proj", "v_proj"]
    assert "lora_target_linear" not in cfg


def test_full_multi_gpu_gets_zero3_and_no_adapter() -> None:
    cfg = render(job("full", strategy="fsdp", optimizer="adamw"))
    assert "adapter" not in cfg and cfg["deepspeed"] == ZERO3
    assert cfg["optimizer"] == "adamw_torch_fused"


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
