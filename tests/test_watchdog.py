"""The watchdog's pure core: phases, progress, deadlines from the environment."""

from __future__ import annotations

import pytest

from orchestrator.core.settings import Settings, SettingsError, settings
from orchestrator.engine.watchdog import DEFAULT_DEADLINES_S, Watchdog, deadlines


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_silent_phase_is_overdue_and_progress_resets_it() -> None:
    clock = Clock()
    dog = Watchdog({"training": 10.0}, clock=clock)
    assert dog.overdue() is None  # no phase yet
    dog.phase("training")
    clock.now = 9.0
    assert dog.overdue() is None
    dog.progress()
    clock.now = 18.0
    assert dog.overdue() is None
    clock.now = 19.5
    reason = dog.overdue()
    assert reason is not None and "training" in reason and "ORCH_STALL_TRAINING_S" in reason


def test_unguarded_phases_never_stall() -> None:
    clock = Clock()
    dog = Watchdog({"training": 1.0}, clock=clock)
    dog.phase("queued")
    clock.now = 1e9
    assert dog.overdue() is None


def test_deadlines_come_from_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    assert deadlines(Settings()) == DEFAULT_DEADLINES_S
    assert deadlines(Settings(ORCH_STALL_MERGING_S="90"))["merging"] == 90.0
    monkeypatch.setenv("ORCH_STALL_RELEASING_S", "60")
    assert deadlines()["releasing"] == 60.0  # orch's settings, from the environment
    for bad in ("0", "-5", "soon", "inf", "nan"):
        monkeypatch.setenv("ORCH_STALL_TRAINING_S", bad)
        with pytest.raises(SettingsError, match="ORCH_STALL_TRAINING_S"):
            settings()
