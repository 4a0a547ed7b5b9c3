"""The `orch` command line, run as a real process against a real SQLite file."""

from __future__ import annotations

import json
import os
import shutil
import socket
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import orchfork
import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    e = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "xdg")}
    e.pop("ORCH_DB_URL", None)
    return e


def orch(env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = orchfork.run(list(args), env=env, cwd=ROOT, timeout=60)
    if check and proc.returncode != 0:
        raise AssertionError(f"orch {' '.join(args)} -> {proc.returncode}\n{proc.stderr}")
    return proc


def db(env: dict[str, str]) -> Path:
    return Path(env["XDG_DATA_HOME"]) / "orch" / "orch.db"


EXPECTED = {  # example -> (gpu, count, interruptible)
    "qlora-8b": ("RTX 3090", 1, True),
    "qlora-70b": ("A100 80GB", 1, True),
    # Checkpointing left to the planner: on, one A100 is cheaper than off, sharded over two:
    # the second GPU halves 0.63 h of training but doubles the price of 0.22 h of set-up.
    "lora-14b": ("A100 80GB", 1, True),
    # FSDP2's bf16 shards (6 bytes/param with 8-bit AdamW) fit four A100s; ZeRO-3 needed 8.
    "full-32b": ("A100 80GB", 4, True),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_plan_json_for_examples(env: dict[str, str], name: str) -> None:
    out = json.loads(orch(env, "plan", f"examples/{name}.yml", "--json").stdout)
    est = out["estimate"]
    assert set(est) >= {"method", "gpu_count", "peak_bytes", "required_bytes", "components"}
    assert est["required_bytes"] > est["peak_bytes"] == sum(est["components"].values())
    keys = {"provider", "gpu", "gpu_count", "billing", "interruptible", "price_per_hour",
            "est_hours", "est_cost"}
    p = out["placement"]
    assert set(p) >= keys and all(set(a) >= keys for a in out["alternatives"])
    assert (p["gpu"], p["gpu_count"], p["interruptible"]) == EXPECTED[name]
    assert est["gpu_count"] == p["gpu_count"]
    costs = [float(x["est_cost"]) for x in [p, *out["alternatives"]]]
    assert costs == sorted(costs)
    # Planning needs no database: nothing was created.
    assert not db(env).exists()


def test_plan_human_output(env: dict[str, str]) -> None:
    out = orch(env, "plan", "examples/qlora-8b.yml").stdout
    assert "GPU memory per GPU on RTX 3090 x1" in out
    assert "required (+20% headroom)" in out
    assert "Chosen: RTX 3090 x1 at the cloud catalog's prices (an estimate)" in out
    assert "Not planned, price not published" in out


def test_plan_of_a_sim_job_has_no_cloud_or_dedicated_notes(env: dict[str, str]) -> None:
    """Issue 36 §6: a `providers: [sim]` job was told to set cloud API keys and about
    dedicated-host tiers it may not use."""
    env = {k: v for k, v in env.items() if k not in ("VAST_API_KEY", "RUNPOD_API_KEY")}
    out = orch(env, "plan", "examples/quickstart.yml").stdout
    for words in ("VAST_API_KEY", "RUNPOD_API_KEY", "price not published", "dedicated-host"):
        assert words not in out, out
    assert "Offers: those of sim (resources.providers names no cloud: no API key" in out
    data = json.loads(orch(env, "plan", "examples/quickstart.yml", "--json").stdout)
    assert data["unpriced_tiers"] == []
    # A job that may use any provider is still told both.
    any_out = orch(env, "plan", "examples/qlora-8b.yml").stdout
    assert "set VAST_API_KEY or RUNPOD_API_KEY" in any_out
    assert "Not planned, price not published: dedicated-host" in any_out


def test_invalid_job_file_exits_2_and_writes_nothing(env: dict[str, str], tmp_path: Path) -> None:
    bad = tmp_path / "job.yml"
    bad.write_text("name: x\nbase_model: meta-llama/Llama-3.1-8B\nmethod: qlora\n"
                   "dataset: {path: nope.jsonl}\ntraning: {}\n")
    for cmd in (["plan", str(bad)], ["submit", str(bad), "--dry-run"]):
        proc = orch(env, *cmd, check=False)
        assert proc.returncode == 2
        assert f"{bad}:5 traning: unknown key; did you mean 'training'?" in proc.stderr
        assert "Traceback" not in proc.stderr
    assert not db(env).exists()


def test_hf_dataset_and_bad_repo_id_exit_2_at_plan(env: dict[str, str], tmp_path: Path) -> None:
    # A Hub dataset plans with its size (issue 39); without `tokens:` and with no Hub to ask,
    # the plan says which number to give.
    job = tmp_path / "job.yml"
    job.write_text("name: x\nbase_model: meta-llama/Llama-3.1-8B\nmethod: qlora\n"
                   "dataset: {path: {hf: tatsu-lab/alpaca}}\n")
    bad = tmp_path / "bad.yml"
    shutil.copy(EXAMPLES / "data" / "train.jsonl", tmp_path / "train.jsonl")
    bad.write_text("name: x\nbase_model: 'org/a;rm -rf x'\nmethod: qlora\n"
                   "dataset: {path: train.jsonl}\n")
    # No Hub answers here (HF_ENDPOINT on a closed port): no verdict, so tokens are asked for.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    for path, expect in ((job, f"{job}:4 dataset.path.hf: the Hub ({dead}) did not answer"),
                         (bad, f"{bad}:2 base_model.repo: 'org/a;rm -rf x' is not a repo id")):
        proc = orch({**env, "HF_ENDPOINT": dead}, "plan", str(path), check=False)
        assert proc.returncode == 2 and expect in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
    job.write_text(job.read_text().replace("}}", "}, tokens: 1000000}"))
    proc = orch(env, "plan", str(job), check=False)
    assert proc.returncode == 0, proc.stderr
    assert "1,000,000 tokens x 1 epoch (job file)" in proc.stdout, proc.stdout
    assert not db(env).exists()


def test_no_fit_exits_3_with_the_gap(env: dict[str, str], tmp_path: Path) -> None:
    job = tmp_path / "job.yml"
    shutil.copy(EXAMPLES / "data" / "train.jsonl", tmp_path / "train.jsonl")
    # On the seed catalogs: the market snapshot's RunPod pods state their host RAM, and
    # eight L40s offload this job's optimizer to their 1 TB (fsdp2_offload).
    job.write_text("name: big\nbase_model: meta-llama/Llama-3.1-70B\nmethod: full\n"
                   "training: {optimizer: adamw}\ndataset: {path: train.jsonl}\n"
                   "resources: {providers: [cloud, dedicated-host]}\n")
    proc = orch(env, "plan", str(job), check=False)
    assert proc.returncode == 3
    assert "no placement fits: the job needs at least" in proc.stderr
    assert "the largest eligible offer has" in proc.stderr


def test_servers_and_dry_run_submit(env: dict[str, str], simhost: Any,
                                    ssh_keypair: Any) -> None:
    from test_cli_servers import give_orch_key

    assert "no servers registered" in orch(env, "servers", "list").stdout
    give_orch_key(env, ssh_keypair)  # `servers add` logs in to the server with orch's key
    sim = simhost()
    orch(env, "servers", "add", "box1", "--host", sim.host, "--port", str(sim.port), "--user",
         sim.user, "--gpu", "H100 SXM", "--monthly", "2190")
    dup = orch(env, "servers", "add", "box1", "--host", "h", "--gpu", "H100 SXM",
               "--monthly", "1", check=False)
    assert dup.returncode == 2 and "already exists" in dup.stderr
    listed = json.loads(orch(env, "servers", "list", "--json").stdout)
    checked_at = listed[0].pop("checked_at")
    assert checked_at.endswith("Z")
    assert listed == [{"name": "box1", "host": sim.host, "port": sim.port, "user": sim.user,
                       "gpu": "H100 SXM", "gpu_count": 1, "monthly_price": "2190.000000",
                       "status": "idle", "check_error": None, "host_key": sim.host_key,
                       "host_check": None}]  # no job has host-checked it yet (issue 40)

    # The idle registered H100 now wins QLoRA 8B at zero marginal cost, in plan and submit.
    plan = json.loads(orch(env, "plan", "examples/qlora-8b.yml", "--json").stdout)
    assert plan["placement"]["provider"] == "dedicated"
    assert plan["placement"]["offer_id"] == "server:box1"
    assert plan["placement"]["est_cost"] == "0.000000"
    sub = json.loads(orch(env, "submit", "examples/qlora-8b.yml", "--dry-run", "--json").stdout)
    assert sub["status"] == "planned" and sub["placement"]["offer_id"] == "server:box1"

    jobs = json.loads(orch(env, "jobs", "--json").stdout)
    assert [j["job_id"] for j in jobs] == [sub["job_id"]]
    assert jobs[0]["status"] == "planned" and jobs[0]["gpu"] == "H100 SXM"
    assert jobs[0]["created_at"].endswith("Z")
    assert sub["job_id"] in orch(env, "jobs").stdout

    # The row and its first event are in SQLite, readable with plain sqlite3.
    con = sqlite3.connect(db(env))
    (status, hash_, placement) = con.execute(
        "SELECT status, spec_hash, placement_json FROM job").fetchone()
    assert status == "planned" and len(hash_) == 64
    assert json.loads(placement)["placement"]["gpu"] == "H100 SXM"
    assert con.execute("SELECT kind FROM event").fetchall() == [("planned",)]
    assert con.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    con.close()

    orch(env, "servers", "remove", "box1")
    gone = orch(env, "servers", "remove", "box1", check=False)
    assert gone.returncode == 4 and "box1" in gone.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["--gpu", "T4"], "is not a known GPU"),
    (["--gpu", "H100"], "is ambiguous"),
    (["--gpu", "H200", "--monthly", "-5"], "--monthly must be > 0"),
    (["--gpu", "H200", "--monthly", "abc"], "--monthly 'abc'"),
    (["--gpu", "H200", "--gpus", "9"], "--gpus must be 1..8"),
])
def test_servers_add_rejects_bad_input(env: dict[str, str], args: list[str],
                                       message: str) -> None:
    base = ["servers", "add", "s1", "--host", "h1"]
    if "--monthly" not in args:
        args = [*args, "--monthly", "100"]
    proc = orch(env, *base, *args, check=False)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not db(env).exists()


