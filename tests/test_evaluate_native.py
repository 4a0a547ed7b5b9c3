"""Evaluation on a container rental (a simulated host without Docker): the eval set is served
by vLLM installed in a venv of its own (issue 19 §1); the lm-eval tasks run lm-eval's `hf`
backend in the trainer image; no `docker` is called."""

from __future__ import annotations

import json
import socket
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import PlaybookHostFactory, Reports
from test_pipeline import ANSWERS, make_job

from playbooks import images
from playbooks.base import PlaybookFailed
from playbooks.evaluate_native import EVAL_SET_TASK, native_argv, score_samples, task_config
from playbooks.pipeline import run_pipeline

CLOUD_IMAGE = "axolotlai/axolotl-cloud:0.18.0-py3.12-cu130-2.12.0"


def test_container_host_serves_the_eval_set_with_vllm_and_runs_tasks_with_lm_eval_hf(
        playbook_host: PlaybookHostFactory, reports: Reports, tmp_path: Path) -> None:
    # A rental of the axolotl cloud image: no Docker, no vLLM. orch installs the pinned vLLM
    # with the image's uv into a venv of its own, serves the eval set from it, stops it, then
    # runs the lm-eval tasks with the image's `hf` backend.
    sim, host = playbook_host(has_docker=False, container_image=CLOUD_IMAGE, train_steps=4,
                              train_step_seconds=0.05)
    job = replace(make_job(tmp_path, "qlora"), eval_tasks=("gsm8k",))
    result = run_pipeline(host, job, reports)

    assert result.metrics["eval.exact_match"] == 1.0  # the stand-in learned the dataset
    assert result.metrics["eval.count"] == len(ANSWERS)
    assert result.metrics["lm_eval.gsm8k.exact_match.strict-match"] == 0.25
    assert reports.outcomes("evaluate") == {
        "vllm-install": "changed", "vllm-server": "changed", "vllm-ready": "changed",
        "score-eval-set": "changed", "stop-server": "changed", "lm-eval-present": "ok",
        "lm-eval": "changed"}
    (install,) = sim.events("uv-pip-install")
    assert install["packages"] == [f"vllm=={images.vllm_version()}"]
    (served,) = sim.events("vllm-serving")
    assert served["served"] == ["ft"]
    # stop-server ended the whole process group orch-job.sh started: the port is closed.
    with socket.socket() as check:
        assert check.connect_ex(("127.0.0.1", job.vllm_port)) != 0
    (run,) = sim.events("lm-eval")
    assert run["tasks"] == ["gsm8k"] and str(run["model"]).endswith("/output/merged")
    # Only detect_runner's probe touches docker.
    commands = [c for c in sim.ssh_commands() if c != "docker --version"]
    assert not any(c.startswith("docker ") for c in commands), commands
    assert (Path(job.artifacts_dir) / "adapter_model.safetensors").is_file()


def test_a_rental_without_uv_or_lm_eval_says_so(
        playbook_host: PlaybookHostFactory, reports: Reports, tmp_path: Path) -> None:
    # No axolotl image (no uv in its venv): vLLM cannot be installed, and says why.
    _, host = playbook_host(has_docker=False, train_steps=2, train_step_seconds=0.05)
    with pytest.raises(PlaybookFailed) as info:
        run_pipeline(host, make_job(tmp_path, "lora"), reports)
    assert info.value.step == "vllm-install"
    assert "uv is not on the rental" in info.value.reason
    # Tasks only (no eval set): lm-eval's hf backend, which must be in the image.
    (tmp_path / "b").mkdir()
    _, host = playbook_host(has_docker=False, has_lm_eval=False, train_steps=2,
                            train_step_seconds=0.05)
    with pytest.raises(PlaybookFailed) as info:
        run_pipeline(host, replace(make_job(tmp_path / "b", "lora"), eval_set=None,
                                   eval_tasks=("gsm8k",)), reports)
    assert info.value.step == "lm-eval-present"
    assert "lm_eval is not installed on the host (the axolotl images ship it" in info.value.reason


def test_native_argv_and_task() -> None:
    argv = native_argv("/nvme/orch/jobs/j/output/merged", ["gsm8k", EVAL_SET_TASK],
                       "/nvme/orch/jobs/j/eval/tasks", "/nvme/orch/jobs/j/eval/out", 2048)
    assert argv == [
        "env", "HF_HUB_OFFLINE=1", "lm_eval", "--model", "hf", "--model_args",
        "pretrained=/nvme/orch/jobs/j/output/merged,dtype=bfloat16,max_length=2048",
        "--tasks", f"gsm8k,{EVAL_SET_TASK}", "--batch_size", "auto",
        "--output_path", "/nvme/orch/jobs/j/eval/out", "--log_samples",
        "--include_path", "/nvme/orch/jobs/j/eval/tasks"]  # fmt: skip
    with pytest.raises(ValueError):
        native_argv("/odd,dir", ["gsm8k"], None, "/o", 2048)
    config = task_config("/d/eval.jsonl", 64)
    assert config["generation_kwargs"]["max_gen_toks"] == 64
    assert json.loads(json.dumps(config)) == config


def test_score_samples_needs_every_row() -> None:
    rows = [("2+2=", "4"), ("Capital of France?", "Paris")]
    samples = [{"doc_id": 1, "filtered_resps": ["It is Paris."]},
               {"doc_id": 0, "filtered_resps": ["4"]}]
    metrics, scored = score_samples(samples, rows)
    assert metrics == {"eval.exact_match": 0.5, "eval.contains": 1.0, "eval.count": 2}
    assert [r.answer for r in scored] == ["4", "It is Paris."]
    with pytest.raises(Exception, match="answered 1 of 2"):
        score_samples(samples[:1], rows)


@pytest.mark.parametrize(("args", "code", "text"), [
    (["--model", "hf", "--model_args", "pretrained=/nowhere", "--tasks", "gsm8k"], 1,
     "couldn't find them in the cached files"),
    (["--model", "hf", "--model_args", "pretrained={model}", "--tasks", "nosuchtask"], 1,
     "ValueError: Tasks not found: nosuchtask."),
    (["--model", "hf", "--model_args", "pretrained={model}", "--tasks", "gsm8k",
      "--bogus"], 2, "unrecognized arguments: --bogus"),
    (["--model", "hf", "--model_args", "pretrained={model}", "--tasks", "gsm8k",
      "--log_samples"], 1, "Specify --output_path if providing --log_samples"),
    (["--model", "openai-completions", "--tasks", "gsm8k"], 2, "is not simulated"),
    # The image's bare lm_eval (no api extra): lm-eval's own refusal (api_models.py @v0.4.11).
    (["--model", "local-completions", "--model_args",
      "model=ft,base_url=http://127.0.0.1:9/v1/completions", "--tasks", "gsm8k"], 1,
     "required packages ['tenacity'] are not installed"),
])
def test_the_lm_eval_stand_in_refuses_what_lm_eval_refuses(
        playbook_host: PlaybookHostFactory, args: list[str], code: int, text: str) -> None:
    sim, host = playbook_host(has_docker=False)
    model = sim.root / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    result = host.run(["lm_eval", *(a.format(model=model) for a in args)])
    assert result.exit_code == code and text in result.stderr, result.stderr
