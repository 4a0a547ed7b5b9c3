"""Issue 39 §Datasets: the row formats axolotl takes, several datasets, an eval split, Hub
datasets in the job file, each checked against the rows (local files) and rendered to keys
that pass axolotl 0.18.0's own schema (playbooks/data/axolotl_schema.json)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core import hubsize
from orchestrator.core.datafiles import DatasetSize
from orchestrator.core.hubsize import HubDatasetRef, HubSizeError
from orchestrator.core.spec import JobSpec, SpecError, load_job, spec_hash
from playbooks import axolotl_schema
from playbooks.axolotl import ConfigError, TrainConfigInput, extra_clash, render
from playbooks.axolotl_data import DatasetEntry, TrackerKeys

HEAD = "name: t\nbase_model: meta-llama/Llama-3.1-8B\nmethod: qlora\n"

ROWS: dict[str, list[dict[str, Any]]] = {
    "alpaca": [{"instruction": "Say hi", "input": "", "output": "hi"}],
    "chat_template": [{"messages": [{"role": "user", "content": "2+2?"},
                                    {"role": "assistant", "content": "4"}]}],
    "completion": [{"text": "Once upon a time there was a GPU."}],
    "input_output": [{"segments": [{"label": False, "text": "Q: 2+2?\n"},
                                   {"label": True, "text": "A: 4</s>"}]}],
}


def write(tmp_path: Path, job: str, files: dict[str, list[Any]]) -> Path:
    for name, rows in files.items():
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = tmp_path / "job.yml"
    path.write_text(HEAD + job)
    return path


def problems(path: Path, **kw: Any) -> list[str]:
    with pytest.raises(SpecError) as info:
        load_job(path, **kw)
    return info.value.problems


@pytest.mark.parametrize("fmt", list(ROWS))
def test_each_format_loads_and_is_estimated_from_its_rows(tmp_path: Path, fmt: str) -> None:
    job = load_job(write(tmp_path, f"dataset: {{path: d.jsonl, format: {fmt}}}\n",
                         {"d.jsonl": ROWS[fmt] * 3}))
    assert job.dataset.rows == 3 and job.dataset.tokens > 0
    assert job.dataset.source.startswith("estimated from ")


# (format, a bad row, the words that name the field and what to do)
BAD_ROWS = [
    ("alpaca", {"instruction": "x"}, "alpaca row: field 'output' is missing"),
    ("alpaca", {"instruction": "x", "output": 3}, "field 'output' must be a string (got int)"),
    ("chat_template", {"conversations": [{"from": "human", "value": "hi"}]},
     "chat_template row: field 'messages' is missing; ShareGPT rows: set dataset.fields: "
     "{messages: conversations, role: from, content: value}"),
    ("chat_template", {"messages": [{"role": "user"}]},
     "'messages'[0].content is missing; set dataset.fields.content to the messages' own key"),
    ("chat_template", {"messages": []}, "field 'messages' must be a non-empty list"),
    ("completion", {"body": "x"},
     "completion row: field 'text' is missing (completion rows hold raw text); set "
     "dataset.fields.text to its column"),
    ("input_output", {"segments": [{"text": "x"}]},
     "input_output row: field 'segments'[0] must be {label: true|false, text: string}"),
    ("input_output", {"input": "a", "output": "b"}, "field 'segments' is missing"),
]


@pytest.mark.parametrize(("fmt", "row", "words"), BAD_ROWS)
def test_the_first_bad_row_is_named_with_its_line_and_field(
        tmp_path: Path, fmt: str, row: dict[str, Any], words: str) -> None:
    path = write(tmp_path, f"dataset: {{path: d.jsonl, format: {fmt}}}\n",
                 {"d.jsonl": [*ROWS[fmt], *ROWS[fmt], row]})
    (msg,) = problems(path)
    assert msg.startswith(f"{tmp_path / 'd.jsonl'}:3: "), msg
    assert words in msg, msg


def test_field_mappings_read_sharegpt_and_other_columns(tmp_path: Path) -> None:
    share = [{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt",
                                                                  "value": "hello"}]}]
    job = load_job(write(tmp_path, "dataset:\n  path: s.jsonl\n  format: chat_template\n"
                                   "  fields: {messages: conversations, role: from, content: "
                                   "value}\n", {"s.jsonl": share}))
    assert job.dataset.rows == 1
    job = load_job(write(tmp_path, "dataset: {path: c.jsonl, format: completion, fields: "
                                   "{text: body}}\n", {"c.jsonl": [{"body": "raw text"}]}))
    assert job.dataset.rows == 1
    # A field the format does not read is refused at its line.
    (msg,) = problems(write(tmp_path, "dataset:\n  path: c.jsonl\n  format: alpaca\n"
                                      "  fields: {text: body}\n", {}))
    assert "fields.text is not read by format alpaca (its fields: none)" in msg, msg


def test_several_datasets_add_up_and_each_is_checked(tmp_path: Path) -> None:
    files = {"a.jsonl": ROWS["alpaca"] * 2, "c.jsonl": ROWS["chat_template"]}
    job = load_job(write(tmp_path, "datasets:\n  - {path: a.jsonl}\n"
                                   "  - {path: c.jsonl, format: chat_template}\n", files))
    one = load_job(write(tmp_path, "dataset: {path: a.jsonl}\n", files)).dataset
    assert job.dataset.tokens > one.tokens and job.dataset.rows == 3
    assert job.spec.dataset == job.spec.all_datasets[0]  # the single form's view
    assert len(job.spec.all_datasets) == 2
    bad = write(tmp_path, "datasets:\n  - {path: a.jsonl}\n  - {path: c.jsonl}\n", files)
    (msg,) = problems(bad)
    assert "c.jsonl:1: alpaca row: field 'instruction' is missing" in msg
    # A missing second file names its place in the list.
    (msg,) = problems(write(tmp_path, "datasets:\n  - a.jsonl\n  - gone.jsonl\n", files))
    assert msg.startswith(f"{tmp_path / 'job.yml'}:6 datasets[1].path: file not found"), msg


def test_one_of_dataset_and_datasets(tmp_path: Path) -> None:
    files = {"a.jsonl": ROWS["alpaca"]}
    found = problems(write(tmp_path, "training: {epochs: -1}\n", files))
    assert any("dataset: required" in p for p in found), found
    assert any("training.epochs" in p for p in found), found  # reported together
    found = problems(write(tmp_path, "dataset: {path: a.jsonl}\ndatasets: [{path: x.jsonl}]\n",
                           files))
    assert any("give dataset (one) or datasets (several), not both" in p for p in found)


def test_a_recorded_datasets_spec_validates_again() -> None:
    spec = JobSpec.model_validate({"name": "j", "base_model": "Qwen/Qwen2.5-0.5B",
                                   "method": "lora", "datasets": [{"path": "a.jsonl"},
                                                                  {"path": "b.jsonl"}]})
    again = JobSpec.model_validate_json(spec.model_dump_json())
    assert again == spec and spec_hash(again) == spec_hash(spec)


def test_new_keys_enter_the_spec_hash_only_when_set() -> None:
    base = {"name": "j", "base_model": "Qwen/Qwen2.5-0.5B", "method": "lora",
            "dataset": {"path": "d.jsonl"}}
    plain = spec_hash(JobSpec.model_validate(base))
    spelled = {**base, "dataset": {"path": {"local": "d.jsonl", "split": "train",
                                            "revision": "main"}, "fields": None},
               "training": {"val_set_size": None}}
    assert spec_hash(JobSpec.model_validate(spelled)) == plain
    # Where the run is logged and who is told change nothing the job produces.
    told = {**base, "tracking": {"wandb": {"project": "p"}},
            "notify": {"url": "https://example.com/hook"}}
    assert spec_hash(JobSpec.model_validate(told)) == plain
    held = {**base, "training": {"val_set_size": 0.1}}
    assert spec_hash(JobSpec.model_validate(held)) != plain


def test_hub_datasets_in_the_job_file(tmp_path: Path) -> None:
    text = ("dataset:\n  path: {hf: org/chat, split: train_sft, revision: v2, subset: en}\n"
            "  format: chat_template\n  validation_split: test_sft\n  tokens: 1000\n")
    job = load_job(write(tmp_path, text, {}))
    p = job.spec.dataset.path
    assert (p.hf, p.split, p.revision, p.subset) == ("org/chat", "train_sft", "v2", "en")
    # Hub-only keys on a local file, and a bad Hub id, are refused at their line.
    (msg,) = problems(write(tmp_path, "dataset: {path: {local: a.jsonl, revision: v2}}\n",
                            {"a.jsonl": ROWS["alpaca"]}))
    assert "revision: only for a Hugging Face dataset (hf:)" in msg, msg
    (msg,) = problems(write(tmp_path, "dataset: {path: {hf: 'org/a;b'}, tokens: 5}\n", {}))
    assert "dataset.path.hf: 'org/a;b' is not a repo id" in msg, msg
    (msg,) = problems(write(tmp_path, "dataset: {path: d.jsonl, validation_split: test}\n",
                            {"d.jsonl": ROWS["alpaca"]}))
    assert "validation_split: only for a Hugging Face dataset" in msg, msg


def test_the_hubs_size_is_the_estimate_and_names_its_source(tmp_path: Path) -> None:
    asked: list[HubDatasetRef] = []

    def sizer(ref: HubDatasetRef) -> DatasetSize | None:
        asked.append(ref)
        card = {"dataset_info": {"splits": [{"name": "train", "num_bytes": 44_400_000,
                                             "num_examples": 52_002}]}}
        return hubsize.from_card(card, ref)

    job = load_job(write(tmp_path, "dataset: tatsu-lab/alpaca\n", {}), hub_size=sizer)
    assert asked == [HubDatasetRef("tatsu-lab/alpaca")]
    assert job.dataset.source == ("Hub dataset info: 52,002 rows, 44.4 MB in split train of "
                                  "tatsu-lab/alpaca")
    assert job.dataset.tokens == 44_400_000 // 4 + 52_002 * 24 and job.dataset.rows == 52_002
    # A split the Hub does not list is refused at the field, with the ones it has.
    (msg,) = problems(write(tmp_path, "dataset: {path: {hf: tatsu-lab/alpaca, split: test}}\n",
                            {}), hub_size=sizer)
    assert msg.endswith("dataset.path.split: tatsu-lab/alpaca has no split 'test' (it has "
                        "train)"), msg


def test_val_set_size_is_held_out_and_not_with_a_validation_split(tmp_path: Path) -> None:
    files = {"a.jsonl": ROWS["alpaca"] * 10}
    whole = load_job(write(tmp_path, "dataset: a.jsonl\n", files)).dataset
    held = load_job(write(tmp_path, "dataset: a.jsonl\ntraining: {val_set_size: 0.1}\n",
                          files)).dataset
    assert held.tokens == round(whole.tokens * 0.9)
    assert held.source.endswith("less 0.1 held out (val_set_size)")
    (msg,) = problems(write(tmp_path, "dataset: {path: {hf: o/d}, validation_split: test, "
                                      "tokens: 9}\ntraining: {val_set_size: 0.1}\n", files))
    assert "training.val_set_size and a dataset's validation_split both pick" in msg


# --- hubsize: the Hub's published sizes ------------------------------------------------------

# The dataset viewer's documented /size answer (https://huggingface.co/docs/dataset-viewer/
# size, ibm/duorc), cut to two splits.
VIEWER = {"size": {"dataset": {"dataset": "ibm/duorc", "num_rows": 187213},
                   "splits": [{"dataset": "ibm/duorc", "config": "ParaphraseRC",
                               "split": "train", "num_bytes_parquet_files": 26005668,
                               "num_bytes_memory": 496682909, "num_rows": 69524,
                               "num_columns": 7},
                              {"dataset": "ibm/duorc", "config": "SelfRC", "split": "train",
                               "num_bytes_parquet_files": 14851720,
                               "num_bytes_memory": 239852729, "num_rows": 60721,
                               "num_columns": 7}]}, "pending": [], "failed": [],
           "partial": False}


def test_viewer_sizes_need_the_subset_when_there_are_several() -> None:
    ref = HubDatasetRef("ibm/duorc", format="completion")
    with pytest.raises(HubSizeError) as info:
        hubsize.from_viewer(VIEWER, ref)
    assert info.value.key == "subset"
    assert str(info.value) == ("ibm/duorc has subsets ParaphraseRC, SelfRC; name the one to "
                               "train on")
    size = hubsize.from_viewer(VIEWER, HubDatasetRef("ibm/duorc", subset="SelfRC",
                                                     format="completion"))
    assert size is not None and size.rows == 60721 and size.tokens == round(239852729 / 4)
    assert size.source == ("Hub dataset viewer: 60,721 rows, 239.9 MB in split train of "
                           "subset SelfRC of ibm/duorc")
    assert hubsize.from_viewer({"error": "not ready"}, ref) is None


def test_card_sizes_by_config_name() -> None:
    card = {"dataset_info": [
        {"config_name": "en", "splits": [{"name": "train", "num_bytes": 32088854,
                                          "num_examples": 51942}]},
        {"config_name": "pt", "splits": [{"name": "train", "num_bytes": 1, "num_examples": 1}]}]}
    size = hubsize.from_card(card, HubDatasetRef("HiTZ/alpaca_mt", subset="en"))
    assert size is not None and size.rows == 51942
    with pytest.raises(HubSizeError, match="has no subset 'de' \\(it has en, pt\\)"):
        hubsize.from_card(card, HubDatasetRef("HiTZ/alpaca_mt", subset="de"))
    assert hubsize.from_card({"license": "cc-by-4.0"}, HubDatasetRef("tatsu-lab/alpaca")) is None


# --- rendering: axolotl's own keys -----------------------------------------------------------

def _config(**kw: Any) -> dict[str, Any]:
    return render(TrainConfigInput(method="qlora", base_model_dir="/w/models/m",
                                   dataset_path="/w/data/d.jsonl", dataset_format="alpaca",
                                   output_dir="/w/out", **kw))


def test_every_format_renders_to_keys_axolotl_accepts() -> None:
    entries = (
        DatasetEntry("/w/data/a.jsonl", "alpaca"),
        DatasetEntry("/w/hf/org--chat/main", "chat_template", split="train_sft", subset="en",
                     messages_field="conversations", role_key="from", content_key="value"),
        DatasetEntry("/w/data/c.jsonl", "completion", text_field="body"),
        DatasetEntry("/w/data/s.jsonl", "input_output"),
    )
    cfg = _config(datasets=entries, test_datasets=(
        DatasetEntry("/w/hf/org--chat/main", "chat_template", split="test_sft", subset="en"),))
    assert cfg["datasets"] == [
        {"path": "/w/data/a.jsonl", "type": "alpaca"},
        {"path": "/w/hf/org--chat/main", "type": "chat_template", "split": "train_sft",
         "name": "en", "field_messages": "conversations",
         "message_property_mappings": {"role": "from", "content": "value"}},
        {"path": "/w/data/c.jsonl", "type": "completion", "field": "body"},
        {"path": "/w/data/s.jsonl", "type": "input_output"},
    ]
    assert cfg["test_datasets"][0]["split"] == "test_sft"
    assert axolotl_schema.problems(cfg) == []


def test_val_set_size_and_trackers_render_and_pass_the_schema() -> None:
    tracking = TrackerKeys(wandb_project="p", wandb_entity="team", wandb_name="job-a",
                           wandb_run_id="j-1", mlflow_tracking_uri="https://mlflow.example.com",
                           mlflow_experiment_name="e", mlflow_run_name="job-a")
    cfg = _config(val_set_size=0.05, tracking=tracking)
    assert cfg["val_set_size"] == 0.05
    assert {k: cfg[k] for k in ("use_wandb", "wandb_project", "wandb_run_id", "use_mlflow",
                                "mlflow_tracking_uri")} == {
        "use_wandb": True, "wandb_project": "p", "wandb_run_id": "j-1", "use_mlflow": True,
        "mlflow_tracking_uri": "https://mlflow.example.com"}
    assert axolotl_schema.problems(cfg) == []
    with pytest.raises(ConfigError, match="non-zero val_set_size should not be used with "
                                          "test_datasets"):
        _config(val_set_size=0.05, test_datasets=(DatasetEntry("/w/x", split="test"),))


def test_trainer_extra_cannot_set_what_datasets_and_tracking_own() -> None:
    assert "set tracking.wandb.project instead" in (extra_clash("wandb_project") or "")
    assert "set training.val_set_size instead" in (extra_clash("val_set_size") or "")
    assert "set by orch" in (extra_clash("test_datasets") or "")
