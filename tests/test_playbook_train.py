"""The train playbook over real SSH against the simulated host: start, reattach, resume."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import PlaybookHostFactory, Reports

from playbooks.axolotl import TrainConfigInput
from playbooks.base import (
    Fault,
    Host,
    HostPaths,
    Layout,
    PlaybookFailed,
    StepFailed,
    container_name,
    run_playbook,
)
from playbooks.train import (
    NativeEnv,
    Progress,
    TrainJob,
    TrainState,
    detect_runner,
    log_tail,
    parse_progress,
    prepare_resume,
    status,
    steps,
    train_argv,
    wait,
)
from playbooks.trainjob import render_config
from simhost import SimHost

TOOLKIT = "1.17.8-1"
BASE_REPO = "Qwen/Qwen2.5-0.5B"
ROWS = [{"instruction": "Say hi", "input": "", "output": "hi"}]


def download_base(sim: SimHost, host: Host, repo: str, model: str) -> None:
    """Put a base model in the host's cache. A Docker host's OS has no `hf` (orch runs it in
    the trainer image: playbooks/model_cache.py); this setup runs the image's stand-in
    directly, so no container or image pull shows in the events the tests count."""
    hf = "hf"
    if host.run(["docker", "--version"]).ok:
        hf = str(sim.dir / "image-bin" / "hf")
    host.must([hf, "download", repo, "--local-dir", model], "hf download")


def make_job(sim: SimHost, host: Host, tmp_path: Path, job_id: str = "j-1", *,
             method: str = "qlora", runner: str = "docker", save_steps: int = 2,
             dataset_name: str = "train.jsonl", env: dict[str, str] | None = None,
             rows: list[dict[str, str]] | None = None, strategy: str = "single",
             optimizer: str = "adamw_8bit") -> TrainJob:
    """A job whose base model is in the host's model cache (downloaded by the hf stand-in)."""
    layout = Layout(host.paths("/mnt/nvme/orch"))
    model = layout.model_dir(BASE_REPO)
    if not (Path(model) / "config.json").exists():
        download_base(sim, host, BASE_REPO, model)
    local = tmp_path / "local" / dataset_name
    local.parent.mkdir(parents=True, exist_ok=True)
    local.write_text("".join(json.dumps(r) + "\n" for r in rows or ROWS))
    config = TrainConfigInput(method=method, base_model_dir="", dataset_path="",  # type: ignore[arg-type]
                              dataset_format="alpaca", output_dir="", save_steps=save_steps,
                              save_total_limit=10, strategy=strategy, optimizer=optimizer)
    return TrainJob(job_id, layout, str(local), config, model, env=env or {},
                    runner=runner)  # type: ignore[arg-type]


def checkpoints(job: TrainJob) -> list[str]:
    return sorted((p.name for p in Path(job.output_dir).glob("checkpoint-*")),
                  key=lambda n: int(n.split("-")[1]))


def reconnect(sim: SimHost, factory: Any) -> Host:
    """What a restarted orch does: a fresh connection, the same host paths."""
    factory.close(sim.host, sim.port, sim.user)
    conn = factory.connect(sim.host, sim.port, sim.user, sim.host_key)
    return Host(conn, HostPaths(str(sim.root)), command_timeout=60)


