"""`orch render`: what would run, for every example job on both host kinds, and that it is
exactly what the playbooks upload and run."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import orchfork
import pytest
import yaml
from conftest import PlaybookHostFactory, Reports
from test_evaluate_native import CLOUD_IMAGE
from test_pipeline import free_port
from test_playbook_train import TOOLKIT, make_job

from playbooks import evaluate, images, merge, rendering, train, vllm
from playbooks.base import run_playbook
from playbooks.model_cache import ModelCache
from playbooks.pipeline import cache_for
from playbooks.trainjob import NativeEnv

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted(p for p in (ROOT / "examples").glob("*.yml")
                  if "grid" not in (yaml.safe_load(p.read_text()) or {}))


def orch(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "xdg")}
    env.pop("ORCH_DB_URL", None)
    env.pop("HF_TOKEN", None)
    return orchfork.run(list(args), env=env, cwd=ROOT, timeout=120)


@pytest.mark.parametrize("host", ["docker", "container"])
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_every_example_renders_on_both_host_kinds(tmp_path: Path, example: Path,
                                                  host: str) -> None:
    proc = orch(tmp_path, "render", str(example), "--host", host, "--json",
                "-o", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    repo = "axolotlai/axolotl" if host == "docker" else "axolotlai/axolotl-cloud"
    assert out["image"] == f"{repo}:0.18.0-py3.12-cu130-2.12.0"
    cfg = out["axolotl_config"]
    assert cfg["output_dir"].startswith("/")
    assert set(out["commands"]) == {"download", "train", "merge", "evaluate", "lm_eval",
                                    "deliver"}
    download = out["commands"]["download"]
    assert "hf" in download and "download" in download
    if host == "docker":
        # No bare hf or lm_eval on a Docker host: the host OS has neither (issue 19 §4.2).
        assert download[:3] == ["docker", "run", "--rm"] and out["image"] in download
        for name, argv in out["commands"].items():
            assert not argv or argv[0] not in ("hf", "lm_eval", "env"), name
    train_argv = out["commands"]["train"]
    if host == "docker":
        assert train_argv[:3] == ["docker", "run", "-d"] and out["image"] in train_argv
        volume = train_argv[train_argv.index("-v") + 1]
        assert volume.endswith(":/workspace/data")  # never over /workspace
    else:
        assert "docker" not in train_argv and train_argv[-3:-1] == ["axolotl", "train"]
        assert "/workspace/axolotl-venv/bin" in train_argv
    if "deepspeed" in cfg:
        assert cfg["deepspeed"].startswith("/")
        assert (tmp_path / "out" / "deepspeed.json").is_file()
    written = yaml.safe_load((tmp_path / "out" / "config.yml").read_text())
    assert written == cfg
    assert json.loads((tmp_path / "out" / "render.json").read_text()) == out


@pytest.mark.parametrize("host", ["docker", "container"])
def test_the_delivery_to_the_hub_is_rendered(tmp_path: Path, host: str) -> None:
    job = tmp_path / "job.yml"
    shutil.copytree(ROOT / "examples" / "data", tmp_path / "data")
    job.write_text((ROOT / "examples" / "quickstart.yml").read_text()
                   + "output: {merged: true, push_to_hub: my-org/tuned}\n")
    proc = orch(tmp_path, "render", str(job), "--host", host, "--json")
    assert proc.returncode == 0, proc.stderr
    deliver = json.loads(proc.stdout)["commands"]["deliver"]
    assert deliver[deliver.index("upload") - 1:deliver.index("upload") + 2] == [
        "hf", "upload", "my-org/tuned"]
    assert "--private" in deliver and "HF_TOKEN" not in " ".join(deliver).replace(
        "-e HF_TOKEN", "")
    if host == "docker":
        assert deliver[:3] == ["docker", "run", "--rm"]
        assert "/workspace/data/jobs/quickstart-qwen25-05b/output/merged" in deliver
    else:
        assert "/workspace/orch/jobs/quickstart-qwen25-05b/output/merged" in deliver


@pytest.mark.parametrize("host", ["docker", "container"])
def test_lm_eval_tasks_are_rendered(tmp_path: Path, host: str) -> None:
    # Issue 19: eval.tasks ran a bare lm_eval on a monthly server and were not rendered.
    job = tmp_path / "job.yml"
    shutil.copytree(ROOT / "examples" / "data", tmp_path / "data")
    job.write_text((ROOT / "examples" / "quickstart.yml").read_text().replace(
        "eval:\n", "eval:\n  tasks: [gsm8k, hellaswag]\n"))
    proc = orch(tmp_path, "render", str(job), "--host", host, "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    argv = out["commands"]["lm_eval"]
    lm = argv[argv.index("lm_eval"):]
    assert lm[lm.index("--tasks") + 1] == "gsm8k,hellaswag"
    # Against the vLLM server on both kinds of host, after adding the api extra
    # local-completions needs (issue 19 §1: the hf backend cannot hold a 70B on one GPU).
    assert "lm_eval[api]==0.4.11" in argv
    assert lm[lm.index("--model") + 1] == "local-completions"
    assert "base_url=http://127.0.0.1:8000/v1/completions" in lm[lm.index("--model_args") + 1]
    if host == "docker":
        # In the trainer image (the host OS has no lm_eval), on the host's network (vLLM is
        # published on its 127.0.0.1).
        assert argv[:3] == ["docker", "run", "--rm"] and out["image"] in argv
        assert argv[argv.index("--network") + 1] == "host"
    else:  # natively in the rented image, its environment restored
        assert "docker" not in argv and "/workspace/axolotl-venv/bin" in " ".join(argv)


@pytest.mark.parametrize(("example", "kind"), [("quickstart", "docker"),
                                             ("qlora-8b", "container")])
def test_the_default_host_is_the_kind_the_plan_chose(tmp_path: Path, example: str,
                                                     kind: str) -> None:
    """Issue 36 §6: a plan on a container rental rendered for Docker unless told."""
    proc = orch(tmp_path, "render", f"examples/{example}.yml", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["host"] == kind
    assert any(n.startswith(f"host: {kind}, the kind the placement is") for n in out["notes"])
    explicit = json.loads(orch(tmp_path, "render", f"examples/{example}.yml", "--host", kind,
                               "--json").stdout)
    assert {k: v for k, v in explicit.items() if k != "notes"} == \
        {k: v for k, v in out.items() if k != "notes"}


def test_sweep_file_points_at_its_base_job(tmp_path: Path) -> None:
    proc = orch(tmp_path, "render", "examples/sweep-lr.yml")
    assert proc.returncode == 2 and "render its base job" in proc.stderr
    assert "qlora-8b.yml" in proc.stderr


def test_bad_host_kind_is_refused(tmp_path: Path) -> None:
    proc = orch(tmp_path, "render", "examples/quickstart.yml", "--host", "vm")
    assert proc.returncode == 2 and "--host must be docker or container" in proc.stderr


@pytest.mark.parametrize("runner", ["docker", "process"])
def test_rendered_is_what_the_playbooks_upload_and_run(
        playbook_host: PlaybookHostFactory, reports: Reports, tmp_path: Path,
        runner: str) -> None:
    # A rental whose boot persisted the image env (Vast.ai onstart): `hf` for the model.
    rental = {} if runner == "docker" else {"container_image": CLOUD_IMAGE,
                                            "persisted_env": ("/etc/environment",)}
    sim, host = playbook_host(toolkit_preinstalled=TOOLKIT, train_steps=2,
                              train_step_seconds=0.05, has_docker=runner == "docker", **rental)
    job = make_job(sim, host, tmp_path, runner=runner)
    if runner == "process":
        job = replace(job, native=NativeEnv.mapped(host.paths))
    download = rendering.download_argv(job, "org/base", "main", 10**9, False)
    port = free_port() if runner == "docker" else 8000
    rendered = rendering.render(job, evaluates=True, vllm_image=images.vllm_image(),
                                download=download, vllm_port=port,
                                eval_tasks=("gsm8k",) if runner == "docker" else ())
    # The base model's download, as prepare sets it up for this kind of host.
    cache = cache_for(ModelCache("org/base", "main", 10**9, job.layout), job.image,
                      job.runner, job.native)
    run_playbook("model_cache", cache.steps(), host, reports)
    assert shlex.join(rendered.commands["download"]) in sim.ssh_commands()
    run_playbook("train", train.steps(job), host, reports)
    assert train.wait(host, job, poll_s=0.05).state is train.TrainState.SUCCEEDED
    run_playbook("merge", merge.steps(job, poll_s=0.05), host, reports)
    assert Path(job.config_file).read_text() == rendered.files[job.config_file]
    ran = sim.ssh_commands()
    assert shlex.join(rendered.commands["train"]) in ran
    assert shlex.join(rendered.commands["merge"]) in ran
    if runner == "docker":
        spec = vllm.server_spec(host, job.job_id, merge.merged_dir(job), job.layout,
                                images.vllm_image(), port, job.config.sequence_len)
        assert rendered.commands["evaluate"] == spec.docker_argv()
        result = evaluate.evaluate(host, job.job_id, merge.merged_dir(job), job.layout,
                                   images.vllm_image(), port, job.config.sequence_len,
                                   tasks=["gsm8k"], emit=reports, trainer_image=job.image)
        assert "lm_eval.gsm8k.exact_match.strict-match" in result.metrics
        ran = sim.ssh_commands()
        assert shlex.join(rendered.commands["evaluate"]) in ran
        assert shlex.join(rendered.commands["lm_eval"]) in ran
        return
    # A container rental: vLLM from its own venv, natively, as rendered (installs in notes).
    result = evaluate.evaluate(host, job.job_id, merge.merged_dir(job), job.layout,
                               images.vllm_image(), 8000, job.config.sequence_len,
                               [{"prompt": "say hi", "expected": "hi"}], emit=reports,
                               runner=runner, native_wrap=job.native.wrap,
                               native_wrapper=job.wrapper, native_uv=job.native.uv,
                               vllm_version=images.vllm_version())
    assert "eval.exact_match" in result.metrics
    ran = sim.ssh_commands()
    assert shlex.join(rendered.commands["evaluate"]) in ran
    installs = rendering.native_server(job, 8000, job.config.sequence_len).install_argvs()
    assert all(shlex.join(argv) in ran for argv in installs)
    assert any(shlex.join(installs[1]) in note for note in rendered.notes)
