"""Measured restarts (issue 41): rental to first training step, from orch's own records.

The deadline policy's restart before a job's first step was the plan's boot + download only;
the rest (SSH, the host check, set-up, the trainer's start) is measured from the instance
rows and the jobs' first `train.progress` event on each machine (`core.restarts`), read the
same way by the engine (`records.restarts`) and by `orch plan` (`records.readonly`).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from conftest import database_url
from sqlalchemy import text
from test_deadline_engine import deadline_job, events
from test_engine import Rig, assert_nothing_left, rig

from orchestrator.core import restarts
from orchestrator.records import readonly
from orchestrator.records import restarts as stored
from orchestrator.records.readonly import RESTART_SQL
from orchestrator.records.store import Store, open_store
from orchestrator.records.store.tables import Event, Instance

__all__ = ["rig"]

T0 = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


def test_the_median_of_the_newest_rentals_that_reached_a_step() -> None:
    rows = [("sim", "A100", T0 + timedelta(minutes=n), T0 + timedelta(minutes=n, seconds=s))
            for n, s in enumerate([30, 10, 20, 1000])]
    rows += [("sim", "A100", T0, None),  # never reached a step: not a restart
             ("sim", "A100", T0, T0 - timedelta(seconds=5)),  # a step before it: not its own
             ("vastai", "H100", T0, T0 + timedelta(seconds=7))]
    got = restarts.measured(rows)
    # The slow one of [10, 20, 30, 1000]: at position 2.7, 70 % of the way from 30 to 1000.
    assert got == {("sim", "A100"): restarts.Measured(25.0, 4, pytest.approx(709.0)),
                   ("vastai", "H100"): restarts.Measured(7.0, 1, 7.0)}
    assert got[("sim", "A100")].describe() == "25 s (median of 4 rentals; 90% within 709 s)"
    # Only the newest WINDOW of a key count (rows come newest first).
    many = [("sim", "A100", T0, T0 + timedelta(seconds=1))] * restarts.WINDOW
    old = [("sim", "A100", T0, T0 + timedelta(seconds=999))] * 5
    assert restarts.measured(many + old)[("sim", "A100")] == restarts.Measured(
        1.0, restarts.WINDOW, 1.0)


def test_a_slow_restart_is_the_90th_percentile_of_the_window() -> None:
    """What the deadline's margins budget: 9 in 10 of the measured restarts started sooner;
    one rental is its own slow one; never beyond the longest measured."""
    times = [float(s) for s in range(1, 21)]  # 1..20 s
    assert restarts.slow_of(times) == pytest.approx(18.1)
    assert restarts.slow_of([5.0]) == 5.0
    assert restarts.slow_of([5.0, 9.0]) == pytest.approx(8.6)
    # One outlier in twenty is past the 90th percentile; three are not.
    assert restarts.slow_of([8.0] * 19 + [22.0]) == 8.0
    assert restarts.slow_of([8.0] * 17 + [20.0, 21.0, 22.0]) == pytest.approx(20.1)
    assert restarts.slow_of([30.0, 10.0, 20.0, 1000.0]) == pytest.approx(709.0)  # any order
    with pytest.raises(ValueError, match="at least one"):
        restarts.slow_of([])


def _job(store: Store, name: str) -> str:
    return store.create_job(
        name=name, status="queued", method="lora", base_model="m", spec_json="{}",
        spec_hash="0" * 64, placement=None, provider=None, gpu=None, gpu_count=None,
        billing=None, interruptible=None, est_hours=None, est_cost=None, event_kind="queued",
        event_message="", event_data=None).id


def _rental(store: Store, job_id: str, gpu: str, at: datetime, ended: datetime | None,
            iid: str | None = "i-1", offer_id: str = "o") -> None:
    with store.transaction() as session:
        session.add(Instance(job_id=job_id, provider="sim", provider_instance_id=iid, gpu=gpu,
                             offer_id=offer_id,
                             gpu_count=1, billing="per_second", interruptible=True,
                             price_per_hour_micros=1, state="terminated", created_at=at,
                             terminated_at=ended))


def _step(store: Store, job_id: str, at: datetime) -> None:
    with store.transaction() as session:
        session.add(Event(job_id=job_id, at=at, kind="train.progress", message="step"))


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_the_engine_and_orch_plan_read_the_same_restarts(
        backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    url = database_url(backend, tmp_path, request)
    store = open_store(url)
    try:
        a, b = _job(store, "a"), _job(store, "b")
        # Job a: a first machine preempted after 40 s to its first step, then a second one
        # whose first step came 60 s after it was rented: each machine its own restart.
        _rental(store, a, "A100 80GB", T0, T0 + timedelta(minutes=10))
        _step(store, a, T0 + timedelta(seconds=40))
        _step(store, a, T0 + timedelta(minutes=5))
        _rental(store, a, "A100 80GB", T0 + timedelta(minutes=12), None)
        _step(store, a, T0 + timedelta(minutes=13))
        # Job b: a machine that never reached a step, one never created (no provider id).
        _rental(store, b, "A100 80GB", T0 + timedelta(minutes=20), T0 + timedelta(minutes=21))
        _rental(store, b, "A100 80GB", T0 + timedelta(minutes=22), None, iid=None)
        _step(store, b, T0 + timedelta(minutes=30))  # the never-created row's: not counted
        _rental(store, b, "H100 PCIe", T0 + timedelta(minutes=29), None)
        # A machine taken warm (created when taken, no boot): not a restart.
        _rental(store, b, "H100 PCIe", T0 + timedelta(minutes=40), None, offer_id="warm:7")
        _step(store, b, T0 + timedelta(minutes=40, seconds=2))
        want = {("sim", "A100 80GB"): restarts.Measured(50.0, 2, 58.0),
                ("sim", "H100 PCIe"): restarts.Measured(60.0, 1, 60.0)}
        keys = [("sim", "A100 80GB"), ("sim", "H100 PCIe"), ("sim", "RTX 5090")]
        assert stored.measured(store, keys) == want
        assert readonly.restart_times(url, keys) == want
        # Only the keys asked for are read.
        assert stored.measured(store, keys[1:]) == {("sim", "H100 PCIe"): want["sim", "H100 PCIe"]}
        assert readonly.restart_times(url, [keys[0]]) == {
            ("sim", "A100 80GB"): want["sim", "A100 80GB"]}
    finally:
        store.close()


def test_a_keys_newest_rentals_are_read_from_their_index(tmp_path: Path) -> None:
    """The restart read is an index walk of one key's newest rentals, not a sort of every
    rental (migration 0013): asked before each rental of a deadline job and by `orch plan`,
    it read and sorted all instance rows (150k: 0.12-0.15 s for two keys; 0.1-0.4 ms now)."""
    store = open_store(f"sqlite:///{tmp_path / 'orch.db'}")
    try:
        with store.session() as session:
            plan = [str(row[-1]) for row in session.execute(
                text("EXPLAIN QUERY PLAN " + RESTART_SQL), {"provider": "sim", "gpu": "A100"})]
    finally:
        store.close()
    assert any("ix_instance_provider_gpu_created_at" in step for step in plan), plan
    assert not any("TEMP B-TREE" in step for step in plan), plan


def test_the_policy_weighs_the_restart_orch_measured_before_the_first_step(rig: Rig) -> None:
    """The first job's policy has only the plan's boot + download; once rentals of that GPU
    have reached a step, the next job's policy weighs their median restart, and its margins a
    slow one (their 90th percentile)."""
    cloud = rig.cloud(gpus=["A100 80GB"])  # spot and on-demand: one GPU, one history
    first = deadline_job(rig, 12)
    assert rig.run(cloud, first).status == "succeeded"
    (before,) = events(rig, first, "deadline.decision")
    (row,) = rig.store.instances_of(first)
    seen = stored.measured(rig.store, [("sim", row.gpu)])
    measured = seen[("sim", row.gpu)]
    assert measured.rentals == 1
    assert float(str(before["spot_restart_s"])) < measured.seconds  # the plan's: too short
    assert before["on_demand_slow_restart_s"] == before["on_demand_restart_s"]  # no history

    # Two more rentals of that GPU, 30 s and 300 s to their first step.
    other = _job(rig.store, "other")
    now = datetime.now(UTC)
    for n, seconds in enumerate((30, 300)):
        at = now - timedelta(hours=n + 1)
        _rental(rig.store, other, row.gpu or "", at, at + timedelta(minutes=10),
                iid=f"i-{n}")
        _step(rig.store, other, at + timedelta(seconds=seconds))
    measured = stored.measured(rig.store, [("sim", row.gpu)])[("sim", row.gpu)]
    assert measured.rentals == 3 and measured.seconds == 30.0 and measured.slow > 200

    second = deadline_job(rig, 12)
    assert rig.run(cloud, second).status == "succeeded"
    (after,) = events(rig, second, "deadline.decision")
    assert float(str(after["spot_restart_s"])) == pytest.approx(30.0, abs=0.1)
    assert float(str(after["on_demand_restart_s"])) == pytest.approx(30.0, abs=0.1)
    assert float(str(after["on_demand_slow_restart_s"])) == pytest.approx(measured.slow,
                                                                          abs=0.1)
    # The Safety Net's margin holds the slow one: spot restart + loss + slow + a check.
    assert float(str(after["safety_net_s"])) >= 30.0 + measured.slow
    assert_nothing_left(rig, cloud, second)
