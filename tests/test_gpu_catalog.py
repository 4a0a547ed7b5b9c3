"""The GPU catalog covers what the providers rent (issue 20 §1).

Every GPU name RunPod's catalog and vast-cli know is either a catalog model (with its figures
and source) or left out with a reason; live offers of every covered GPU reach the ranking
through the real adapters against the emulators, and unknown names are reported, never
dropped silently.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from emulators.runpod import RunPodEmulator
from emulators.vast import VastEmulator

from orchestrator.core import scheduler
from orchestrator.core.architectures import lookup
from orchestrator.core.sizing import Workload
from playbooks.gpu import catalog_model
from providers import catalog
from providers.base import ReportsSkipped, Requirements
from providers.runpod.compute import RunPod
from providers.vastai.compute import GPU_MAP, VastAI, canonical_gpu

# RunPod's GPU type ids: docs.runpod.io/references/gpu-types ("Table last generated:
# 2026-02-12"; runpod/docs references/gpu-types.mdx at a900806e, 2026-08-20).
RUNPOD_IDS = [
    "AMD Instinct MI300X OAM", "NVIDIA A100 80GB PCIe", "NVIDIA A100-SXM4-80GB", "NVIDIA A30",
    "NVIDIA A40", "NVIDIA B200", "NVIDIA B300 SXM6 AC", "NVIDIA GeForce RTX 3070",
    "NVIDIA GeForce RTX 3080", "NVIDIA GeForce RTX 3080 Ti", "NVIDIA GeForce RTX 3090",
    "NVIDIA GeForce RTX 3090 Ti", "NVIDIA GeForce RTX 4070 Ti", "NVIDIA GeForce RTX 4080",
    "NVIDIA GeForce RTX 4080 SUPER", "NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 5080",
    "NVIDIA GeForce RTX 5090", "NVIDIA H100 80GB HBM3", "NVIDIA H100 NVL", "NVIDIA H100 PCIe",
    "NVIDIA H200", "NVIDIA H200 NVL", "NVIDIA L4", "NVIDIA L40", "NVIDIA L40S",
    "NVIDIA RTX 2000 Ada Generation", "NVIDIA RTX 4000 Ada Generation",
    "NVIDIA RTX 4000 SFF Ada Generation", "NVIDIA RTX 5000 Ada Generation",
    "NVIDIA RTX 6000 Ada Generation", "NVIDIA RTX A2000", "NVIDIA RTX A4000",
    "NVIDIA RTX A4500", "NVIDIA RTX A5000", "NVIDIA RTX A6000",
    "NVIDIA RTX PRO 4500 Blackwell", "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition",
    "NVIDIA RTX PRO 6000 Blackwell Server Edition MIG 1g.24gb",
    "NVIDIA RTX PRO 6000 Blackwell Server Edition MIG 2g.48gb",
    "NVIDIA RTX PRO 6000 Blackwell Server Edition",
    "NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "Tesla V100-PCIE-16GB",
    "Tesla V100-SXM2-16GB", "Tesla V100-SXM2-32GB",
]
GIB = 1024**3
_MIB = 1024**2


def vast_cli_gpu_names() -> list[str]:
    """The GPU names of the installed vast-cli (its `gpu_name` constants, from Vast's
    gpulist.json): read from the package's source, since they are plain assignments."""
    import vastai.data.query as q

    text = Path(q.__file__).read_text()
    section = text[text.index("# GPU name constants"):]
    return re.findall(r'^\w+ = "([^"]+)"$', section, flags=re.M)


def test_every_entry_has_its_figures_and_source() -> None:
    for name, gpu in catalog.gpus().items():
        assert gpu.memory_bytes > 0 and gpu.bf16_tflops > 0 and gpu.bandwidth_tbps > 0, name
        assert 0 < gpu.mfu < 1 and gpu.interconnect in {"pcie", "nvlink"}, name
        assert re.fullmatch(r"\d+\.\d", gpu.compute_capability), name
        assert float(gpu.compute_capability) >= 8.0, f"{name}: no BF16 before Ampere"
        assert len(gpu.source) > 10, name


def test_every_runpod_id_is_covered_or_left_out_with_a_reason() -> None:
    from providers.runpod.compute import canonical_gpu as runpod_gpu

    left = catalog.left_out("runpod")
    for gpu_id in RUNPOD_IDS:
        model = runpod_gpu(gpu_id)
        assert (model is None) == (gpu_id in left), gpu_id
        if model is not None:
            # The pod's nvidia-smi prints the id: the GPU check must accept it as the model.
            assert catalog_model(gpu_id) == model, gpu_id
    assert runpod_gpu("NVIDIA L40S") == "L40S"
    assert runpod_gpu("NVIDIA RTX A6000") == "RTX A6000"


