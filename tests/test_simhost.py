"""The simulated GPU host, exercised the way the playbooks will: through real SSH."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from playbooks import images
from playbooks.ssh import (
    CommandFailed,
    ConnectionFactory,
    ConnectionLost,
    HostUnreachable,
    Result,
    put_file,
    run,
    tunnel,
    write_secret_env,
)
from simhost import SimHost
from simhost.standins.common import alive, process_starttime

SimHostFactory = Callable[..., SimHost]
IMAGE = "axolotlai/axolotl:0.18.0-py3.12-cu130-2.12.0"
VLLM_IMAGE = images.vllm_image()  # the pinned server (playbooks/data/images.yaml)
TOOLKIT = "1.17.8-1"
GPGKEY = "https://nvidia.github.io/libnvidia-container/gpgkey"
LIST = "https://nvidia.github.io/libnvidia-container/stable/deb/nvidia-container-toolkit.list"


def connect(factory: ConnectionFactory, host: SimHost) -> Any:
    return factory.connect(host.host, host.port, host.user, host.host_key)


def sh(conn: Any, script: str, timeout: float = 30) -> Result:
    return run(conn, ["sh", "-c", script], timeout=timeout)


def host_pids(host: SimHost) -> list[int]:
    """Live (non-zombie) processes that carry the host's id or name its directory."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            status = Path(f"/proc/{entry}/stat").read_text()
            env = Path(f"/proc/{entry}/environ").read_bytes()
            argv = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if status[status.rfind(")") + 2] in "ZX":
            continue
        if f"SIMHOST_ID={host.id}".encode() in env.split(b"\0") or str(host.dir).encode() in argv:
            found.append(int(entry))
    return found


def write_job(
    conn: Any,
    host: SimHost,
    tmp_path: Path,
    name: str,
    *,
    steps: int = 8,
    save_steps: int = 2,
    base_model: str = "meta-llama/Llama-3.2-1B",
    rows: list[dict[str, str]] | None = None,
) -> Path:
    """Upload a QLoRA config and an alpaca dataset under the NVMe, as the train playbook will."""
    assert host.nvme_path is not None
    rows = rows or [{"instruction": "Say hi", "input": "", "output": "hi"}]
    dataset = tmp_path / f"{name}.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = tmp_path / f"{name}.yml"
    config.write_text(
        f"base_model: {base_model}\n"
        "adapter: qlora\nload_in_4bit: true\nlora_r: 16\nlora_alpha: 32\nlora_dropout: 0.05\n"
        "lora_target_linear: true\nlearning_rate: 0.0002\nmicro_batch_size: 2\n"
        "datasets:\n"
        f"- path: /workspace/data/{name}/data/train.jsonl\n  type: alpaca\n"
        f"output_dir: /workspace/data/{name}/out\nmax_steps: {steps}\nsave_steps: {save_steps}\n"
        "auto_resume_from_checkpoints: true\n"
    )
    job = host.nvme_path / name
    put_file(conn, dataset, str(job / "data" / "train.jsonl"))
    put_file(conn, config, str(job / "config.yml"))
    return job


def start_training(conn: Any, host: SimHost, name: str) -> Result:
    return run(
        conn,
        [
            "docker", "run", "-d", "--name", name, "--gpus", "all", "--ipc=host",
            "--shm-size", "10g", "--ulimit", "memlock=-1",
            "-v", f"{host.nvme_path}:/workspace/data",
            IMAGE, "axolotl", "train", f"/workspace/data/{name}/config.yml",
        ],
        timeout=30,
    ).check()  # fmt: skip


def wait_exited(conn: Any, name: str, deadline: float = 20) -> tuple[str, int]:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        result = run(
            conn, ["docker", "inspect", "-f", "{{.State.Status}} {{.State.ExitCode}}", name], 30
        ).check()
        status, code = result.stdout.split()
        if status == "exited":
            return status, int(code)
        time.sleep(0.1)
    raise AssertionError(f"container {name} still running after {deadline}s")


def test_nvidia_smi_reports_the_configured_gpus(
    simhost: SimHostFactory, ssh_factory: ConnectionFactory
) -> None:
    host = simhost(
        gpu_model="NVIDIA A100-SXM4-80GB",
        gpu_count=2,
        gpu_memory_mib=81920,
        driver_version="550.54.15",
    )
    conn = connect(ssh_factory, host)
    query = ["--query-gpu=name,memory.total,driver_version", "--format=csv,noheader,nounits"]
    result = run(conn, ["nvidia-smi", *query], timeout=30).check()
    assert result.stdout.splitlines() == ["NVIDIA A100-SXM4-80GB, 81920, 550.54.15"] * 2
    with_units = run(conn, ["nvidia-smi", "--query-gpu=memory.total", "--format=csv"], 30).check()
    assert with_units.stdout.splitlines() == ["memory.total [MiB]", "81920 MiB", "81920 MiB"]


