"""The clairvoyant bound of issue 41's benches (bench/deadline_oracle.py): the least any policy
could pay for a job over a known spot trace.

Checked against an exhaustive search of every schedule on small cases (a second, independent
reading of the same rules), on the cases whose answer is known, and against the policy's own
replays (core/deadlinesim.py): no replayed strategy that meets the deadline pays less."""

from __future__ import annotations

import math
import random
from decimal import Decimal
from pathlib import Path

import benchmod
import pytest

from orchestrator.core import deadlinesim as ds
from orchestrator.core.deadline import Market, Mode, Restart
from providers import spottrace
from providers.spottrace import SpotTrace

oracle = benchmod.load("deadline_oracle")


def exhaustive(job: object, spell: list[int]) -> float | None:
    """Every schedule, tick by tick: at each tick's start keep the machine (a spot one only
    within its spell), release it, or rent spot (while a spell is on) or on-demand."""
    return exhaustive_pools(job, [spell])


def _job(rng: random.Random) -> object:
    return oracle.Job(work=rng.randint(1, 4), window=rng.randint(2, 9),
                      spot_restart=rng.randint(0, 2), on_demand_restart=rng.randint(0, 2),
                      spot_per_tick=1.0, on_demand_per_tick=rng.choice((1.5, 2.0, 3.0)))


def _spells(rng: random.Random, n: int) -> list[int]:
    found, spell, on = [], 0, rng.random() < 0.5
    for _ in range(n):
        if rng.random() < 0.35:  # the market changes: spot goes, comes, or a new spell begins
            on = rng.random() < 0.6
            spell += 1
        found.append(spell if on else -1)
    return found


def test_it_agrees_with_an_exhaustive_search_of_every_schedule() -> None:
    rng = random.Random(41)
    agreed = 0
    for _ in range(400):
        job, spell = _job(rng), _spells(rng, 9)
        want, got = exhaustive(job, spell), oracle.cheapest(job, spell)
        assert (got is None) == (want is None), (job, spell, got, want)
        if want is not None:
            assert got == pytest.approx(want), (job, spell)
            agreed += 1
    assert agreed > 200  # most cases can finish: the comparison is not all None


def exhaustive_pools(job: object, pools: list[list[int]]) -> float | None:
    """`exhaustive` with several spot pools at one price: a spot machine is in one pool and
    stays only within that pool's spell; renting it again (in its pool or another) is a new
    rental with its restart."""
    best = math.inf
    end = min(job.window, *(len(p) for p in pools))  # type: ignore[attr-defined]

    def go(t: int, kind: int | None, left: int, done: int, cost: float) -> None:
        # kind: None idle, -1 on-demand, i >= 0 spot in pool i
        nonlocal best
        if done >= job.work:  # type: ignore[attr-defined]
            best = min(best, cost)
            return
        if t >= end or cost >= best:
            return
        options: list[tuple[int | None, int]] = [(None, 0)]
        if kind == -1 or (kind is not None and kind >= 0 and pools[kind][t] >= 0
                          and pools[kind][t] == pools[kind][t - 1]):
            options.append((kind, left))
        options += [(i, job.spot_restart) for i, p in enumerate(pools)  # type: ignore[attr-defined]
                    if p[t] >= 0]
        options.append((-1, job.on_demand_restart))  # type: ignore[attr-defined]
        for nxt, restart in options:
            if nxt is None:
                go(t + 1, None, 0, done, cost)
                continue
            price = job.on_demand_per_tick if nxt == -1 else job.spot_per_tick  # type: ignore[attr-defined]
            go(t + 1, nxt, max(0, restart - 1), done + (restart == 0), cost + price)

    go(0, None, 0, 0, 0.0)
    return None if best == math.inf else best


def test_with_several_pools_it_agrees_with_an_exhaustive_search() -> None:
    """Two spot pools (other GPUs or zones the job accepts): the bound with both agrees with
    every schedule searched, and is never above the bound with either alone."""
    rng = random.Random(7)
    agreed = 0
    for _ in range(300):
        job, one, two = _job(rng), _spells(rng, 8), _spells(rng, 8)
        want, got = exhaustive_pools(job, [one, two]), oracle.cheapest(job, one, two)
        assert (got is None) == (want is None), (job, one, two, got, want)
        if want is None:
            continue
        assert got == pytest.approx(want), (job, one, two)
        for alone in (oracle.cheapest(job, one), oracle.cheapest(job, two)):
            # (None: one pool alone cannot finish, where a spot restart shorter than
            # on-demand's and the other pool's spell can)
            assert alone is None or got <= alone + 1e-9
        agreed += 1
    assert agreed > 150


def test_the_known_cases() -> None:
    job = oracle.Job(work=10, window=30, spot_restart=3, on_demand_restart=2,
                     spot_per_tick=1.0, on_demand_per_tick=2.0)
    assert oracle.cheapest(job, [0] * 30) == pytest.approx(13.0)  # spot throughout
    assert oracle.cheapest(job, [-1] * 30) == pytest.approx(24.0)  # no spot: on-demand
    assert oracle.cheapest(oracle.Job(10, 11, 3, 2, 1.0, 2.0), [0] * 11) is None
    # Spot for 12 ticks, then gone: a restart of 3 leaves 9 of the 10 ticks of work; on-demand
    # finishes the last one (2 + 1 ticks at 2.0), or runs it all (12 ticks at 2.0 = 24).
    assert oracle.cheapest(job, [0] * 12 + [-1] * 18) == pytest.approx(12.0 + 6.0)
    # Spells too short to pay for their restart are left alone.
    assert oracle.cheapest(job, [0, 0, 0, -1] * 8) == pytest.approx(24.0)
    # Waiting for spot is free if the deadline allows it.
    assert oracle.cheapest(job, [-1] * 15 + [1] * 15) == pytest.approx(13.0)
    # No work: nothing to rent, even with no time left.
    assert oracle.cheapest(oracle.Job(0, 0, 3, 2, 1.0, 2.0), []) == 0.0


