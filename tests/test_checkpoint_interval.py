"""The engine's checkpoint interval (`save_steps`): ORCH_CHECKPOINT_EVERY_S, and on spot
Young's optimum for the GPU's preemption rate and the job's checkpoint, never longer.

bench/deadline.py runs trace hours in seconds: a checkpoint every 15 real minutes would be
none at all there (and a preemption would lose the whole run), so the interval is a setting
scaled with the trace clock, as the deadline check interval is.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import orchfork
import pytest
import test_engine_crash as crash
import yaml
from test_engine import Rig, assert_nothing_left, rig, training_step, when
from test_engine_crash import env

from orchestrator.core import checkpointing, preemption, sizing
from orchestrator.core.architectures import known_models
from orchestrator.core.planning import workload_from
from orchestrator.core.spec import load_job
from orchestrator.engine.jobinputs import Inputs

__all__ = ["env", "rig"]

ROOT = Path(__file__).resolve().parent.parent
PER_STEP = 1024 * 2 * 4  # examples/quickstart.yml: sequence_len x micro_batch x accumulation


def _inputs(steps: int, train_s: float) -> Inputs:
    loaded = load_job(ROOT / "examples" / "quickstart.yml")
    return Inputs(loaded, steps * PER_STEP, train_s / 3600, {})


def test_save_steps_default_is_one_checkpoint_per_15_minutes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ORCH_CHECKPOINT_EVERY_S", raising=False)
    assert _inputs(1200, 2 * 3600).save_steps(1) == 150  # 2 h, 1200 steps: every 15 min
    assert _inputs(192, 96).save_steps(1) == 192  # shorter than 15 min: only the last


def test_save_steps_follow_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    # 2 trace hours in 96 s (48 s per trace hour): 15 trace minutes are 12 s, 24 of 192 steps.
    monkeypatch.setenv("ORCH_CHECKPOINT_EVERY_S", "12")
    assert _inputs(192, 96).save_steps(1) == 24
    assert _inputs(192, 96).save_steps(2) == 12  # two GPUs: half the steps, as often


# --- on spot: Young's interval (core/checkpointing) -------------------------------------

def test_young_is_the_square_root_of_twice_the_write_by_the_mean_time_between() -> None:
    # 2 s to write, 0.3 preemptions an hour: M = 12,000 s, sqrt(2 x 2 x 12,000) = 219.1 s.
    assert checkpointing.young_s(2.0, 0.3) == pytest.approx(219.089, abs=1e-3)
    assert checkpointing.young_s(2.0, 0.0) == math.inf  # never preempted: never needed
    with pytest.raises(ValueError, match="preemptions/h"):
        checkpointing.young_s(2.0, -1.0)


@pytest.mark.parametrize(("longest", "write_bytes", "rate", "expected"), [
    (900.0, 250e6, 0.3, 219.089),  # Young's optimum, inside the bounds
    (900.0, 250e6, 0.0, 900.0),  # no preemptions: the longest
    (900.0, 50e9, 0.3, 900.0),  # a full fine-tune's write: Young says longer; the longest
    (900.0, 1e6, 1.0, 60.0),  # a tiny write at a high rate: never under a minute
    (30.0, 1e6, 1.0, 30.0),  # ... unless the user asked for less (ORCH_CHECKPOINT_EVERY_S)
    (120.0, 250e6, 0.3, 120.0),  # the user's longest stands over Young's 3.7 min
])
def test_the_spot_interval_is_young_within_a_minute_and_the_setting(
        longest: float, write_bytes: float, rate: float, expected: float) -> None:
    spot = checkpointing.Spot(preemptions_per_hour=rate, write_bytes_per_s=125e6)
    found = checkpointing.interval(longest, spot, int(write_bytes))
    assert found.seconds == pytest.approx(expected, abs=1e-3)
    assert found.write_s == pytest.approx(write_bytes / 125e6)


def test_a_machine_that_is_not_preempted_checkpoints_at_the_setting() -> None:
    assert checkpointing.interval(900.0) == checkpointing.Interval(900.0, None, None)
    assert checkpointing.interval(900.0).describe() == "every 15 min"
    with pytest.raises(ValueError, match="longest must be > 0"):
        checkpointing.interval(0.0)
    with pytest.raises(ValueError, match="write rate"):
        checkpointing.interval(900.0, checkpointing.Spot(0.3, 0.0), 1)
    with pytest.raises(ValueError, match="needs the checkpoint's size"):
        checkpointing.interval(900.0, checkpointing.Spot(0.3, 125e6))  # not 0 bytes silently


@pytest.mark.parametrize(("every", "size", "expected"), [
    (900.0, 10**8, 3),  # the longest interval: the trainer's three, as always
    (300.0, 10**8, 9),  # a third of it: three times as many, the same 45 minutes
    (60.0, 10**8, 45),  # a minute: 45 of 0.1 GB
    (60.0, 10**9, 5),  # ... of 1 GB: 5 GB at most
    (60.0, 4 * 10**9, 3),  # never fewer than three
])
def test_a_shorter_interval_keeps_more_checkpoints_as_long_on_the_host(
        every: float, size: int, expected: int) -> None:
    found = checkpointing.kept(checkpointing.Interval(every, 1.0, every), 900.0, size)
    assert found == expected


def test_the_interval_says_what_set_it() -> None:
    spot = checkpointing.Spot(0.3, 125e6)
    assert checkpointing.interval(900.0, spot, int(250e6)).describe() == (
        "every 3.7 min (Young's optimum for a 2.0 s write)")
    assert checkpointing.interval(900.0, spot, int(50e9)).describe() == (
        "every 15 min (bounded; Young's optimum for a 6.7 min write: 51.6 min)")
    assert checkpointing.interval(900.0, checkpointing.Spot(0.0, 125e6), 1).describe() == (
        "every 15 min (bounded; Young's optimum for a 0.0 s write: none: no preemptions)")


def _workload(method: str, optimizer: str) -> sizing.Workload:
    arch = known_models()["qwen/qwen2.5-0.5b"].architecture
    return sizing.Workload(arch=arch, method=method, optimizer=optimizer)  # type: ignore[arg-type]


def test_a_checkpoint_is_the_trained_weights_and_their_optimizer_state() -> None:
    arch = known_models()["qwen/qwen2.5-0.5b"].architecture
    adapters = arch.lora_params(16, sizing.LINEAR_MODULES)
    # LoRA/QLoRA: fp32 adapters (4 bytes) and AdamW's two fp32 moments (8) or 8-bit ones
    # (2); the frozen base, quantized or not, is not written.
    assert sizing.checkpoint_bytes(_workload("lora", "adamw")) == adapters * 12
    assert sizing.checkpoint_bytes(_workload("qlora", "adamw_8bit")) == adapters * 6
    assert sizing.checkpoint_bytes(_workload("lora", "adamw_8bit")) == adapters * 6
    # A full fine-tune: the bf16 model (2 bytes) and its bf16 moments (4).
    assert sizing.checkpoint_bytes(_workload("full", "adamw")) == arch.params * 6


def test_a_spot_rental_of_a_lora_job_checkpoints_more_often_a_full_one_does_not(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ORCH_CHECKPOINT_EVERY_S", raising=False)
    spot = checkpointing.Spot(preemptions_per_hour=0.3, write_bytes_per_s=125e6)
    qlora = _inputs(1200, 2 * 3600)  # the quickstart: a QLoRA adapter of Qwen2.5-0.5B
    every = qlora.checkpoint_interval(spot)
    assert 60 < every.seconds < 900 and every.young_s == every.seconds
    # 1200 steps in 2 h: one checkpoint per `every` seconds of them.
    assert qlora.save_steps(1, spot) == int(1200 * every.seconds / 7200) < 150
    assert qlora.save_steps(1, checkpointing.Spot(0.0, 125e6)) == 150  # never preempted
    loaded = load_job(ROOT / "examples" / "full-32b.yml")
    full = Inputs(loaded, 1200 * PER_STEP, 2.0, {})
    assert full.checkpoint_interval(spot).seconds == 900  # Young's optimum is longer


def _long_job(rig: Rig, spot: str, extra: str = "") -> Path:
    """The quickstart with `resources.spot: spot` (and `extra`) on an A100 80GB, with 200M
    tokens: 1.24 h of training estimated (the stand-in trains its few steps regardless)."""
    path = rig.job_file()
    path.write_text(path.read_text()
                    .replace("  format: alpaca\n", "  format: alpaca\n  tokens: 200000000\n")
                    .replace("  spot: allowed\n",
                             f"  spot: {spot}\n  gpus: [A100 80GB]\n{extra}"))
    return path


def _rendered(rig: Rig, spot: str) -> tuple[str, dict[str, Any]]:
    """The long job's id and the axolotl config it trains with on the simulated cloud."""
    path = _long_job(rig, spot)
    job_id = rig.queue(path)
    seen: list[dict[str, Any]] = []

    def look() -> None:  # the config on the host, while it trains
        seen.extend(yaml.safe_load(p.read_text())
                    for p in (rig.tmp / "sim").rglob("config.yml") if job_id in str(p))

    cloud = rig.cloud()
    when(lambda: training_step(rig.store, job_id) > 0, look)
    job = rig.run(cloud, job_id)
    assert job.status == "succeeded", job.failure_reason
    (row,) = rig.store.instances_of(job_id)
    assert row.interruptible is (spot == "required") and row.gpu == "A100 80GB"
    assert_nothing_left(rig, cloud, job_id)
    assert seen, "the config was not seen on the host"
    # `orch render` says what the engine gave the trainer (same records: the rig's database).
    rendered = orchfork.run(["render", str(path), "--json"], env=dict(os.environ), cwd=ROOT,
                            timeout=120)
    assert rendered.returncode == 0, rendered.stderr
    out = json.loads(rendered.stdout)["axolotl_config"]
    assert {k: out[k] for k in KEYS} == {k: seen[0][k] for k in KEYS}
    return job_id, seen[0]