def test_missing_or_broken_driver(simhost: SimHostFactory, ssh_factory: ConnectionFactory) -> None:
    missing, broken = simhost(driver_missing=True), simhost(driver_broken=True)
    conn = connect(ssh_factory, missing)
    assert run(conn, ["nvidia-smi"], timeout=30).exit_code == 127
    assert sh(conn, "command -v nvidia-smi").exit_code != 0
    failed = run(connect(ssh_factory, broken), ["nvidia-smi"], timeout=30)
    assert failed.exit_code == 9 and "couldn't communicate with the NVIDIA driver" in failed.stderr


def test_toolkit_install_configure_and_restart_persist(
    simhost: SimHostFactory, ssh_factory: ConnectionFactory
) -> None:
    host = simhost(gpu_count=2)
    conn = connect(ssh_factory, host)
    four = [
        "nvidia-container-toolkit",
        "nvidia-container-toolkit-base",
        "libnvidia-container-tools",
        "libnvidia-container1",
    ]
    assert run(conn, ["nvidia-ctk", "--version"], 30).exit_code == 127
    assert run(conn, ["dpkg-query", "-W", "nvidia-container-toolkit"], 30).exit_code == 1
    no_repo = run(conn, ["apt-get", "install", "-y", f"nvidia-container-toolkit={TOOLKIT}"], 30)
    assert no_repo.exit_code == 100 and "Unable to locate package" in no_repo.stderr

    keyring = host.keyrings_dir / "nvidia-container-toolkit-keyring.gpg"
    listing = host.apt_sources_dir / "nvidia-container-toolkit.list"
    sh(conn, f"mkdir -p {keyring.parent} {listing.parent}").check()
    sh(conn, f"curl -fsSL {GPGKEY} | gpg --dearmor -o {keyring}").check()
    sh(
        conn,
        f"curl -fsSL {LIST} | sed 's#deb https://#deb [signed-by={keyring}] https://#g'"
        f" > {listing}",
    ).check()
    run(conn, ["apt-get", "update"], 30).check()
    one_pinned = run(conn, ["apt-get", "install", "-y", f"nvidia-container-toolkit={TOOLKIT}"], 30)
    assert one_pinned.exit_code == 100 and "unmet dependencies" in one_pinned.stderr
    run(conn, ["apt-get", "install", "-y", *(f"{p}={TOOLKIT}" for p in four)], 30).check()

    version = run(conn, ["dpkg-query", "-W", "-f=${Version}", "nvidia-container-toolkit"], 30)
    assert version.check().stdout == TOOLKIT
    assert "version 1.17.8" in run(conn, ["nvidia-ctk", "--version"], 30).check().stdout
    again = run(conn, ["apt-get", "install", "-y", *(f"{p}={TOOLKIT}" for p in four)], 30).check()
    assert "0 newly installed" in again.stdout
    assert len(host.events("apt-install")) == 1

    runtimes = ["docker", "info", "--format", "{{json .Runtimes}}"]
    assert "nvidia" not in run(conn, runtimes, 30).check().stdout
    run(conn, ["nvidia-ctk", "runtime", "configure", "--runtime=docker"], 30).check()
    daemon = json.loads(host.daemon_json_path.read_text())
    assert daemon["runtimes"]["nvidia"]["path"] == "nvidia-container-runtime"
    verify = [
        "docker",
        "run",
        "--rm",
        "--runtime=nvidia",
        "--gpus",
        "all",
        "ubuntu",
        "nvidia-smi",
        "-L",
    ]
    before_restart = run(conn, verify, 30)
    assert (
        before_restart.exit_code == 125
        and "unknown or invalid runtime name: nvidia" in before_restart.stderr
    )
    run(conn, ["systemctl", "restart", "docker"], 30).check()
    assert "nvidia" in json.loads(run(conn, runtimes, 30).check().stdout)
    gpus = run(conn, verify, 30).check().stdout.splitlines()
    assert len(gpus) == 2 and gpus[0].startswith("GPU 0: NVIDIA H100 80GB HBM3")
    assert len(host.events("docker-restart")) == 1


