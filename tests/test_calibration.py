"""Estimates against published measurements with pinned configs (data/calibration.yaml)."""

from __future__ import annotations

import pytest

from orchestrator.core.calibration import Point, points

POINTS = points()


@pytest.mark.parametrize("point", POINTS, ids=[p.name for p in POINTS])
def test_architecture_matches_the_published_parameter_count(point: Point) -> None:
    assert point.arch.params == point.published_params


@pytest.mark.parametrize("point", [p for p in POINTS if p.asserted],
                         ids=[p.name for p in POINTS if p.asserted])
def test_estimate_within_15_percent(point: Point) -> None:
    assert abs(point.error) <= 0.15, (
        f"{point.name}: orch {point.estimate_gib():.2f} GiB vs {point.measured_gib} "
        f"published ({point.error:+.1%})")


def test_every_point_names_its_source_and_kind() -> None:
    assert POINTS and all(p.source and p.kind in ("measurement", "statement") for p in POINTS)
    # At least two independent measurements are asserted, not only the rule's own source.
    assert sum(p.asserted and p.kind == "measurement" for p in POINTS) >= 2
