"""The deadline contract in the engine, end to end on the simulated cloud (issue 41).

A job with `resources.deadline_hours` and `spot: allowed` asks the policy before renting
(a `deadline.decision` event, the rental of the kind it chose), moves from spot to on-demand
when the slack no longer covers a preemption (`deadline.move`, the spot row closed `moved`,
the job finishing on on-demand from its mirrored checkpoint), and says at once when it will
miss the deadline whatever happens (`deadline.will_miss`).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from emulators.webhook import WebhookReceiver
from test_engine import Rig, assert_nothing_left, rig, training_step, when

from orchestrator.records import preemptions
from orchestrator.records.store import utcnow
from providers import spottrace
from providers.sim import spotmarket

__all__ = ["rig"]


def deadline_job(r: Rig, hours: float) -> str:
    path = r.job_file()
    path.write_text(path.read_text().replace("  spot: allowed\n",
                                             f"  spot: allowed\n  deadline_hours: {hours}\n"))
    return r.queue(path)


def events(r: Rig, job_id: str, kind: str) -> list[dict[str, object]]:
    return [json.loads(e.data_json or "{}") for e in r.store.events(job_id) if e.kind == kind]


ORCH = shutil.which("orch", path=str(Path(sys.executable).parent)) or "orch"


def shown(job_id: str) -> tuple[dict[str, Any], str]:
    """`orch show JOB`'s deadline (`--json`) and its text, from the rig's database."""
    def run(*extra: str) -> str:
        return subprocess.run([ORCH, "show", job_id, *extra], capture_output=True, text=True,
                              timeout=120, check=True).stdout
    return json.loads(run("--json"))["deadline"], run("--events", "0")


def test_a_deadline_with_slack_starts_on_spot_as_the_policy_decides(rig: Rig) -> None:
    cloud = rig.cloud()
    job_id = deadline_job(rig, 12)
    job = rig.run(cloud, job_id)
    assert job.status == "succeeded", job.failure_reason
    (decision,) = events(rig, job_id, "deadline.decision")
    assert decision["choice"] == "spot" and decision["rule"] == "taking_risks", decision
    assert "(prior)" in str(decision["preemptions"])
    (row,) = rig.store.instances_of(job_id)
    assert row.interruptible and row.end_reason == "released"
    assert rig.store.get_job(job_id).deadline_choice is None
    deadline, text = shown(job_id)  # `orch show`: due in 12 h, met, spot throughout
    assert deadline["outcome"] == "met" and deadline["hours"] == 12, deadline
    assert 11 * 3600 < deadline["margin_s"] < 12 * 3600 and deadline["decisions"] == 1
    assert deadline["on_demand_from"] is None and deadline["will_miss"] is None
    assert "deadline: due " in text and "to spare" in text and "on-demand from" not in text
    assert_nothing_left(rig, cloud, job_id)


STEPS, STEP_S = 80, 0.4


def squeeze(r: Rig, job_id: str, left_s: float) -> None:
    """Move the job's start back so that `left_s` seconds remain to its deadline."""
    job = r.store.get_job(job_id)
    hours = json.loads(job.spec_json)["resources"]["deadline_hours"]
    at = utcnow() - timedelta(seconds=hours * 3600 - left_s)
    with r.store.transaction() as session:
        row = session.get(type(job), job_id)
        assert row is not None
        row.created_at = at


