"""Issue 39's acceptance on `sim`: a job with a Hub dataset (and a local one, and an eval split),
W&B tracking and a webhook runs end to end.

- the Hub emulator (HF_ENDPOINT) serves the dataset to the host's `hf`, which runs the real
  huggingface_hub client (simhost/standins/hf.py) on the GPU host, never through orch's side;
- the axolotl config the host trains with names both datasets, the eval split and the W&B
  keys, and passes the schema check (the simulated trainer reads every entry);
- WANDB_API_KEY reaches the trainer through the job's 0600 env file only: never argv, the
  database or the events.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from emulators.hub import HubEmulator
from emulators.webhook import WebhookReceiver
from test_engine import Rig, rig, training_step, when  # noqa: F401  (the engine test rig)

from playbooks.axolotl_schema import problems, rule_problems

SECRET = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"  # 24 bytes, base64
WANDB_KEY = "wandb-key-" + "0123456789abcdef" * 2
ROWS = [{"conversations": [{"from": "human", "value": f"What is {i}+{i}?"},
                           {"from": "gpt", "value": str(2 * i)}]} for i in range(8)]
FILES = {"README.md": b"# chats\n",
         "data/train-00000-of-00001.jsonl": "".join(json.dumps(r) + "\n"
                                                   for r in ROWS).encode(),
         "data/test-00000-of-00001.jsonl": (json.dumps(ROWS[0]) + "\n").encode()}
CARD = {"dataset_info": {"splits": [{"name": "train", "num_bytes": 8_000, "num_examples": 8},
                                    {"name": "test", "num_bytes": 1_000, "num_examples": 1}]}}
DATASETS = """datasets:
  - path: data/train.jsonl
    format: alpaca
  - path: {hf: org/chats}
    format: chat_template
    fields: {messages: conversations, role: from, content: value}
    validation_split: test
"""


def queue(rig: Rig, path: Path) -> str:  # noqa: F811
    """`orch submit`'s recording: the Hub dataset sized from its card (as `orch plan` does)."""
    import os

    from orchestrator.core.spec import load_job
    from orchestrator.engine.integrations import PlanSizer
    from orchestrator.engine.submission import record_job

    job, _ = record_job(rig.store, load_job(path, hub_size=PlanSizer(path, os.environ)))
    return job.id


def host_files(rig: Rig, name: str) -> list[Path]:  # noqa: F811
    return [p for p in (rig.tmp / "sim").rglob(name) if p.is_file()]


