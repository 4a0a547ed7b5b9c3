"""A failure after training never loses the trained model (issue 9 §1.8).

The job asks for lm-eval tasks on a simulated host that has no `lm_eval`: evaluation fails
after training. The adapter must already be in the job's artifacts directory, the job
ends `failed` with an "evaluation failed: ..." reason that says where the model is and how
to evaluate it again, and no instance is left running.
"""

from __future__ import annotations

import json
from pathlib import Path

from test_engine import Rig, assert_nothing_left, rig  # noqa: F401  (fixture)
from test_evaluate_native import CLOUD_IMAGE


def test_evaluation_failure_keeps_the_artifacts(rig: Rig) -> None:  # noqa: F811
    cloud = rig.cloud()
    path = rig.job_file()
    path.write_text(path.read_text().replace("  eval_set: data/eval.jsonl",
                                             "  eval_set: data/eval.jsonl\n  tasks: [gsm8k, "
                                             "no_such_task]"))
    job_id = rig.queue(path)
    job = rig.run(cloud, job_id)

    assert job.status == "failed"
    reason = job.failure_reason or ""
    assert reason.startswith("evaluation failed: "), reason
    assert "Tasks not found: no_such_task" in reason
    assert job.artifacts_dir, "the artifacts directory was not recorded"
    artifacts = Path(job.artifacts_dir)
    assert f"The trained model is kept in {artifacts}." in reason
    assert "Re-running only the evaluation" in reason
    assert (artifacts / "manifest.json").is_file()
    assert (artifacts / "adapter_model.safetensors").is_file()
    kinds = rig.kinds(job_id)
    # Copied back before the evaluation started, and the failure is recorded as its own.
    assert kinds.index("artifacts") < kinds.index("evaluation.failed")
    (failed,) = [e for e in rig.store.events(job_id) if e.kind == "evaluation.failed"]
    assert json.loads(failed.data_json or "{}")["artifacts_dir"] == str(artifacts)
    assert rig.states(job_id)[-3:] == ["merging", "evaluating", "failed"]
    assert_nothing_left(rig, cloud, job_id)


def test_container_rental_evaluates_without_docker(rig: Rig) -> None:  # noqa: F811
    # A container rental of the axolotl image (Vast.ai, RunPod): no Docker; the pinned vLLM
    # is installed in a venv of its own and serves the eval set (issue 19 §1).
    cloud = rig.cloud(host_options={"has_docker": False, "container_image": CLOUD_IMAGE})
    job_id = rig.queue(rig.job_file())
    job = rig.run(cloud, job_id)

    assert job.status == "succeeded", job.failure_reason
    metrics = {m.name: m.value for m in rig.store.metrics(job_id) if m.step is None}
    assert metrics["eval.count"] == 3
    steps = [json.loads(e.data_json or "{}") for e in rig.store.events(job_id)
             if e.kind.startswith("step.")]
    assert {s["step"] for s in steps if s["playbook"] == "evaluate"} >= {
        "vllm-install", "vllm-server", "vllm-ready", "score-eval-set"}
    assert not any(s["step"].startswith("lm-eval") for s in steps)
    assert_nothing_left(rig, cloud, job_id)