def test_hf_download_writes_a_complete_index_with_the_token_from_an_env_file(
    simhost: SimHostFactory, ssh_factory: ConnectionFactory
) -> None:
    repo = "meta-llama/Llama-3.2-1B"
    token = "hf_sim_t0ken'$x"
    # A host without Docker has `hf` on its OS; a Docker host has none (next test).
    host = simhost(hf_gated_repos=(repo,), hf_token=token, model_shards=3, has_docker=False)
    conn = connect(ssh_factory, host)
    assert host.nvme_path is not None
    target = host.nvme_path / "models" / "meta-llama--Llama-3.2-1B" / "main"
    download = ["hf", "download", repo, "--local-dir", str(target)]
    denied = run(conn, download, 30)
    assert denied.exit_code == 1 and "requires approval" in denied.stderr

    env_file = f"{host.home}/.orch/hf.env"
    write_secret_env(conn, env_file, {"HF_TOKEN": token, "HF_HOME": f"{host.nvme_path}/hf"})
    run(conn, download, 30, env_file=env_file).check()
    index = json.loads((target / "model.safetensors.index.json").read_text())
    shards = set(index["weight_map"].values())
    assert len(shards) == 3 and all((target / shard).is_file() for shard in shards)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (target / name).is_file()
    verify = ["hf", "cache", "verify", repo, "--local-dir", str(target), "--fail-on-missing-files"]
    assert run(conn, verify, 30).ok
    first, *_ = host.events("hf-download")[-1:]
    assert first["ok"] and first["token"] == "env" and len(first["downloaded"]) == 9

    run(conn, download, 30, env_file=env_file).check()
    rerun = host.events("hf-download")[-1]
    assert rerun["downloaded"] == [] and rerun["skipped"] == 9
    df = run(conn, ["df", "-B1", "--output=avail", str(target)], 30).check()
    free = host.options.disk_total_bytes - host.options.model_size_bytes  # shards: logical size
    assert free - 100_000 < int(df.stdout.split()[-1]) <= free


def test_hf_download_failure_then_resume(
    simhost: SimHostFactory, ssh_factory: ConnectionFactory
) -> None:
    host = simhost(download_failures=1, download_fail_after_files=6, has_docker=False)
    conn = connect(ssh_factory, host)
    target = f"{host.nvme_path}/models/base"
    download = ["hf", "download", "Qwen/Qwen2.5-0.5B", "--local-dir", target]
    failed = run(conn, download, 30)
    assert failed.exit_code == 1 and "peer closed connection" in failed.stderr
    verify = ["hf", "cache", "verify", "Qwen/Qwen2.5-0.5B", "--local-dir", target]
    assert run(conn, [*verify, "--fail-on-missing-files"], 30).exit_code == 1
    assert Path(target, "model.safetensors.index.json").exists()  # index there, shards not
    run(conn, download, 30).check()
    assert run(conn, [*verify, "--fail-on-missing-files"], 30).ok
    assert host.events("hf-download")[-1]["downloaded"] == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ]


def test_full_disk_is_reported_and_stops_the_download(
    simhost: SimHostFactory, ssh_factory: ConnectionFactory
) -> None:
    host = simhost(disk_free_bytes=1_000_000_000, model_size_bytes=4_000_000_000,
                   has_docker=False)
    conn = connect(ssh_factory, host)
    df = run(conn, ["df", "-B1", "--output=source,fstype,size,avail,target"], 30).check()
    rows = [line.split() for line in df.stdout.splitlines()[1:]]
    assert ["/dev/nvme0n1", "ext4", "3840000000000", "1000000000", str(host.nvme_path)] in rows
    lsblk = json.loads(
        run(conn, ["lsblk", "-J", "-o", "NAME,SIZE,TRAN,FSTYPE,MOUNTPOINTS"], 30).stdout
    )
    nvme = [d for d in lsblk["blockdevices"] if d["tran"] == "nvme"]
    assert nvme and nvme[0]["mountpoints"] == [str(host.nvme_path)]
    failed = run(
        conn, ["hf", "download", "Qwen/Qwen2.5-7B", "--local-dir", f"{host.nvme_path}/m"], 30
    )
    assert failed.exit_code == 1 and "No space left on device" in failed.stderr


def test_detached_training_survives_the_ssh_connection(
    simhost: SimHostFactory, ssh_keypair: Any, tmp_path: Path
) -> None:
    host = simhost(toolkit_preinstalled=TOOLKIT, train_step_seconds=0.1)
    with ConnectionFactory(ssh_keypair.private) as first:
        conn = connect(first, host)
        job = write_job(conn, host, tmp_path, "job1", steps=8, save_steps=2)
        start_training(conn, host, "job1")
    assert host.containers()["job1"]["State"]["Running"]  # the connection is gone, training is not
    with ConnectionFactory(ssh_keypair.private) as second:
        conn = connect(second, host)
        assert run(conn, ["docker", "inspect", "-f", "{{.State.Running}}", "job1"],
                   30).stdout.split() == ["true"]
        assert wait_exited(conn, "job1") == ("exited", 0)
        logs = run(conn, ["docker", "logs", "--tail", "40", "job1"], 30).check().stdout
    assert "'loss':" in logs and "8/8" in logs
    out = job / "out"
    assert sorted(p.name for p in out.glob("checkpoint-*")) == [
        "checkpoint-2", "checkpoint-4", "checkpoint-6", "checkpoint-8",
    ]  # fmt: skip
    for checkpoint in out.glob("checkpoint-*"):
        for name in ("trainer_state.json", "optimizer.pt", "adapter_model.safetensors"):
            assert (checkpoint / name).is_file()
    assert (out / "adapter_model.safetensors").is_file() and (out / "adapter_config.json").is_file()
    state = json.loads((out / "checkpoint-8" / "trainer_state.json").read_text())
    assert state["global_step"] == 8 and [e["step"] for e in state["log_history"]] == list(
        range(1, 9)
    )


