"""Issue 39 §Tracking: `tracking:` in the job file, rendered to axolotl 0.18.0's own keys
(checked against its schema), the run named after the job, the check before renting
(which key to set), the run's URL, and the trackers' keys reaching the trainer the way
HF_TOKEN does: the job's 0600 secrets.env, `docker run -e NAME`, never argv."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import PlaybookHostFactory, Reports

from orchestrator.core import trackingspec
from orchestrator.core.spec import SpecError, load_job
from orchestrator.core.trackingspec import TrackingSpec
from playbooks import axolotl_schema
from playbooks.axolotl import TrainConfigInput, render
from playbooks.base import Layout, run_playbook
from playbooks.gpu import GpuExpectation
from playbooks.pipeline import PipelineJob, train_job

HEAD = ("name: alpaca-r16\nbase_model: meta-llama/Llama-3.1-8B\nmethod: qlora\n"
        "dataset: {path: d.jsonl}\n")
KEY = "wandb_s3cret_0123456789abcdef0123456789abcdef"


def load(tmp_path: Path, text: str) -> Any:
    (tmp_path / "d.jsonl").write_text('{"instruction": "a", "output": "b"}\n')
    (tmp_path / "job.yml").write_text(HEAD + text)
    return load_job(tmp_path / "job.yml")


def test_tracking_in_the_job_file_renders_to_axolotls_keys(tmp_path: Path) -> None:
    job = load(tmp_path, "tracking:\n  wandb: {project: llama-finetunes, entity: my-team}\n"
                         "  mlflow: {tracking_uri: 'https://mlflow.example.com/', "
                         "experiment: llama}\n")
    keys = trackingspec.tracker_keys(job.spec.tracking, job.spec.name, "j-3f9a0c1b2d4e")
    cfg = render(TrainConfigInput(method="qlora", base_model_dir="/m", dataset_path="/d",
                                  dataset_format="alpaca", output_dir="/o", tracking=keys))
    assert {k: v for k, v in cfg.items() if k.startswith(("wandb", "mlflow", "use_"))} == {
        "use_wandb": True, "wandb_project": "llama-finetunes", "wandb_entity": "my-team",
        "wandb_name": "alpaca-r16", "wandb_run_id": "j-3f9a0c1b2d4e", "use_mlflow": True,
        "mlflow_tracking_uri": "https://mlflow.example.com",
        "mlflow_experiment_name": "llama", "mlflow_run_name": "alpaca-r16"}
    assert axolotl_schema.problems(cfg) == []
    offline = TrackingSpec.model_validate({"wandb": {"project": "p", "mode": "offline",
                                                     "name": "mine"}})
    keys = trackingspec.tracker_keys(offline, "job", "j-1")
    assert keys is not None and (keys.wandb_mode, keys.wandb_name) == ("offline", "mine")


@pytest.mark.parametrize(("text", "words"), [
    ("tracking: {wandb: {project: 'a/b'}}", "tracking.wandb.project: 'a/b': W&B names are"),
    ("tracking: {mlflow: {tracking_uri: ./mlruns}}",
     "tracking.mlflow.tracking_uri: './mlruns': give the MLflow tracking server's http(s) URL"),
    ("tracking: {mlflow: {tracking_uri: 'https://u:p@mlflow.example.com'}}",
     "do not put credentials in the URI"),
    ("tracking: {}", "name a tracker (wandb or mlflow), or remove tracking"),
    ("tracking: {wandb: {project: p, mode: on}}", "tracking.wandb.mode: must be one of"),
])
def test_bad_tracking_is_refused_at_load(tmp_path: Path, text: str, words: str) -> None:
    with pytest.raises(SpecError) as info:
        load(tmp_path, text + "\n")
    (msg,) = info.value.problems
    assert words in msg and msg.startswith(f"{tmp_path / 'job.yml'}:5 tracking"), msg


def test_a_tracker_without_its_key_is_refused_with_what_to_set() -> None:
    both = TrackingSpec.model_validate({"wandb": {"project": "p"},
                                        "mlflow": {"tracking_uri": "databricks"}})
    assert trackingspec.env_problems(both, set()) == [
        "tracking.wandb: W&B needs WANDB_API_KEY in the environment of the orch process that "
        "runs the job (your key: https://wandb.ai/authorize); or set tracking.wandb.mode: "
        "offline",
        "tracking.mlflow.tracking_uri: databricks needs DATABRICKS_HOST and DATABRICKS_TOKEN "
        "in the environment of the orch process that runs the job"]
    assert trackingspec.env_problems(both, {"WANDB_API_KEY", "DATABRICKS_HOST",
                                            "DATABRICKS_TOKEN"}) == []
    offline = TrackingSpec.model_validate({"wandb": {"project": "p", "mode": "offline"}})
    assert trackingspec.env_problems(offline, set()) == []
    half = TrackingSpec.model_validate({"mlflow": {"tracking_uri": "https://m.example.com"}})
    assert trackingspec.env_problems(half, {"MLFLOW_TRACKING_USERNAME"}) == [
        "tracking.mlflow: MLFLOW_TRACKING_USERNAME is set without MLFLOW_TRACKING_PASSWORD; "
        "set both (or MLFLOW_TRACKING_TOKEN)"]
    assert "set MLFLOW_TRACKING_TOKEN" in (trackingspec.mlflow_auth_problem(401, False) or "")
    assert trackingspec.mlflow_auth_problem(200, False) is None


def test_run_urls() -> None:
    assert trackingspec.run_id("j-3f9a/0c:1") == "j-3f9a-0c-1"
    assert trackingspec.wandb_run_url("p", "j-1", "team") == "https://wandb.ai/team/p/runs/j-1"
    assert trackingspec.wandb_run_url("p", "j-1", None) is None  # the key's entity: asked
    assert trackingspec.wandb_run_url("p", "j-1", "t", "https://wandb.corp/") == \
        "https://wandb.corp/t/p/runs/j-1"
    assert trackingspec.mlflow_run_url("https://m.example.com/", "4", "ab12") == \
        "https://m.example.com/#/experiments/4/runs/ab12"


def test_the_keys_reach_the_trainer_as_hf_token_does(
        playbook_host: PlaybookHostFactory, reports: Reports, tmp_path: Path) -> None:
    from playbooks.train import steps

    tracking = TrackingSpec.model_validate({"wandb": {"project": "p"}})
    env = trackingspec.trainer_env(tracking, {"WANDB_API_KEY": KEY, "HOME": "/root",
                                              "MLFLOW_TRACKING_TOKEN": "not-asked-for"})
    assert env == {"WANDB_API_KEY": KEY, "WANDB_RESUME": "allow"}
    sim, host = playbook_host(toolkit_preinstalled="1.17.8-1", train_steps=2,
                              train_step_seconds=0.05)
    layout = Layout(host.paths("/mnt/nvme/orch"))
    model = layout.model_dir("Qwen/Qwen2.5-0.5B")
    host.must([str(sim.dir / "image-bin" / "hf"), "download", "Qwen/Qwen2.5-0.5B",
               "--local-dir", model], "hf download")
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"instruction": "a", "input": "", "output": "b"}) + "\n")
    config = TrainConfigInput(method="qlora", base_model_dir="", dataset_path="",
                              dataset_format="alpaca", output_dir="")
    job = PipelineJob(job_id="j-7", repo="Qwen/Qwen2.5-0.5B", model_bytes=1000,
                      gpu=GpuExpectation("RTX 4090", 1), config=config, dataset=str(data),
                      artifacts_dir=str(tmp_path / "out"), trainer_env=env)
    tj = train_job(job, layout, model, "docker")
    assert KEY not in repr(job) and KEY not in repr(tj)
    run_playbook("train", steps(tj), host, reports)
    assert sorted(sim.containers()["orch-train-j-7"]["Config"]["Env"]) == [
        "WANDB_API_KEY", "WANDB_RESUME"]
    assert KEY in Path(tj.secrets_file or "").read_text()  # the 0600 file, as HF_TOKEN's
    assert KEY not in " ".join(sim.ssh_commands())
    assert KEY not in json.dumps([r.data() | {"m": r.message} for r in reports.items])


def test_one_check_before_renting_for_trackers_and_webhooks(tmp_path: Path) -> None:
    from orchestrator.core.integrationchecks import before_renting

    job = load(tmp_path, "tracking: {wandb: {project: p}}\n"
                         "notify: {url_env: SLACK_WEBHOOK_URL, format: slack}\n")
    assert [p.split(":")[0] for p in before_renting(job.spec, {"WANDB_API_KEY": ""})] == [
        "tracking.wandb", "notify.url_env"]
    assert before_renting(job.spec, {"WANDB_API_KEY": KEY, "SLACK_WEBHOOK_URL":
                                     "https://hooks.slack.com/services/T/B/X"}) == []
