"""The GPU playbook over real SSH: a matching host passes, a wrong one is the provider's fault."""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import PlaybookHostFactory, Reports

from playbooks import gpu
from playbooks.base import Fault, PlaybookFailed, run_playbook
from playbooks.gpu import GpuExpectation, GpuInfo, catalog_model, check_gpus, parse_inventory
from playbooks.ssh import Result


def test_matching_host_passes_and_reports_inventory(playbook_host: PlaybookHostFactory,
                                                    reports: Reports) -> None:
    sim, host = playbook_host(gpu_count=2)
    run_playbook("gpu", gpu.steps(GpuExpectation("H100 SXM", 2, 80_000)), host, reports)
    assert reports.outcomes() == {"driver": "ok", "inventory": "ok"}
    # Both steps share one nvidia-smi call.
    assert sum("nvidia-smi" in c for c in sim.ssh_commands()) == 1
    assert check_gpus(host) == [GpuInfo("NVIDIA H100 80GB HBM3", 81559, "580.65.06",
                                        "H100 SXM", used_mib=0)] * 2


@pytest.mark.parametrize(
    ("expected", "found"),
    [
        (GpuExpectation("H200", 2), "model NVIDIA H100 80GB HBM3 is not a H200"),
        (GpuExpectation("H100 SXM", 4), "2 GPU(s) instead of 4"),
        (GpuExpectation("H100 SXM", 1), "2 GPU(s) instead of 1"),
        (GpuExpectation("H100 SXM", 2, 143_000), "81559 MiB of GPU memory instead of >= 143000"),
    ],
    ids=["wrong-model", "too-few", "too-many", "too-little-memory"],
)
def test_mismatch_is_a_provider_fault(playbook_host: PlaybookHostFactory, reports: Reports,
                                      expected: GpuExpectation, found: str) -> None:
    _, host = playbook_host(gpu_count=2)
    with pytest.raises(PlaybookFailed) as info:
        run_playbook("gpu", gpu.steps(expected), host, reports)
    assert info.value.fault is Fault.PROVIDER and info.value.step == "inventory"
    assert found in info.value.reason
    assert f"promised {expected.count}x {expected.model}" in info.value.reason
    assert "found 2x NVIDIA H100 80GB HBM3 (81559 MiB)" in info.value.reason
    assert reports.outcomes() == {"driver": "ok", "inventory": "failed"}
    assert reports.items[-1].fault == "provider"


def test_driver_too_old_for_the_images_cuda_fails_before_anything_is_pulled(
        playbook_host: PlaybookHostFactory, reports: Reports) -> None:
    # A monthly server with a CUDA 12.8 driver cannot run the cu130 trainer image.
    sim, host = playbook_host(gpu_count=1, driver_version="570.172.08", cuda_version="12.8")
    image = "axolotlai/axolotl:0.18.0-py3.12-cu130-2.12.0"
    expected = GpuExpectation("H100 SXM", 1, min_cuda="13.0", image=image, exact_count=False)
    with pytest.raises(PlaybookFailed) as info:
        run_playbook("gpu", gpu.steps(expected), host, reports)
    assert info.value.fault is Fault.HOST and info.value.step == "driver-cuda"
    assert ("driver 570.172.08 supports CUDA 12.8, but the trainer image "
            f"{image} needs CUDA >= 13.0") in info.value.reason
    assert "upgrade the driver" in info.value.reason
    assert not sim.events("docker-pull") and not sim.events("hf-download")

    reports.clear()
    _, new = playbook_host(gpu_count=1)  # an R580 driver: CUDA 13.0
    run_playbook("gpu", gpu.steps(expected), new, reports)
    assert reports.outcomes() == {"driver": "ok", "inventory": "ok", "driver-cuda": "ok"}


def test_more_gpus_accepted_when_count_is_a_minimum(playbook_host: PlaybookHostFactory,
                                                    reports: Reports) -> None:
    _, host = playbook_host(gpu_count=2, gpu_model="NVIDIA GeForce RTX 4090",
                            gpu_memory_mib=24564)
    expected = GpuExpectation("RTX 4090", 1, 24_000, exact_count=False)
    run_playbook("gpu", gpu.steps(expected), host, reports)
    assert reports.outcomes() == {"driver": "ok", "inventory": "ok"}


@pytest.mark.parametrize(
    ("option", "says"),
    [("driver_missing", "nvidia-smi is not installed"),
     ("driver_broken", "nvidia-smi failed (exit 9)")],
)
def test_missing_or_broken_driver_is_a_host_fault(playbook_host: PlaybookHostFactory,
                                                  reports: Reports, option: str,
                                                  says: str) -> None:
    _, host = playbook_host(**{option: True})
    with pytest.raises(PlaybookFailed) as info:
        run_playbook("gpu", gpu.steps(GpuExpectation("H100 SXM", 1)), host, reports)
    assert info.value.fault is Fault.HOST and info.value.step == "driver"
    assert "no working NVIDIA driver" in info.value.reason and says in info.value.reason
    assert reports.outcomes() == {"driver": "failed"}


