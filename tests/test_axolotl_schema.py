"""Every axolotl config orch can render, checked against axolotl's own schema (0.18.0).

The schema file is extracted from axolotl's sdist by scripts/axolotl_schema.py (parsed, not
imported); here every method x strategy x option is rendered and each key and value checked.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.cli.render import render_job
from playbooks import axolotl_schema, images
from playbooks.axolotl import DEEPSPEED, OPTIMIZERS, ConfigError, TrainConfigInput, render

ROOT = Path(__file__).resolve().parents[1]
DS = "/workspace/data/jobs/j/deepspeed.json"


def config(method: str, strategy: str, **kw: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "method": method, "base_model_dir": "/workspace/data/models/m/main",
        "dataset_path": "/workspace/data/jobs/j/data/train.jsonl", "dataset_format": "alpaca",
        "output_dir": "/workspace/data/jobs/j/output", "strategy": strategy,
        "deepspeed_path": DS if strategy in DEEPSPEED else "", **kw}
    return render(TrainConfigInput(**fields))


def test_schema_file_is_for_the_pinned_image_and_names_its_source() -> None:
    doc = axolotl_schema.schema()
    assert doc["axolotl_version"] == images.catalog().version == "0.18.0"
    assert doc["sdist"] == "axolotl-0.18.0.tar.gz" and len(doc["sha256"]) == 64
    assert "src/axolotl/utils/schemas/config.py" in doc["source_files"]
    assert "src/axolotl/integrations/liger/args.py" in doc["source_files"]
    assert doc["fields"]["lora_alpha"] == ["int", "null"]


OPTIONS: list[dict[str, Any]] = [
    {},
    {"dataset_format": "chat_template"},
    {"lora_target": ("q_proj", "k_proj", "v_proj", "o_proj")},
    {"gradient_checkpointing": False},
    {"packing": False},
    {"lora_alpha": 64, "lora_r": 32, "lora_dropout": 0.0},
    {"epochs": 2.5, "learning_rate": 1e-5, "sequence_len": 8192},
    *({"optimizer": name} for name in OPTIMIZERS),
]


@pytest.mark.parametrize(("method", "strategy"), list(itertools.product(
    ["qlora", "lora", "full"],
    ["single", "ddp", "zero3", "zero3_offload", "fsdp2", "fsdp2_offload"])))
def test_every_rendered_variant_fits_axolotls_schema(method: str, strategy: str) -> None:
    for option in OPTIONS:
        if "offload" in strategy:
            # bitsandbytes steps 8-bit state on the GPU only: offloaded layouts run adamw,
            # and an 8-bit optimizer with them is refused, never rendered.
            if "8bit" in str(option.get("optimizer", "")):
                with pytest.raises(ConfigError, match="cannot run with its state offloaded"):
                    config(method, strategy, **option)
                continue
            option = {"optimizer": "adamw", **option}
        cfg = config(method, strategy, **option)
        assert axolotl_schema.problems(cfg) == [], (method, strategy, option)


@pytest.mark.parametrize("example", [p for p in sorted((ROOT / "examples").glob("*.yml"))
                                     if "grid" not in (yaml.safe_load(p.read_text()) or {})],
                         ids=lambda p: p.name)
@pytest.mark.parametrize("host", images.HOST_KINDS)
def test_every_example_job_renders_to_a_valid_config(example: Path, host: str,
                                                     tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    monkeypatch.delenv("ORCH_DB_URL", raising=False)
    rendered = render_job(example, host)
    assert axolotl_schema.problems(rendered.axolotl_config) == []


def test_checker_catches_what_axolotl_rejects() -> None:
    cfg = config("qlora", "single")
    bad = {**cfg, "lora_alpha": 32.0, "learning_rte": 1e-4, "bf16": "yes",
           "datasets": [{"path": "/d", "type": "alpaca", "fields_messages": "m"}],
           "dynamic_checkpoint": {"enabled": "true"}, "liger_rope": True}
    found = axolotl_schema.problems(bad)
    assert any(p.startswith("lora_alpha: 32.0 (float)") for p in found)
    assert "learning_rte: not an axolotl 0.18.0 config key" in found
    assert any(p.startswith("bf16: 'yes'") for p in found)
    assert "datasets[0].fields_messages: not a field of axolotl's SFTDataset" in found
    assert any(p.startswith("dynamic_checkpoint.enabled: 'true'") for p in found)
    assert "liger_rope: needs plugins: [axolotl.integrations.liger.LigerPlugin]" in found
    assert len(found) == 6, json.dumps(found, indent=1)


def test_plugin_keys_are_checked_once_the_plugin_is_listed() -> None:
    # Memory savers another module may add (real-hosts.md §3): checked like any other key.
    cfg = {**config("lora", "single"),
           "plugins": ["axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin",
                       "axolotl.integrations.liger.LigerPlugin"],
           "cut_cross_entropy": True, "liger_rms_norm": True, "liger_glu_activation": True}
    assert axolotl_schema.problems(cfg) == []
    assert axolotl_schema.problems({**cfg, "liger_rms_norm": "on"})


def test_fsdp2_renders_axolotls_own_keys() -> None:
    for method in ("qlora", "lora", "full"):
        cfg = config(method, "fsdp2", optimizer="adamw_8bit")
        assert cfg["fsdp_version"] == 2 and "deepspeed" not in cfg
        assert cfg["fsdp_config"]["offload_params"] is False
        assert cfg["fsdp_config"]["auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"
        # Rank 0 loads, the others get the shards; QLoRA too, as axolotl's FSDP + QLoRA
        # examples set it (examples/llama-3/qlora-fsdp-70b.yaml:65 at v0.18.0).
        assert cfg["fsdp_config"]["cpu_ram_efficient_loading"] is True, method
        # bitsandbytes' 8-bit AdamW is refused by axolotl under FSDP2: torchao's instead.
        assert cfg["optimizer"] == "adamw_torch_8bit"
        assert axolotl_schema.problems(cfg) == [], method
    offload = config("full", "fsdp2_offload", optimizer="adamw")
    assert offload["fsdp_config"]["offload_params"] is True
    assert offload["optimizer"] == "adamw_torch_fused"


def test_the_schema_check_refuses_what_axolotls_validators_refuse() -> None:
    base = config("lora", "fsdp2")
    assert axolotl_schema.problems({**base, "optimizer": "adamw_bnb_8bit"}) == [
        "optimizer: FSDP2 not compatible with adamw_bnb_8bit, use `adamw_torch_8bit` instead"]
    offload = config("full", "fsdp2_offload", optimizer="adamw")
    assert "8bit optimizers do not work with FSDP2 offload" in " ".join(
        axolotl_schema.problems({**offload, "optimizer": "adamw_torch_8bit"}))
    assert axolotl_schema.problems({**base, "deepspeed": DS}) == [
        "deepspeed: deepspeed and fsdp cannot be used together."]
