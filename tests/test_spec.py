"""Job-file loading: valid files resolve; every bad input names file, line, field and fix."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pytest

from orchestrator.core.spec import DEFAULT_TRAINER_IMAGE, SpecError, load_job

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

MINIMAL = """\
name: t
base_model: meta-llama/Llama-3.1-8B
method: qlora
dataset:
  path: train.jsonl
"""


def write(tmp_path: Path, text: str, rows: list[dict] | None = None) -> Path:
    data = tmp_path / "train.jsonl"
    rows = rows if rows is not None else [
        {"instruction": "Say hi", "input": "", "output": "hi there"},
        {"instruction": "Add 2 and 2", "input": "", "output": "4"},
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    job = tmp_path / "job.yml"
    job.write_text(text)
    return job


def problems(path: Path) -> list[str]:
    with pytest.raises(SpecError) as info:
        load_job(path)
    return info.value.problems


@pytest.mark.parametrize("name", ["qlora-8b", "qlora-70b", "lora-14b", "full-32b"])
def test_examples_load(name: str) -> None:
    path = EXAMPLES / f"{name}.yml"
    job = load_job(path)
    assert job.dataset.tokens > 0
    assert job.architecture.params > 0


def test_minimal_file_gets_documented_defaults(tmp_path: Path) -> None:
    job = load_job(write(tmp_path, MINIMAL))
    s = job.spec
    assert s.training.sequence_len == 2048
    # Memory savers are the planner's choice unless the file fixes them (docs/sizing.md).
    assert s.training.optimizer == "auto" and s.training.cross_entropy == "auto"
    assert s.training.gradient_checkpointing == "auto"
    assert s.training.activation_offloading == "auto" and s.resources.gpu_count is None
    assert s.lora.r == 16 and s.lora.modules[0] == "q_proj"
    assert s.resources.spot == "allowed" and s.resources.headroom == 0.2
    assert s.resources.gpus is None and s.resources.max_gpus == 8
    assert s.trainer.image == DEFAULT_TRAINER_IMAGE
    assert s.base_model.revision == "main"
    # Counted from the file: two rows, chars/4 plus template tokens.
    assert job.dataset.rows == 2 and "estimated" in job.dataset.source


def test_unknown_key_suggests_the_right_one(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "traning:\n  epochs: 2\n")
    assert problems(path) == [f"{path}:6 traning: unknown key; did you mean 'training'?"]


def test_nested_impossible_value_names_line_and_field(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "training:\n  epochs: 1\n  learning_rate: -1\n")
    assert problems(path) == [f"{path}:8 training.learning_rate: must be > 0 (got -1)"]


def test_all_problems_reported_at_once_sorted_by_line(tmp_path: Path) -> None:
    text = """\
name: "bad name!"
base_model: meta-llama/Llama-3.1-8B
method: qlorra
training:
  micro_batch_size: "2"
  gradient_checkpointing: maybe
dataset:
  path: train.jsonl
resources:
  spot: sometimes
  max_gpus: 9
  headroom: 1.5