def test_catalog_names_from_nvidia_smi() -> None:
    names = {
        "NVIDIA H100 80GB HBM3": "H100 SXM",
        "NVIDIA H100 PCIe": "H100 PCIe",
        "NVIDIA A100-SXM4-80GB": "A100 80GB",
        "NVIDIA A100 80GB PCIe": "A100 80GB",
        "NVIDIA GeForce RTX 4090": "RTX 4090",
        "nvidia geforce  rtx 4090": "RTX 4090",
        "GeForce RTX 3090": "RTX 3090",
        "NVIDIA GeForce RTX 5090": "RTX 5090",
        "NVIDIA H200": "H200",
        "NVIDIA B200": "B200",
        "NVIDIA B300 SXM6 AC": "B300",
    }
    for smi, model in names.items():
        assert catalog_model(smi) == model, smi
    # A variant that is another product is that product, never its neighbour (an offer
    # for an H100 PCIe is not fulfilled by an H100 NVL).
    variants = {"NVIDIA A100-SXM4-40GB": "A100 40GB", "NVIDIA GeForce RTX 3090 Ti": "RTX 3090 Ti",
                "NVIDIA H100 NVL": "H100 NVL", "NVIDIA L40S": "L40S", "NVIDIA L40": "L40",
                "NVIDIA H200 NVL": "H200 NVL", "NVIDIA A10": "A10",
                "NVIDIA GeForce RTX 4080 SUPER": "RTX 4080 SUPER"}
    for smi, model in variants.items():
        assert catalog_model(smi) == model, smi
    for other in ["NVIDIA GeForce RTX 4090 D", "Tesla V100-SXM2-32GB",
                  "NVIDIA RTX PRO 6000 Blackwell Server Edition MIG 1g.24gb"]:
        assert catalog_model(other) is None, other


def test_parse_inventory_and_bad_expectations() -> None:
    text = "NVIDIA H200, 143771, 570.172.08\nNVIDIA H200, 143771 MiB, 570.172.08\n\n"
    assert [g.memory_mib for g in parse_inventory(text)] == [143771, 143771]
    assert [g.used_mib for g in parse_inventory(text)] == [None, None]  # not asked
    # memory.used, the fourth field: a number, or [N/A] (unknown).
    used = parse_inventory("NVIDIA H200, 143771, 570.172.08, 21504\n"
                           "NVIDIA H200, 143771 MiB, 570.172.08, [N/A]")
    assert [(g.memory_mib, g.used_mib) for g in used] == [(143771, 21504), (143771, None)]
    with pytest.raises(ValueError, match="memory.total"):
        parse_inventory("NVIDIA H200, [N/A], 570.172.08")
    with pytest.raises(ValueError, match="unknown GPU model"):
        GpuExpectation("H100", 1)
    with pytest.raises(ValueError, match=">= 1"):
        GpuExpectation("H200", 0)


def test_memory_in_use_is_held_against_the_job_only_past_an_idle_cards() -> None:
    def card(used: int | None) -> GpuInfo:
        return GpuInfo("NVIDIA H100 80GB HBM3", 81559, "580.65.06", "H100 SXM", used)

    training = GpuExpectation("H100 SXM", 1, free_mib=81_500)  # planned to the last MiB
    assert gpu.busy(training, [card(4)]) is None  # a headless card's few MiB: idle
    assert gpu.busy(training, [card(None)]) is None  # not reported: not judged
    said = gpu.busy(training, [card(600)])
    assert said is not None and "GPU 0: 600 of 81559 MiB in use" in said
    assert "training needs 81500 MiB free" in said and "vLLM" not in said
    # An idle card's use is allowed for continuously, not as a cliff: 23864 MiB free of a
    # 4090's 24564 covers a plan of 24000 (its peak x 1.2) with the allowance.
    rtx = GpuInfo("NVIDIA GeForce RTX 4090", 24564, "580.65.06", "RTX 4090", 700)
    assert gpu.busy(GpuExpectation("RTX 4090", 1, free_mib=24_000), [rtx]) is None
    # vLLM's need is its fraction of each card and its CUDA context (768 MiB), on the GPUs it
    # uses (its tensor-parallel size); only the job's GPUs (the first `count`).
    serving = GpuExpectation("H100 SXM", 1, serve_utilization=0.9, exact_count=False)
    assert gpu.busy(serving, [card(7000), card(60000)]) is None
    said = gpu.busy(serving, [card(8000), card(0)])  # 73559 free < 73404 + 768
    assert said is not None and "vLLM takes 0.9 of a GPU's memory (73404 MiB" in said
    two = GpuExpectation("H100 SXM", 2, free_mib=10_000, serve_utilization=0.9, serve_gpus=1)
    assert gpu.busy(two, [card(0), card(30000)]) is None  # GPU 1 trains, vLLM is on GPU 0
    assert gpu.busy(replace(two, serve_gpus=2), [card(0), card(30000)]) is not None


def test_the_processes_holding_memory_are_named_as_nvidia_smi_lists_them() -> None:
    def listed(stdout: str) -> str:
        return gpu.held_by(lambda argv: Result(tuple(argv), " ".join(argv), 0, stdout, "", 0.1))

    assert listed("4242, python3, 21504\n77, my, odd, name, [N/A]\n") == (
        "held by pid 4242 (python3, 21504 MiB), pid 77 (my, odd, name)")
    assert listed("").startswith("no process holding it is visible from orch's login")
    # memory.total [N/A] is an error that says so, memory.used [N/A] is unknown.
    with pytest.raises(ValueError, match=r"memory.total '\[N/A\]'"):
        parse_inventory("NVIDIA H200, [N/A], 570.172.08, 21504")
