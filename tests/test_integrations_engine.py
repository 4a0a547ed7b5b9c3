"""Issue 39, phase B: Hub datasets, trackers and webhooks checked by the engine before renting
(the same path as `orch submit` and `orch worker`), against the Hub emulator in HF_ENDPOINT.

Each refusal fails the job with the field and the fix, and nothing is rented.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from emulators.hub import HubEmulator
from test_engine import Rig, rig  # noqa: F401  (the engine test rig fixture)

CARD = {"dataset_info": {"splits": [{"name": "train", "num_bytes": 4_000, "num_examples": 20},
                                    {"name": "test", "num_bytes": 400, "num_examples": 2}]}}
FILES = {"README.md": b"# data\n", "data/train-00000-of-00001.jsonl": b"{}\n"}


def hub_job(rig: Rig, dataset: str, extra: str = "") -> Path:  # noqa: F811
    """The quickstart job with `dataset` (YAML) in place of its local file."""
    path = rig.job_file()
    text = path.read_text().replace("dataset:\n  path: data/train.jsonl\n  format: alpaca\n",
                                    dataset)
    path.write_text(text + extra)
    return path


def refused(rig: Rig, path: Path) -> str:  # noqa: F811
    """Run `path` on a fresh simulated cloud; the failure reason (nothing may be rented)."""
    cloud = rig.cloud()
    job_id = rig.queue(path)
    job = rig.run(cloud, job_id)
    assert job.status == "failed", job.failure_reason
    assert rig.store.instances_of(job_id) == [] and cloud.list() == []
    reason: Any = job.failure_reason
    assert reason.startswith("before renting: "), reason
    return str(reason)


def test_a_gated_hub_dataset_without_a_token_fails_before_renting(
        rig: Rig, session_hub: HubEmulator, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    monkeypatch.delenv("HF_TOKEN", raising=False)
    session_hub.add_repo("org/gated-data", FILES, repo_type="dataset", gated=True,
                         card_data=CARD)
    try:
        reason = refused(rig, hub_job(rig, "dataset:\n  path: {hf: org/gated-data}\n"
                                           "  tokens: 100000\n"))
    finally:
        del session_hub.repos[("dataset", "org/gated-data")]
    assert "dataset.path.hf: " in reason and "HF_TOKEN" in reason
    assert "`hf` says: Access denied. Dataset 'org/gated-data' requires approval." in reason


def test_an_unknown_hub_dataset_fails_before_renting(
        rig: Rig, session_hub: HubEmulator) -> None:  # noqa: F811
    reason = refused(rig, hub_job(rig, "datasets:\n  - path: data/train.jsonl\n"
                                       "  - path: {hf: org/no-such-data}\n    tokens: 1000\n"))
    assert "datasets[1].path.hf: " in reason
    assert "Dataset 'org/no-such-data' not found" in reason


def test_a_validation_split_the_dataset_lacks_fails_before_renting(
        rig: Rig, session_hub: HubEmulator) -> None:  # noqa: F811
    session_hub.add_repo("org/open-data", FILES, repo_type="dataset", card_data=CARD)
    try:
        reason = refused(rig, hub_job(rig, "dataset:\n  path: {hf: org/open-data}\n"
                                           "  tokens: 100000\n  validation_split: valid\n"))
    finally:
        del session_hub.repos[("dataset", "org/open-data")]
    assert "dataset.validation_split: org/open-data has no split 'valid' (it has train, " \
           "test)" in reason


def test_a_tracker_without_its_key_fails_before_renting(
        rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    from emulators.webhook import WebhookReceiver

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    with WebhookReceiver() as hook:
        path = rig.job_file()
        path.write_text(path.read_text() + "tracking:\n  wandb: {project: orch-tests}\n"
                        f"notify: {{url: {hook.url}/orch}}\n")
        reason = refused(rig, path)
        got = [r.json() for r in hook.delivered()]
    assert "tracking.wandb: W&B needs WANDB_API_KEY" in reason
    assert "https://wandb.ai/authorize" in reason
    # The failure is told, with its reason.
    assert [g["type"] for g in got] == ["job.failed"]
    assert got[0]["data"]["reason"] == reason


def test_a_webhook_url_variable_unset_and_a_bad_secret_fail_before_renting(
        rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    monkeypatch.delenv("ORCH_TEST_HOOK_URL", raising=False)
    monkeypatch.setenv("ORCH_NOTIFY_URL", "http://127.0.0.1:9/hooks")
    monkeypatch.setenv("ORCH_NOTIFY_SECRET_ENV", "ORCH_TEST_HOOK_SECRET")
    monkeypatch.setenv("ORCH_TEST_HOOK_SECRET", "whsec_not base64!")
    path = rig.job_file()
    path.write_text(path.read_text() + "notify:\n  url_env: ORCH_TEST_HOOK_URL\n")
    reason = refused(rig, path)
    assert "notify.url_env: ORCH_TEST_HOOK_URL is not set" in reason
    assert "ORCH_NOTIFY_SECRET_ENV: ORCH_TEST_HOOK_SECRET is not base64" in reason
    assert "whsec_not" not in reason  # the secret's value is never echoed


def test_the_sim_hub_answers_dataset_info_as_the_real_client_reads_it() -> None:
    """Without HF_ENDPOINT a sim-only job's datasets are the hosts' synthetic ones: the sim Hub
    publishes their splits (read here by huggingface_hub's own HfApi) and gates as for models."""
    from huggingface_hub import HfApi

    from orchestrator.core.spec import JobSpec
    from orchestrator.engine import integrations
    from providers.sim import hub
    from simhost.standins.hf import SYNTHETIC_SPLITS

    url = hub.serve(("org/gated-data",))
    info = HfApi(endpoint=url, token=False).dataset_info("org/any-data")
    card = info.card_data.to_dict() if info.card_data is not None else {}
    splits = {s["name"]: s["num_examples"] for s in card["dataset_info"]["splits"]}
    assert splits == SYNTHETIC_SPLITS

    def spec(dataset: dict[str, object]) -> JobSpec:
        return JobSpec.model_validate({"name": "j", "base_model": "Qwen/Qwen2.5-0.5B",
                                       "method": "qlora", "dataset": dataset})

    ok = integrations.check_hub_datasets(spec({"path": {"hf": "org/any-data"},
                                               "validation_split": "test"}), None, url)
    assert ok.problems == [] and ok.unchecked == []
    bad = integrations.check_hub_datasets(spec({"path": {"hf": "org/any-data", "split": "dev"}}),
                                          None, url)
    assert bad.problems == ["dataset.path.split: org/any-data has no split 'dev' (it has "
                            "train, test)"]
    gated = integrations.check_hub_datasets(spec({"path": {"hf": "org/gated-data"}}), None, url)
    assert len(gated.problems) == 1 and "requires approval" in gated.problems[0]


@pytest.mark.parametrize("host", ["docker", "container"])
def test_orch_render_shows_the_hub_dataset_as_the_host_downloads_it(
        tmp_path: Path, host: str) -> None:
    """A sim-only job without HF_ENDPOINT: sized by the sim Hub, rendered with the download
    on the host, the eval split and the W&B keys; the config passes the schema check."""
    import json
    import os
    import shutil

    import orchfork

    from playbooks.axolotl_schema import problems, rule_problems

    root = Path(__file__).resolve().parents[1]
    shutil.copytree(root / "examples" / "data", tmp_path / "data")
    text = (root / "examples" / "quickstart.yml").read_text().replace(
        "dataset:\n  path: data/train.jsonl\n  format: alpaca\n",
        "dataset:\n  path: tatsu-lab/alpaca\n  validation_split: test\n")
    job = tmp_path / "job.yml"
    job.write_text(text + "tracking:\n  wandb: {project: alpaca-runs}\n  mlflow: "
                   "{tracking_uri: 'https://mlflow.example.com', experiment: alpaca}\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("ORCH_DB_URL", "HF_TOKEN", "HF_ENDPOINT")}
    env["XDG_DATA_HOME"] = str(tmp_path / "xdg")
    proc = orchfork.run(["render", str(job), "--host", host, "--json"], env=env, cwd=root,
                        timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    cfg = out["axolotl_config"]
    base = "/workspace/data" if host == "docker" else "/workspace/orch"
    folder = f"{base}/datasets/tatsu-lab--alpaca/main"
    assert cfg["datasets"] == [{"path": folder, "type": "alpaca", "split": "train"}]
    assert cfg["test_datasets"] == [{"path": folder, "type": "alpaca", "split": "test"}]
    assert cfg["use_wandb"] is True and cfg["wandb_project"] == "alpaca-runs"
    assert cfg["use_mlflow"] is True and cfg["mlflow_experiment_name"] == "alpaca"
    assert cfg["mlflow_tracking_uri"] == "https://mlflow.example.com"
    assert cfg["mlflow_run_name"] == cfg["wandb_name"] == "quickstart-qwen25-05b"
    assert problems(cfg) == [] and rule_problems(cfg) == []
    download = out["commands"]["dataset tatsu-lab/alpaca"]
    assert download[download.index("hf"):download.index("hf") + 3] == [
        "hf", "download", "tatsu-lab/alpaca"]
    assert "--repo-type=dataset" in download
    assert (download[:3] == ["docker", "run", "--rm"]) == (host == "docker")


def test_a_webhook_that_refuses_is_recorded_and_shown_and_the_job_still_succeeds(
        rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """A receiver answering 404 (another attempt would not change it): the job succeeds,
    the failure is a `notify.failed` event and `orch show` (text and --json) shows it; the
    tracker's run page is shown from the job id."""
    import json
    import os

    import orchfork
    from emulators.webhook import WebhookReceiver

    monkeypatch.setenv("WANDB_API_KEY", "wandb-test-key")
    with WebhookReceiver() as hook:
        hook.fail_next, hook.fail_status = 100, 404
        url = hook.url
        path = rig.job_file()
        path.write_text(path.read_text() + f"notify: {{url: {hook.url}/hooks/orch}}\n"
                        "tracking:\n  wandb: {project: runs, entity: team}\n")
        cloud = rig.cloud()
        job_id = rig.queue(path)
        job = rig.run(cloud, job_id)
        assert job.status == "succeeded", job.failure_reason
        assert [r.json()["type"] for r in hook.received] == ["job.succeeded"]
    failed = [e for e in rig.store.events(job_id) if e.kind == "notify.failed"]
    assert len(failed) == 1
    data = json.loads(failed[0].data_json or "{}")
    assert data["type"] == "job.succeeded" and data["reason"] == "HTTP 404"
    assert data["endpoint"] == url and data["attempts"] == 1
    assert "/hooks/orch" not in (failed[0].data_json or "")  # a URL's path may be a secret
    env = {**os.environ, "XDG_DATA_HOME": str(rig.tmp / "xdg")}
    root = Path(__file__).resolve().parents[1]
    shown = orchfork.run(["show", job_id], env=env, cwd=root, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert (f"webhook not delivered: job.succeeded to {url} (HTTP 404, 1 attempt(s))"
            in shown.stdout)
    assert f"W&B run: https://wandb.ai/team/runs/runs/{job_id}" in shown.stdout
    as_json = json.loads(orchfork.run(["show", job_id, "--json"], env=env, cwd=root,
                                      timeout=120).stdout)
    assert as_json["notify_failed"][0]["reason"] == "HTTP 404"
    assert as_json["trackers"][0]["url"] == f"https://wandb.ai/team/runs/runs/{job_id}"


def test_a_sweep_tells_when_it_finishes_with_its_best_run(
        rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """`notify:` in the sweep file: each run's end is told, and the last run's end tells
    `sweep.finished` with the best run by the objective (once)."""
    from emulators.webhook import WebhookReceiver

    from orchestrator.core.sweepspec import load_sweep
    from orchestrator.records.sweep.store import submit_sweep
    from providers.sim.compute import SimCloud

    with WebhookReceiver() as hook:
        base = rig.job_file()
        sweep = base.parent / "sweep.yml"
        sweep.write_text(f"name: hooked\nbase: {base.name}\n"
                         "grid:\n  training.learning_rate: [1.0e-4, 2.0e-4]\n"
                         "objective: {metric: eval.exact_match, goal: max}\n"
                         f"notify: {{url: {hook.url}/sweeps}}\n")
        report = submit_sweep(rig.store, load_sweep(sweep), listed=SimCloud.price_list())
        ids = [r.job_id for r in report.runs]
        assert len(ids) == 2
        cloud = rig.cloud()
        for job_id in ids:
            assert rig.run(cloud, job_id).status == "succeeded"
        got = [r.json() for r in hook.delivered()]
    assert [g["type"] for g in got] == ["job.succeeded", "job.succeeded", "sweep.finished"]
    finished = got[-1]["data"]
    assert finished["name"] == "hooked" and finished["runs"] == 2
    assert finished["last_run"] == ids[1] and finished["metric"] == "eval.exact_match"
    assert finished["best"]["job_id"] in ids
    kinds = [e.kind for i in ids for e in rig.store.events(i)]
    assert kinds.count("sweep.finished") == 1


def test_a_sweep_whose_budget_holds_its_runs_back_tells_so(rig: Rig) -> None:  # noqa: F811
    """After a run, every run still queued waits on the sweep's budget: `job.budget_reached`
    (scope sweep, with what was spent), once."""
    from emulators.webhook import WebhookReceiver

    from orchestrator.core.sweepspec import load_sweep
    from orchestrator.records.sweep.store import submit_sweep
    from providers.sim.compute import SimCloud

    with WebhookReceiver() as hook:
        base = rig.job_file()
        sweep = base.parent / "sweep.yml"
        sweep.write_text(f"name: tight\nbase: {base.name}\nbudget: 0.000001\n"
                         "grid:\n  training.learning_rate: [1.0e-4, 2.0e-4, 3.0e-4]\n"
                         f"notify: {{url: {hook.url}/sweeps, events: [job.budget_reached]}}\n")
        report = submit_sweep(rig.store, load_sweep(sweep), listed=SimCloud.price_list())
        first = str(report.runs[0].job_id)
        assert rig.run(rig.cloud(), first).status == "succeeded"
        got = [r.json() for r in hook.delivered()]
    assert [g["type"] for g in got] == ["job.budget_reached"]
    data = got[0]["data"]
    assert data["scope"] == "sweep" and data["name"] == "tight" and data["waiting"] == 2
    assert data["budget_usd"] == "0.000001" and data["last_run"] == first


def test_orch_notify_url_that_never_answers_is_recorded_when_the_run_stops_waiting(
        rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """ORCH_NOTIFY_URL on a closed port: the job succeeds all the same; the delivery still
    retrying when the run stops waiting (notifications.CLOSE_S) is recorded, not lost."""
    import json
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("ORCH_NOTIFY_URL", f"http://127.0.0.1:{port}/secret-path")
    cloud = rig.cloud()
    job_id = rig.queue(rig.job_file())
    job = rig.run(cloud, job_id)
    assert job.status == "succeeded", job.failure_reason
    failed = [json.loads(e.data_json or "{}") for e in rig.store.events(job_id)
              if e.kind == "notify.failed"]
    assert [f["type"] for f in failed] == ["job.succeeded"]
    assert failed[0]["endpoint"] == f"http://127.0.0.1:{port}"
    assert failed[0]["reason"].startswith(("not confirmed", "ConnectError"))


def test_a_sweep_over_a_hub_dataset_is_sized_once_from_the_hub(tmp_path: Path) -> None:
    """The base job's Hub dataset is sized by the Hub (here the sim Hub); every run reuses
    that size (no `tokens:` needed) and records it for its worker."""
    from orchestrator.core.sweepspec import load_sweep
    from orchestrator.engine import hubdatasets
    from orchestrator.engine.submission import hub_size_record
    from providers.sim import hub

    (tmp_path / "job.yml").write_text(
        "name: j\nbase_model: Qwen/Qwen2.5-0.5B\nmethod: qlora\n"
        "dataset: {path: tatsu-lab/alpaca}\nresources: {providers: [sim]}\n")
    (tmp_path / "sweep.yml").write_text(
        "name: s\nbase: job.yml\ngrid:\n  training.learning_rate: [1.0e-4, 2.0e-4]\n")
    sizer = hubdatasets.Sizer(None, hub=hub.serve(hub.gated_repos()), viewer=None)
    loaded = load_sweep(tmp_path / "sweep.yml", hub_size=sizer)
    assert len(loaded.runs) == 2
    for run in loaded.runs:
        ((ref, size),) = run.job.hub_sizes
        assert ref.repo == "tatsu-lab/alpaca" and size.rows == 16
        assert hub_size_record(ref, size)["source"].startswith("Hub dataset info: 16 rows")


def test_a_takeover_sends_again_what_a_crashed_run_recorded_but_did_not_deliver(
        rig: Rig) -> None:  # noqa: F811
    """Persist before acting: a run that died after recording `job.preempted` (its webhook
    id in the event) but before delivering it leaves it unsent; the next run of the job
    sends it with the same id, and not what was recorded as delivered."""
    import json

    from emulators.webhook import WebhookReceiver

    with WebhookReceiver() as hook:
        path = rig.job_file()
        path.write_text(path.read_text() + f"notify: {{url: {hook.url}/orch}}\n")
        job_id = rig.queue(path)
        # What the crashed run left in the history (its process is gone).
        rig.store.add_event(job_id, "job.preempted", "lost", {
            "webhook_id": "msg_unsent", "reason": "preempted", "instance": "sim-1"})
        rig.store.add_event(job_id, "job.replaced", "again", {
            "webhook_id": "msg_sent", "placement": "sim RTX 3090 x1"})
        rig.store.add_event(job_id, "notify.sent", "delivered", {
            "webhook_id": "msg_sent", "type": "job.replaced", "endpoint": hook.url})
        job = rig.run(rig.cloud(), job_id)
        got = hook.delivered()
    assert job.status == "succeeded", job.failure_reason
    assert [(r.json()["type"], r.headers["webhook-id"]) for r in got][:1] == [
        ("job.preempted", "msg_unsent")]
    assert [r.json()["type"] for r in got] == ["job.preempted", "job.succeeded"]
    assert got[0].json()["data"] == {"job_id": job_id, "name": "quickstart-qwen25-05b",
                                     "reason": "preempted", "instance": "sim-1"}
    sent = [json.loads(e.data_json or "{}")["webhook_id"] for e in rig.store.events(job_id)
            if e.kind == "notify.sent"]
    assert sent[0] == "msg_sent" and "msg_unsent" in sent and len(sent) == 3