def test_fresh_run_waits_to_success_and_a_rerun_starts_nothing(
        playbook_host: PlaybookHostFactory, reports: Reports, tmp_path: Path) -> None:
    marker = tmp_path / "nope"
    token = f"hf_s3cret'$(touch {marker})"
    sim, host = playbook_host(toolkit_preinstalled=TOOLKIT, train_steps=6,
                              train_step_seconds=0.1)
    job = make_job(sim, host, tmp_path, env={"HF_TOKEN": token})
    assert detect_runner(host) == "docker"
    run_playbook("train", steps(job), host, reports)
    assert reports.outcomes() == {"upload-dataset": "changed", "secrets-env": "changed",
                                  "upload-config": "changed", "pull-image": "changed",
                                  "start-training": "changed"}
    seen: list[Progress] = []
    final = wait(host, job, seen.append, poll_s=0.05)
    assert final.state is TrainState.SUCCEEDED and final.exit_code == 0
    steps_seen = [p.step or 0 for p in seen]
    assert steps_seen == sorted(set(steps_seen)) and steps_seen[-1] == 6  # once per step
    assert all(p.total == 6 for p in seen)
    assert all(isinstance(p.loss, float) and 0 < p.loss < 3 for p in seen)
    assert checkpoints(job) == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    assert (Path(job.output_dir) / "adapter_model.safetensors").is_file()
    assert "Training completed" in log_tail(host, job, 5)

    # The container saw the config by its /workspace path and got the token by name only.
    (run,) = sim.events("docker-run")
    assert run["container"] == container_name("train", "j-1") == "orch-train-j-1"
    assert run["argv"][-3:] == ["axolotl", "train", "/workspace/data/jobs/j-1/config.yml"]
    record = sim.containers()["orch-train-j-1"]
    assert record["Config"]["Env"] == ["HF_TOKEN"]
    assert record["HostConfig"]["Binds"] == [f"{job.layout.base}:/workspace/data"]
    config = Path(job.config_file).read_text()
    assert "/workspace/data/jobs/j-1/data/train.jsonl" in config
    assert "output_dir: /workspace/data/" in config
    assert not any("s3cret" in c for c in sim.ssh_commands())
    assert not any("s3cret" in json.dumps(e) for e in sim.events())
    assert not marker.exists()

    reports.clear()
    run_playbook("train", steps(job), host, reports)
    assert set(reports.outcomes().values()) == {"skipped"}
    assert len(sim.events("docker-run")) == 1


def test_dataset_upload_is_skipped_when_unchanged_and_redone_when_changed(
        playbook_host: PlaybookHostFactory, reports: Reports, tmp_path: Path) -> None:
    sim, host = playbook_host()
    job = make_job(sim, host, tmp_path)
    upload = steps(job)[:1]
    run_playbook("train", upload, host, reports)
    run_playbook("train", upload, host, reports)
    assert [r.outcome for r in reports.items] == ["changed", "skipped"]
    Path(job.dataset).write_text(json.dumps({"instruction": "Q", "input": "", "output": "A"}))
    run_playbook("train", steps(job)[:1], host, reports)
    assert reports.items[-1].outcome == "changed"
    assert Path(job.data_file).read_text() == Path(job.dataset).read_text()


def test_reattach_after_the_connection_closed_mid_training(
        playbook_host: PlaybookHostFactory, reports: Reports, tmp_path: Path,
        ssh_factory: Any) -> None:
    # 10 s of training: enough that it still runs after the reconnect and a second render
    # on a loaded machine (at 2 s a CI run saw it finish first; the test is about
    # reattaching to a running one).
    sim, host = playbook_host(toolkit_preinstalled=TOOLKIT, train_steps=100,
                              train_step_seconds=0.1)
    job = make_job(sim, host, tmp_path)
    run_playbook("train", steps(job), host, reports)
    early: list[Progress] = []
    end = time.monotonic() + 10
    while not early and time.monotonic() < end:  # until the first step was logged
        running = wait(host, job, early.append, poll_s=0.05, deadline=time.monotonic() + 0.2)
    assert running.state is TrainState.RUNNING and early
    with pytest.raises(Exception, match="still running"):
        prepare_resume(host, job)  # a running training is never restarted

    again = reconnect(sim, ssh_factory)
    assert not host.conn.is_connected and again.conn is not host.conn
    assert status(again, job).state is TrainState.RUNNING
    # Rendered again with other checkpoints (a takeover after the rate moved): the running
    # trainer's config is not rewritten under it, and nothing is started twice.
    before = Path(job.config_file).read_text()
    other = replace(job, config=replace(job.config, save_steps=7))
    reports.clear()
    run_playbook("train", steps(other), again, reports)
    assert status(again, job).state is TrainState.RUNNING  # else the check proves nothing
    assert reports.outcomes()["upload-config"] == "skipped"
    assert reports.outcomes()["start-training"] == "skipped"
    assert Path(job.config_file).read_text() == before
    late: list[Progress] = []
    assert wait(again, job, late.append, poll_s=0.05).state is TrainState.SUCCEEDED
    assert late[-1].step == 100 and late[0].step is not None
    assert late[0].step >= (early[-1].step or 0)
    reports.clear()
    run_playbook("train", steps(job), again, reports)
    assert reports.outcomes()["start-training"] == "skipped"
    assert len(sim.events("docker-run")) == 1


