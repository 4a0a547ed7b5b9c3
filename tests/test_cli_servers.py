"""`orch servers` against a real sshd on loopback (issue 9 §4, issue 12 §4).

The simulated host plays the monthly server; orch runs as a real process with its own data
directory, whose SSH key the server authorises (or not).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sqlite3
import subprocess
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import orchfork
import pytest
from conftest import KeyPair

from simhost import SimHost

ROOT = Path(__file__).resolve().parent.parent
SimHostFactory = Callable[..., SimHost]


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    e = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "xdg")}
    e.pop("ORCH_DB_URL", None)
    return e


def give_orch_key(env: dict[str, str], key: KeyPair) -> Path:
    """Make `key` orch's own key (the one the simulated host authorises)."""
    folder = Path(env["XDG_DATA_HOME"]) / "orch" / "ssh"
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    shutil.copy(key.private, folder / "id_ed25519")
    (folder / "id_ed25519").chmod(0o600)
    (folder / "id_ed25519.pub").write_text(key.public + "\n")
    return folder / "id_ed25519"


def orch(env: dict[str, str], *args: str, stdin: str | None = None
         ) -> subprocess.CompletedProcess[str]:
    return orchfork.run(list(args), env=env, cwd=ROOT, timeout=120, input=stdin)


def add_args(sim: SimHost, name: str = "box1", gpu: str = "H100 SXM") -> list[str]:
    return ["servers", "add", name, "--host", sim.host, "--port", str(sim.port),
            "--user", sim.user, "--gpu", gpu, "--monthly", "2190"]


def listed(env: dict[str, str]) -> list[dict[str, Any]]:
    proc = orch(env, "servers", "list", "--json")
    assert proc.returncode == 0, proc.stderr
    result: list[dict[str, Any]] = json.loads(proc.stdout)
    return result


def test_add_proves_the_server_and_pins_its_host_key(
        env: dict[str, str], simhost: SimHostFactory, ssh_keypair: KeyPair) -> None:
    give_orch_key(env, ssh_keypair)
    sim = simhost(cuda_version="12.8", driver_version="570.172.08")
    proc = orch(env, *add_args(sim))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert sim.host_key_fingerprint in out and "pinned" in out
    assert "NVIDIA H100 80GB HBM3" in out and "570.172.08" in out and "CUDA 12.8" in out
    assert "docker     Docker version" in out and "/mnt/nvme (NVMe)" in out
    (row,) = listed(env)
    assert row["host_key"] == sim.host_key and row["status"] == "idle"
    assert row["check_error"] is None and row["checked_at"].endswith("Z")

    # `check` runs a job's host check there too (issue 40 §1): an R570 driver supports CUDA
    # 12.8, the trainer image needs 13.0, so jobs there would fail: exit 3, with the fix.
    again = orch(env, "servers", "check", "box1", "--json")
    assert again.returncode == 3, again.stderr
    assert "box1 failed its host check" in again.stderr and "jobs there fail" in again.stderr
    assert "fix: install an NVIDIA driver >= 580.65.06 (CUDA 13.0) on box1" in again.stderr
    out = json.loads(again.stdout)
    check = out["check"]
    assert check["fingerprint"] == sim.host_key_fingerprint
    assert check["gpus"][0]["model"] == "H100 SXM" and check["cuda"] == "12.8"
    assert check["cache_nvme"] is True and check["cache_free_bytes"] > 0
    hosted = out["host_check"]
    assert (hosted["outcome"], hosted["job_id"]) == ("failed", None)
    assert [(f["check"], f["severity"]) for f in hosted["findings"]] == [("driver", "blocks")]
    assert listed(env)[0]["host_check"] == hosted  # remembered: the next job checks again
    assert "found: driver" in hosted["next_due"]