def test_no_policy_replayed_over_the_same_trace_pays_less() -> None:
    """Whatever the policy does on a trace (core/deadlinesim.replay, with its lost work and
    detection delays), the clairvoyant schedule of the same job on the same trace costs no
    more. Trace, work and restarts are whole ticks, so neither side gains from rounding."""
    rng = random.Random(7)
    tick = 60.0
    regime = spottrace.exponential(0.8, 1.0)
    compared = 0
    for seed in range(40):
        work, window = rng.randint(60, 180), rng.randint(200, 400)  # ticks
        restart = Restart(boot_s=tick * rng.randint(3, 8))
        market = Market(Decimal("0.234"), Decimal("0.468"), 0.8, restart, restart)
        raw = spottrace.generate(regime, seed, 3 * window * tick / 3600 + 24)
        trace = SpotTrace(raw.horizon_h, tuple(
            (a, b) for a, b in ((round(s * 60) / 60, round(e * 60) / 60) for s, e in raw.intervals)
            if b > a))
        job = ds.Job(work_s=work * tick, window_s=window * tick, checkpoint_every_s=600.0,
                     detect_s=tick)
        ticks = oracle.Job(work=work, window=window, spot_restart=round(restart.seconds / tick),
                           on_demand_restart=round(restart.seconds / tick),
                           spot_per_tick=0.234 / 60, on_demand_per_tick=0.468 / 60)
        bound = oracle.cheapest(ticks, oracle.spells(trace, 0.0, tick / 3600, window))
        assert bound is not None  # on-demand from the start always fits these windows
        for plan, mode in ((ds.Plan.POLICY, Mode.GREEDY), (ds.Plan.POLICY, Mode.UNIFORM_PROGRESS),
                           (ds.Plan.SPOT, Mode.GREEDY), (ds.Plan.ON_DEMAND, Mode.GREEDY)):
            out = ds.replay(job, market, trace, ds.strategy(plan, market, mode))
            if out.missed(job):
                continue
            paid = float(out.cost(market))
            assert bound <= paid + 1e-6, (seed, plan, mode, bound, paid)
            compared += 1
    assert compared > 100


def test_spells_follow_the_trace_and_wrap_at_its_horizon() -> None:
    trace = SpotTrace(4.0, ((0.5, 1.5), (2.0, 3.0)))
    assert oracle.spells(trace, 0.0, 0.5, 8) == [-1, 0, 0, -1, 1, 1, -1, -1]
    assert oracle.spells(trace, 3.5, 0.5, 4) == [-1, -1, 0, 0]  # hour 4 is hour 0 again


def test_a_run_s_restart_and_work_are_measured_from_its_finished_on_demand_jobs(
        tmp_path: Path) -> None:
    """Restart: the last rental to the end of the trainer's start (`train/start-training`),
    not to the first progress event (a training step later); work: from there to the end."""
    import sqlite3
    from datetime import UTC, datetime, timedelta

    from orchestrator.records.store import open_store
    from orchestrator.records.store.tables import Event, Instance

    t0 = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
    store = open_store(f"sqlite:///{tmp_path / 'orch.db'}")

    def job(name: str, rentals: list[int], started: int, done: int, status: str) -> None:
        jid = store.create_job(
            name=name, status="queued", method="lora", base_model="m", spec_json="{}",
            spec_hash="0" * 64, placement=None, provider=None, gpu=None, gpu_count=None,
            billing=None, interruptible=None, est_hours=None, est_cost=None,
            event_kind="queued", event_message="", event_data=None).id
        with store.transaction() as session:
            for k, at in enumerate(rentals):
                session.add(Instance(job_id=jid, provider="sim", provider_instance_id=f"i{k}",
                                     gpu="A100 80GB", gpu_count=1, billing="per_second",
                                     interruptible=False, price_per_hour_micros=1,
                                     state="terminated", created_at=t0 + timedelta(seconds=at)))
            # An earlier machine's trainer start (before the last rental), then the last's.
            for at in ([rentals[0] + 3] if len(rentals) > 1 else []) + [started]:
                session.add(Event(job_id=jid, at=t0 + timedelta(seconds=at),
                                  kind="step.changed", message="train/start-training"))
            session.add(Event(job_id=jid, at=t0 + timedelta(seconds=started + 2),
                              kind="train.progress", message="step 1/48"))
        con = sqlite3.connect(tmp_path / "orch.db")
        con.execute("UPDATE job SET status = ?, finished_at = ? WHERE id = ?",
                    (status, (t0 + timedelta(seconds=done)).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                     jid))
        con.commit()
        con.close()

    job("ondemand-0", [0], 7, 100, "succeeded")  # restart 7, work 93
    job("ondemand-1", [0, 50], 59, 160, "succeeded")  # second machine: restart 9, work 101
    job("ondemand-2", [0], 8, 105, "succeeded")  # restart 8, work 97
    job("ondemand-3", [0], 1, 500, "failed")  # not finished: not measured
    job("policy-0", [0], 1, 50, "succeeded")  # another strategy's
    store.close()
    con = sqlite3.connect(tmp_path / "orch.db")
    assert oracle.measured(con, "ondemand") == oracle.Measured(8.0, 97.0, 3)
    with pytest.raises(oracle.Unmeasured):
        oracle.measured(con, "spot")