def test_crash_then_resume_from_the_newest_valid_checkpoint(
        playbook_host: PlaybookHostFactory, reports: Reports, tmp_path: Path) -> None:
    sim, host = playbook_host(toolkit_preinstalled=TOOLKIT, train_steps=8,
                              train_step_seconds=0.05, train_crash_at_step=5)
    job = make_job(sim, host, tmp_path)
    run_playbook("train", steps(job), host, reports)
    failed = wait(host, job, poll_s=0.05)
    assert failed.state is TrainState.FAILED and failed.exit_code == 1
    assert "illegal memory access" in log_tail(host, job, 10)

    info = prepare_resume(host, job)
    assert info.step == 4 and info.checkpoint == f"{job.output_dir}/checkpoint-4"
    assert info.last_step == 4 and info.lost_steps == 0 and info.moved_aside == ()
    assert status(host, job).state is TrainState.MISSING  # the old container is gone
    assert prepare_resume(host, job).step == 4  # repeating it is harmless

    reports.clear()
    run_playbook("train", steps(job), host, reports)
    assert reports.outcomes()["start-training"] == "changed"
    assert wait(host, job, poll_s=0.05).state is TrainState.SUCCEEDED
    assert sim.events("train-finished")[-1]["resumed_from"] == 4
    assert "Resuming training from checkpoint checkpoint-4" in log_tail(host, job, 50)


def test_host_dies_mid_save_partial_checkpoint_moved_aside(
        playbook_host: PlaybookHostFactory, reports: Reports, tmp_path: Path,
        ssh_factory: Any) -> None:
    sim, host = playbook_host(toolkit_preinstalled=TOOLKIT, train_steps=8,
                              train_step_seconds=0.1, host_dies_at_step=4)
    job = make_job(sim, host, tmp_path)
    try:
        run_playbook("train", steps(job), host, reports)
    except PlaybookFailed as exc:  # the host may die while the start step still verifies
        assert exc.fault is Fault.TRANSIENT and exc.step == "start-training"
    deadline = time.monotonic() + 15
    while not sim.events("host-died") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sim.events("host-died")
    sim.stop()
    sim.start()  # boots again; the container shows `exited 255`

    host = reconnect(sim, ssh_factory)
    gone = status(host, job)
    assert gone.state is TrainState.FAILED and gone.exit_code == 255
    partial = Path(job.output_dir) / "checkpoint-4"
    assert partial.is_dir() and not (partial / "trainer_state.json").exists()
    info = prepare_resume(host, job)
    assert info.step == 2 and info.last_step == 3 and info.lost_steps == 1
    (aside,) = info.moved_aside
    assert Path(aside).name.startswith("checkpoint-4.partial-") and Path(aside).is_dir()
    assert (Path(aside) / "adapter_model.safetensors").is_file()  # moved, not deleted
    assert not partial.exists() and info.problems == ("checkpoint-4: trainer_state.json missing",)

    run_playbook("train", steps(job), host, reports)
    assert wait(host, job, poll_s=0.05).state is TrainState.SUCCEEDED
    assert sim.events("train-finished")[-1]["resumed_from"] == 2
    assert checkpoints(job)[-1] == "checkpoint-8" and Path(aside).is_dir()