def test_every_vast_cli_gpu_name_is_covered_or_left_out() -> None:
    names = vast_cli_gpu_names()
    assert len(names) > 100 and {"L40S", "RTX A6000", "RTX 6000Ada"} <= set(names)
    left = catalog.left_out("vastai")
    covered = {n for spellings, _floor in GPU_MAP.values() for n in spellings}
    assert set(names) <= covered | set(left), sorted(set(names) - covered - set(left))
    assert not covered & set(left)
    # Every covered name maps to one model (A100s apart by gpu_ram, 40 vs 80 GB).
    assert canonical_gpu("A100 PCIE", 40960) == "A100 40GB"
    assert canonical_gpu("A100 SXM4", 81920) == "A100 80GB"
    assert canonical_gpu("RTX 6000Ada", 49140) == "RTX 6000 Ada"
    assert canonical_gpu("Tesla V100", 16384) is None


def test_job_with_l40s_is_valid() -> None:
    assert catalog.resolve_gpu("L40S") == ["L40S"]
    assert catalog.resolve_gpu("rtx a6000") == ["RTX A6000"]


# -- live offers of every covered GPU reach the ranking ------------------------------------

def _tiny() -> Workload:
    # Small enough to fit every covered GPU (the 6 GB RTX A2000 included).
    return Workload(lookup("meta-llama/Llama-3.2-1B").architecture, "qlora", sequence_len=512,
                    micro_batch_size=1)


@pytest.fixture
def vast() -> Iterator[VastEmulator]:
    with VastEmulator(api_key="vast-k") as emu:
        yield emu


def test_a_stored_gpu_name_maps_to_the_catalogs_unless_unknown_or_ambiguous() -> None:
    assert catalog.canonical_name("A100 80GB") == "A100 80GB"  # already the catalog's
    assert catalog.canonical_name("rtx a6000") == "RTX A6000"  # an alias, one model
    assert catalog.canonical_name("H100") == "H100"  # both H100 variants: left as stored
    assert catalog.canonical_name("Tesla V100") == "Tesla V100"  # not in the catalog


def test_vast_offers_of_every_covered_gpu_reach_the_ranking(vast: VastEmulator) -> None:
    specs = catalog.gpus()
    offer_id = 0
    for model, (spellings, floor) in GPU_MAP.items():
        for name in spellings:
            offer_id += 1
            ram = max(floor, specs[model].memory_bytes // _MIB)
            vast.add_offer(id=offer_id, gpu_name=name, gpu_ram=ram, dph_base=0.1 + offer_id / 100)
    vast.add_offer(id=900, gpu_name="Tesla V100", gpu_ram=16384)
    vast.add_offer(id=901, gpu_name="RTX 9090", gpu_ram=65536)
    api = VastAI("vast-k", base_url=vast.url, attempts=1)
    offers = api.offers(Requirements(gpu_count=1, min_gpu_memory_bytes=0, interruptible=False))
    assert {o.gpu for o in offers} == set(GPU_MAP)
    assert isinstance(api, ReportsSkipped)
    assert api.skipped == {"Tesla V100": 1, "RTX 9090": 1}
    assert "compute capability" in catalog.skip_reason("vastai", "Tesla V100")
    assert "unknown" in catalog.skip_reason("vastai", "RTX 9090")
    ranking = scheduler.rank(_tiny(), 1_000_000, offers, specs)
    assert {p.offer.gpu for p in ranking.placements} == set(GPU_MAP)


def test_runpod_offers_of_every_covered_gpu_reach_the_ranking() -> None:
    rows = [{"id": gpu_id, "name": gpu_id, "memory": 48, "secure": True, "community": False,
             "price": {"secure": "0.50", "community": None},
             "maxCount": {"secure": 8, "community": 0}, "availability": "HIGH",
             "dataCenters": []} for gpu_id in RUNPOD_IDS]
    with RunPodEmulator(api_key="rp-k", gpus=json.loads(json.dumps(rows))) as emu, \
            RunPod("rp-k", base_url=emu.url, attempts=1) as api:
        offers = api.offers(Requirements(gpu_count=1, min_gpu_memory_bytes=0))
        assert api.skipped == {i: 1 for i in catalog.left_out("runpod") if i in RUNPOD_IDS}
    mapped = set(catalog.spellings("runpod"))
    assert {o.gpu for o in offers} == mapped
    ranking = scheduler.rank(_tiny(), 1_000_000, offers, catalog.gpus())
    assert {p.offer.gpu for p in ranking.placements} == mapped
