"""`orch plan`, `orch prices` and `orch offers` for jobs with deadlines (issue 41 §2, §3).

`orch plan` gives each strategy's expected cost and chance of missing the deadline and refuses
a deadline no placement meets, naming the fastest; `orch prices` / `orch offers` show each
spot row's preemption rate, learned from orch's instance rows (the prior before any).
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from emulators.vast import VastEmulator
from test_cli import orch

from orchestrator.records.store import open_store, utcnow
from orchestrator.records.store.tables import Event, Job

ROOT = Path(__file__).resolve().parent.parent
KEY = "vast-market-key-0123456789"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items()
         if k not in {"VAST_API_KEY", "RUNPOD_API_KEY", "ORCH_DB_URL", "ORCH_VASTAI_URL"}}
    e.update(XDG_DATA_HOME=str(tmp_path / "xdg"), XDG_CONFIG_HOME=str(tmp_path / "config"))
    return e


def job(tmp_path: Path, hours: float) -> Path:
    text = (ROOT / "examples" / "quickstart.yml").read_text()
    text = text.replace("  spot: allowed\n", f"  spot: allowed\n  deadline_hours: {hours}\n")
    text = text.replace("data/", str(ROOT / "examples" / "data") + "/")
    path = tmp_path / "job.yml"
    path.write_text(text)
    return path


def test_plan_gives_each_strategy_expected_cost_and_chance_of_missing(
        env: dict[str, str], tmp_path: Path) -> None:
    path = job(tmp_path, 0.5)
    out = json.loads(orch(env, "plan", str(path), "--json").stdout)["deadline"]
    assert out["preemptions"] == "0.30/h (prior)"
    by = {s["strategy"]: s for s in out["strategies"]}
    assert set(by) == {"on_demand", "spot", "policy"}
    assert by["on_demand"]["p_miss"] == 0 and by["policy"]["p_miss"] == 0
    assert by["spot"]["p_miss"] > 0  # spot alone misses some deadlines at the prior's rate
    assert Decimal(by["policy"]["expected_cost"]) < Decimal(by["on_demand"]["expected_cost"])
    human = orch(env, "plan", str(path)).stdout
    assert "chance of missing" in human and "policy (" in human


def test_plan_weighs_the_restart_orch_measured_on_the_spot_gpu(
        env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before any history the restarts are the plan's boot + download; after a rental of the
    spot placement's GPU took 40 minutes from rental to first step, `orch plan` weighs that,
    says so, and expects the policy to cost no less (the engine reads the same rows)."""
    path = job(tmp_path, 3)
    before = json.loads(orch(env, "plan", str(path), "--json").stdout)
    restarts = before["deadline"]["restarts"]
    assert restarts["spot_source"] == "plan" and restarts["on_demand_source"] == "plan"
    spot = next(p for p in [before["placement"], *before["alternatives"]]
                if p["interruptible"])  # the plan's first spot placement, as the policy's
    monkeypatch.setenv("XDG_DATA_HOME", env["XDG_DATA_HOME"])
    store = open_store(f"sqlite:///{Path(env['XDG_DATA_HOME']) / 'orch' / 'orch.db'}")
    job_id = _a_job(store)
    row = store.add_instance(job_id, provider=spot["provider"], offer_id="o", gpu=spot["gpu"],
                             gpu_count=1, billing="per_second", interruptible=True,
                             price_per_hour=Decimal("0.3"), attempt=0)
    rented = utcnow() - timedelta(hours=2)
    with store.transaction() as session:
        got = session.get(type(row), row.id)
        assert got is not None
        got.provider_instance_id, got.created_at = "i-1", rented
    with store.transaction() as session:
        session.add(Event(job_id=job_id, at=rented + timedelta(minutes=40),
                          kind="train.progress", message="step 1"))
    # The on-demand placement's GPU: rentals that reached a step 10, 10, 10 and 30 minutes
    # after they were made. The policy plans with the median and its margins with a slow one.
    od = next(p for p in [before["placement"], *before["alternatives"]]
              if not p["interruptible"])
    for n, minutes in enumerate((10, 10, 10, 30)):
        other = _a_job(store)
        row = store.add_instance(other, provider=od["provider"], offer_id="o", gpu=od["gpu"],
                                 gpu_count=1, billing="per_second", interruptible=False,
                                 price_per_hour=Decimal("0.6"), attempt=0)
        at = rented - timedelta(hours=n + 1)
        with store.transaction() as session:
            got = session.get(type(row), row.id)
            assert got is not None
            got.provider_instance_id, got.created_at = f"i-od-{n}", at
            session.add(Event(job_id=other, at=at + timedelta(minutes=minutes),
                              kind="train.progress", message="step 1"))
    store.close()
    after = json.loads(orch(env, "plan", str(path), "--json").stdout)["deadline"]
    assert after["restarts"]["spot_s"] == 2400.0
    assert after["restarts"]["spot_source"] == "measured: 2400 s (1 rental)"
    assert after["restarts"]["on_demand_s"] == 600.0
    assert after["restarts"]["on_demand_source"] == ("measured: 600 s (median of 4 rentals; "
                                                     "90% within 1440 s)")
    assert after["restarts"]["on_demand_slow_s"] == 1440.0  # 0.7 of the way from 10 to 30 min
    policy = {s["strategy"]: Decimal(s["expected_cost"]) for s in after["strategies"]}
    earlier = {s["strategy"]: Decimal(s["expected_cost"])
               for s in before["deadline"]["strategies"]}
    assert policy["spot"] > earlier["spot"]  # each restart of spot costs 40 minutes now
    assert "restarts: spot 40.0 min (measured: 2400 s (1 rental))" in orch(
        env, "plan", str(path)).stdout