def test_host_without_docker_uses_the_wrapper_and_recovers_from_a_crash(
        playbook_host: PlaybookHostFactory, reports: Reports, tmp_path: Path) -> None:
    sim, host = playbook_host(has_docker=False, train_steps=6, train_step_seconds=0.1,
                              train_crash_at_step=5)
    assert detect_runner(host) == "process"
    job = make_job(sim, host, tmp_path, runner="process")
    assert status(host, job).state is TrainState.MISSING  # before anything was uploaded
    run_playbook("train", steps(job), host, reports)
    assert reports.outcomes()["job-wrapper"] == "changed"
    assert "pull-image" not in reports.outcomes()
    failed = wait(host, job, poll_s=0.05)
    assert failed.state is TrainState.FAILED and failed.exit_code == 1

    # Re-running the steps restarts by itself (prepare_resume inside the start step).
    reports.clear()
    run_playbook("train", steps(job), host, reports)
    assert reports.outcomes()["start-training"] == "changed"
    seen: list[Progress] = []
    assert wait(host, job, seen.append, poll_s=0.05).state is TrainState.SUCCEEDED
    assert seen[-1].step == 6 and seen[-1].loss is not None
    assert sim.events("train-finished")[-1]["resumed_from"] == 4
    assert checkpoints(job)[-1] == "checkpoint-6" and not sim.events("docker-run")
    reports.clear()
    run_playbook("train", steps(job), host, reports)
    assert set(reports.outcomes().values()) == {"skipped"}


def _train_sharded(playbook_host: PlaybookHostFactory, reports: Reports, tmp_path: Path,
                   strategy: str, optimizer: str = "adamw_8bit",
                   ) -> tuple[Host, TrainJob, dict[str, Any]]:
    """A full fine-tune on two simulated GPUs under `strategy`, trained to the end."""
    sim, host = playbook_host(toolkit_preinstalled=TOOLKIT, gpu_count=2, train_steps=2,
                              train_step_seconds=0.05)
    job = make_job(sim, host, tmp_path, method="full", strategy=strategy, optimizer=optimizer)
    run_playbook("train", steps(job), host, reports)
    assert wait(host, job, poll_s=0.05).state is TrainState.SUCCEEDED
    return host, job, yaml.safe_load(Path(job.config_file).read_text())


@pytest.mark.parametrize("strategy", ["zero3", "zero3_offload"])
def test_sharded_job_uploads_its_deepspeed_config_and_names_it_absolutely(
        playbook_host: PlaybookHostFactory, reports: Reports, tmp_path: Path,
        strategy: str) -> None:
    # A relative `deepspeed:` resolves from the process's working directory only: in the
    # image that is /workspace/axolotl, so orch uploads the JSON and names it absolutely.
    # With offload, DeepSpeed takes the trainer's AdamW only with zero_force_ds_cpu_optimizer
    # false (the stand-in refuses it otherwise, as DeepSpeed does).
    host, job, config = _train_sharded(playbook_host, reports, tmp_path, strategy, "adamw")
    assert reports.outcomes()["upload-deepspeed"] == "changed"
    assert job.deepspeed_file == f"{job.layout.job_dir('j-1')}/deepspeed.json"
    zero = json.loads(Path(job.deepspeed_file).read_text())
    assert zero["zero_optimization"]["stage"] == 3
    assert config["deepspeed"] == "/workspace/data/jobs/j-1/deepspeed.json"
    reports.clear()
    run_playbook("train", steps(job), host, reports)
    assert reports.outcomes()["upload-deepspeed"] == "skipped"