def test_drift_moves_the_job_from_spot_to_on_demand_and_it_finishes_there(
        rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCH_DEADLINE_CHECK_S", "60")
    cloud = rig.cloud(host_options={"train_steps": STEPS, "train_step_seconds": STEP_S})
    job_id = deadline_job(rig, 12)
    # At step 5, the deadline comes closer: the work left and an on-demand restart fit, a
    # preemption on top (the check interval of 60 s) no longer does.
    def closer() -> None:
        (decided,) = events(rig, job_id, "deadline.decision")
        after, restart = decided["after_training_s"], decided["on_demand_restart_s"]
        assert isinstance(after, float) and isinstance(restart, float)
        squeeze(rig, job_id, (STEPS - 5) * STEP_S + after + restart + 25)

    when(lambda: training_step(rig.store, job_id) >= 5, closer)
    job = rig.run(cloud, job_id)
    assert job.status == "succeeded", job.failure_reason
    moves = events(rig, job_id, "deadline.move")
    assert moves and moves[0]["rule"] == "drift", moves
    first, second = rig.store.instances_of(job_id)
    assert first.interruptible and first.end_reason == "moved"
    assert not second.interruptible and second.end_reason == "released"
    assert job.interruptions == 0 and job.deadline_choice == "on_demand"
    assert not events(rig, job_id, "deadline.will_miss")  # on-demand meets it
    assert events(rig, job_id, "resume"), "did not resume from the mirrored checkpoint"
    deadline, text = shown(job_id)  # `orch show` says when and why it took on-demand
    assert deadline["outcome"] == "met" and deadline["margin_s"] > 0, deadline
    taken = deadline["on_demand_from"]
    assert taken["rule"] == "drift" and taken["kind"] == "deadline.move", deadline
    assert "to the end (drift)" in text and "met, " in text
    assert_nothing_left(rig, cloud, job_id)


def test_a_job_that_will_miss_whatever_happens_says_so_at_once_and_keeps_going(
        rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCH_DEADLINE_CHECK_S", "60")
    cloud = rig.cloud(host_options={"train_steps": 30, "train_step_seconds": STEP_S})
    with WebhookReceiver() as hook:  # a notify target: told as soon as it is known
        path = rig.job_file()
        path.write_text(path.read_text().replace(
            "  spot: allowed\n", "  spot: allowed\n  deadline_hours: 12\n")
            + f"notify: {{url: '{hook.url}/orch', events: [deadline.will_miss]}}\n")
        job_id = rig.queue(path)
        when(lambda: training_step(rig.store, job_id) >= 5, lambda: squeeze(rig, job_id, 5))
        job = rig.run(cloud, job_id)
        sent = [r.json() for r in hook.delivered()]
    assert job.status == "succeeded", job.failure_reason
    # Said once, not at every check, and not twice (the history's event is the webhook's).
    (miss,) = events(rig, job_id, "deadline.will_miss")
    assert miss["fastest"] == "spot" and float(str(miss["miss_by_s"])) > 0, miss
    assert [e["type"] for e in sent] == ["deadline.will_miss"]
    assert sent[0]["data"]["job_id"] == job_id and sent[0]["data"]["reason"]
    assert miss["webhook_id"]
    assert not events(rig, job_id, "deadline.move")  # moving would only be later
    (row,) = rig.store.instances_of(job_id)
    assert row.interruptible and row.end_reason == "released"
    deadline, text = shown(job_id)  # `orch show`: missed, and said so early
    assert deadline["outcome"] == "missed" and deadline["margin_s"] < 0, deadline
    assert deadline["will_miss"]["miss_by_s"] == miss["miss_by_s"]
    assert "missed by " in text and "it expected to miss it by" in text
    assert_nothing_left(rig, cloud, job_id)


def test_preemption_rates_are_learned_from_the_instance_rows(rig: Rig) -> None:
    cloud = rig.cloud()
    job_id = rig.queue(rig.job_file())
    store, now = rig.store, utcnow()
    prior = preemptions.rate_of(store, "sim", "RTX 3090", now)
    assert prior.describe() == "0.30/h (prior)"

    def row(hours: float, reason: str | None, interruptible: bool = True,
            iid: str | None = "i-x") -> None:
        r = store.add_instance(job_id, provider="sim", offer_id="o", gpu="RTX 3090",
                               gpu_count=1, billing="per_second", interruptible=interruptible,
                               price_per_hour=prior_price, attempt=0)
        assert r.id is not None
        with store.transaction() as session:
            got = session.get(type(r), r.id)
            assert got is not None
            got.provider_instance_id = iid
            got.created_at = now - timedelta(hours=hours)
            if reason is not None:
                got.terminated_at, got.end_reason = now, reason
                got.state = "terminated"

    from decimal import Decimal
    prior_price = Decimal("0.1")
    row(2.0, "interrupted")
    row(3.0, "interrupted")
    row(4.0, "moved")  # hours, not an interruption
    row(1.0, None)  # live: its hours so far
    row(9.0, "capacity", iid=None)  # never ran
    row(9.0, "interrupted", interruptible=False)  # on-demand: not spot's history
    seen = preemptions.histories(store, now)[("sim", "RTX 3090")]
    assert seen.interruptions == 2 and seen.hours == pytest.approx(10.0)
    rate = preemptions.rate_of(store, "sim", "RTX 3090", now)
    # The gamma-Poisson posterior mean with the prior's 0.298/h over 10 h (docs/deadline.md).
    assert rate.preemptions_per_hour == pytest.approx((0.298 * 10 + 2) / 20)
    assert rate.describe() == "0.25/h (2 in 10.0 h of running, prior 0.30/h over 10 h)"
    del cloud


def test_the_sim_spot_market_is_chosen_by_the_settings(
        tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.core.settings import SettingsError, settings
    from orchestrator.engine import wiring
    from providers.sim.compute import SimCloud

    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    monkeypatch.delenv("ORCH_SIM_SPOT_REGIME", raising=False)
    assert wiring.sim_spot_market() is None
    monkeypatch.setenv("ORCH_SIM_SPOT_REGIME", "bursty")
    monkeypatch.setenv("ORCH_SIM_SPOT_SEED", "3")
    monkeypatch.setenv("ORCH_SIM_SPOT_SECONDS_PER_HOUR", "48")
    cloud = wiring.sim_from_env()
    assert isinstance(cloud, SimCloud) and cloud.spot_market is not None
    market = cloud.spot_market
    assert (market.regime.name, market.seed, market.seconds_per_hour) == ("bursty", 3, 48.0)
    # Every process opening the same market shares its hour 0.
    assert wiring.sim_spot_market() == market
    monkeypatch.setenv("ORCH_SIM_SPOT_REGIME", "stormy")
    with pytest.raises(SettingsError, match="ORCH_SIM_SPOT_REGIME='stormy'"):
        settings()


def one_a100_job(r: Rig) -> tuple[Any, str]:
    """A 10-step job with a 12-h deadline on the sim's A100 80GB (one spot offer)."""
    cloud = r.cloud(host_options={"train_steps": 10, "train_step_seconds": 0.3})
    path = r.job_file()
    path.write_text(path.read_text().replace(
        "  spot: allowed\n", "  spot: allowed\n  deadline_hours: 12\n  gpus: [A100 80GB]\n"
        "  gpu_count: 1\n"))
    return cloud, r.queue(path)


def test_a_preempted_job_with_one_spot_offer_takes_it_again_when_the_policy_says_spot(
        rig: Rig) -> None:
    cloud, job_id = one_a100_job(rig)

    def preempt() -> None:
        (row,) = rig.store.instances_of(job_id)
        assert row.provider_instance_id
        cloud.preempt(row.provider_instance_id)

    when(lambda: training_step(rig.store, job_id) >= 4, preempt)
    job = rig.run(cloud, job_id)
    assert job.status == "succeeded", job.failure_reason
    first, second = rig.store.instances_of(job_id)
    # The same (only) spot offer again: the policy chose spot for the re-placement too.
    assert first.offer_id == second.offer_id and first.interruptible and second.interruptible
    assert [d["choice"] for d in events(rig, job_id, "deadline.decision")] == ["spot", "spot"]
    assert_nothing_left(rig, cloud, job_id)


def test_spot_gone_between_the_policy_and_the_rental_is_asked_again_not_failed(
        rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    # The policy's search lists spot; by the rental it is gone (a market replayed at 48 s a
    # trace hour, bench/deadline.py, does that every few seconds). Before: the job failed,
    # "no offers from sim" or "no spot A100 80GB to be had now".
    monkeypatch.setenv("ORCH_DEADLINE_CHECK_S", "1")
    market = spotmarket.SpotMarket(spotmarket.regime("calm"), 0, 0.0)
    spells = market.trace("A100 80GB").intervals
    start, end = max(spells, key=lambda s: s[1] - s[0])  # hours of spot to train in
    assert not market.available("A100 80GB", (end + 0.001) * 3600)
    began = time.time()
    flipped: list[float] = []

    def clock() -> float:
        """Spot from the start; gone for 2 s once the policy chose it; then back."""
        if not flipped and any(d.get("choice") == "spot"
                               for d in events(rig, job_id, "deadline.decision")):
            flipped.append(time.time())
        if flipped and time.time() - flipped[0] < 2.0:
            return (end + 0.001) * 3600
        return (start + 0.001) * 3600 + time.time() - began

    cloud = rig.cloud(spot_market=market, clock=clock, gpus=["A100 80GB"],
                      host_options={"train_steps": 6, "train_step_seconds": 0.2})
    path = rig.job_file()
    path.write_text(path.read_text().replace(
        "  spot: allowed\n", "  spot: allowed\n  deadline_hours: 12\n  gpu_count: 1\n"))
    job_id = rig.queue(path)
    job = rig.run(cloud, job_id)

    assert job.status == "succeeded", job.failure_reason
    choices = [d["choice"] for d in events(rig, job_id, "deadline.decision")]
    assert choices[0] == "spot" and "wait" in choices and choices[-1] == "spot", choices
    ran = [r for r in rig.store.instances_of(job_id) if r.end_reason == "released"]
    assert len(ran) == 1 and ran[0].interruptible
    assert_nothing_left(rig, cloud, job_id)


def _pool_hour(market: spotmarket.SpotMarket, gpus: tuple[str, str]) -> float:
    """A trace hour at which both GPUs' spot can be had and, whichever is rented first,
    the other's spot lasts an hour past the end of the first's spell."""
    one, two = (market.trace(g) for g in gpus)

    def lasts(trace: spottrace.SpotTrace, at: float) -> bool:
        ends = trace.preempted_at(at)
        return ends is not None and ends > at + 1.0

    for start, end in one.intervals:
        at = start + 0.01
        other_end = two.preempted_at(at)
        if other_end is None or end - at < 0.5 or other_end - at < 0.5:
            continue
        if lasts(two, end + 0.001) and lasts(one, other_end + 0.001):
            return at
    raise AssertionError("no such hour in the trace")


def test_preempted_on_one_gpus_spot_it_moves_to_anothers_spot(rig: Rig,
                                                              monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    """Each GPU model the job accepts is its own spot pool (its own trace in the simulated
    market, as zones and hosts are on real clouds): spot can be had while any of them has
    it. Preempted on one, the policy is asked again, sees the other's spot and places the
    job there (resuming from its last mirrored checkpoint, if any), instead of waiting or
    paying on-demand."""
    monkeypatch.setenv("ORCH_DEADLINE_CHECK_S", "1")
    gpus = ("A100 80GB", "RTX 5090")
    market = spotmarket.SpotMarket(spotmarket.regime("bursty"), 0, 0.0)
    hour = _pool_hour(market, gpus)
    began = time.time()
    jumped: list[float] = []
    job_id: str | None = None

    def clock() -> float:
        """The market from `hour`; once the job has trained a step on its first machine,
        the end of that machine's spell (its preemption), the other GPU's spot still up."""
        if not jumped and job_id is not None and events(rig, job_id, "train.progress"):
            (first,) = rig.store.instances_of(job_id)
            ends = market.trace(first.gpu or "").preempted_at(hour)
            assert ends is not None
            jumped.append(ends * 3600 + 1 - (hour * 3600 + time.time() - began))
        return hour * 3600 + time.time() - began + (jumped[0] if jumped else 0.0)

    # 40 steps (12 s), not 12: once, under a full suite's load, the job ended on its first
    # machine, never preempted (cause not captured); a longer training widens the window in
    # which the jump to the spell's end lands while the job still runs.
    cloud = rig.cloud(spot_market=market, clock=clock, gpus=list(gpus),
                      host_options={"train_steps": 40, "train_step_seconds": 0.3})
    path = rig.job_file()
    path.write_text(path.read_text().replace(
        "  spot: allowed\n", "  spot: allowed\n  deadline_hours: 12\n  gpu_count: 1\n"
        f"  gpus: [{', '.join(gpus)}]\n"))
    job_id = rig.queue(path)
    job = rig.run(cloud, job_id)

    assert job.status == "succeeded", job.failure_reason
    first, second = rig.store.instances_of(job_id)
    assert first.interruptible and first.end_reason == "interrupted", first
    assert second.interruptible and second.end_reason == "released", second
    assert {first.gpu, second.gpu} == set(gpus)  # the other pool's spot, not the same GPU
    decisions = events(rig, job_id, "deadline.decision")
    assert [d["choice"] for d in decisions] == ["spot", "spot"], decisions
    assert_nothing_left(rig, cloud, job_id)


def test_interruptions_on_spot_that_reach_the_limit_take_on_demand_not_a_failure(
        rig: Rig) -> None:
    # The attempt limit (max_attempts, 6 by default) once failed a deadline job whose spot
    # machines kept being preempted (the product bench's heavy market: 1 job in 50), though
    # on-demand, which no preemption ends, could still finish it in time.
    cloud, job_id = one_a100_job(rig)

    def preempt(index: int) -> None:
        rows = rig.store.instances_of(job_id)
        assert rows[index].provider_instance_id
        cloud.preempt(rows[index].provider_instance_id)

    def nth_trains(index: int) -> bool:
        rows = rig.store.instances_of(job_id)
        return (len(rows) > index and rows[index].provider_instance_id is not None
                and rig.store.get_job(job_id).status == "training")

    when(lambda: nth_trains(0) and training_step(rig.store, job_id) >= 2, lambda: preempt(0))
    when(lambda: nth_trains(1), lambda: preempt(1))
    job = rig.run(cloud, job_id, max_attempts=2)
    assert job.status == "succeeded", job.failure_reason
    rows = rig.store.instances_of(job_id)
    assert [(r.interruptible, r.end_reason) for r in rows] == [
        (True, "interrupted"), (True, "interrupted"), (False, "released")]
    decisions = events(rig, job_id, "deadline.decision")
    assert decisions[-1]["rule"] == "attempts" and decisions[-1]["choice"] == "on_demand"
    assert rig.store.get_job(job_id).deadline_choice == "on_demand"
    deadline, text = shown(job_id)
    assert deadline["on_demand_from"]["rule"] == "attempts" and "(the attempt limit)" in text
    assert_nothing_left(rig, cloud, job_id)
