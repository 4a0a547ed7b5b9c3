"""GPU memory another process holds (the user's notebook on a kept server, a server left
running, a leftover the driver still counts): vLLM refuses to start without
gpu_memory_utilization x the card free, and says so under its engine's prefix before the API
server's "Engine core initialization failed", which ends its log. orch reports the engine's
cause and what nvidia-smi says holds the memory (a Docker host and a container rental, real
sshd, the stand-ins' nvidia-smi and vLLM)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import PlaybookHostFactory, Reports
from test_evaluate_native import CLOUD_IMAGE
from test_pipeline import make_job
from test_playbook_evaluate import IMAGE, ROWS, free_port, merged_model, setup

from playbooks.base import PlaybookFailed, container_name
from playbooks.evaluate import evaluate
from playbooks.pipeline import run_pipeline
from playbooks.vllm import root_cause

# The API server's last line after any engine start-up failure (vLLM V1).
ENGINE_FAILED = ("RuntimeError: Engine core initialization failed. See root cause above. "
                 "Failed core proc(s): {}")
# 21504 MiB held of an H100's 81559: 58.65 GiB free, 57.9 once vLLM's CUDA context exists;
# vLLM asks 0.9 x 79.65 = 71.68 GiB.
REFUSED = ("ValueError: Free memory on device cuda:0 (57.9/79.65 GiB) on startup is less than "
           "desired GPU memory utilization (0.9, 71.68 GiB). Decrease GPU memory utilization "
           "or reduce GPU memory used by other processes.")


def test_the_engines_cause_is_read_past_the_api_servers_last_line() -> None:
    log = "\n".join([
        "(APIServer pid=1) INFO 12-07 10:00:01 [api_server.py:1882] vLLM API server version 0.19.1",
        "(EngineCore_DP0 pid=229) ERROR 12-07 10:00:09 [core.py:1108] EngineCore failed to start.",
        "(EngineCore_DP0 pid=229) ERROR 12-07 10:00:09 [core.py:1108] Traceback (most recent "
        "call last):",
        f"(EngineCore_DP0 pid=229) ERROR 12-07 10:00:09 [core.py:1108] {REFUSED}",
        "(APIServer pid=1) Traceback (most recent call last):",
        '(APIServer pid=1)   File "/usr/local/bin/vllm", line 10, in <module>',
        f"(APIServer pid=1) {ENGINE_FAILED}",
    ])
    assert root_cause(log) == REFUSED
    # Out of memory while loading, as torch names it; other failures are their last line.
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    assert root_cause(f"(EngineCore pid=7) {oom}\n(APIServer pid=1) {ENGINE_FAILED}") == oom
    assert root_cause("INFO loading\nOSError: [Errno 98] Address already in use") == (
        "OSError: [Errno 98] Address already in use")
    assert root_cause(ENGINE_FAILED) == ENGINE_FAILED  # nothing else to go by
    # Python's resource tracker may warn after the API server's line (vllm-project/vllm#26898).
    warned = (f"{log}\n/usr/lib/python3.12/multiprocessing/resource_tracker.py:279: "
              "UserWarning: resource_tracker: There appear to be 1 leaked shared_memory objects "
              "to clean up at shutdown\n  warnings.warn('resource_tracker: There appear to be %d '")
    assert root_cause(warned) == REFUSED


def test_a_docker_host_whose_gpu_memory_is_held_says_the_cause_and_who_holds_it(
        playbook_host: PlaybookHostFactory) -> None:
    sim, host, layout = setup(playbook_host, gpu_memory_held_mib=21504)
    model = merged_model(layout, "job-m")
    with pytest.raises(PlaybookFailed) as info:
        evaluate(host, "job-m", model, layout, IMAGE, free_port(), 1024, ROWS)
    said = str(info.value)
    assert REFUSED in said and "Engine core initialization failed" not in said
    assert ("nvidia-smi on the host: GPU 0: 21504 of 81559 MiB in use; held by pid 4242 "
            "(python3, 21504 MiB)") in said
    # The stand-in's log ends as vLLM's does, the engine's error ~60 lines before the end (the
    # API server's traceback): the 50 lines kept with the failure are that traceback, and the
    # cause was read further back. The refused container is removed.
    log = info.value.stderr_tail
    assert log.rstrip().endswith(ENGINE_FAILED) and "Free memory on device" not in log
    assert not sim.events("vllm-serving") and container_name("vllm", "job-m") not in (
        sim.containers())


def test_a_rental_whose_gpu_memory_is_held_fails_its_eval_with_the_cause(
        playbook_host: PlaybookHostFactory, reports: Reports, tmp_path: Path) -> None:
    # No host check here (run_pipeline of a job without one): the trained model is home when
    # the evaluation is refused, and the reason is vLLM's cause, not its last line. A
    # rental's nvidia-smi sees no process of another PID namespace, and says so.
    _sim, host = playbook_host(has_docker=False, container_image=CLOUD_IMAGE, train_steps=2,
                               train_step_seconds=0.05, gpu_memory_held_mib=21504)
    job = make_job(tmp_path, "lora")
    with pytest.raises(PlaybookFailed) as info:
        run_pipeline(host, job, reports)
    said = str(info.value)
    assert info.value.playbook == "evaluate" and REFUSED in said
    assert "GPU 0: 21504 of 81559 MiB in use; no process holding it is visible" in said
    assert any(Path(job.artifacts_dir).rglob("adapter_model.safetensors"))


def test_a_rentals_evaluation_ends_with_its_gpu_memory_free(
        playbook_host: PlaybookHostFactory, reports: Reports, tmp_path: Path) -> None:
    # vLLM's engine process holds the GPU's memory and takes seconds to exit after SIGTERM
    # (5 s here). The stop must wait for it: the next job on a machine kept warm, or the
    # merge, would otherwise meet the memory still taken. orch-job.sh's stop once returned as
    # soon as its leader `sh` died, the engine still exiting.
    _sim, host = playbook_host(has_docker=False, container_image=CLOUD_IMAGE, train_steps=2,
                               train_step_seconds=0.05, vllm_exit_seconds=5.0)
    job = make_job(tmp_path, "lora")
    result = run_pipeline(host, job, reports)
    assert result.metrics["eval.exact_match"] == 1.0
    used = host.run(["nvidia-smi", "--query-gpu=memory.used",
                     "--format=csv,noheader,nounits"]).stdout.split()
    assert used == ["0"]