def test_add_with_json_reports_the_check(
        env: dict[str, str], simhost: SimHostFactory, ssh_keypair: KeyPair) -> None:
    give_orch_key(env, ssh_keypair)
    sim = simhost(has_docker=False)
    proc = orch(env, *add_args(sim), "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["name"] == "box1" and out["check"]["docker"] is None
    assert any("Docker is not installed" in n for n in out["check"]["notes"])


def test_a_key_the_server_does_not_authorise_says_which_key_to_add(
        env: dict[str, str], simhost: SimHostFactory) -> None:
    sim = simhost()  # authorises the test key, not the one orch creates for itself
    proc = orch(env, *add_args(sim))
    assert proc.returncode == 3, proc.stderr
    pub = Path(env["XDG_DATA_HOME"]) / "orch" / "ssh" / "id_ed25519.pub"
    assert str(pub) in proc.stderr and pub.read_text().strip() in proc.stderr
    assert "authorized_keys" in proc.stderr and "Traceback" not in proc.stderr
    assert listed(env) == []  # nothing recorded


def test_an_unreachable_server_is_refused(env: dict[str, str], ssh_keypair: KeyPair) -> None:
    give_orch_key(env, ssh_keypair)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    proc = orch(env, "servers", "add", "box1", "--host", "127.0.0.1", "--port", str(port),
                "--gpu", "H100 SXM", "--monthly", "2190")
    assert proc.returncode == 3
    assert "cannot reach 127.0.0.1" in proc.stderr and "nothing was recorded" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert listed(env) == []


def test_a_server_whose_gpu_check_fails_is_refused(
        env: dict[str, str], simhost: SimHostFactory, ssh_keypair: KeyPair) -> None:
    give_orch_key(env, ssh_keypair)
    sim = simhost()  # an H100 SXM
    proc = orch(env, *add_args(sim, gpu="H200"))
    assert proc.returncode == 3
    assert "failed its GPU check" in proc.stderr and "is not a H200" in proc.stderr
    assert listed(env) == []


def test_trust_repins_a_changed_host_key_after_confirmation(
        env: dict[str, str], simhost: SimHostFactory, ssh_keypair: KeyPair) -> None:
    give_orch_key(env, ssh_keypair)
    sim = simhost()
    assert orch(env, *add_args(sim)).returncode == 0
    old = sim.host_key_fingerprint
    sim.stop()  # "reinstalled": a new host key
    sim.host_key_path.unlink()
    sim.host_key_path.with_suffix(".pub").unlink()
    sim.start()
    assert sim.host_key_fingerprint != old
    if listed(env)[0]["port"] != sim.port:
        # Its old port was taken meanwhile (another test's host): the server is where it
        # now listens; what is checked here is its new key, never skipped.
        with sqlite3.connect(Path(env["XDG_DATA_HOME"]) / "orch" / "orch.db") as con:
            con.execute("UPDATE server SET port = ? WHERE name = 'box1'", (sim.port,))
    assert listed(env)[0]["port"] == sim.port

    refused = orch(env, "servers", "check", "box1")
    assert refused.returncode == 3 and "host key mismatch" in refused.stderr
    assert "orch servers trust box1" in refused.stderr

    declined = orch(env, "servers", "trust", "box1", stdin="n\n")
    assert declined.returncode == 1
    assert old in declined.stdout and sim.host_key_fingerprint in declined.stdout
    assert listed(env)[0]["host_key"] != sim.host_key

    accepted = orch(env, "servers", "trust", "box1", stdin="y\n")
    assert accepted.returncode == 0, accepted.stderr
    assert listed(env)[0]["host_key"] == sim.host_key
    assert orch(env, "servers", "check", "box1").returncode == 0


def test_a_server_that_failed_its_gpu_check_in_a_job_is_not_chosen_until_checked(
        env: dict[str, str], simhost: SimHostFactory, ssh_keypair: KeyPair,
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from orchestrator.core.spec import load_job
    from orchestrator.engine.runner import JobRunner, Options, owner_id
    from orchestrator.engine.submission import record_job
    from orchestrator.records.store import open_store
    from providers.base import Requirements
    from providers.dedicated.compute import Dedicated

    give_orch_key(env, ssh_keypair)
    monkeypatch.setenv("XDG_DATA_HOME", env["XDG_DATA_HOME"])
    monkeypatch.delenv("ORCH_DB_URL", raising=False)
    sim = simhost(train_steps=4, train_step_seconds=0.1)
    assert orch(env, *add_args(sim)).returncode == 0
    store = open_store()
    provider = Dedicated(store)
    want = Requirements(gpu_count=1, min_gpu_memory_bytes=0)
    assert [o.offer_id for o in provider.offers(want)] == ["server:box1"]

    # The driver breaks after the server's last host check (a passing one a moment ago, so
    # the next is not due: issue 40); the next job's GPU playbook finds it.
    from orchestrator.core.hostmemory import Source

    store.record_host_observation("dedicated", "box1", Source.CHECK, failed=False,
                                  delivered=None, why="passed")
    options_file = sim.state_dir / "options.json"
    options = json.loads(options_file.read_text())
    options_file.write_text(json.dumps({**options, "driver_broken": True}))
    shutil.copytree(ROOT / "examples" / "data", tmp_path / "jobs" / "data")
    job_file = tmp_path / "jobs" / "job.yml"
    job_file.write_text((ROOT / "examples" / "quickstart.yml").read_text()
                        .replace("providers: [sim]", "servers: [box1]"))
    job, _ = record_job(store, load_job(job_file))
    owner = owner_id("test")
    assert store.claim_job(job.id, owner, 5) is not None
    done = JobRunner(store, {"dedicated": provider}, owner,
                     Options(poll_s=0.2, watch_s=0.2, lease_s=5)).run(job.id)
    assert done.status == "failed" and "nvidia-smi failed" in (done.failure_reason or "")
    assert provider.offers(want) == []  # not chosen again
    (row,) = listed(env)
    assert row["status"] == "failed" and "nvidia-smi failed" in row["check_error"]
    shown = orch(env, "servers", "list").stdout
    assert "box1 is not used by jobs" in shown and "orch servers check box1" in shown
    still = orch(env, "servers", "check", "box1")
    assert still.returncode == 3 and "failed its GPU check" in still.stderr

    options_file.write_text(json.dumps({**options, "driver_broken": False}))  # fixed
    fixed = orch(env, "servers", "check", "box1")
    assert fixed.returncode == 0, fixed.stderr
    assert "box1: ok; jobs may use it" in fixed.stdout
    # ...after the host check a job would run, remembered: the next job does not run it.
    hosted = listed(env)[0]["host_check"]
    assert (hosted["outcome"], hosted["job_id"]) == ("passed", None)
    assert hosted["seconds"] > 0  # its report, not the passing row recorded above
    from orchestrator.engine.hostchecks import server_due

    assert server_due(store, "dedicated", "box1") is None
    assert [o.offer_id for o in provider.offers(want)] == ["server:box1"]
    assert listed(env)[0]["status"] == "idle"
    store.close()
    assert Decimal(listed(env)[0]["monthly_price"]) == Decimal(2190)


def test_reconcile_removes_secrets_a_crashed_job_left_on_a_kept_server(
        env: dict[str, str], simhost: SimHostFactory, ssh_keypair: KeyPair) -> None:
    give_orch_key(env, ssh_keypair)
    sim = simhost()
    assert orch(env, *add_args(sim)).returncode == 0
    assert sim.nvme_path is not None
    base = sim.nvme_path / "orch"
    left = [base / "secrets" / "hf.env", base / "secrets" / ".hf.env.0badc0de.tmp",
            base / "jobs" / "j-dead" / "secrets.env",
            base / "jobs" / "j-dead" / ".secrets.env.12345678.tmp"]
    kept = base / "jobs" / "j-dead" / "config.yml"
    for path in [*left, kept]:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("HF_TOKEN=hf_leftover\n")
        path.chmod(0o600)

    dry = orch(env, "reconcile", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    assert [a["kind"] for a in json.loads(dry.stdout)["actions"]] == ["scrub-secrets"]
    assert all(p.exists() for p in left)

    proc = orch(env, "reconcile", "--json")
    assert proc.returncode == 0, proc.stderr
    (action,) = json.loads(proc.stdout)["actions"]
    assert action["kind"] == "scrub-secrets" and "removed 4 secret file(s)" in action["reason"]
    assert not any(p.exists() for p in left) and kept.exists()
