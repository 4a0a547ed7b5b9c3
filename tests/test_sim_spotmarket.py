"""The simulated cloud replays a spot market: spot comes and goes as the trace says.

Real `SimCloud` instances (sshd hosts on loopback) on a clock the test moves: spot offers
vanish while the GPU's trace says spot is gone, renting one then is refused as out of
capacity, a spot instance is preempted when its availability ends, and an on-demand one
never is.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import KeyPair

from providers.base import CapacityError, InstanceState, Offer, Requirements
from providers.sim import spotmarket
from providers.sim.compute import SimCloud

REPO = Path(__file__).resolve().parents[1]
ORIGIN = 1_700_000_000.0
GPU = "A100 80GB"  # the catalog sells it spot and on-demand


class Clock:
    def __init__(self) -> None:
        self.now = ORIGIN

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "sim"
    try:
        yield folder
    finally:
        SimCloud(folder).terminate_all()


def market(seconds_per_hour: float = 10.0) -> spotmarket.SpotMarket:
    return spotmarket.SpotMarket(spotmarket.regime("bursty"), 41, ORIGIN, seconds_per_hour)


def moments(m: spotmarket.SpotMarket) -> tuple[float, float, float]:
    """An epoch in the middle of GPU's first availability, its end, and one with spot gone."""
    (start, end), (after, _) = m.trace(GPU).intervals[:2]
    gone = m.origin + (end + after) / 2 * m.seconds_per_hour
    return m.origin + (start + end) / 2 * m.seconds_per_hour, \
        m.origin + end * m.seconds_per_hour, gone


def offer(cloud: SimCloud, spot: bool) -> Offer | None:
    req = Requirements(gpu_count=1, min_gpu_memory_bytes=0, gpus=frozenset({GPU}))
    found = [o for o in cloud.offers(req) if o.interruptible is spot]
    return found[0] if found else None


def test_spot_offers_come_and_go_with_the_trace_and_on_demand_stays(state_dir: Path) -> None:
    clock, m = Clock(), market()
    cloud = SimCloud(state_dir, spot_market=m, clock=clock)
    up, _, gone = moments(m)
    clock.now = up
    assert offer(cloud, spot=True) is not None and offer(cloud, spot=False) is not None
    clock.now = gone
    assert offer(cloud, spot=True) is None
    assert offer(cloud, spot=False) is not None  # on-demand is always there
    assert offer(SimCloud(state_dir, clock=clock), spot=True) is not None  # no market: always


def test_renting_spot_while_it_is_gone_is_refused_and_leaves_nothing(
        state_dir: Path, ssh_keypair: KeyPair) -> None:
    clock, m = Clock(), market()
    cloud = SimCloud(state_dir, spot_market=m, clock=clock)
    up, _, gone = moments(m)
    clock.now = up
    spot = offer(cloud, spot=True)
    assert spot is not None
    clock.now = gone
    with pytest.raises(CapacityError, match="no spot A100 80GB"):
        cloud.create(spot, ssh_keypair.public, "job-1")
    assert cloud.list() == [] and cloud.billed() == {}


def test_a_spot_instance_is_preempted_when_its_availability_ends_on_demand_never(
        state_dir: Path, ssh_keypair: KeyPair) -> None:
    clock, m = Clock(), market()
    cloud = SimCloud(state_dir, spot_market=m, clock=clock)
    up, ends, _ = moments(m)
    clock.now = up
    spot, on_demand = offer(cloud, spot=True), offer(cloud, spot=False)
    assert spot is not None and on_demand is not None
    s = cloud.create(spot, ssh_keypair.public, "job-1")
    d = cloud.create(on_demand, ssh_keypair.public, "job-2")
    clock.now = ends - 1
    assert cloud.get(s.instance_id).state is InstanceState.RUNNING
    clock.now = ends + 0.01
    assert cloud.get(s.instance_id).state is InstanceState.INTERRUPTED
    clock.now = ends + 1000 * m.seconds_per_hour  # a thousand hours of the market later
    assert cloud.get(d.instance_id).state is InstanceState.RUNNING


def test_the_market_origin_is_shared_by_every_process_opening_it(tmp_path: Path) -> None:
    first = spotmarket.open_market(tmp_path, "calm", 3, 3.6, now=100.0)
    again = spotmarket.open_market(tmp_path, "calm", 3, 3.6, now=500.0)
    assert first.origin == again.origin == 100.0
    other = spotmarket.open_market(tmp_path, "heavy", 3, 3.6, now=700.0)
    assert other.origin == 700.0 and other.regime.name == "heavy"
    saved = json.loads((tmp_path / spotmarket.ORIGIN_FILE).read_text())
    assert saved == {"regime": "heavy", "seed": 3, "seconds_per_hour": 3.6, "origin": 700.0}
    with pytest.raises(ValueError, match="known: calm, bursty, heavy"):
        spotmarket.regime("stormy")


def test_a_gpu_trace_is_the_same_in_another_process() -> None:
    # The per-GPU seed must not depend on the interpreter's string hash (PYTHONHASHSEED).
    code = ("from providers.sim import spotmarket as s; "
            "m = s.SpotMarket(s.regime('heavy'), 9, 0.0); "
            f"print(repr(m.trace({GPU!r}).intervals[:5]))")
    outputs = {subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, text=True,
                              capture_output=True, env={"PYTHONHASHSEED": str(n)}).stdout
               for n in (1, 2)}
    here = spotmarket.SpotMarket(spotmarket.regime("heavy"), 9, 0.0).trace(GPU).intervals[:5]
    assert outputs == {repr(here) + "\n"}
