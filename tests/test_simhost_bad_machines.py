"""The simulated hosts' bad-machine faults act on the job's own tools too, not only on the
host check's: a slow GPU trains slower, a host without a route to the Hub cannot download
the model, and the stand-in `dd` refuses what the real one refuses, in its words."""

from __future__ import annotations

import re
import subprocess
from typing import Any

import pytest
from conftest import PlaybookHostFactory

from playbooks.model_cache import classify_download_error

IMAGE = "axolotlai/axolotl:0.18.0-py3.12-cu130-2.12.0"
RENTAL = "axolotlai/axolotl-cloud:0.18.0-py3.12-cu130-2.12.0"
CONFIG = ("base_model: meta-llama/Llama-3.2-1B\nadapter: lora\nlora_r: 8\nlora_alpha: 16\n"
          "learning_rate: 0.0002\nmicro_batch_size: 1\n"
          "datasets:\n- path: /workspace/data/j/train.jsonl\n  type: alpaca\n"
          "output_dir: /workspace/data/j/out\nmax_steps: 3\nsave_steps: 10\n")


def train_rate(playbook_host: PlaybookHostFactory, **options: Any) -> str:
    """The it/s the simulated trainer's progress bar reports on a host with `options`."""
    sim, host = playbook_host(toolkit_preinstalled="1.18.1-1", train_step_seconds=0.05,
                              **options)
    assert sim.nvme_path is not None
    job = sim.nvme_path / "j"
    job.mkdir(parents=True)
    (job / "train.jsonl").write_text('{"instruction": "hi", "input": "", "output": "ho"}\n')
    (job / "config.yml").write_text(CONFIG)
    result = host.run(["docker", "run", "--rm", "--gpus", "all", "-v",
                       f"{sim.nvme_path}:/workspace/data", IMAGE, "axolotl", "train",
                       "/workspace/data/j/config.yml"], timeout=60)
    assert result.ok, result.stderr
    return re.findall(r"([0-9.]+)it/s", result.stdout)[-1]


def test_a_slow_gpu_trains_at_its_fraction(playbook_host: PlaybookHostFactory) -> None:
    # The trainer's own report of its rate (the stand-in's step time), not a wall clock.
    assert train_rate(playbook_host) == "20.00"
    assert train_rate(playbook_host, gpu_speed=0.5) == "10.00"


def test_without_a_route_to_the_hub_the_model_download_fails_and_is_retried(
        playbook_host: PlaybookHostFactory) -> None:
    sim, host = playbook_host(container_image=RENTAL, hub_unreachable=True)
    hf = str(sim.path("/workspace/axolotl-venv/bin/hf"))
    result = host.run([hf, "download", "Qwen/Qwen2.5-0.5B", "--local-dir",
                       str(sim.path("/mnt/nvme/m"))], timeout=60)
    assert result.exit_code == 1
    assert result.stderr.rstrip().endswith(
        "httpx.ConnectError: [Errno -3] Temporary failure in name resolution")
    assert not sim.path("/mnt/nvme/m").exists()
    # The model cache retries it (not a refusal it recognises): the bad host costs the
    # retries' time when the check does not catch it first.
    assert classify_download_error(result.stderr, result.exit_code, "Qwen/Qwen2.5-0.5B",
                                   "main") is None
    assert sim.events("hf-download")[-1]["error"] == "no-route"


@pytest.mark.parametrize("operand", ["foo=1", "bogus"])
def test_dd_refuses_an_unknown_operand_as_dd_does(playbook_host: PlaybookHostFactory,
                                                  operand: str) -> None:
    _, host = playbook_host()
    real = subprocess.run(["dd", operand], capture_output=True, text=True,
                          env={"LC_ALL": "C", "PATH": "/usr/bin:/bin"})
    simulated = host.run(["dd", operand], timeout=30)
    assert (simulated.exit_code, simulated.stderr) == (real.returncode, real.stderr)


def test_dd_stops_at_a_full_disk(playbook_host: PlaybookHostFactory) -> None:
    sim, host = playbook_host(disk_free_bytes=3 * 2**20)
    target = str(sim.path("/mnt/nvme/t"))
    result = host.run(["dd", "if=/dev/zero", f"of={target}", "bs=1M", "count=8",
                       "conv=fdatasync"], timeout=30)
    assert result.exit_code == 1
    assert f"dd: error writing '{target}': No space left on device" in result.stderr
    assert "3145728 bytes (3.1 MB, 3.0 MiB) copied" in result.stderr


def test_dd_cut_short_by_sigint_reports_what_it_did(playbook_host: PlaybookHostFactory) -> None:
    # As GNU dd does on SIGINT (the host check bounds it with `timeout -s INT`).
    sim, host = playbook_host(disk_write_bytes_per_second=20e6)
    target = sim.path("/mnt/nvme/t")
    result = host.run(["timeout", "-s", "INT", "0.5", "dd", "if=/dev/zero", f"of={target}",
                       "bs=1M", "count=100", "conv=fdatasync"], timeout=30)
    assert result.exit_code == 124
    found = re.search(r"^(\d+) bytes .* copied", result.stderr, re.M)
    assert found is not None, result.stderr
    done = int(found.group(1))
    assert 0 < done < 100 * 2**20 and target.stat().st_size == done
