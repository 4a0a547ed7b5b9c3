"""The engine's checkpoint interval (`save_steps`) follows ORCH_CHECKPOINT_EVERY_S.

bench/deadline.py runs trace hours in seconds: a checkpoint every 15 real minutes would be
none at all there (and a preemption would lose the whole run), so the interval is a setting
scaled with the trace clock, as the deadline check interval is.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.core.spec import load_job
from orchestrator.engine.jobinputs import Inputs

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