def test_a_hub_dataset_with_wandb_and_a_webhook_runs_end_to_end_on_sim(
        rig: Rig, session_hub: HubEmulator, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    monkeypatch.setenv("WANDB_API_KEY", WANDB_KEY)
    monkeypatch.setenv("ORCH_TEST_HOOK_SECRET", SECRET)
    session_hub.add_repo("org/chats", FILES, repo_type="dataset", card_data=CARD)
    before = len(session_hub.requests)
    hook = WebhookReceiver(secret=SECRET).__enter__()
    path = rig.job_file()
    text = path.read_text().replace("dataset:\n  path: data/train.jsonl\n  format: alpaca\n",
                                    DATASETS)
    path.write_text(text + "tracking:\n  wandb: {project: orch-tests, entity: team}\n"
                    f"notify:\n  url: {hook.url}/orch\n  secret_env: ORCH_TEST_HOOK_SECRET\n")
    cloud = rig.cloud(host_options={"train_steps": 10, "train_step_seconds": 0.3})
    try:
        job_id = queue(rig, path)
        seen: list[dict[str, Any]] = []
        containers: list[dict[str, Any]] = []

        def look() -> None:  # the host's files while training runs
            seen.extend(yaml.safe_load(p.read_text())
                        for p in host_files(rig, "config.yml") if job_id in str(p))
            containers.extend(json.loads(p.read_text())
                              for p in host_files(rig, "container.json"))

        def preempt() -> None:  # once, on the first machine
            (row,) = rig.store.instances_of(job_id)
            cloud.preempt(str(row.provider_instance_id))

        when(lambda: training_step(rig.store, job_id) > 0, look)
        when(lambda: training_step(rig.store, job_id) >= 4, preempt)
        job = rig.run(cloud, job_id)
    finally:
        del session_hub.repos[("dataset", "org/chats")]
        hook.__exit__(None, None, None)
    assert job.status == "succeeded", job.failure_reason

    # The host's real `hf` client downloaded the dataset from the Hub emulator.
    downloads = [r for r in session_hub.requests[before:] if "/datasets/org/chats" in r.path]
    assert any(r.path.endswith("data/train-00000-of-00001.jsonl") for r in downloads)
    assert seen, "the config was not seen on the host"
    config = seen[0]
    assert problems(config) == [] and rule_problems(config) == []
    first, second = config["datasets"]
    assert first["type"] == "alpaca" and first["path"].endswith("/train.jsonl")
    assert second == {"path": "/workspace/data/datasets/org--chats/main", "type": "chat_template",
                      "split": "train", "field_messages": "conversations",
                      "message_property_mappings": {"role": "from", "content": "value"}}
    assert config["test_datasets"] == [{**second, "split": "test"}]
    assert config["use_wandb"] is True and config["wandb_project"] == "orch-tests"
    assert config["wandb_run_id"] == job_id and config["wandb_name"] == "quickstart-qwen25-05b"

    # The key went nowhere but the trainer's env file (removed with the host's job folder).
    train = [c for c in containers if "train" in c["Name"]]
    assert train, [c["Name"] for c in containers]
    names = [e.split("=")[0] for e in train[0]["Config"]["Env"]]
    assert "WANDB_API_KEY" in names and "WANDB_RESUME" in names, names
    assert all(WANDB_KEY not in json.dumps(c["Args"]) for c in containers)
    # The receiver got the signed events in order, each verified; the history keeps their ids.
    got = hook.delivered()
    assert [r.json()["type"] for r in got] == ["job.preempted", "job.replaced",
                                              "job.succeeded"]
    assert all(r.verified for r in got) and all(r.path == "/orch" for r in got)
    assert got[0].json()["data"]["job_id"] == job_id
    assert got[1].json()["data"]["placement"].startswith("sim ")
    ids = [json.loads(e.data_json or "{}").get("webhook_id") for e in rig.store.events(job_id)
           if e.kind in ("job.preempted", "job.replaced", "job.succeeded")]
    assert ids == [r.headers["webhook-id"] for r in got]
    stored = json.dumps([(e.kind, e.message, e.data_json) for e in rig.store.events(job_id)])
    assert WANDB_KEY not in stored and WANDB_KEY not in (job.spec_json or "")


BAD_INPUTS = [  # what replaces the quickstart's dataset (or is added), words the error has
    ("dataset:\n  path: {hf: org/no-such-data}\n",
     ["dataset.path.hf", "Dataset 'org/no-such-data' not found", "fix the repo id"]),
    ("dataset:\n  path: {hf: org/gated-chats}\n  tokens: 100000\n",
     ["dataset.path.hf", "requires approval", "HF_TOKEN"]),
    ("dataset:\n  path: data/bad.jsonl\n", ["data/bad.jsonl:2: alpaca row: field 'output'"]),
    ("tracking:\n  mlflow: {tracking_uri: 'https://mlflow.example.com'}\n"
     "  wandb: {project: p}\n", ["tracking.wandb", "WANDB_API_KEY"]),
    ("notify: {url: 'ftp://example.com/hook'}\n", ["notify", "is not an http(s) URL"]),
]


@pytest.mark.parametrize(("change", "words"), BAD_INPUTS,
                         ids=["unknown-dataset", "gated-dataset", "bad-row", "tracker-key",
                              "webhook-url"])
def test_bad_input_exits_2_with_the_field_and_the_fix_before_renting(
        session_hub: HubEmulator, tmp_path: Path, change: str, words: list[str]) -> None:
    import os
    import shutil

    import orchfork

    root = Path(__file__).resolve().parents[1]
    shutil.copytree(root / "examples" / "data", tmp_path / "data")
    (tmp_path / "data" / "bad.jsonl").write_text(
        '{"instruction": "a", "input": "", "output": "b"}\n{"instruction": "a"}\n')
    text = (root / "examples" / "quickstart.yml").read_text()
    if change.startswith("dataset:"):
        text = text.replace("dataset:\n  path: data/train.jsonl\n  format: alpaca\n", change)
    else:
        text += change
    job = tmp_path / "job.yml"
    job.write_text(text)
    env = {k: v for k, v in os.environ.items()
           if k not in ("ORCH_DB_URL", "HF_TOKEN", "WANDB_API_KEY")}
    env.update(XDG_DATA_HOME=str(tmp_path / "xdg"), HF_ENDPOINT=session_hub.url)
    session_hub.add_repo("org/gated-chats", FILES, repo_type="dataset", gated=True,
                         card_data=CARD)
    try:
        done = orchfork.run(["submit", str(job)], env=env, cwd=root, timeout=300)
    finally:
        del session_hub.repos[("dataset", "org/gated-chats")]
    assert done.returncode == 2, done.stdout + done.stderr
    for w in words:
        assert w in done.stderr, (w, done.stderr)
    assert "nothing was done" in done.stderr and "renting" not in done.stdout
    jobs = orchfork.run(["jobs", "--json"], env=env, cwd=root, timeout=120)
    assert json.loads(jobs.stdout or "[]") in ([], {"jobs": []}), jobs.stdout


def test_tracker_secrets_leave_a_kept_server_and_reach_no_record(
        rig: Rig, simhost: Any, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """As HF_TOKEN (test_engine's kept-server test): WANDB_API_KEY and MLFLOW_TRACKING_TOKEN
    reach the trainer's 0600 env file only, which is gone from a monthly server after the
    job; neither is in orch's database, logs, artifacts or the job's report."""
    from test_engine import HOST, run_on_server

    mlflow_token = "mlflow-" + "f00d" * 8
    monkeypatch.setenv("WANDB_API_KEY", WANDB_KEY)
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", mlflow_token)
    host = simhost(**HOST)
    original = rig.job_file

    def with_tracking(*args: Any, **kwargs: Any) -> Path:
        path = original(*args, **kwargs)
        path.write_text(path.read_text() + "tracking:\n  wandb: {project: p}\n  mlflow: "
                        "{tracking_uri: 'https://mlflow.example.com', experiment: e}\n")
        return path

    monkeypatch.setattr(rig, "job_file", with_tracking)
    job_id, job = run_on_server(rig, host)
    assert job.status == "succeeded", job.failure_reason
    secrets = (WANDB_KEY.encode(), mlflow_token.encode())
    on_host = [p for p in host.root.rglob("*") if p.is_file() and p.stat().st_size < 1 << 20
               and any(s in p.read_bytes() for s in secrets)]
    assert on_host == []
    ours = [p for p in (rig.tmp / "xdg").rglob("*") if p.is_file()]
    ours += [p for p in rig.tmp.glob("*.db*") if p.is_file()]
    assert ours and [p for p in ours if any(s in p.read_bytes() for s in secrets)] == []
    report = json.dumps([(e.kind, e.message, e.data_json) for e in rig.store.events(job_id)])
    assert all(s.decode() not in report for s in secrets)


def test_orch_plan_sizes_a_hub_dataset_from_the_hub_and_names_the_source(
        session_hub: HubEmulator, tmp_path: Path) -> None:
    """Without tokens: the estimate comes from the Hub's dataset info (HF_ENDPOINT's Hub);
    a Hub that does not answer is no verdict: exit 2, saying so and asking for tokens."""
    import os
    import shutil
    import socket

    import orchfork

    root = Path(__file__).resolve().parents[1]
    shutil.copytree(root / "examples" / "data", tmp_path / "data")
    job = tmp_path / "job.yml"
    job.write_text((root / "examples" / "quickstart.yml").read_text().replace(
        "dataset:\n  path: data/train.jsonl\n  format: alpaca\n",
        "dataset:\n  path: org/sized-chats\n  format: chat_template\n"
        "  fields: {messages: conversations, role: from, content: value}\n"))
    env = {k: v for k, v in os.environ.items() if k not in ("ORCH_DB_URL", "HF_TOKEN")}
    env.update(XDG_DATA_HOME=str(tmp_path / "xdg"), HF_ENDPOINT=session_hub.url)
    session_hub.add_repo("org/sized-chats", FILES, repo_type="dataset", card_data=CARD)
    try:
        planned = orchfork.run(["plan", str(job)], env=env, cwd=root, timeout=120)
    finally:
        del session_hub.repos[("dataset", "org/sized-chats")]
    assert planned.returncode == 0, planned.stderr
    assert ("(Hub dataset info: 8 rows, 0.0 MB in split train of org/sized-chats)"
            in planned.stdout.splitlines()[0])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    unanswered = orchfork.run(["plan", str(job)], env={**env, "HF_ENDPOINT": dead}, cwd=root,
                              timeout=120)
    assert unanswered.returncode == 2
    assert f"dataset.path.hf: the Hub ({dead}) did not answer" in unanswered.stderr
    assert "give tokens" in unanswered.stderr


def test_a_container_rental_downloads_the_hub_dataset_in_the_image_environment(
        tmp_path: Path, ssh_keypair: Any, monkeypatch: pytest.MonkeyPatch,
        session_hub: HubEmulator) -> None:
    """On RunPod (a container rental: no Docker, `hf` in the image's venv) the dataset is
    downloaded by the host's `hf` run through NativeEnv.wrap, and the job trains on it."""
    from emulators.hosts import SimHostBackend
    from emulators.runpod import RunPodEmulator
    from test_emulator_hosts import RUNPOD_CATALOG
    from test_engine import HOST
    from test_engine_providers import KEY, drive, runpod

    from orchestrator.records.store import open_store

    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    url = f"sqlite:///{tmp_path / 'orch.db'}"
    monkeypatch.setenv("ORCH_DB_URL", url)
    r = Rig(tmp_path, open_store(url), ssh_keypair, [])
    session_hub.add_repo("org/chats", FILES, repo_type="dataset", card_data=CARD)
    before = len(session_hub.requests)
    hosts = SimHostBackend(tmp_path / "emu-hosts", dict(HOST))
    try:
        with RunPodEmulator(api_key=KEY, gpus=json.loads(json.dumps(RUNPOD_CATALOG)),
                            hosts=hosts) as emu:
            path = r.job_file()
            path.write_text(path.read_text().replace(
                "dataset:\n  path: data/train.jsonl\n  format: alpaca\n",
                DATASETS).replace("providers: [sim]", "providers: [runpod]"))
            job_id = queue(r, path)
            job = drive(r, {"runpod": hosts.serving(runpod(emu))}, job_id)
    finally:
        del session_hub.repos[("dataset", "org/chats")]
        hosts.stop_all()
        r.store.close()
    assert job.status == "succeeded", job.failure_reason
    downloads = [q for q in session_hub.requests[before:] if "/datasets/org/chats" in q.path]
    assert any(q.path.endswith("data/train-00000-of-00001.jsonl") for q in downloads)