def test_submit_with_no_provider_says_what_to_do(env: dict[str, str]) -> None:
    proc = orch(env, "submit", "examples/qlora-8b.yml", check=False)
    assert proc.returncode == 3, proc.stderr
    assert "VAST_API_KEY" in proc.stderr and "resources.providers: [sim]" in proc.stderr
    assert "Nothing was recorded" in proc.stderr
    assert json.loads(orch(env, "jobs", "--json").stdout) == []


def test_reconcile_terminates_a_sim_orphan(env: dict[str, str], ssh_keypair: Any) -> None:
    from providers.base import Requirements
    from providers.sim.compute import SimCloud

    cloud = SimCloud(Path(env["XDG_DATA_HOME"]) / "orch" / "sim")
    try:
        [offer] = cloud.offers(Requirements(1, 0, gpus=frozenset({"RTX 3090"}),
                                            interruptible=True))
        inst = cloud.create(offer, ssh_keypair.public, "j-orphan")
        dry = json.loads(orch(env, "reconcile", "--dry-run", "--json").stdout)
        assert "sim" in dry["providers"] and dry["dry_run"] is True
        assert [(a["kind"], a["instance_id"]) for a in dry["actions"]] == \
            [("terminate", inst.instance_id)]
        assert len(cloud.list()) == 1
        out = orch(env, "reconcile").stdout
        assert "terminated" in out and inst.instance_id in out
        assert cloud.list() == []
        assert "nothing to do" in orch(env, "reconcile", "--dry-run").stdout
    finally:
        cloud.terminate_all()


def test_plan_limited_to_named_servers_says_which_to_register(env: dict[str, str],
                                                             tmp_path: Path) -> None:
    shutil.copy(EXAMPLES / "data" / "train.jsonl", tmp_path / "train.jsonl")
    job = tmp_path / "job.yml"
    job.write_text("name: s\nbase_model: meta-llama/Llama-3.1-8B\nmethod: qlora\n"
                   "dataset: {path: train.jsonl}\nresources: {servers: [box1]}\n")
    proc = orch(env, "plan", str(job), check=False)
    assert proc.returncode == 3, proc.stderr
    assert "resources.servers" in proc.stderr and "Traceback" not in proc.stderr
    bad = tmp_path / "bad.yml"
    bad.write_text(job.read_text().replace("[box1]", "['a b']"))
    proc = orch(env, "plan", str(bad), check=False)
    assert proc.returncode == 2 and "servers" in proc.stderr, proc.stderr
