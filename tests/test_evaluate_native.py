"""Evaluation on a container rental (a simulated host without Docker): vLLM, installed in a
venv of its own (issue 19 §1), serves the model; the eval set is scored through it and the
lm-eval tasks run the rented image's lm-eval against it (`--model local-completions`), as on
a Docker host; no `docker` is called."""

from __future__ import annotations

import socket
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import PlaybookHostFactory, Reports
from test_pipeline import ANSWERS, make_job

from playbooks import images
from playbooks.base import PlaybookFailed
from playbooks.pipeline import run_pipeline
from playbooks.vllm import Serving

CLOUD_IMAGE = "axolotlai/axolotl-cloud:0.18.0-py3.12-cu130-2.12.0"


@pytest.mark.parametrize("eval_set", [True, False])
def test_a_rental_serves_with_vllm_and_runs_tasks_against_it(
        playbook_host: PlaybookHostFactory, reports: Reports, tmp_path: Path,
        eval_set: bool) -> None:
    # A rental of the axolotl cloud image: no Docker, no vLLM. orch installs the pinned vLLM
    # with the image's uv into a venv of its own and serves the model from it; the tasks run
    # the image's lm-eval against that server (the hf backend would load the whole bf16
    # model on one GPU: the 70B example's could not run), also with no eval set.
    sim, host = playbook_host(has_docker=False, container_image=CLOUD_IMAGE, train_steps=4,
                              train_step_seconds=0.05)
    job = replace(make_job(tmp_path, "qlora"), eval_tasks=("gsm8k",))
    if not eval_set:
        job = replace(job, eval_set=None)
    result = run_pipeline(host, job, reports)

    if eval_set:
        assert result.metrics["eval.exact_match"] == 1.0  # the stand-in learned the dataset
        assert result.metrics["eval.count"] == len(ANSWERS)
    assert result.metrics["lm_eval.gsm8k.exact_match.strict-match"] == 0.25
    assert reports.outcomes("evaluate") == {
        "vllm-install": "changed", "vllm-server": "changed", "vllm-ready": "changed",
        **({"score-eval-set": "changed"} if eval_set else {}), "lm-eval": "changed",
        "stop-server": "changed"}
    installs = [e["packages"] for e in sim.events("uv-pip-install")]
    api = images.catalog().lm_eval["api_requirement"]
    assert installs == [[f"vllm=={images.vllm_version()}"], [api]]
    (served,) = sim.events("vllm-serving")
    assert served["served"] == ["ft"]
    (run,) = sim.events("lm-eval")
    assert run["backend"] == "local-completions" and run["tasks"] == ["gsm8k"]
    assert run["container"] is None  # natively, in the rented image
    # stop-server ended the whole process group orch-job.sh started: the port is closed.
    with socket.socket() as check:
        assert check.connect_ex(("127.0.0.1", job.vllm_port)) != 0
    # Only detect_runner's probe touches docker.
    commands = [c for c in sim.ssh_commands() if c != "docker --version"]
    assert not any(c.startswith("docker ") for c in commands), commands
    assert (Path(job.artifacts_dir) / "adapter_model.safetensors").is_file()


def test_a_rental_without_uv_says_so(
        playbook_host: PlaybookHostFactory, reports: Reports, tmp_path: Path) -> None:
    # No axolotl image (no uv in its venv): vLLM cannot be installed, and says why.
    _, host = playbook_host(has_docker=False, train_steps=2, train_step_seconds=0.05)
    with pytest.raises(PlaybookFailed) as info:
        run_pipeline(host, make_job(tmp_path, "lora"), reports)
    assert info.value.step == "vllm-install"
    assert "uv is not on the rental" in info.value.reason


SERVER = ["--model", "local-completions", "--model_args",
          "model=ft,base_url=http://127.0.0.1:9/v1/completions,tokenizer={model}"]


