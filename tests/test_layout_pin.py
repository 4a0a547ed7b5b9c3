"""`resources.layout`: each layout can be pinned, `orch plan --json` says which it used, and an
impossible pin is a clear error naming the field (through the real `orch` command)."""

from __future__ import annotations

import json
from dataclasses import replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import orchfork
import pytest
from termutil import ROOT

from orchestrator.core import scheduler
from orchestrator.core.architectures import lookup
from orchestrator.core.sizing import Workload
from orchestrator.core.spec import SpecError, load_job, spec_hash
from providers import catalog
from providers.base import Billing, Offer

FULL_32B = (ROOT / "examples" / "full-32b.yml").read_text()


def _job(tmp_path: Path, resources: str, text: str = FULL_32B, name: str = "job.yml") -> Path:
    """examples/full-32b.yml (or `text`) with `resources` for its resources block."""
    (tmp_path / "data").mkdir(exist_ok=True)
    for f in ("train.jsonl", "eval.jsonl"):
        (tmp_path / "data" / f).write_text((ROOT / "examples" / "data" / f).read_text())
    head = text.split("\nresources:")[0]
    path = tmp_path / name
    path.write_text(f"{head}\nresources:\n{resources}")
    return path


def _plan(path: Path) -> tuple[int, dict[str, Any] | None, str]:
    proc = orchfork.run(["plan", str(path), "--json"], timeout=300, cwd=ROOT)
    data = json.loads(proc.stdout) if proc.returncode == 0 else None
    return proc.returncode, data, proc.stderr


def test_auto_picks_fsdp2_where_zero3_needs_twice_the_gpus(tmp_path: Path) -> None:
    """The sharded example before (zero3 pinned: what auto chose before FSDP2) and after."""
    rc, before, err = _plan(_job(tmp_path, "  max_gpus: 8\n  layout: zero3\n"))
    assert rc == 0, err
    assert before is not None
    rc, after, err = _plan(_job(tmp_path, "  max_gpus: 8\n"))
    assert rc == 0, err
    assert after is not None
    assert (before["placement"]["gpu_count"], before["placement"]["strategy"]) == (8, "zero3")
    assert before["estimate"]["strategy"] == "zero3"
    assert (after["placement"]["gpu_count"], after["placement"]["strategy"]) == (4, "fsdp2")
    assert after["layout"] == {"requested": "auto", "used": "fsdp2"}
    assert float(after["placement"]["est_cost"]) < float(before["placement"]["est_cost"])
    # 8-bit moments: ZeRO-3 keeps fp32 master + moments (12 bytes/param ÷ G), FSDP2 2 ÷ G.
    params = 32_763_876_352
    assert before["estimate"]["components"]["optimizer"] == pytest.approx(12 * params / 8, 1)
    assert after["estimate"]["components"]["optimizer"] == pytest.approx(2 * params / 4, 1)


@pytest.mark.parametrize(("layout", "resources", "count"), [
    ("single", "  providers: [cloud]\n", 1),
    ("ddp", "  gpu_count: 2\n", 2),
    ("zero3", "  gpu_count: 2\n", 2),
    ("fsdp2", "  gpu_count: 2\n", 2),
])
def test_each_layout_can_be_pinned(tmp_path: Path, layout: str, resources: str,
                                   count: int) -> None:
    quickstart = (ROOT / "examples" / "quickstart.yml").read_text()
    path = _job(tmp_path, f"{resources}  layout: {layout}\n", quickstart)
    rc, plan, err = _plan(path)
    assert rc == 0, err
    assert plan is not None
    assert plan["placement"]["strategy"] == plan["estimate"]["strategy"] == layout
    assert plan["layout"] == {"requested": layout, "used": layout}
    assert plan["placement"]["gpu_count"] == count


@pytest.mark.parametrize(("layout", "count"), [("zero3_offload", 1), ("zero3_offload", 2),
                                               ("fsdp2_offload", 2)])
def test_offload_layouts_can_be_pinned_where_host_ram_is_known(layout: str,
                                                               count: int) -> None:
    # The catalogs give no host RAM, so offload is placed on offers that state it.
    w = replace(Workload(lookup("meta-llama/Llama-3.2-1B").architecture, "qlora",
                         optimizer="adamw"), layout=layout)
    gpus = catalog.gpus()
    offer = Offer(provider="dedicated", offer_id="server:box", gpu="RTX 3090",
                  gpu_count=count, gpu_memory_bytes=gpus["RTX 3090"].memory_bytes,
                  billing=Billing.PER_SECOND, interruptible=False,
                  price_per_hour=Decimal("0.30"), ram_bytes=64 * 10**9)
    ranking = scheduler.rank(w, 1_000_000, [offer, replace(offer, ram_bytes=None)], gpus)
    assert [p.estimate.strategy.value for p in ranking.placements] == [layout]
    assert ranking.rejected == {scheduler.NO_RAM: 1}
    assert ranking.placements[0].estimate.host_ram_bytes > 0