lora: {r: 0, target: [q_proj, vproj]}
"""
    found = problems(write(tmp_path, text))
    lines = [int(p.split(":")[1].split()[0]) for p in found]
    assert lines == sorted(lines)
    joined = "\n".join(found)
    assert ":1 name: must be 1-64 letters" in joined
    assert ":3 method: must be one of qlora, lora, full (got 'qlorra'); did you mean 'qlora'?" \
        in joined
    assert ":5 training.micro_batch_size: must be an integer (got '2')" in joined
    assert ":6 training.gradient_checkpointing: must be auto, true or false (got 'maybe')" \
        in joined
    assert ":10 resources.spot: must be one of allowed, required, never" in joined
    assert ":11 resources.max_gpus: must be <= 8 (got 9)" in joined
    assert ":12 resources.headroom: must be <= 1 (got 1.5)" in joined
    assert ":13 lora.r: must be > 0 (got 0)" in joined
    assert "did you mean 'v_proj'?" in joined


def test_missing_required_fields(tmp_path: Path) -> None:
    path = write(tmp_path, "name: t\nmethod: lora\n")
    found = problems(path)
    assert f"{path}:1 base_model: required; add it" in found[0]
    assert any("dataset: required" in p for p in found)


def test_yaml_syntax_error_and_duplicate_keys(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "training: [unclosed\n")
    assert "not valid YAML" in problems(path)[0]
    path = write(tmp_path, MINIMAL + "method: lora\n")
    assert problems(path) == [f"{path}:6 method: duplicate key; keep only one"]


def test_top_level_must_be_mapping(tmp_path: Path) -> None:
    assert "must be a mapping" in problems(write(tmp_path, "- a\n- b\n"))[0]


def test_yaml12_exponent_floats_are_numbers(tmp_path: Path) -> None:
    job = load_job(write(tmp_path, MINIMAL + "training:\n  learning_rate: 1e-4\n"))
    assert job.spec.training.learning_rate == pytest.approx(1e-4)


def test_money_is_decimal_exactly(tmp_path: Path) -> None:
    job = load_job(write(tmp_path, MINIMAL + "resources:\n  max_price_per_hour: 0.074\n"
                                             "  max_cost: 25\n"))
    assert job.spec.resources.max_price_per_hour == Decimal("0.074")
    assert job.spec.resources.max_cost == Decimal("25")
    path = write(tmp_path, MINIMAL + "resources:\n  max_cost: -3\n")
    assert problems(path) == [f"{path}:7 resources.max_cost: must be > 0 (got -3)"]


def test_unknown_base_model_suggests_and_explains(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL.replace("Llama-3.1-8B", "Llama-3.1-8C"))
    (msg,) = problems(path)
    assert msg.startswith(f"{path}:2 base_model: unknown base model")
    assert "did you mean 'meta-llama/Llama-3.1-8B'" in msg and "config:" in msg


def test_base_model_aliases_are_case_insensitive(tmp_path: Path) -> None:
    job = load_job(write(tmp_path, MINIMAL.replace("meta-llama/Llama-3.1-8B",
                                                   "META-LLAMA/llama-3.1-8b-instruct")))
    assert job.architecture.params == 8_030_261_248


def test_base_model_from_config_json(tmp_path: Path) -> None:
    cfg = {"model_type": "qwen2", "hidden_size": 896, "num_hidden_layers": 24,
           "num_attention_heads": 14, "num_key_value_heads": 2, "intermediate_size": 4864,
           "vocab_size": 151936, "tie_word_embeddings": True}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    text = MINIMAL.replace("base_model: meta-llama/Llama-3.1-8B",
                           "base_model: {repo: me/tiny, revision: v2, config: config.json}")
    job = load_job(write(tmp_path, text))
    assert job.architecture.params == 494_032_768  # Qwen2.5-0.5B's published total
    assert job.spec.base_model.revision == "v2"


def test_config_json_missing_fields_are_named(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64}))
    text = MINIMAL.replace("base_model: meta-llama/Llama-3.1-8B",
                           "base_model:\n  repo: me/tiny\n  config: config.json")
    (msg,) = problems(write(tmp_path, text))
    assert ":4 base_model.config:" in msg
    assert "missing num_hidden_layers, num_attention_heads, intermediate_size, vocab_size" in msg


def test_inline_architecture(tmp_path: Path) -> None:
    text = MINIMAL.replace(
        "base_model: meta-llama/Llama-3.1-8B",
        "base_model:\n  repo: me/x\n  architecture: {hidden_size: 4096, num_hidden_layers: 32,"
        " num_attention_heads: 32, num_key_value_heads: 8, intermediate_size: 14336,"
        " vocab_size: 128256}")
    assert load_job(write(tmp_path, text)).architecture.params == 8_030_261_248
    bad = text.replace("hidden_size: 4096", "hiden_size: 4096")
    found = problems(write(tmp_path, bad))
    assert any("base_model.architecture.hiden_size: unknown key; did you mean 'hidden_size'?"
               in p for p in found)


def test_dataset_file_must_exist(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL.replace("train.jsonl", "missing.jsonl"))
    (msg,) = problems(path)
    assert msg.startswith(f"{path}:5 dataset.path: file not found")


def test_a_hub_dataset_without_tokens_needs_the_hubs_size(tmp_path: Path) -> None:
    # Issue 39: {hf: ...} is downloaded on the host; its size comes from `tokens:` or from
    # the Hub's published dataset information (the engine's HubSizer). Without either, the
    # file says which number to give.
    for spelled in ("{hf: tatsu-lab/alpaca}", "tatsu-lab/alpaca"):
        text = MINIMAL.replace("path: train.jsonl", f"path: {spelled}")
        path = write(tmp_path, text)
        (msg,) = problems(path)
        assert msg.startswith(f"{path}:4 dataset.tokens: tatsu-lab/alpaca (train): no size "
                              "known here"), msg
        assert "give tokens, the number of tokens in one epoch" in msg
        job = load_job(write(tmp_path, text + "  tokens: 5000000\n"))
        assert job.spec.dataset.path.hf == "tatsu-lab/alpaca"
        assert (job.dataset.tokens, job.dataset.source) == (5_000_000, "job file")


@pytest.mark.parametrize("repo", ["org/a;touch x", "org/--x", "a/b/c", "org/-x", "org/x.git",
                                  "org/x..y", "org/" + "n" * 97, "org/mödel"])
def test_invalid_repo_ids_are_refused_with_file_line_and_field(tmp_path: Path,
                                                                repo: str) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama", "hidden_size": 64,
                                  "num_hidden_layers": 2, "num_attention_heads": 4,
                                  "num_key_value_heads": 4, "intermediate_size": 128,
                                  "vocab_size": 1000}))
    # The model shape comes from the file, so only the id itself can be wrong.
    text = MINIMAL.replace("base_model: meta-llama/Llama-3.1-8B",
                           f"base_model:\n  repo: {json.dumps(repo)}\n  config: config.json")
    path = write(tmp_path, text)
    (msg,) = problems(path)
    assert msg.startswith(f"{path}:3 base_model.repo: {repo!r}"), msg
    short = write(tmp_path, MINIMAL.replace("meta-llama/Llama-3.1-8B", json.dumps(repo)))
    (msg,) = problems(short)
    assert msg.startswith(f"{short}:2 base_model.repo: {repo!r}"), msg
    data = write(tmp_path, MINIMAL.replace("path: train.jsonl",
                                           f"path: {{hf: {json.dumps(repo)}}}"))
    (msg,) = problems(data)
    assert msg.startswith(f"{data}:5 dataset.path.hf: {repo!r}"), msg


def test_dataset_rows_are_checked_with_their_line(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL, rows=[{"instruction": "a", "output": "b"}, {"prompt": "x"}])
    (msg,) = problems(path)
    assert ("train.jsonl:2: alpaca row: field 'instruction' is missing; an alpaca row is "
            "{instruction, input (optional), output}, all strings") in msg
    (tmp_path / "train.jsonl").write_text('{"instruction": "a", "output": "b"}\nnot json\n')
    assert "train.jsonl:2: not valid JSON" in problems(path)[0]


def test_chat_template_tokens_are_estimated(tmp_path: Path) -> None:
    rows = [{"messages": [{"role": "user", "content": "x" * 400},
                          {"role": "assistant", "content": "y" * 400}]}]
    job = load_job(write(tmp_path, MINIMAL + "  format: chat_template\n", rows))
    assert job.dataset.tokens == 800 // 4 + 2 * 6


def test_gpu_and_provider_names_are_checked(tmp_path: Path) -> None:
    text = MINIMAL + "resources:\n  gpus: [h100, T4]\n  providers: [clod]\n"
    found = problems(write(tmp_path, text))
    assert any(":7 resources.gpus[1]: unknown GPU 'T4'" in p for p in found)
    assert any(":8 resources.providers[0]: unknown provider 'clod'; did you mean 'cloud'?" in p
               for p in found)


def test_the_48_gb_class_is_known(tmp_path: Path) -> None:
    """Issue 20: `resources.gpus: [L40S]` was refused as an unknown GPU."""
    text = MINIMAL + "resources:\n  gpus: [L40S, RTX A6000, rtx 6000 ada, A40]\n"
    job = load_job(write(tmp_path, text))
    assert job.spec.resources.gpus == ["L40S", "RTX A6000", "rtx 6000 ada", "A40"]


def test_unpinned_trainer_image_is_refused(tmp_path: Path) -> None:
    (msg,) = problems(write(tmp_path, MINIMAL + "trainer: {image: axolotlai/axolotl}\n"))
    assert "trainer.image: pin an image tag" in msg
    latest = MINIMAL + "trainer:\n  image: axolotlai/axolotl:main-latest\n"
    (msg,) = problems(write(tmp_path, latest))
    assert "pin an image tag" in msg


def test_default_trainer_image_was_published() -> None:
    # 0.16.1-py3.12-cu130-2.12.0 never existed (real-hosts.md §1): the default must be a
    # tag of the v0.18.0 build matrix.
    assert DEFAULT_TRAINER_IMAGE == "axolotlai/axolotl:0.18.0-py3.12-cu130-2.12.0"


@pytest.mark.parametrize("image", ["axolotlai/axolotl:0.16.1-py3.12-cu130-2.12.0",
                                   "axolotlai/axolotl:0.18.0-py3.11-cu128-2.9.1",
                                   "someone/else:1.0"])
def test_unpublished_trainer_image_is_refused_listing_the_known_ones(
        tmp_path: Path, image: str) -> None:
    (msg,) = problems(write(tmp_path, MINIMAL + f"trainer:\n  image: {image}\n"))
    assert f":{len(MINIMAL.splitlines()) + 2} trainer.image: " in msg and image in msg
    assert "axolotlai/axolotl:0.18.0-py3.12-cu130-2.12.0" in msg
    assert "axolotlai/axolotl:0.18.0-py3.12-cu130-2.11.0" in msg


def test_published_cloud_image_is_accepted(tmp_path: Path) -> None:
    text = MINIMAL + "trainer:\n  image: axolotlai/axolotl-cloud:0.18.0-py3.12-cu130-2.11.0\n"
    assert load_job(write(tmp_path, text)).spec.trainer.image.endswith("2.11.0")


def test_lora_alpha_must_be_a_whole_number(tmp_path: Path) -> None:
    assert type(load_job(write(tmp_path, MINIMAL)).spec.lora.alpha) is int
    (msg,) = problems(write(tmp_path, MINIMAL + "lora: {alpha: 16.5}\n"))
    assert "lora.alpha" in msg


def test_spec_hash_is_stable_and_sensitive(tmp_path: Path) -> None:
    a = load_job(write(tmp_path, MINIMAL)).spec_hash
    assert a == load_job(write(tmp_path, MINIMAL)).spec_hash
    # Spelling a default explicitly does not change the identity.
    assert a == load_job(write(tmp_path, MINIMAL + "training: {epochs: 1}\n")).spec_hash
    assert a != load_job(write(tmp_path, MINIMAL + "training: {epochs: 2}\n")).spec_hash


@pytest.mark.parametrize(("text", "expected"), [
    ("? [a, b]\n: 1\n", ":1 (top level): keys must be plain names, not lists or mappings"),
    ("training: {{a: 1}: 2}\n", ":1 training: keys must be plain names"),
    ("d: &d {epochs: 2}\ntraining: {<<: *d}\n", ":2 training: merge keys (<<) are not supported"),
    ("name: !foo t\n", ":1 name: not a plain value"),
    ("1: 2\n", ":1 (top level): keys must be names (got 1)"),
])
def test_yaml_shapes_we_refuse_are_errors_not_tracebacks(tmp_path: Path, text: str,
                                                          expected: str) -> None:
    (msg,) = problems(write(tmp_path, text))
    assert expected in msg


def test_alias_bomb_is_refused_quickly(tmp_path: Path) -> None:
    lines = ['a: &a ["x","x","x","x","x","x","x","x","x"]']
    for prev, name in zip("abcdef", "bcdefg", strict=True):
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    (msg,) = problems(write(tmp_path, "\n".join(lines) + "\n"))
    assert "more than 100,000 values" in msg


def test_row_problems_stop_after_five_in_file_order(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL, rows=[{"bad": i} for i in range(30)])
    found = problems(path)
    assert len(found) == 6 and found[-1].endswith("stopped after 5 problems")
    assert [p.split("train.jsonl:")[1].split(":")[0] for p in found[:5]] == \
        ["1", "2", "3", "4", "5"]


def test_bom_and_blank_lines_and_crlf_are_fine(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL)
    (tmp_path / "train.jsonl").write_bytes(
        b'\xef\xbb\xbf{"instruction": "a", "output": "b"}\r\n\r\n{"instruction": "c", '
        b'"output": "d"}\r\n')
    assert load_job(path).dataset.rows == 2


def test_non_string_alpaca_fields_are_refused(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL, rows=[{"instruction": 1, "output": None}])
    assert "field 'instruction' must be a string (got int)" in problems(path)[0]


def test_eval_set_rows_are_checked(tmp_path: Path) -> None:
    (tmp_path / "eval.jsonl").write_text('{"prompt": "2+2?", "expected": "4"}\n{"q": 1}\n')
    path = write(tmp_path, MINIMAL + "eval: {eval_set: eval.jsonl}\n")
    (msg,) = problems(path)
    assert "eval.jsonl:2: an eval row needs string 'prompt' and 'expected'" in msg


def test_dataset_path_that_is_a_directory(tmp_path: Path) -> None:
    (tmp_path / "adir").mkdir()
    (msg,) = problems(write(tmp_path, MINIMAL.replace("train.jsonl", "adir")))
    assert "dataset.path: is a directory, not a file" in msg


def test_shape_hints_for_multi_shape_fields(tmp_path: Path) -> None:
    text = "name: t\nbase_model: 8\nmethod: qlora\ndataset: {path: 5}\n"
    found = problems(write(tmp_path, text))
    assert "base_model: must be a repo id such as meta-llama/Llama-3.1-8B" in found[0]
    assert "dataset.path: must be a JSONL file path" in found[1]


def test_gpu_lists_accept_numbers_and_refuse_empty(tmp_path: Path) -> None:
    job = load_job(write(tmp_path, MINIMAL + "resources: {gpus: 3090}\n"))
    assert job.spec.resources.gpus == ["3090"]
    (msg,) = problems(write(tmp_path, MINIMAL + "resources: {gpus: []}\n"))
    assert "resources.gpus: must name at least one, or be any" in msg


def test_inline_architecture_error_names_the_field(tmp_path: Path) -> None:
    text = MINIMAL.replace(
        "base_model: meta-llama/Llama-3.1-8B",
        "base_model: {repo: x/y, architecture: {hidden_size: 100, num_hidden_layers: 2, "
        "num_attention_heads: 3, intermediate_size: 10, vocab_size: 10}}")
    path = write(tmp_path, text)
    assert problems(path) == [f"{path}:2 base_model.architecture: hidden_size must be divisible "
                              "by num_attention_heads, or give head_dim"]


def test_lora_section_with_full_method_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL.replace("method: qlora", "method: full") + "lora: {r: 8}\n")
    assert problems(path) == [f"{path}:6 lora: only used by method qlora or lora; remove it "
                              "for a full fine-tune"]


# --- issue 36 §6: every problem at once, GPU look-alikes, paths orch does not fetch ----------


def test_file_problems_come_with_the_schema_problems(tmp_path: Path) -> None:
    """A missing dataset was reported only once the schema's problems had been fixed."""
    text = (MINIMAL.replace("train.jsonl", "missing.jsonl")
            + "  format: alpaca\ntraining: {learning_rate: -1}\neval: {eval_set: gone.jsonl}\n")
    path = write(tmp_path, text)
    found = problems(path)
    assert [p.split(": ")[0] for p in found] == [
        f"{path}:5 dataset.path", f"{path}:7 training.learning_rate", f"{path}:8 eval.eval_set"]
    assert "file not found" in found[0] and "file not found" in found[2]
    # Rows are checked too, in the format the file names.
    (tmp_path / "rows.jsonl").write_text('{"prompt": "x"}\n')
    rows = write(tmp_path, MINIMAL.replace("train.jsonl", "rows.jsonl")
                 + "  format: alpaca\nmethod2: x\n")
    found = problems(rows)
    assert any("rows.jsonl:1: alpaca row: field 'instruction' is missing" in p
               for p in found), found
    assert any("method2: unknown key" in p for p in found), found