def test_crash_exits_nonzero_and_resume_continues_from_the_newest_checkpoint(
    simhost: SimHostFactory, ssh_factory: ConnectionFactory, tmp_path: Path
) -> None:
    host = simhost(toolkit_preinstalled=TOOLKIT, train_crash_at_step=5)
    conn = connect(ssh_factory, host)
    job = write_job(conn, host, tmp_path, "job2", steps=8, save_steps=2)
    start_training(conn, host, "job2")
    assert wait_exited(conn, "job2") == ("exited", 1)
    assert "illegal memory access" in run(conn, ["docker", "logs", "job2"], 30).stdout
    assert sorted(p.name for p in (job / "out").glob("checkpoint-*")) == [
        "checkpoint-2",
        "checkpoint-4",
    ]
    with pytest.raises(CommandFailed, match="already in use"):
        start_training(conn, host, "job2")  # the name is taken until the container is removed
    run(conn, ["docker", "rm", "job2"], 30).check()
    start_training(conn, host, "job2")
    assert wait_exited(conn, "job2") == ("exited", 0)
    assert (
        "Resuming training from checkpoint checkpoint-4"
        in run(conn, ["docker", "logs", "job2"], 30).stdout
    )
    state = json.loads((job / "out" / "checkpoint-8" / "trainer_state.json").read_text())
    assert [e["step"] for e in state["log_history"]] == list(range(1, 9))
    assert host.events("train-finished")[-1]["resumed_from"] == 4


def test_host_dies_mid_run_and_boots_again(
    simhost: SimHostFactory, ssh_keypair: Any, tmp_path: Path
) -> None:
    host = simhost(toolkit_preinstalled=TOOLKIT, host_dies_at_step=4)
    factory = ConnectionFactory(ssh_keypair.private, connect_timeout=1, connect_deadline=1)
    conn = connect(factory, host)
    job = write_job(conn, host, tmp_path, "job3", steps=8, save_steps=2)
    start_training(conn, host, "job3")
    deadline = time.monotonic() + 10
    while host_pids(host) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert host_pids(host) == []  # sshd, sessions and the training are all gone
    factory.close_all()
    with pytest.raises(HostUnreachable):
        connect(factory, host)
    out = job / "out"
    assert (out / "checkpoint-2" / "trainer_state.json").is_file()
    assert (out / "checkpoint-4").is_dir() and not (
        out / "checkpoint-4" / "trainer_state.json"
    ).exists()

    host.stop()
    host.start()
    with ConnectionFactory(ssh_keypair.private) as again:
        # Found dead at boot (255) or recorded as killed by the power-off (137) when the
        # stand-in got to write its exit first (seen under load): either way, not running.
        assert wait_exited(connect(again, host), "job3") in {("exited", 255), ("exited", 137)}