def test_fsdp2_job_renders_axolotls_keys_and_trains_without_a_deepspeed_file(
        playbook_host: PlaybookHostFactory, reports: Reports, tmp_path: Path) -> None:
    _, job, config = _train_sharded(playbook_host, reports, tmp_path, "fsdp2")
    assert job.deepspeed_file is None
    assert reports.outcomes().get("upload-deepspeed") in (None, "skipped")
    assert config["fsdp_version"] == 2 and "deepspeed" not in config
    # The job's 8-bit AdamW, as the FSDP2 build axolotl accepts (torchao's, not bnb's).
    assert config["optimizer"] == "adamw_torch_8bit"


def test_native_run_restores_the_image_environment(
        playbook_host: PlaybookHostFactory, reports: Reports, tmp_path: Path) -> None:
    # On a container rental `ssh host cmd` does not see the image's ENV: the wrapper's
    # command sources the env file the cloud entrypoint wrote, puts the venv first on PATH
    # and sources cuda13_env.sh, each through the host's path mapping.
    sim, host = playbook_host(has_docker=False, train_steps=2, train_step_seconds=0.05)
    marker = sim.root / "marker"
    (sim.root / "etc").mkdir(exist_ok=True)
    (sim.root / "etc" / "rp_environment").write_text('export ORCH_FROM_IMAGE="image env"\n')
    venv = sim.root / "workspace" / "axolotl-venv" / "bin"
    venv.mkdir(parents=True)
    # The venv's axolotl records what it saw, then runs the stand-in further down PATH.
    (venv / "axolotl").write_text(
        "#!/bin/sh\n"
        f'printf "%s\\n" "$ORCH_FROM_IMAGE" "$LD_LIBRARY_PATH" "$1" >> "{marker}"\n'
        'PATH=${PATH#*:} exec axolotl "$@"\n')
    (venv / "axolotl").chmod(0o755)
    scripts = sim.root / "workspace" / "axolotl" / "scripts"
    scripts.mkdir(parents=True)
    (scripts / "cuda13_env.sh").write_text(
        'export LD_LIBRARY_PATH="/cu13/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"\n')
    job = replace(make_job(sim, host, tmp_path, runner="process"),
                  native=NativeEnv.mapped(host.paths))
    run_playbook("train", steps(job), host, reports)
    assert wait(host, job, poll_s=0.05).state is TrainState.SUCCEEDED
    assert marker.read_text().splitlines() == ["image env", "/cu13/lib", "train"]
    assert train_argv(job)[:4] == ["sh", job.wrapper, "start", job.handle("train").run_dir]


HOSTILE = "x;touch {m}; $(touch {m}) `touch {m}` 'q\" \nz"