@pytest.mark.parametrize(("given", "meant"), [
    ("H100s", "H100"), ("Nvidia H100", "H100"), ("h100-sxm6", "H100 SXM"),
    ("A100-80G", "A100 80GB"), ("L40SS", "L40S"), ("RTX4090ti", "RTX 4090"), ("B200x", "B200")])
def test_an_unknown_gpu_gets_the_nearest_known_name(tmp_path: Path, given: str,
                                                    meant: str) -> None:
    path = write(tmp_path, MINIMAL + f"resources:\n  gpus: [{given!r}]\n")
    (msg,) = problems(path)
    assert f"unknown GPU {given!r}; did you mean {meant!r}?" in msg, msg
    # Also when the schema refuses something else in the file.
    found = problems(write(tmp_path, MINIMAL + f"resources:\n  gpus: [{given!r}]\n"
                                               "  spot: maybe\n"))
    assert len(found) == 2 and any(f"did you mean {meant!r}?" in p for p in found), found


def test_an_unknown_model_number_gets_no_look_alike(tmp_path: Path) -> None:
    (msg,) = problems(write(tmp_path, MINIMAL + "resources:\n  gpus: [V100]\n"))
    assert "unknown GPU 'V100'; known:" in msg, msg


@pytest.mark.parametrize("where", ["dataset", "eval"])
@pytest.mark.parametrize("url", ["s3://bucket/train.jsonl", "gs://b/t.jsonl",
                                 "https://example.com/t.jsonl"])