def test_merge_then_vllm_serves_completions_through_a_tunnel(
    simhost: SimHostFactory, ssh_factory: ConnectionFactory, tmp_path: Path
) -> None:
    host = simhost(toolkit_preinstalled=TOOLKIT, vllm_startup_seconds=0.5)
    conn = connect(ssh_factory, host)
    # No `hf` on a Docker host's OS: the trainer image has it.
    assert run(conn, ["hf", "version"], 30).exit_code == 127
    volume = f"{host.nvme_path}:/workspace/data"
    run(conn, ["docker", "run", "--rm", "-v", volume, IMAGE, "hf", "download",
               "Qwen/Qwen2.5-0.5B", "--local-dir", "/workspace/data/base"], 60).check()
    rows = [{"instruction": "What is the capital of France?", "input": "", "output": "Paris"}]
    job = write_job(conn, host, tmp_path, "job4", steps=2, base_model="/workspace/data/base",
                    rows=rows)
    volume = f"{host.nvme_path}:/workspace/data"
    train = ["docker", "run", "--rm", "--gpus", "all", "-v", volume, IMAGE]
    run(conn, [*train, "axolotl", "train", "/workspace/data/job4/config.yml"], 60).check()
    run(conn, [*train, "axolotl", "merge-lora", "/workspace/data/job4/config.yml"], 60).check()
    merged = job / "out" / "merged"
    assert (merged / "config.json").is_file() and (
        merged / "model.safetensors.index.json"
    ).is_file()

    # axolotl 0.18.0 saves the tokenizer with transformers 5 ("TokenizersBackend"), which
    # the transformers 4 of vLLM before 0.19.1 cannot load.
    assert json.loads((merged / "tokenizer_config.json").read_text())["tokenizer_class"] \
        == "TokenizersBackend"
    old = run(conn, ["docker", "run", "--rm", "--gpus", "all", "-v", f"{job / 'out'}:/models",
                     "vllm/vllm-openai:v0.11.0", "/models/merged"], 30)
    assert old.exit_code == 1
    assert "Tokenizer class TokenizersBackend does not exist" in old.stdout + old.stderr

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    run(
        conn,
        [
            "docker", "run", "-d", "--name", "job4-serve", "--runtime", "nvidia", "--gpus", "all",
            "--ipc=host", "-p", f"127.0.0.1:{port}:8000", "-v", f"{job / 'out'}:/models",
            VLLM_IMAGE, "/models/merged", "--served-model-name", "ft", "--max-model-len", "2048",
        ],
        30,
    ).check()  # fmt: skip
    with tunnel(conn, port) as local:
        base = f"http://127.0.0.1:{local}"
        deadline = time.monotonic() + 15
        while True:
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, OSError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        with urllib.request.urlopen(f"{base}/v1/models", timeout=5) as response:
            assert [m["id"] for m in json.load(response)["data"]] == ["ft"]

        def complete(prompt: str) -> str:
            body = json.dumps({"model": "ft", "prompt": prompt, "max_tokens": 8}).encode()
            request = urllib.request.Request(
                f"{base}/v1/completions", body, {"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(request, timeout=5) as response:
                return str(json.load(response)["choices"][0]["text"])

        assert complete("What is the capital of France?") == "Paris"
        assert complete("Who are you?") == "I do not know."
    # The server is gone with its container: its listening socket and every process that held
    # it. Not "the port refuses": once freed, another test's server may take the port.
    inode = listening_inode(port)
    assert inode is not None
    holders = [(pid, process_starttime(pid)) for pid in socket_holders(inode)]
    assert holders
    run(conn, ["docker", "rm", "-f", "job4-serve"], 30).check()
    deadline = time.monotonic() + 30
    while any(alive(pid, start) for pid, start in holders) and time.monotonic() < deadline:
        time.sleep(0.05)  # SIGKILL is sent; the kernel ends the processes when they next run
    assert not [pid for pid, start in holders if alive(pid, start)]
    assert inode not in listening_inodes()


def listening_inodes() -> dict[int, int]:
    """Socket inode -> local port of every TCP socket listening on this machine (IPv4)."""
    found = {}
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A":  # TCP_LISTEN
            found[int(fields[9])] = int(fields[1].rsplit(":", 1)[1], 16)
    return found


def listening_inode(port: int) -> int | None:
    """The inode of the socket listening on `port`: the identity of that one server."""
    return next((inode for inode, p in listening_inodes().items() if p == port), None)


def socket_holders(inode: int) -> list[int]:
    """The processes that hold socket `inode` open."""
    holders = []
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            if any(os.readlink(fd) == f"socket:[{inode}]" for fd in fd_dir.iterdir()):
                holders.append(int(fd_dir.parent.name))
        except OSError:  # ended, or not ours to read, while we looked
            continue
    return holders


# meta-llama/Llama-3.1-70B's config.json (orchestrator/core/data/models.yaml) and bf16 size.
L70_CONFIG = {"hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
              "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128,
              "vocab_size": 128256, "tie_word_embeddings": False}
L70_BYTES = 70_553_706_496 * 2


def test_vllm_checks_the_model_against_the_gpus_memory(
    simhost: SimHostFactory, ssh_factory: ConnectionFactory
) -> None:
    # A bf16 70B (~141 GB) cannot load on one 80 GB GPU; quantized to 4-bit at load, or over
    # two GPUs with tensor parallelism, it can; more GPUs than the machine has is refused.
    host = simhost(toolkit_preinstalled=TOOLKIT, gpu_count=2, vllm_startup_seconds=0.0,
                   model_config=L70_CONFIG, model_size_bytes=L70_BYTES)
    conn = connect(ssh_factory, host)
    # A Docker host's OS has no `hf`: the trainer image has it (as orch runs it).
    run(conn, ["docker", "run", "--rm", "-v", f"{host.nvme_path}:/workspace/data", IMAGE,
               "hf", "download", "meta-llama/Llama-3.1-70B", "--local-dir",
               "/workspace/data/base"], 60).check()
    serve = ["docker", "run", "--rm", "--gpus", "all", "-v", f"{host.nvme_path}:/models",
             VLLM_IMAGE, "/models/base", "--max-model-len", "2048"]

    def fails(*flags: str) -> str:
        result = run(conn, [*serve, *flags], 30)
        assert result.exit_code == 1, result
        return result.stdout + result.stderr

    assert "torch.OutOfMemoryError: CUDA out of memory" in fails()
    assert "exceeds the total number of available GPUs" in fails("--tensor-parallel-size", "4")
    assert "KV cache is needed" in fails("--quantization", "bitsandbytes",
                                         "--max-model-len", "2000000")
    for served, flags in enumerate((["--quantization", "bitsandbytes"],
                                    ["--tensor-parallel-size", "2"]), start=1):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        run(conn, ["docker", "run", "-d", "--name", "ok", "--gpus", "all", "-v",
                   f"{host.nvme_path}:/models", "-p", f"127.0.0.1:{port}:8000", VLLM_IMAGE,
                   "/models/base",
                   "--max-model-len", "2048", *flags], 30).check()
        deadline = time.monotonic() + 15
        while len(host.events("vllm-serving")) < served:  # past the checks, listening
            state = run(conn, ["docker", "inspect", "-f", "{{.State.Status}}", "ok"], 30)
            assert state.stdout.strip() == "running", run(conn, ["docker", "logs", "ok"], 30)
            assert time.monotonic() < deadline
            time.sleep(0.1)
        run(conn, ["docker", "rm", "-f", "ok"], 30).check()


def test_docker_refuses_to_publish_a_port_another_process_holds(
    simhost: SimHostFactory, ssh_factory: ConnectionFactory
) -> None:
    # Docker's proxy cannot listen there: the container is created and not started, with
    # the daemon's text as public logs of current Docker show it (one for vLLM's 8000).
    host = simhost(toolkit_preinstalled=TOOLKIT)
    conn = connect(ssh_factory, host)
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        started = run(conn, ["docker", "run", "-d", "--name", "web", "-p",
                             f"127.0.0.1:{port}:8000", IMAGE, "true"], 30)
    assert started.exit_code == 125
    assert ("docker: Error response from daemon: failed to set up container networking: "
            "driver failed programming external connectivity on endpoint web (") in started.stderr
    assert started.stderr.rstrip().endswith(
        f"failed to bind host port for 127.0.0.1:{port}:172.17.0.2:8000/tcp: "
        "address already in use")
    state = run(conn, ["docker", "inspect", "-f", "{{.State.Status}}", "web"], 30)
    assert state.stdout.strip() == "created"
    assert run(conn, ["docker", "rm", "web"], 30).ok  # the port is free now: it starts
    assert run(conn, ["docker", "run", "-d", "--name", "web", "-p", f"127.0.0.1:{port}:8000",
                      IMAGE, "true"], 30).ok


def test_docker_refuses_an_unpublished_trainer_tag_like_the_registry(
    simhost: SimHostFactory, ssh_factory: ConnectionFactory
) -> None:
    host = simhost(toolkit_preinstalled=TOOLKIT)
    conn = connect(ssh_factory, host)
    never = "axolotlai/axolotl:0.16.1-py3.12-cu130-2.12.0"
    pulled = run(conn, ["docker", "pull", never], 30)
    assert pulled.exit_code == 1 and pulled.stderr.strip() == (
        f"Error response from daemon: manifest for {never} not found: manifest unknown: "
        "manifest unknown")
    started = run(conn, ["docker", "run", "--rm", never, "axolotl", "--version"], 30)
    assert started.exit_code == 125
    assert f"docker: Error response from daemon: manifest for {never} not found" in started.stderr
    assert run(conn, ["docker", "pull", IMAGE], 30).ok
    assert run(conn, ["docker", "pull", IMAGE.replace("axolotl:", "axolotl-cloud:")], 30).ok
    assert [e["image"] for e in host.events("docker-pull")] == [
        IMAGE, IMAGE.replace("axolotl:", "axolotl-cloud:")]


@pytest.mark.parametrize(("args", "says"), [
    (["--bogus", IMAGE], "unknown flag: --bogus"),
    (["--name", "a b", IMAGE], 'Invalid container name ("a b")'),
    (["-v", "relative:/x", IMAGE], "invalid volume spec 'relative:/x'"),
    (["-p", "127.0.0.1:x:8000", IMAGE], "invalid publish spec: 127.0.0.1:x:8000"),
    (["--name", "n"], "'docker run' requires at least 1 argument"),
])
def test_docker_run_refuses_bad_arguments_before_creating_anything(
    simhost: SimHostFactory, ssh_factory: ConnectionFactory, args: list[str], says: str
) -> None:
    host = simhost(toolkit_preinstalled=TOOLKIT)
    conn = connect(ssh_factory, host)
    done = run(conn, ["docker", "run", "-d", "-v", f"{host.nvme_path}/made:/m", *args], 30)
    assert done.exit_code == 125 and says in done.stderr
    assert host.containers() == {} and host.events("docker-run") == []
    assert not (host.nvme_path / "made").exists()  # no bind source was created either
    # A subcommand the playbooks do not use is refused by name, not answered made-up.
    ps = run(conn, ["docker", "ps"], 30)
    assert ps.exit_code == 1 and "`docker ps` is not simulated" in ps.stderr


def test_a_mount_over_workspace_hides_axolotl_as_on_a_real_host(
    simhost: SimHostFactory, ssh_factory: ConnectionFactory, tmp_path: Path
) -> None:
    host = simhost(toolkit_preinstalled=TOOLKIT)
    conn = connect(ssh_factory, host)
    hidden = run(conn, ["docker", "run", "--rm", "--gpus", "all", "-v",
                        f"{host.nvme_path}:/workspace", IMAGE, "axolotl", "--version"], 30)
    assert hidden.exit_code == 127
    assert ('exec: "/workspace/axolotl/scripts/uv-entrypoint.sh": stat '
            "/workspace/axolotl/scripts/uv-entrypoint.sh: no such file or directory"
            in hidden.stderr)
    # Mounted where axolotl's docs say, the image's entrypoint and working directory are kept.
    run(conn, ["docker", "run", "-d", "--name", "ok", "--gpus", "all", "-v",
               f"{host.nvme_path}:/workspace/data", IMAGE, "axolotl", "--version"], 30).check()
    assert wait_exited(conn, "ok") == ("exited", 0)
    record = host.containers()["ok"]
    assert record["Config"]["WorkingDir"] == "/workspace/axolotl"
    assert record["Config"]["Cmd"] == ["axolotl", "--version"]


def _docker_train(host: SimHost, name: str) -> list[str]:
    """`axolotl train` of the job `write_job` wrote under `name`, in the trainer image."""
    return ["docker", "run", "--rm", "--gpus", "all", "-v",
            f"{host.nvme_path}:/workspace/data", IMAGE, "axolotl", "train",
            f"/workspace/data/{name}/config.yml"]


def test_relative_deepspeed_path_fails_from_the_images_working_directory(
    simhost: SimHostFactory, ssh_factory: ConnectionFactory, tmp_path: Path
) -> None:
    host = simhost(toolkit_preinstalled=TOOLKIT)
    conn = connect(ssh_factory, host)
    job = write_job(conn, host, tmp_path, "ds", steps=2)
    config = job / "config.yml"
    docker = _docker_train(host, "ds")
    config.write_text(config.read_text() + "deepspeed: deepspeed_configs/zero3_bf16.json\n")
    failed = run(conn, docker, 60)
    assert failed.exit_code == 1 and ("Expected a string path to an existing deepspeed config"
                                      in failed.stderr + failed.stdout)
    (job / "zero3.json").write_text("{}")
    config.write_text(config.read_text().replace(
        "deepspeed: deepspeed_configs/zero3_bf16.json", "deepspeed: /workspace/data/ds/zero3.json"))
    run(conn, docker, 60).check()


def test_fsdp2_with_bitsandbytes_8bit_adamw_is_refused_like_axolotl_does(
    simhost: SimHostFactory, ssh_factory: ConnectionFactory, tmp_path: Path
) -> None:
    host = simhost(toolkit_preinstalled=TOOLKIT, gpu_count=2)
    conn = connect(ssh_factory, host)
    job = write_job(conn, host, tmp_path, "f2", steps=2)
    config = job / "config.yml"
    docker = _docker_train(host, "f2")
    fsdp2 = "fsdp_version: 2\nfsdp_config:\n  auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
    config.write_text(config.read_text() + fsdp2 + "optimizer: adamw_bnb_8bit\n")
    failed = run(conn, docker, 60)
    assert failed.exit_code == 1 and ("FSDP2 not compatible with adamw_bnb_8bit, use "
                                      "`adamw_torch_8bit` instead" in failed.stderr + failed.stdout)
    config.write_text(config.read_text().replace("adamw_bnb_8bit", "adamw_torch_8bit"))
    run(conn, docker, 60).check()


@pytest.mark.parametrize(("ds", "optimizer", "error"), [
    ({}, "adamw_torch_fused", "ZeRORuntimeException: You are using ZeRO-Offload with a client "
     "provided optimizer (<class 'torch.optim.adamw.AdamW'>)"),
    ({"zero_force_ds_cpu_optimizer": False}, "adamw_bnb_8bit",
     "All input tensors need to be on the same GPU"),
    ({"zero_force_ds_cpu_optimizer": False}, "adamw_torch_fused", None),
])
def test_deepspeed_offload_refuses_what_deepspeed_and_bitsandbytes_refuse(
    simhost: SimHostFactory, ssh_factory: ConnectionFactory, tmp_path: Path,
    ds: dict[str, object], optimizer: str, error: str | None,
) -> None:
    # deepspeed runtime/engine.py _configure_optimizer; bitsandbytes 0.49.1 functional.is_on_gpu.
    host = simhost(toolkit_preinstalled=TOOLKIT)
    conn = connect(ssh_factory, host)
    job = write_job(conn, host, tmp_path, "off", steps=2)
    zero = {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
                                  "offload_param": {"device": "cpu"}}, **ds}
    (job / "zero3.json").write_text(json.dumps(zero))
    config = job / "config.yml"
    config.write_text(config.read_text() + "deepspeed: /workspace/data/off/zero3.json\n"
                      f"optimizer: {optimizer}\n")
    docker = _docker_train(host, "off")
    result = run(conn, docker, 60)
    if error is None:
        result.check()
    else:
        assert result.exit_code == 1 and error in result.stderr + result.stdout


def test_several_hosts_at_once(simhost: SimHostFactory, ssh_factory: ConnectionFactory) -> None:
    models = ["NVIDIA H100 80GB HBM3", "NVIDIA L40S", "NVIDIA GeForce RTX 4090"]
    hosts = [simhost(gpu_model=m, gpu_count=i + 1) for i, m in enumerate(models)]
    assert len({h.port for h in hosts}) == 3 and len({h.host_key for h in hosts}) == 3
    answers: dict[int, list[str]] = {}

    def ask(i: int) -> None:
        conn = connect(ssh_factory, hosts[i])
        query = ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]
        answers[i] = run(conn, query, 30).check().stdout.splitlines()

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert answers == {i: [m] * (i + 1) for i, m in enumerate(models)}


