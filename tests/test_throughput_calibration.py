"""Time estimates against published throughputs with pinned configs (data/throughput.yaml)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.core import throughput
from orchestrator.core.architectures import lookup
from orchestrator.core.sizing import Strategy, Workload
from orchestrator.core.throughput import formula_source
from orchestrator.core.throughputcal import Point, band, points
from providers import catalog

POINTS = points()
GPUS = catalog.gpus()


@pytest.mark.parametrize("point", POINTS, ids=[p.name for p in POINTS])
def test_architecture_matches_the_published_parameter_count(point: Point) -> None:
    assert point.arch.params == point.published_params


@pytest.mark.parametrize("point", [p for p in POINTS if p.asserted],
                         ids=[p.name for p in POINTS if p.asserted])
def test_estimate_within_the_band(point: Point) -> None:
    assert band() == 0.15
    err = point.error(GPUS)
    assert abs(err) <= band(), (
        f"{point.name}: orch {point.estimate_tokens_per_s(GPUS):,.0f} tokens/s vs "
        f"{point.measured_tokens_per_s:,.0f} published (hours {err:+.1%})")


def test_points_are_sourced_and_unasserted_ones_say_why() -> None:
    assert all(p.source for p in POINTS)
    assert all(p.why for p in POINTS if not p.asserted)
    # Both GPU classes the efficiencies are fitted on, and every method, are asserted.
    asserted = [p for p in POINTS if p.asserted]
    assert {p.gpu for p in asserted} == {"RTX 4090", "A100 80GB"}
    assert {p.workload.method for p in asserted} == {"full", "lora", "qlora"}
    assert all(p.source.startswith("pytorch/torchtune@") for p in asserted)


def test_mean_error_is_small() -> None:
    errors = [abs(p.error(GPUS)) for p in POINTS if p.asserted]
    assert sum(errors) / len(errors) < 0.08


def test_orch_runs_are_uncompiled() -> None:
    # The compiled and uncompiled estimates differ by exactly the measured compile gap.
    w = Workload(lookup("meta-llama/Llama-3.1-8B").architecture, "qlora")
    gpu = GPUS["RTX 4090"]
    plain = throughput.training_seconds(w, 10**8, gpu, 1, Strategy.SINGLE)
    tuned = throughput.training_seconds(w, 10**8, gpu, 1, Strategy.SINGLE, compiled=True)
    assert tuned / plain == pytest.approx(throughput.UNCOMPILED_SPEED)


def test_efficiency_grows_with_width_and_never_exceeds_peak() -> None:
    gpu = GPUS["RTX 4090"]
    small = Workload(lookup("meta-llama/Llama-3.2-1B").architecture, "lora")
    large = Workload(lookup("meta-llama/Llama-3.1-70B").architecture, "lora")
    assert throughput.efficiency(small, gpu) < throughput.efficiency(large, gpu)
    assert throughput.efficiency(large, gpu, compiled=True) == 1.0


def test_bench_prints_time_error_beside_memory_error() -> None:
    root = Path(__file__).resolve().parents[1]
    run = subprocess.run([sys.executable, "bench/sizing_accuracy.py", "--json"], cwd=root,
                         capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(root)})
    r = json.loads(run.stdout)
    assert r["memory_summary"]["asserted"]["points"] >= 3
    assert [t["point"] for t in r["time"]] == [p.name for p in POINTS]
    worst = r["time_summary"]["asserted"]["worst_abs_error"]
    assert worst == pytest.approx(max(abs(p.error(GPUS)) for p in POINTS if p.asserted))
    text = subprocess.run([sys.executable, "bench/sizing_accuracy.py"], cwd=root, check=True,
                          capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(root)}).stdout
    assert "Memory (GiB per GPU)" in text and "Time (training tokens/s" in text


def test_formula_source_names_what_the_estimate_rests_on() -> None:
    runs = sum(p.asserted and p.gpu == "RTX 4090" for p in POINTS)
    assert runs == 2
    assert formula_source("RTX 4090") == (
        "formula, calibrated on 2 published runs on RTX 4090; no finished job of yours with "
        "this GPU, count, method and size")
    assert "no published run on H100 SXM: its efficiency is assumed" in formula_source("H100 SXM")