KEYS = ("save_steps", "save_total_limit")


def _young(rig: Rig) -> float:
    """Young's interval for the long job: the prior's rate, and its QLoRA adapter with
    AdamW (the planner's choice for it on an A100: fp32 adapters and moments, 12 bytes a
    parameter) at the disk floor (125 MB/s)."""
    loaded = load_job(next((rig.tmp / "jobs").glob("*.yml")))
    size = workload_from(loaded).arch.lora_params(16, sizing.LINEAR_MODULES) * 12
    return checkpointing.young_s(size / 125e6, preemption.rate().preemptions_per_hour)


def test_a_spot_rental_is_rendered_with_youngs_interval(
        rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ORCH_CHECKPOINT_EVERY_S", raising=False)
    _, on_demand = _rendered(rig, "never")
    spot_id, spot = _rendered(rig, "required")
    # The same GPU and estimate: the steps scale as the intervals. On-demand: 15 min. Spot:
    # Young's for the prior's rate and the adapter's checkpoint.
    young = _young(rig)
    assert 60 < young < 900
    assert spot["save_steps"] == pytest.approx(on_demand["save_steps"] * young / 900, abs=2)
    # Each checkpoint stays on the host as long as at 15 min: 3 x 15 min of them.
    assert on_demand["save_total_limit"] == 3
    assert spot["save_total_limit"] == math.ceil(3 * 900 / young)
    # The job's events say why (an on-demand machine's interval is the setting: no event).
    (said,) = [e.message for e in rig.store.events(spot_id) if e.kind == "checkpoint.interval"]
    assert "Young's optimum" in said and f"every {spot['save_steps']} steps" in said, said


def test_the_deadline_policy_weighs_a_preemption_by_the_spot_interval_before_renting(
        rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    # Before any step the work is in the plan's seconds: the interval must be seconds too,
    # Young's for the spot offer, not the spot machine's step count read as seconds.
    monkeypatch.delenv("ORCH_CHECKPOINT_EVERY_S", raising=False)
    cloud = rig.cloud()
    job_id = rig.queue(_long_job(rig, "allowed", "  deadline_hours: 12\n"))
    job = rig.run(cloud, job_id)
    assert job.status == "succeeded", job.failure_reason
    first = next(json.loads(e.data_json or "{}") for e in rig.store.events(job_id)
                 if e.kind == "deadline.decision")
    assert first["choice"] == "spot"
    assert first["checkpoint_every_s"] == pytest.approx(_young(rig), abs=0.1)
    assert_nothing_left(rig, cloud, job_id)


def test_a_takeover_keeps_the_checkpoints_the_running_trainer_was_given(
        env: dict[str, str]) -> None:
    # kill -9 of the worker while a spot job trains; the next worker renders the job again
    # with a setting that would give the trainer other checkpoints (the same happens when
    # the GPU's preemption rate moved in between). The trainer still runs with the config it
    # started with: the takeover keeps it, says nothing new, and does not rewrite the file.
    env.update(ORCH_SIM_TRAIN_STEPS="60", ORCH_SIM_STEP_S="0.5")
    env.pop("ORCH_CHECKPOINT_EVERY_S", None)
    folder = Path(env["XDG_DATA_HOME"]).parent / "jobs"
    folder.mkdir()
    path = folder / "job.yml"
    path.write_text((ROOT / "examples" / "quickstart.yml").read_text()
                    .replace("data/", str(ROOT / "examples" / "data") + "/")
                    .replace("  format: alpaca\n", "  format: alpaca\n  tokens: 200000000\n")
                    .replace("  spot: allowed\n", "  spot: required\n  gpus: [A100 80GB]\n"))
    later = {**env, "ORCH_CHECKPOINT_EVERY_S": "60"}
    rendered = [json.loads(orchfork.run(["render", str(path), "--json"], env=e, cwd=ROOT,
                                        timeout=120).stdout)["axolotl_config"]["save_steps"]
                for e in (env, later)]
    assert rendered[0] != rendered[1], rendered  # the later setting does give other steps
    job_id = json.loads(crash.orch(env, "submit", str(path), "--detach", "--json").stdout)[
        "job_id"]

    def on_host() -> int:
        (config,) = [p for p in crash.sim_dir(env).rglob("config.yml") if job_id in str(p)]
        return int(yaml.safe_load(config.read_text())["save_steps"])

    def said() -> list[tuple[object, ...]]:
        return crash.query(env, "SELECT json_extract(data_json, '$.instance'), "
                                "json_extract(data_json, '$.save_steps') FROM event "
                                "WHERE job_id = ? AND kind = 'checkpoint.interval'", job_id)

    first = crash.spawn(env, "worker", "--once")
    try:
        crash.wait_for(lambda: crash.training(env, job_id), what="training on spot")
        first.kill()  # SIGKILL: no teardown, the trainer goes on
        first.wait(timeout=30)
    finally:
        first.kill()
    ((instance, steps),) = said()
    assert steps == on_host() == rendered[0]
    crash.lease_lapsed(env)
    connected = len(crash.query(env, "SELECT id FROM event WHERE job_id = ? AND kind = "
                                     "'connected'", job_id))
    second = crash.spawn(later, "worker", "--once")
    try:
        # Taken over: connected again, then training progress read from the same trainer.
        def reattached() -> bool:
            ids = [r[0] for r in crash.query(
                env, "SELECT id FROM event WHERE job_id = ? AND kind = 'connected' "
                     "ORDER BY id", job_id)]
            return len(ids) > connected and bool(crash.query(
                env, "SELECT 1 FROM event WHERE job_id = ? AND kind = 'train.progress' "
                     "AND id > ?", job_id, ids[-1]))

        crash.wait_for(reattached, timeout=120, what="the takeover reading progress")
        assert on_host() == steps  # the running trainer's config, not rewritten
        second.wait(timeout=180)
    finally:
        second.kill()
    assert second.returncode == 0
    assert crash.status(env, job_id) == "succeeded"
    assert said() == [(instance, steps)]  # one machine, one interval: no second event
    assert crash.live_instances(env) == []
