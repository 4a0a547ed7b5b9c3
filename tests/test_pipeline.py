"""The whole host pipeline over real SSH, for each method; warm re-runs change nothing."""

from __future__ import annotations

import json
import socket
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import PlaybookHostFactory, Reports

from playbooks.axolotl import TrainConfigInput
from playbooks.gpu import GpuExpectation
from playbooks.pipeline import PipelineJob, run_pipeline

ANSWERS = {"What is the capital of France?": "Paris", "2+2=": "4"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_job(tmp_path: Path, method: str, dataset_name: str = "train.jsonl") -> PipelineJob:
    data = tmp_path / dataset_name
    data.write_text("".join(json.dumps({"instruction": q, "input": "", "output": a}) + "\n"
                            for q, a in ANSWERS.items()))
    evals = tmp_path / "eval.jsonl"
    evals.write_text("".join(json.dumps({"prompt": q, "expected": a}) + "\n"
                             for q, a in ANSWERS.items()))
    config = TrainConfigInput(method=method, base_model_dir="", dataset_path="",  # type: ignore[arg-type]
                              dataset_format="alpaca", output_dir="", save_steps=2)
    return PipelineJob(job_id=f"j-{method}", repo="meta-llama/Llama-3.2-1B",
                       model_bytes=2_471_645_184, gpu=GpuExpectation("H100 SXM", 1),
                       config=config, dataset=str(data), eval_set=str(evals),
                       artifacts_dir=str(tmp_path / "artifacts" / method),
                       vllm_port=free_port(), poll_s=0.1)


@pytest.mark.parametrize("method", ["qlora", "lora", "full"])
def test_full_pipeline_then_warm_rerun(playbook_host: PlaybookHostFactory, reports: Reports,
                                       tmp_path: Path, method: str) -> None:
    sim, host = playbook_host(train_steps=4, train_step_seconds=0.05, vllm_startup_seconds=0.2)
    job = make_job(tmp_path, method)
    progress: list[int] = []
    result = run_pipeline(host, job, reports, lambda p: progress.append(p.step or 0))

    assert result.train_status.state.value == "succeeded"
    assert progress and progress == sorted(progress) and progress[-1] == 4
    assert result.metrics["eval.exact_match"] == 1.0  # the stand-in learned the dataset
    assert result.metrics["eval.count"] == len(ANSWERS)
    local = Path(job.artifacts_dir)
    assert (local / "manifest.json").is_file()
    names = {p.name for p in local.rglob("*") if p.is_file()}
    assert not any(n.startswith("checkpoint-") for n in names)
    if method == "full":
        assert reports.outcomes("merge") == {"merge-lora": "skipped"}
    else:
        assert "adapter_model.safetensors" in names
        assert reports.outcomes("merge")["merge-lora"] == "changed"
    assert reports.outcomes("container_toolkit")["packages"] == "changed"
    assert reports.outcomes("model_cache")["download"] == "changed"

    # A second run on the same, now warm host installs, downloads and trains nothing new.
    counts = {k: len(sim.events(k)) for k in ("apt-install", "hf-download", "docker-restart",
                                              "merge-finished")}
    trainings = len(_training_runs(sim))
    reports.clear()
    again = run_pipeline(host, replace(job, vllm_port=free_port()), reports)
    assert again.metrics["eval.exact_match"] == 1.0
    for playbook in ("container_toolkit", "model_cache", "train", "merge"):
        assert set(reports.outcomes(playbook).values()) <= {"skipped", "ok"}, playbook
    assert len(sim.events("apt-install")) == counts["apt-install"]
    assert len(sim.events("hf-download")) == counts["hf-download"]
    assert len(sim.events("docker-restart")) == counts["docker-restart"]
    assert len(sim.events("merge-finished")) == counts["merge-finished"]
    # Training is reattached, not started again; only the eval server (and the toolkit's
    # verification container) run again.
    assert len(_training_runs(sim)) == trainings == 1
    assert again.artifacts is not None and not again.artifacts.copied


def _training_runs(sim: object) -> list[dict[str, object]]:
    runs = sim.events("docker-run")  # type: ignore[attr-defined]
    return [e for e in runs if list(e["argv"])[:2] == ["axolotl", "train"]]


def test_pipeline_with_hostile_names_runs_nothing_unintended(
        playbook_host: PlaybookHostFactory, reports: Reports, tmp_path: Path) -> None:
    sim, host = playbook_host(train_steps=2, train_step_seconds=0.05)
    hostile = "t;touch PWNED;$(touch PWNED2)`touch PWNED3`'\".jsonl"
    job = replace(make_job(tmp_path, "qlora", dataset_name=hostile),
                  job_id="j-$(touch PWNED4);x", eval_set=None)
    result = run_pipeline(host, job, reports)
    assert result.train_status.state.value == "succeeded"
    planted = [p for p in Path(sim.dir).rglob("PWNED*")]
    assert planted == [], planted
    assert not list(Path("/").glob("PWNED*")) and not list(Path.cwd().glob("PWNED*"))


def test_evaluation_failure_comes_after_the_artifacts_are_copied(
        playbook_host: PlaybookHostFactory, reports: Reports, tmp_path: Path) -> None:
    # An lm-eval task that does not exist: evaluation fails after training, and the trained
    # adapter must already be in the artifacts directory (issue 9 §1.8).
    from playbooks.base import PlaybookFailed

    _, host = playbook_host(train_steps=2, train_step_seconds=0.05, vllm_startup_seconds=0.2)
    job = replace(make_job(tmp_path, "qlora"), eval_tasks=("no_such_task",))
    with pytest.raises(PlaybookFailed) as info:
        run_pipeline(host, job, reports)
    assert info.value.playbook == "evaluate" and info.value.step == "lm-eval"
    assert "Tasks not found: no_such_task" in info.value.reason
    local = Path(job.artifacts_dir)
    assert (local / "manifest.json").is_file()
    assert (local / "adapter_model.safetensors").is_file()


def test_lm_eval_tasks_run_in_the_trainer_image_on_a_docker_host(
        playbook_host: PlaybookHostFactory, reports: Reports, tmp_path: Path) -> None:
    # Issue 19: a monthly server's OS has no lm_eval; the axolotl image has it, without the
    # `lm_eval[api]` extra that `--model local-completions` needs. The old playbook ran a
    # bare `lm_eval` on the host and failed "lm_eval is not installed on the host".
    sim, host = playbook_host(train_steps=2, train_step_seconds=0.05, vllm_startup_seconds=0.2)
    bare = host.run(["lm_eval", "--version"])
    assert bare.exit_code == 127 and "lm_eval: command not found" in bare.stderr
    job = replace(make_job(tmp_path, "lora"), eval_tasks=("gsm8k", "hellaswag"))
    result = run_pipeline(host, job, reports)
    assert result.metrics["lm_eval.gsm8k.exact_match.strict-match"] == 0.25
    assert result.metrics["lm_eval.hellaswag.acc"] == 0.5
    assert result.metrics["eval.exact_match"] == 1.0  # the eval set, from the same server
    runs = sim.events("lm-eval")
    assert [(r["backend"], r["model"]) for r in runs] == [("local-completions", "ft")]
    assert runs[0]["container"] == "orch-lm-eval-j-lora"  # in a container, not on the OS
    installs = sim.events("uv-pip-install")
    assert installs and installs[-1]["packages"] == ["lm_eval[api]==0.4.11"]
    assert "orch-lm-eval-j-lora" not in sim.containers()  # --rm: nothing left behind