def test_hostile_job_id_and_dataset_name_run_nothing_unintended(
        playbook_host: PlaybookHostFactory, reports: Reports, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    hostile = HOSTILE.format(m=marker)
    sim, host = playbook_host(toolkit_preinstalled=TOOLKIT, train_steps=2,
                              train_step_seconds=0.05)
    job = make_job(sim, host, tmp_path, job_id=hostile, dataset_name=f"{hostile}.jsonl")
    run_playbook("train", steps(job), host, reports)
    assert wait(host, job, poll_s=0.05).state is TrainState.SUCCEEDED
    assert not marker.exists()
    assert Path(job.data_file).is_file() and Path(job.data_file).parent.parent.parent == \
        Path(job.layout.base) / "jobs"
    assert container_name("train", hostile) in sim.containers()
    with pytest.raises(ValueError, match="image"):
        TrainJob("j", job.layout, job.dataset, job.config, job.base_model, image="--privileged")
    with pytest.raises(ValueError, match="variable name"):
        TrainJob("j", job.layout, job.dataset, job.config, job.base_model,
                 env={"A=1 B": "x"})


def test_parse_progress() -> None:
    log = ("Tokenizing Prompts (num_proc=4): 100%|##########| 1000/1000 [00:01<00:00]\n"
           "{'loss': 2.5, 'grad_norm': 1.0, 'learning_rate': 0.0002, 'epoch': 0.1}\n"
           "  10%|#         | 1/10 [00:01<00:09, 1.00it/s]\r  20%|##        | 2/10 [00:02<00:08]\n"
           "{'eval_loss': 9.9, 'epoch': 0.2}\n{'train_loss': 7.7}\n")
    assert parse_progress(log) == Progress(2, 10, 2.5, ((1, 2.5),))
    assert parse_progress("no progress yet") == Progress(None, None, None)
    # transformers: the bar reaches a step, tqdm.write clears it, prints the logs dict and
    # draws the bar again at the same step; every step's loss is kept, not only the last.
    hf = "".join(f"\r {10 * n}%|#| {n}/10 [00:0{n}<00:00]\r   \r{{'loss': {n / 10}, "
                 f"'epoch': {n / 10}}}\n\r {10 * n}%|#| {n}/10 [00:0{n}<00:00]"
                 for n in (3, 4, 5))
    assert parse_progress(hf).losses == ((3, 0.3), (4, 0.4), (5, 0.5))
    # A loss with no bar after it yet belongs to the next poll.
    assert parse_progress(hf + "\r   \r{'loss': 0.6}\n").losses[-1] == (5, 0.5)
    assert parse_progress("{'loss': 1e-3}").loss == 0.001


def test_a_run_that_crashes_right_after_starting_counts_as_started(
        playbook_host: PlaybookHostFactory, tmp_path: Path) -> None:
    # Issue 10 §8: on a busy machine the crash at step 1 lands between the start step's own
    # status read and its re-check. The step did start the run; the failure belongs to the
    # wait (with the log), not to "start-training did not take effect".
    sim, host = playbook_host(toolkit_preinstalled=TOOLKIT, train_steps=6,
                              train_step_seconds=0.05, train_crash_at_step=1,
                              train_crash_repeats=True)
    job = make_job(sim, host, tmp_path)
    *before, start = steps(job)
    run_playbook("train", before, host, lambda report: None)
    assert start.name == "start-training" and not start.check(host)
    assert start.apply is not None
    try:
        start.apply(host)
    except StepFailed as exc:  # the crash may already show in the step's own status read
        assert "training exited with code" in str(exc)
    deadline = time.monotonic() + 30
    while status(host, job).state is not TrainState.FAILED and time.monotonic() < deadline:
        time.sleep(0.05)
    assert status(host, job).state is TrainState.FAILED
    assert start.check(host), "a started run that failed must not read as never started"


@pytest.mark.parametrize(("epochs", "total"), [(2, 12), (1.5, 9)])
def test_the_trainer_runs_the_epochs_the_job_asks_for(
        playbook_host: PlaybookHostFactory, reports: Reports, tmp_path: Path, epochs: float,
        total: int) -> None:
    """Issue 36 §6: the sim trainer ran `train_steps` whatever `epochs` said. As
    transformers' Trainer: max_steps = ceil(num_train_epochs * steps per epoch), and the
    logged `epoch` counts epochs."""
    sim, host = playbook_host(toolkit_preinstalled=TOOLKIT, train_steps=6,
                              train_step_seconds=0.02)
    job = make_job(sim, host, tmp_path, save_steps=100)
    job = replace(job, config=replace(job.config, epochs=epochs))
    assert f"num_epochs: {epochs:g}" in render_config(job)
    run_playbook("train", steps(job), host, reports)
    seen: list[Progress] = []
    final = wait(host, job, seen.append, poll_s=0.05)
    assert final.state is TrainState.SUCCEEDED
    assert seen[-1].step == seen[-1].total == total
    state = json.loads((Path(job.output_dir) / f"checkpoint-{total}" / "trainer_state.json")
                       .read_text())
    assert (state["global_step"], state["max_steps"], state["epoch"]) == (total, total, epochs)
    assert state["num_train_epochs"] == epochs
