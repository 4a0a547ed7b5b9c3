"""Estimates against published measurements with pinned configs (data/calibration.yaml)."""

from __future__ import annotations

import pytest

from orchestrator.core.calibration import UPCAST_EXTRA_BYTES, Point, points
from orchestrator.core.sizing import GIB, Strategy, estimate

POINTS = points()
ONE_GPU = [p for p in POINTS if p.asserted and not p.sharded]
SHARDED = [p for p in POINTS if p.asserted and p.sharded]

# Sharded runs (issue 36): an underestimate is an OOM on a paid machine, so every asserted
# point must come out at or above its published peak, less at most this (the width of a
# pixel of the bar charts some points are read from, and run-to-run spread)...
MARGIN_BELOW = 0.02
# ...and the over-estimate must stay moderate: each point, and the mean over them.
MOST_ABOVE = 0.35
MEAN_ABOVE = 0.15


@pytest.mark.parametrize("point", POINTS, ids=[p.name for p in POINTS])
def test_architecture_matches_the_published_parameter_count(point: Point) -> None:
    assert point.arch.params == point.published_params


@pytest.mark.parametrize("point", ONE_GPU, ids=[p.name for p in ONE_GPU])
def test_estimate_within_15_percent(point: Point) -> None:
    assert abs(point.error) <= 0.15, (
        f"{point.name}: orch {point.estimate_gib():.2f} GiB vs {point.measured_gib} "
        f"published ({point.error:+.1%})")


@pytest.mark.parametrize("point", SHARDED, ids=[p.name for p in SHARDED])
def test_no_sharded_run_is_underestimated(point: Point) -> None:
    assert -MARGIN_BELOW <= point.error <= MOST_ABOVE, (
        f"{point.name}: orch {point.estimate_gib():.2f} GiB vs {point.measured_gib} "
        f"published ({point.error:+.1%})")


def test_sharded_overestimate_stays_moderate_on_average() -> None:
    mean = sum(p.error for p in SHARDED) / len(SHARDED)
    assert 0 <= mean <= MEAN_ABOVE, f"mean error {mean:+.1%}"


def test_held_out_points_cover_sharded_full_fine_tunes() -> None:
    # The recalibration was fitted to some sharded full fine-tunes only; others from other
    # sources are held out of it and must hold as well (bench/sizing_accuracy.py reports
    # both sets apart).
    held = [p for p in SHARDED if p.held_out]
    fitted = [p for p in SHARDED if not p.held_out]
    assert fitted and held
    assert {p.workload.method for p in held} == {"full", "lora", "qlora"}
    full_sources = {p.source.split()[0] for p in held if p.workload.method == "full"}
    assert len(full_sources) >= 2, full_sources


def test_every_point_names_its_source_and_kind() -> None:
    assert POINTS and all(p.source and p.kind in ("measurement", "statement") for p in POINTS)
    # At least two independent measurements are asserted, not only the rule's own source.
    assert sum(p.asserted and p.kind == "measurement" for p in POINTS) >= 2
    # A point left unasserted says why; every point carries the estimate before issue 36.
    assert all(p.why for p in POINTS if not p.asserted)
    assert all(p.before_gib is not None for p in POINTS)
    assert all(p.measured_as in ("allocated", "reserved", "nvidia-smi", "statement", "unstated")
               for p in POINTS)


def test_sharded_full_fine_tunes_were_underestimated_before_issue_36() -> None:
    # What the recalibration fixed: on main (0f7499d) several sharded full fine-tunes came
    # out more than 10 % under their published peaks.
    before = [p.before_error for p in SHARDED if p.workload.method == "full"]
    assert sum(e is not None and e < -0.10 for e in before) >= 5


def test_fsdp1_points_add_the_fp32_upcast_to_the_fsdp2_estimate() -> None:
    # accelerate's FSDP1 holds fp32 parameters, gradients and moments: 16 bytes per
    # parameter, the same as ZeRO-3's state; orch's fsdp2 keeps 8.
    assert UPCAST_EXTRA_BYTES == 8
    upcast = [p for p in POINTS if p.upcast_fp32]
    assert upcast and all(p.layout is Strategy.FSDP2 and p.workload.method == "full"
                          for p in upcast)


