"""The merge playbook over real SSH: merge-lora into merged/, skipped when complete or full."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import PlaybookHostFactory, Reports
from test_playbook_train import TOOLKIT, make_job

from playbooks import merge, train
from playbooks.base import Host, PlaybookFailed, run_playbook
from simhost import SimHost


def trained(playbook_host: PlaybookHostFactory, tmp_path: Path, method: str,
            runner: str = "docker") -> tuple[SimHost, Host, train.TrainJob]:
    options: dict[str, Any] = (
        {"has_docker": False} if runner == "process" else {"toolkit_preinstalled": TOOLKIT})
    sim, host = playbook_host(train_steps=2, train_step_seconds=0.05, merge_seconds=0.05,
                              **options)
    job = make_job(sim, host, tmp_path, method=method, runner=runner)
    run_playbook("train", train.steps(job), host, lambda r: None)
    assert train.wait(host, job, poll_s=0.05).state is train.TrainState.SUCCEEDED
    return sim, host, job


def merged_files(job: train.TrainJob) -> set[str]:
    return {p.name for p in Path(merge.merged_dir(job)).iterdir()}


def test_qlora_merge_creates_merged_and_a_rerun_is_skipped(
        playbook_host: PlaybookHostFactory, reports: Reports, tmp_path: Path) -> None:
    sim, host, job = trained(playbook_host, tmp_path, "qlora")
    run_playbook("merge", merge.steps(job, poll_s=0.05), host, reports)
    assert reports.outcomes() == {"adapter-present": "ok", "merge-lora": "changed"}
    folder = Path(merge.merged_dir(job))
    assert folder == Path(job.output_dir) / "merged"
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    assert {"config.json", *index["weight_map"].values()} <= merged_files(job)
    run = sim.events("docker-run")[-1]
    assert run["container"] == "orch-merge-j-1" and run["argv"][-3:] == [
        "merge-lora", "/workspace/data/jobs/j-1/config.yml",
        "--lora-model-dir=/workspace/data/jobs/j-1/output"]
    assert "orch-merge-j-1" not in sim.containers()

    reports.clear()
    run_playbook("merge", merge.steps(job, poll_s=0.05), host, reports)
    assert reports.outcomes()["merge-lora"] == "skipped"
    assert len(sim.events("merge-finished")) == 1

    # A merge cut short (a shard missing) is not complete: the step merges again.
    (folder / sorted(set(index["weight_map"].values()))[-1]).unlink()
    reports.clear()
    run_playbook("merge", merge.steps(job, poll_s=0.05), host, reports)
    assert reports.outcomes()["merge-lora"] == "changed"
    assert len(sim.events("merge-finished")) == 2


def test_lora_merge_without_docker(playbook_host: PlaybookHostFactory, reports: Reports,
                                   tmp_path: Path) -> None:
    sim, host, job = trained(playbook_host, tmp_path, "lora", runner="process")
    run_playbook("merge", merge.steps(job, poll_s=0.05), host, reports)
    assert reports.outcomes() == {"job-wrapper": "skipped", "adapter-present": "ok",
                                  "merge-lora": "changed"}
    assert "config.json" in merged_files(job)
    reports.clear()
    run_playbook("merge", merge.steps(job, poll_s=0.05), host, reports)
    assert reports.outcomes()["merge-lora"] == "skipped"
    assert len(sim.events("merge-finished")) == 1


def test_full_fine_tune_skips_the_merge_and_untrained_jobs_fail_clearly(
        playbook_host: PlaybookHostFactory, reports: Reports, tmp_path: Path) -> None:
    sim, host = playbook_host(toolkit_preinstalled=TOOLKIT)
    full = make_job(sim, host, tmp_path, "full-1", method="full")
    run_playbook("merge", merge.steps(full), host, reports)
    assert reports.outcomes() == {"merge-lora": "skipped"}
    assert merge.merged_dir(full) == full.output_dir
    assert not sim.events("docker-run") and not sim.events("merge-finished")

    untrained = make_job(sim, host, tmp_path, "lora-1", method="lora")
    with pytest.raises(PlaybookFailed, match="no trained adapter") as info:
        run_playbook("merge", merge.steps(untrained), host, reports)
    assert info.value.step == "adapter-present"