@pytest.mark.parametrize(("args", "code", "text"), [
    ([*SERVER, "--tasks", "nosuchtask"], 1, "ValueError: Tasks not found: nosuchtask."),
    ([*SERVER, "--tasks", "gsm8k", "--bogus"], 2, "unrecognized arguments: --bogus"),
    ([*SERVER, "--tasks", "gsm8k", "--log_samples"], 1,
     "Specify --output_path if providing --log_samples"),
    (["--model", "openai-completions", "--tasks", "gsm8k"], 2, "is not simulated"),
    # The backend orch ran before vLLM served every evaluation: gone from the stand-in.
    (["--model", "hf", "--model_args", "pretrained={model}", "--tasks", "gsm8k"], 2,
     "--model hf is not simulated"),
    (["--model_args", "pretrained={model}", "--tasks", "gsm8k"], 2,
     "--model hf is not simulated"),
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


def test_a_killed_lm_eval_is_reported_as_killed_with_its_last_lines(
        playbook_host: PlaybookHostFactory, reports: Reports, tmp_path: Path) -> None:
    # The OOM killer ends lm_eval with SIGKILL: the job says so (not "failed (exit -1)" with
    # uv's last line) and keeps what lm_eval printed last.
    _, host = playbook_host(has_docker=False, container_image=CLOUD_IMAGE, train_steps=2,
                            train_step_seconds=0.05, lm_eval_oom_killed=True)
    job = replace(make_job(tmp_path, "lora"), eval_tasks=("gsm8k",), eval_set=None)
    with pytest.raises(PlaybookFailed) as info:
        run_pipeline(host, job, reports)
    assert info.value.step == "lm-eval"
    reason = info.value.reason
    assert "lm_eval in the rented image was killed by SIGKILL (exit 137)" in reason, reason
    assert "OOM killer" in reason
    assert "Requesting API: gsm8k: 1 request sent" in reason
    assert "Installed" not in reason and "exit -1" not in reason
    assert "Requesting API: gsm8k" in info.value.stderr_tail


def test_uv_is_called_by_its_path_and_reuses_a_half_done_venv(
        playbook_host: PlaybookHostFactory, reports: Reports, tmp_path: Path) -> None:
    # The axolotl uv images have uv in /root/.local/bin, on their ENV PATH only: a session
    # without the image's environment (no env file written at boot) finds none by name.
    sim, host = playbook_host(has_docker=False, container_image=CLOUD_IMAGE, train_steps=2,
                              train_step_seconds=0.05)
    uv = host.paths(images.layout().uv)
    assert host.run(["sh", "-c", "command -v uv"]).exit_code != 0
    assert host.run(["test", "-x", uv]).ok
    # An earlier install that did not finish (connection lost after `uv venv`): the venv is
    # there, vLLM is not. uv refuses to make it again unless told to reuse it.
    assert sim.nvme_path is not None
    venv = f"{sim.nvme_path}/orch/vllm-venv/{images.vllm_version()}"
    assert host.run([uv, "venv", "--python", "3.12", venv]).ok
    again = host.run([uv, "venv", "--python", "3.12", venv])
    assert again.exit_code == 2
    assert f"A virtual environment already exists at: {venv}" in again.stderr
    assert "hint: Use the `--clear` flag" in again.stderr

    job = replace(make_job(tmp_path, "lora"), eval_tasks=("gsm8k",))
    result = run_pipeline(host, job, reports)
    assert reports.outcomes("evaluate")["vllm-install"] == "changed"
    assert result.metrics["eval.exact_match"] == 1.0
    assert "lm_eval.gsm8k.exact_match.strict-match" in result.metrics


def test_a_rental_serving_the_4bit_base_installs_and_imports_bitsandbytes(
        playbook_host: PlaybookHostFactory, reports: Reports, tmp_path: Path) -> None:
    # QLoRA is served as the 4-bit base + adapter (`--quantization bitsandbytes`). vLLM's
    # wheel does not bring bitsandbytes (the vllm-openai image installs it): without it vLLM
    # refuses to load, so the install adds it and its check imports it.
    sim, host = playbook_host(has_docker=False, container_image=CLOUD_IMAGE, train_steps=2,
                              train_step_seconds=0.05)
    uv, version = host.paths(images.layout().uv), images.vllm_version()
    assert sim.nvme_path is not None
    venv = f"{sim.nvme_path}/orch/vllm-venv/{version}"
    # The venv an earlier job made to serve a merged model: vLLM alone.
    assert host.run([uv, "venv", "--python", "3.12", venv]).ok
    assert host.run([uv, "pip", "install", "--python", f"{venv}/bin/python",
                     f"vllm=={version}"]).ok
    model = sim.root / "some-model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    refused = host.run([f"{venv}/bin/vllm", "serve", str(model), "--quantization",
                        "bitsandbytes"])
    assert refused.exit_code == 1
    assert ("ImportError: Please install bitsandbytes>=0.48.1 via `pip install "
            "bitsandbytes>=0.48.1` to use bitsandbytes quantizer.") in refused.stderr
    assert not host.run([f"{venv}/bin/python", "-c", "import bitsandbytes"]).ok

    job = replace(make_job(tmp_path, "qlora"), serving=Serving("adapter"))
    result = run_pipeline(host, job, reports)
    assert result.metrics["eval.exact_match"] == 1.0
    assert reports.outcomes("evaluate")["vllm-install"] == "changed"
    bnb = images.catalog().vllm["bitsandbytes"]
    assert sim.events("uv-pip-install")[-1]["packages"] == [f"vllm=={version}",
                                                             f"bitsandbytes=={bnb}"]
    imported = host.run([f"{venv}/bin/python", "-c",
                         "import bitsandbytes; print(bitsandbytes.__version__)"])
    assert imported.ok and imported.stdout.split() == [bnb]
    (served,) = sim.events("vllm-serving")
    assert served["served"][-1] == "ft"  # the adapter, on the 4-bit base


@pytest.mark.parametrize("rental", [True, False])
def test_few_shot_tasks_fit_the_served_context_whatever_the_sequence_len(
        playbook_host: PlaybookHostFactory, reports: Reports, tmp_path: Path,
        rental: bool) -> None:
    # lm-eval's API models send requests up to their max_length (2048 by default): a
    # 5-shot gsm8k prompt does not fit a server sized to a short training sequence_len
    # (vLLM answers 400), so vLLM serves at least lm-eval's context and lm-eval is told it.
    kind = {"has_docker": False, "container_image": CLOUD_IMAGE} if rental else {}
    sim, host = playbook_host(train_steps=2, train_step_seconds=0.05, **kind)
    job = make_job(tmp_path, "lora")
    job = replace(job, config=replace(job.config, sequence_len=512),
                  eval_tasks=("gsm8k", "hellaswag"))
    result = run_pipeline(host, job, reports)
    assert result.metrics["lm_eval.gsm8k.exact_match.strict-match"] == 0.25
    assert result.metrics["eval.exact_match"] == 1.0
    served = [c for c in sim.ssh_commands() if "--max-model-len" in c]
    assert served and all("--max-model-len 2048" in c for c in served), served
    (lm_eval,) = [c for c in sim.ssh_commands() if "local-completions" in c]
    assert "max_length=2048" in lm_eval
    # What lm-eval sent was scored as sent: every loglikelihood span is its continuation.
    assert all(r["aligned"] for r in sim.events("lm-eval-request"))