def test_a_url_is_said_to_be_one(tmp_path: Path, where: str, url: str) -> None:
    text = (MINIMAL.replace("path: train.jsonl", f"path: {url}") if where == "dataset"
            else MINIMAL + f"eval: {{eval_set: {url!r}}}\n")
    (msg,) = problems(write(tmp_path, text))
    scheme = url.split(":")[0]
    assert f"{url!r} is a URL ({scheme}://); orch reads a local JSONL file" in msg, msg
    assert "file not found" not in msg and "s3:/b" not in msg


def test_a_hub_id_as_the_path_is_a_hub_dataset_unless_a_file_has_that_name(
        tmp_path: Path) -> None:
    text = MINIMAL.replace("path: train.jsonl", "path: tatsu-lab/alpaca\n  tokens: 1000")
    job = load_job(write(tmp_path, text))
    assert job.spec.dataset.path.hf == "tatsu-lab/alpaca"
    # Both a file here and a Hub id: the file says which to write.
    (tmp_path / "tatsu-lab").mkdir()
    (tmp_path / "tatsu-lab" / "alpaca").write_text('{"instruction": "a", "output": "b"}\n')
    (msg,) = problems(write(tmp_path, text))
    assert msg.endswith("dataset.path: 'tatsu-lab/alpaca' is both a file here "
                        f"({tmp_path / 'tatsu-lab/alpaca'}) and a Hugging Face dataset id: "
                        "write ./tatsu-lab/alpaca for the file or {hf: tatsu-lab/alpaca} for "
                        "the Hub dataset"), msg
    local = load_job(write(tmp_path, text.replace("path: tatsu-lab", "path: ./tatsu-lab")))
    assert local.spec.dataset.path.local == "./tatsu-lab/alpaca"
    # A missing file with a data file's name is just missing.
    (msg,) = problems(write(tmp_path, MINIMAL.replace("train.jsonl", "data/x.jsonl")))
    assert "download it first" not in msg and "file not found" in msg
    # An eval set is read here: a Hub id there still says how to download it.
    (msg,) = problems(write(tmp_path, MINIMAL + "eval: {eval_set: tatsu-lab/alpaca-eval}\n"))
    assert ("download it first with `hf download --repo-type dataset tatsu-lab/alpaca-eval "
            "--local-dir data/alpaca-eval`") in msg