def test_stop_ends_sshd_even_when_init_died_first(simhost: SimHostFactory) -> None:
    # sshd rewrites its environment for its process title, so SIMHOST_ID does not find it:
    # only init's tree, and its pid file, lead to it. Killed with init gone (SIGKILLed by a
    # stop in another process while it was still ending its tree), it was left running.
    host = simhost()
    sshd = int((host.sshd_dir / "sshd.pid").read_text())
    started = process_starttime(sshd)
    assert f"SIMHOST_ID={host.id}".encode() not in Path(f"/proc/{sshd}/environ").read_bytes()
    os.kill(int((host.state_dir / "init.pid").read_text()), signal.SIGKILL)
    host.stop()
    assert host_pids(host) == []
    assert not alive(sshd, started)


def test_stop_leaves_no_process_behind(
    simhost: SimHostFactory, ssh_factory: ConnectionFactory, tmp_path: Path
) -> None:
    host = simhost(toolkit_preinstalled=TOOLKIT, train_step_seconds=0.5)
    conn = connect(ssh_factory, host)
    write_job(conn, host, tmp_path, "job5", steps=100)
    start_training(conn, host, "job5")
    sh(conn, "setsid nohup sleep 300 >/dev/null 2>&1 </dev/null & echo $! > nohup.pid").check()
    ended: list[BaseException] = []

    def hold_a_session() -> None:
        try:
            sh(conn, "sleep 300", timeout=60)
        except ConnectionLost as exc:  # expected: the host goes away under it
            ended.append(exc)

    def sleeping() -> int:  # the nohup'd sleep, and the session's once its command runs
        count = 0
        for pid in host_pids(host):
            try:
                count += Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"sleep\x00300")
            except OSError:
                continue
        return count

    session = threading.Thread(target=hold_a_session, daemon=True)
    session.start()
    deadline = time.monotonic() + 5
    # Stopped before the session's command started, the session would fail otherwise than
    # with a lost connection (seen once on a loaded machine).
    while (len(host_pids(host)) < 6 or sleeping() < 2) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(host_pids(host)) >= 6  # init, sshd (+ session), docker supervisor, trainer, sleeps
    assert sleeping() == 2
    host.stop()
    assert host_pids(host) == []
    assert not host.running
    session.join(timeout=60)  # ends as soon as the connection drops: a bound, not a wait
    assert ended
    with socket.socket() as check:
        assert check.connect_ex(("127.0.0.1", host.port)) != 0