def test_an_offload_pin_says_whether_host_ram_is_unknown_or_too_small() -> None:
    # Issue 36 §3: a known but small host RAM is not "does not fit in GPU memory".
    w = replace(Workload(lookup("meta-llama/Llama-3.2-1B").architecture, "qlora",
                         optimizer="adamw"), layout="zero3_offload")
    gpus = catalog.gpus()
    offer = Offer(provider="runpod", offer_id="small", gpu="RTX 3090", gpu_count=1,
                  gpu_memory_bytes=gpus["RTX 3090"].memory_bytes, billing=Billing.PER_SECOND,
                  interruptible=False, price_per_hour=Decimal("0.30"), ram_bytes=10**6)
    offers = [offer, replace(offer, offer_id="unknown", ram_bytes=None)]
    ranking = scheduler.rank(w, 1_000_000, offers, gpus)
    assert ranking.rejected == {
        "host RAM too small for the state resources.layout offloads to it": 1,
        "host RAM unknown, and resources.layout offloads to it": 1}
    with pytest.raises(scheduler.NoFit) as info:
        scheduler.choose(w, 1_000_000, offers, gpus)
    assert "1 host RAM too small for the state resources.layout offloads to it" in \
        str(info.value) and "a machine with more host RAM" in str(info.value)
    assert "RunPod's listed pods, live Vast.ai offers" in str(info.value)


def test_a_pin_that_cannot_fit_names_the_field(tmp_path: Path) -> None:
    # 80 GB GPUs: the market snapshot lists a B300 (288 GB), which holds it on one GPU.
    rc, _, err = _plan(_job(tmp_path, "  max_gpus: 8\n  gpus: [A100 80GB, H100 SXM]\n"
                                      "  layout: single\n"))
    assert rc != 0
    assert "resources.layout single: no placement fits" in err
    assert "single on 1 GPU" in err and "Try resources.layout: auto" in err


@pytest.mark.parametrize(("resources", "words"), [
    ("  gpu_count: 4\n  layout: single\n",
     "resources.layout single cannot run with resources.gpu_count 4: single is for one GPU"),
    ("  max_gpus: 1\n  layout: fsdp2\n",
     "resources.layout fsdp2 cannot run with resources.max_gpus 1: fsdp2 needs two or more "
     "GPUs"),
    ("  layout: fsdp\n", "resources.layout"),
])
def test_impossible_pins_are_refused_when_the_file_is_read(tmp_path: Path, resources: str,
                                                            words: str) -> None:
    with pytest.raises(SpecError) as info:
        load_job(_job(tmp_path, resources))
    assert words in str(info.value)


def test_a_pin_the_optimizer_cannot_run_under_names_both_fields(tmp_path: Path) -> None:
    # The example trains with adamw_8bit; FSDP2 offload steps the optimizer on the CPU.
    rc, _, err = _plan(_job(tmp_path, "  max_gpus: 8\n  layout: fsdp2_offload\n"))
    assert rc != 0 and ("resources.layout fsdp2_offload needs training.optimizer adamw (8-bit "
                        "optimizers cannot step state offloaded to the CPU)") in err


def test_layout_auto_keeps_every_recorded_spec_hash(tmp_path: Path) -> None:
    auto = load_job(_job(tmp_path, "  max_gpus: 8\n", name="a.yml"))
    said = load_job(_job(tmp_path, "  max_gpus: 8\n  layout: auto\n", name="b.yml"))
    pinned = load_job(_job(tmp_path, "  max_gpus: 8\n  layout: zero3\n", name="c.yml"))
    assert spec_hash(auto.spec) == spec_hash(said.spec) != spec_hash(pinned.spec)


@pytest.mark.parametrize(("layout", "expected"), [("zero3_offload", "zero3_offload"),
                                                  ("auto", "single")])
def test_the_engine_renders_the_layout_it_was_placed_with(tmp_path: Path, layout: str,
                                                           expected: str) -> None:
    # At run time the engine sizes the job again on the GPU it got, where the host RAM an
    # offload layout needs is not known any more: it must not fall back to one plain GPU.
    from orchestrator.core.planning import total_tokens
    from orchestrator.engine.jobinputs import Inputs
    from orchestrator.records.store import Instance, Job

    quickstart = (ROOT / "examples" / "quickstart.yml").read_text()
    loaded = load_job(_job(tmp_path, f"  layout: {layout}\n", quickstart))
    job = Job(id="j-000000000001", name="q", status="queued", method="qlora",
              base_model="meta-llama/Llama-3.2-1B", spec_json="{}", spec_hash="b" * 64,
              gpu="RTX 3090", gpu_count=1)
    inst = Instance(job_id=job.id, provider="dedicated", gpu="RTX 3090", gpu_count=1,
                    billing="monthly", interruptible=False, price_per_hour_micros=0,
                    state="running")
    inputs = Inputs(loaded, total_tokens(loaded), None, {})
    pj = inputs.pipeline_job(job, inst, vllm_port=8000, poll_s=1.0,
                             rendered=inputs.rendered(job, inst))
    assert pj.config.strategy == expected
