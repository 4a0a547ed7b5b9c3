"""Orchestration overhead of the host pipeline on an already prepared (warm) host.

One run, three measurements on one simulated GPU host (real sshd on loopback, stand-ins
with trivially short training, merge and serving):
1. warm-up: the whole pipeline for job A (installs the toolkit, downloads the model);
2. orch: the whole pipeline for job B on the now warm host, timed; its SSH commands are
   read back from the host's command log (SFTP transfers are counted separately);
3. plain: the same command strings (job id B -> C) sent through ONE plain `ssh` session
   (`sh -s` reading them from stdin), timed.
Prints wall times, round trips and the ratio (target: within 2x), and checks that the warm
run installed and downloaded nothing. Asserts nothing. Usage: python bench/pipeline_overhead.py
"""

from __future__ import annotations

import json
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from playbooks.axolotl import TrainConfigInput  # noqa: E402
from playbooks.base import Host, HostPaths, StepReport  # noqa: E402
from playbooks.gpu import GpuExpectation  # noqa: E402
from playbooks.pipeline import PipelineJob, run_pipeline  # noqa: E402
from playbooks.ssh import ConnectionFactory  # noqa: E402
from simhost import SimHost, SimHostOptions  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        key = tmp / "id_ed25519"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)],
                       check=True)
        opts = SimHostOptions(train_steps=2, train_step_seconds=0.01, merge_seconds=0.0,
                              vllm_startup_seconds=0.0)
        data = tmp / "train.jsonl"
        data.write_text(json.dumps({"instruction": "2+2=", "input": "", "output": "4"}) + "\n")
        evals = tmp / "eval.jsonl"
        evals.write_text(json.dumps({"prompt": "2+2=", "expected": "4"}) + "\n")
        config = TrainConfigInput(method="qlora", base_model_dir="", dataset_path="",
                                  dataset_format="alpaca", output_dir="", save_steps=1)
        with SimHost(tmp / "host", key.with_suffix(".pub").read_text(), opts) as sim, \
                ConnectionFactory(key) as factory:
            conn = factory.connect(sim.host, sim.port, sim.user, sim.host_key)
            host = Host(conn, HostPaths(str(sim.root)))
            def emit(report: StepReport) -> None:
                pass

            job = PipelineJob(job_id="j-warmup", repo="meta-llama/Llama-3.2-1B",
                              model_bytes=2_471_645_184, gpu=GpuExpectation("H100 SXM", 1),
                              config=config, dataset=str(data), eval_set=str(evals),
                              artifacts_dir=str(tmp / "a"), vllm_port=free_port(), poll_s=0.05)
            run_pipeline(host, job, emit)
            before = {k: len(sim.events(k)) for k in ("apt-install", "hf-download")}
            n0 = len(sim.ssh_commands())

            t = time.perf_counter()
            run_pipeline(host, replace(job, job_id="j-bench", artifacts_dir=str(tmp / "b"),
                                       vllm_port=free_port()), emit)
            orch_s = time.perf_counter() - t
            commands = sim.ssh_commands()[n0:]
            after = {k: len(sim.events(k)) for k in ("apt-install", "hf-download")}

            script = "\n".join(c.replace("j-bench", "j-plain") for c in commands) + "\n"
            argv = ["ssh", "-T", "-i", str(key), "-p", str(sim.port), "-o", "BatchMode=yes",
                    "-o", "StrictHostKeyChecking=yes", "-o",
                    f"UserKnownHostsFile={_known_hosts(tmp, sim)}", f"{sim.user}@{sim.host}",
                    "sh -s"]
            t = time.perf_counter()
            subprocess.run(argv, input=script.encode(), stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, check=False, timeout=300)
            plain_s = time.perf_counter() - t

    print(f"{'':28} {'wall s':>8} {'SSH exec round trips':>21}")
    print(f"{'orch pipeline (warm host)':28} {orch_s:8.2f} {len(commands):21d}")
    print(f"{'same commands, one ssh':28} {plain_s:8.2f} {1:21d}")
    ratio = orch_s / plain_s if plain_s else float("inf")
    verdict = "ok" if ratio <= 2 else "over the 2x target"
    print(f"overhead ratio orch/plain: {ratio:.2f}x ({verdict}). Not counted: orch's SFTP "
          "transfers (dataset, config, artifacts), which the plain replay does not make")
    print(f"warm run: {after['apt-install'] - before['apt-install']} apt installs, "
          f"{after['hf-download'] - before['hf-download']} model downloads (expected 0 and 0)")
    print("commands by program:", _by_program(commands))


def _known_hosts(tmp: Path, sim: SimHost) -> Path:
    path = tmp / "known_hosts"
    path.write_text(f"[{sim.host}]:{sim.port} {sim.host_key}\n")
    return path


def _by_program(commands: list[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for c in commands:
        try:
            words = shlex.split(c)
        except ValueError:
            words = [c.split()[0]]
        prog = " ".join(words[:2]) if words[:1] == ["docker"] else (words[0] if words else "?")
        counts[prog] = counts.get(prog, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


if __name__ == "__main__":
    main()