# --- sharded LoRA/QLoRA (issue 36 §5: "a 70B QLoRA on FSDP2 ~20 %" under) ------------------
SHARDED_ADAPTERS = [p for p in POINTS if p.sharded and p.workload.method != "full"]
# The only published sharded adapter runs not held to the bounds, each because what ran (or
# what the figure is) cannot be pinned down; the file says why in full.
UNKNOWABLE = {
    "torchtune Llama-3.1-405B QLoRA r16, FSDP2 x8",  # below its stated config's own parts
    "axolotl Llama-3-70B QLoRA, FSDP CPU offload x2, 512 x 1",  # a README "runs on" line
}


def test_every_published_sharded_adapter_run_is_held_to_the_bounds() -> None:
    assert {p.name for p in SHARDED_ADAPTERS if not p.asserted} == UNKNOWABLE
    asserted = [p for p in SHARDED_ADAPTERS if p.asserted]
    # The PEFT docs' 70B QLoRA in all three layouts and Answer.AI's offloaded 34B/70B QLoRA,
    # all of them under before the adapter terms, are among them.
    layouts = {p.layout for p in asserted if p.workload.method == "qlora" and
               p.arch.num_hidden_layers >= 60}
    assert layouts == {Strategy.ZERO3, Strategy.FSDP2, Strategy.FSDP2_OFFLOAD}
    for p in asserted:
        assert -MARGIN_BELOW <= p.error <= MOST_ABOVE, (
            f"{p.name}: orch {p.estimate_gib():.2f} GiB vs {p.measured_gib} ({p.error:+.1%})")


def test_sharded_adapter_overestimate_stays_moderate() -> None:
    asserted = [p for p in SHARDED_ADAPTERS if p.asserted]
    mean = sum(p.error for p in asserted) / len(asserted)
    assert 0 <= mean <= MEAN_ABOVE, f"mean error {mean:+.1%}"
    # Per layout and method too: no group leans under, none is over by a quarter on average.
    groups: dict[tuple[Strategy, str], list[float]] = {}
    for p in asserted:
        groups.setdefault((p.layout, p.workload.method), []).append(p.error)
    for key, errors in groups.items():
        assert 0 <= sum(errors) / len(errors) <= 0.25, (key, errors)


def test_the_adapter_margin_holds_on_runs_it_was_not_fitted_to() -> None:
    held = [p for p in SHARDED_ADAPTERS if p.asserted and p.held_out]
    assert {p.workload.method for p in held} == {"lora", "qlora"}
    assert {p.layout for p in held} >= {Strategy.FSDP2, Strategy.FSDP2_OFFLOAD}
    assert all(-MARGIN_BELOW <= p.error <= MOST_ABOVE for p in held)


def test_sharded_adapter_runs_were_underestimated_before_the_adapter_terms() -> None:
    # r36-sizing (5485ec0) left these under: -38 % to -5 % on the runs now asserted.
    prev = [p.prev_error for p in SHARDED_ADAPTERS if p.asserted and p.prev_error is not None]
    assert sum(e < -0.05 for e in prev) >= 5


def test_runs_that_kept_bf16_adapters_or_sharded_4bit_scales_are_compared_as_they_ran() -> None:
    point = next(p for p in POINTS if p.name.startswith("PEFT docs Llama-2-70B QLoRA, FSDP x2"))
    e = estimate(point.workload, point.gpu_count, point.layout).components
    halved = (e["adapters"] + e["gradients"] + e["optimizer"]) / 2  # PEFT 0.10: bf16
    assert point.bf16_adapters
    assert point.estimate_gib() == pytest.approx((sum(e.values()) - halved) / GIB)
    torchao = next(p for p in POINTS if p.quant_state_sharded)
    c = estimate(torchao.workload, torchao.gpu_count, torchao.layout).components
    assert torchao.run_difference_bytes(c) < -c["quant_state"] * 0.8