def test_a_deadline_no_placement_meets_is_refused_naming_the_fastest(
        env: dict[str, str], tmp_path: Path) -> None:
    done = orch(env, "plan", str(job(tmp_path, 0.001)), check=False)
    assert done.returncode == 3, done.stderr
    assert "resources.deadline_hours: 0.001 h is shorter than the fastest placement needs" \
        in done.stderr
    assert "set deadline_hours to at least" in done.stderr
    submitted = orch(env, "submit", str(job(tmp_path, 0.001)), "--json", check=False)
    assert submitted.returncode == 3  # nothing queued, nothing rented


def test_prices_and_offers_show_the_learned_preemption_rate(
        env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    with VastEmulator(api_key=KEY) as emu:
        emu.add_offer(id=11, gpu_name="L40S", gpu_ram=46068, dph_base=0.52, min_bid=0.30)
        env.update(VAST_API_KEY=KEY, ORCH_VASTAI_URL=emu.url)
        prior = json.loads(orch(env, "offers", "--json").stdout)["offers"]
        assert {(o["interruptible"], o["preemptions"]) for o in prior} == {
            (True, "0.30/h (prior)"), (False, None)}
        # Two vastai L40S spot machines, one preempted after 3 h, one moved after 7 h:
        # (0.298 * 10 + 1) / (10 + 10) = 0.199/h.
        monkeypatch.setenv("XDG_DATA_HOME", env["XDG_DATA_HOME"])
        store = open_store(f"sqlite:///{Path(env['XDG_DATA_HOME']) / 'orch' / 'orch.db'}")
        job_id = _a_job(store)
        now = utcnow()
        for hours, reason in ((3.0, "interrupted"), (7.0, "moved")):
            row = store.add_instance(job_id, provider="vastai", offer_id="11", gpu="L40S",
                                     gpu_count=1, billing="per_second", interruptible=True,
                                     price_per_hour=Decimal("0.3"), attempt=0)
            with store.transaction() as session:
                got = session.get(type(row), row.id)
                assert got is not None
                got.provider_instance_id, got.state = f"i-{hours}", "terminated"
                got.created_at = now - timedelta(hours=hours)
                got.terminated_at, got.end_reason = now, reason
        store.close()
        learned = "0.20/h (1 in 10.0 h of running, prior 0.30/h over 10 h)"
        offers = json.loads(orch(env, "offers", "--json").stdout)["offers"]
        assert {o["preemptions"] for o in offers if o["interruptible"]} == {learned}
        seen = json.loads(orch(env, "prices", "L40S", "--json").stdout)
        assert {r["preemptions"] for r in seen if r["interruptible"]} == {learned}
        assert "0.20/h (1 in 10 h)" in orch(env, "prices", "L40S").stdout


def _a_job(store: object, path: Path = ROOT / "examples" / "quickstart.yml") -> str:
    from orchestrator.core.spec import load_job
    from orchestrator.engine.submission import record_job
    from orchestrator.records.store import Store

    assert isinstance(store, Store)
    recorded, _ = record_job(store, load_job(path))
    return recorded.id


@pytest.mark.parametrize(("status", "ended_h", "outcome", "says"), [
    ("failed", 1.0, "missed", "missed: the job failed 1h 00m before it"),  # no model by then
    ("failed", 3.0, "missed", "missed by 1h 00m (the job failed)"),
    ("cancelled", 1.0, "stopped", "not judged: the job was cancelled 1h 00m before it"),
    ("cancelled", 3.0, "missed", "missed by 1h 00m (then cancelled)"),  # overdue already
    ("queued", None, "missed", "missed by 1h 00m"),  # still waiting, 3 h into a 2-h deadline
    ("planned", None, "planned", "not run: the job was only planned"),  # a dry run
])
def test_show_says_whether_a_job_that_did_not_succeed_missed_its_deadline(
        env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, status: str,
        ended_h: float | None, outcome: str, says: str) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", env["XDG_DATA_HOME"])
    store = open_store(f"sqlite:///{Path(env['XDG_DATA_HOME']) / 'orch' / 'orch.db'}")
    job_id = _a_job(store, job(tmp_path, 2))
    started = utcnow() - timedelta(hours=3)
    with store.transaction() as session:
        row = session.get(Job, job_id)
        assert row is not None
        row.created_at, row.status = started, status
        row.finished_at = None if ended_h is None else started + timedelta(hours=ended_h)
    store.close()
    deadline = json.loads(orch(env, "show", job_id, "--json").stdout)["deadline"]
    assert deadline["outcome"] == outcome and deadline["hours"] == 2, deadline
    if ended_h is not None:
        assert deadline["margin_s"] == pytest.approx((2 - ended_h) * 3600, abs=0.2)
    elif status == "planned":
        assert deadline["margin_s"] is None
    assert deadline["decisions"] == 0 and deadline["on_demand_from"] is None
    assert says in orch(env, "show", job_id).stdout
    # `--events 0` shows none of the job's events (it once showed them all).
    text = orch(env, "show", job_id, "--events", "0").stdout
    rows = text.split("Events (newest 0 of ")[1].splitlines()[1:]  # after that heading
    assert all(not r.strip() or r.split()[0] == "at" for r in rows), text  # a header at most


def test_plan_says_how_often_the_job_checkpoints_on_spot(
        env: dict[str, str], tmp_path: Path) -> None:
    # The quickstart's QLoRA adapter of Qwen2.5-0.5B: a write of about a second at the disk
    # floor; at the prior's 0.30/h Young's optimum is a couple of minutes (core/checkpointing).
    path = job(tmp_path, 0.5)
    out = json.loads(orch(env, "plan", str(path), "--json").stdout)["deadline"]
    assert 60 < out["spot_checkpoint_every_s"] < 300
    assert "checkpoints on spot: every " in orch(env, "plan", str(path)).stdout
    # The user's longest interval stands over it.
    env["ORCH_CHECKPOINT_EVERY_S"] = "45"
    out = json.loads(orch(env, "plan", str(path), "--json").stdout)["deadline"]
    assert out["spot_checkpoint_every_s"] == 45
