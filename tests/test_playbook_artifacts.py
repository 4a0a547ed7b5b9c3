"""Fetching a job's results from the simulated host over real SSH/SFTP."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from conftest import PlaybookHostFactory
from test_playbook_train import download_base

from playbooks.artifacts import MANIFEST, fetch, read_manifest
from playbooks.base import Fault, Host, Layout, StepFailed
from simhost import SimHost

TOOLKIT = "1.17.8-1"
IMAGE = "axolotlai/axolotl:0.18.0-py3.12-cu130-2.12.0"


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tree(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


def train_and_merge(sim: SimHost, host: Host, job: str) -> tuple[Layout, Path]:
    """A real (stand-in) QLoRA training with checkpoints, then a merge: the job's output dir."""
    assert sim.nvme_path is not None
    layout = Layout(f"{sim.nvme_path}/orch")
    repo = "meta-llama/Llama-3.2-1B"
    base = Path(layout.model_dir(repo))
    download_base(sim, host, repo, str(base))
    data = Path(layout.data_file(job, "train.jsonl"))
    data.parent.mkdir(parents=True)
    data.write_text(json.dumps({"instruction": "Say hi", "input": "", "output": "hi"}) + "\n")
    out = layout.container(layout.output_dir(job))
    config = Path(layout.config_file(job))
    config.write_text(
        f"base_model: {layout.container(str(base))}\nadapter: qlora\nload_in_4bit: true\n"
        f"lora_r: 16\nlora_alpha: 32\ndatasets:\n- path: {layout.container(str(data))}\n"
        f"  type: alpaca\noutput_dir: {out}\ndataset_prepared_path: {out}/prepared\n"
        "max_steps: 4\nsave_steps: 2\n"
    )
    docker = ["docker", "run", "--rm", "--gpus", "all", "-v", f"{layout.base}:/workspace/data",
              IMAGE]
    container_config = layout.container(str(config))
    host.must([*docker, "axolotl", "train", container_config], "training")
    host.must([*docker, "axolotl", "merge-lora", container_config], "merging")
    output = Path(layout.output_dir(job))
    # What the train playbook and axolotl leave next to the adapter in a real run.
    (output / "tokenizer.json").write_text('{"version": "1.0"}')
    (output / "tokenizer_config.json").write_text("{}")
    (output / "train.log").write_text("{'loss': 1.2}\n{'loss': 0.9}\n")
    (output / "prepared").mkdir(exist_ok=True)
    (output / "prepared" / "data.arrow").write_bytes(b"tokenized")
    (output / ".train.log.abc123.part").write_text("half a file")
    return layout, output


def test_fetch_copies_results_not_checkpoints_idempotently_and_merged_on_request(
    playbook_host: PlaybookHostFactory, tmp_path: Path
) -> None:
    sim, host = playbook_host(toolkit_preinstalled=TOOLKIT)
    layout, output = train_and_merge(sim, host, "job-1")
    assert sorted(p.name for p in output.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    local = tmp_path / "artifacts" / "job-1"

    first = fetch(host, layout.output_dir("job-1"), local, include_merged=False)
    expected = {"adapter_model.safetensors", "adapter_config.json", "sim_memory.json",
                "sim_landscape.json", "tokenizer.json", "tokenizer_config.json", "train.log"}
    assert set(first.copied) == expected and first.skipped == []
    assert tree(local) == expected | {MANIFEST}  # no checkpoint-*, merged/, prepared/, .part
    for name in expected:
        assert (local / name).read_bytes() == (output / name).read_bytes()

    manifest = json.loads((local / MANIFEST).read_text())
    assert manifest["source"] == layout.output_dir("job-1")
    assert {f["path"] for f in manifest["files"]} == expected
    for entry in manifest["files"]:
        assert entry["sha256"] == sha(local / entry["path"]) == sha(output / entry["path"])
        assert entry["size"] == (local / entry["path"]).stat().st_size
    stamp = {name: (local / name).stat().st_mtime_ns for name in [*expected, MANIFEST]}

    second = fetch(host, layout.output_dir("job-1"), local, include_merged=False)
    assert second.copied == [] and set(second.skipped) == expected
    assert {name: (local / name).stat().st_mtime_ns for name in stamp} == stamp

    (local / "train.log").write_text("edited locally")  # a damaged copy is replaced
    third = fetch(host, layout.output_dir("job-1"), local, include_merged=False)
    assert third.copied == ["train.log"] and sha(local / "train.log") == sha(output / "train.log")

    with_merged = fetch(host, layout.output_dir("job-1"), local, include_merged=True)
    merged = {f"merged/{p}" for p in tree(output / "merged")}
    assert "merged/config.json" in merged and "merged/model.safetensors.index.json" in merged
    assert set(with_merged.copied) == merged and set(with_merged.skipped) == expected
    assert tree(local) == expected | merged | {MANIFEST}
    assert {f.path for f in read_manifest(local)} == expected | merged
    for item in read_manifest(local):
        assert item.sha256 == sha(local / item.path) and item.size == (local / item.path).stat(
        ).st_size
    assert not any("checkpoint-" in p for p in tree(local))


def test_odd_file_names_are_copied_exactly_and_run_nothing(
    playbook_host: PlaybookHostFactory, tmp_path: Path
) -> None:
    sim, host = playbook_host()
    assert sim.nvme_path is not None
    remote = sim.nvme_path / "orch" / "jobs" / "odd dir; $(touch pwned)" / "output"
    odd = [
        "name with spaces.txt",
        "quote'\"$(touch pwned).json",
        "new\nline.log",
        "-starts-with-dash",
        "back\\slash",
        "ünïcödé.txt",
        "runs/Jan01 x/events.out.tfevents",
        "checkpoint.notes",  # a file, not a checkpoint directory
    ]
    for index, name in enumerate(odd):
        path = remote / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(f"content {index}".encode())
    (remote / "checkpoint-10").mkdir()
    (remote / "checkpoint-10" / "optimizer.pt").write_bytes(b"big")
    (remote / "runs" / "checkpoint-3").mkdir()  # pruned at any depth
    (remote / "runs" / "checkpoint-3" / "state").write_bytes(b"x")
    (remote / ".cache").mkdir()
    (remote / ".cache" / "x").write_bytes(b"cache")
    (remote / "link").symlink_to("/etc/hostname")
    local = tmp_path / "local dir 'q'"

    result = fetch(host, str(remote), local)
    assert set(result.copied) == set(odd)
    assert tree(local) == set(odd) | {MANIFEST}
    for index, name in enumerate(odd):
        assert (local / name).read_bytes() == f"content {index}".encode()
    assert {f.path: f.sha256 for f in read_manifest(local)} == {
        name: sha(remote / name) for name in odd
    }
    assert not list(sim.dir.rglob("pwned")) and not Path("pwned").exists()
    assert fetch(host, str(remote), local).copied == []


def test_a_missing_output_dir_is_a_clear_failure(
    playbook_host: PlaybookHostFactory, tmp_path: Path
) -> None:
    sim, host = playbook_host()
    with pytest.raises(StepFailed, match="no output directory") as info:
        fetch(host, f"{sim.nvme_path}/orch/jobs/none/output", tmp_path / "x")
    assert info.value.fault is Fault.HOST
