"""A sweep's search (TPE) and early stopping (ASHA, Hyperband) over plain trial records."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.core import search
from orchestrator.core.search import (
    Continue,
    Prune,
    RungRecord,
    TrialRecord,
    TrialState,
    decide,
    propose,
    rung_resources,
    rung_step,
    rung_value,
)
from orchestrator.core.searchspec import EarlyStopSpec, Param

ROOT = Path(__file__).resolve().parent.parent
SPACE = (Param("training.learning_rate", "choice", choices=(1.0e-4, 2.0e-4, 5.0e-4)),
         Param("lora.r", "choice", choices=(8, 16, 32)),
         Param("training.epochs", "choice", choices=(1, 2, 3)))
ASHA = EarlyStopSpec(min_fraction=0.1, reduction_factor=3)


def _done(number: int, params: dict[str, object], value: float) -> TrialRecord:
    return TrialRecord(number, params, TrialState.COMPLETE, value)


def test_optuna_stays_off_the_start_up_path() -> None:
    code = ("import sys; import orchestrator.core.search, orchestrator.core.sweepspec, "
            "orchestrator.core.planning; print('optuna' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    assert out.stdout.strip() == "False"


def test_proposals_are_a_function_of_the_records_before_them() -> None:
    first = propose(SPACE, [], seed=7, n=3, goal="min", total=12)
    assert propose(SPACE, [], seed=7, n=3, goal="min", total=12) == first
    # One at a time (a tick per free worker, or a kill -9 between them) proposes the same.
    one_by_one: list[TrialRecord] = []
    for _ in range(3):
        (params,) = propose(SPACE, one_by_one, seed=7, n=1, goal="min", total=12)
        one_by_one.append(TrialRecord(len(one_by_one), params, TrialState.PENDING))
    assert [t.params for t in one_by_one] == first
    assert len({repr(sorted(p.items())) for p in first}) == 3
    assert propose(SPACE, [], seed=8, n=3, goal="min", total=12) != first


def test_tpe_follows_the_finished_runs_and_never_repeats_one() -> None:
    # Past its random start, TPE proposes near the best ended runs (high rank, lr 2e-4).
    records = []
    for i, params in enumerate(p for p in _all_points() if p["training.epochs"] == 2):
        value = 1.0 + abs(params["training.learning_rate"] - 2.0e-4) * 100 + 1 / params["lora.r"]
        records.append(_done(i, params, value))
    proposals = propose(SPACE, records, seed=0, n=6, goal="min", total=20)
    taken = {repr(sorted(t.params.items())) for t in records}
    assert all(repr(sorted(p.items())) not in taken for p in proposals)
    assert sum(p["training.learning_rate"] == 2.0e-4 for p in proposals) >= 3


def _all_points() -> list[dict[str, object]]:
    import itertools

    return [dict(zip((p.key for p in SPACE), combo, strict=True))
            for combo in itertools.product(*(p.choices for p in SPACE))]


def test_a_nearly_exhausted_space_gets_its_last_points_then_nothing() -> None:
    points = _all_points()
    records = [_done(i, p, 1.0 + i / 100) for i, p in enumerate(points[:25])]
    last = propose(SPACE, records, seed=1, n=5, goal="min", total=27)
    assert sorted(map(repr, last)) == sorted(map(repr, points[25:]))


def test_values_are_the_files_own_values() -> None:
    space = (Param("lora.target", "choice", choices=(["q_proj", "v_proj"], "all-linear")),
             Param("training.learning_rate", "float", low=1.0e-5, high=1.0e-3, log=True),
             Param("lora.r", "int", low=4, high=64))
    for params in propose(space, [], seed=3, n=5, goal="max", total=10):
        assert params["lora.target"] in (["q_proj", "v_proj"], "all-linear")
        lr = params["training.learning_rate"]
        assert 1.0e-5 <= lr <= 1.0e-3 and lr == float(f"{lr:.6g}")
        assert isinstance(params["lora.r"], int) and 4 <= params["lora.r"] <= 64


@settings(max_examples=25, deadline=None)
@given(sizes=st.lists(st.integers(1, 4), min_size=1, max_size=3),
       done=st.integers(0, 6), n=st.integers(1, 4), seed=st.integers(0, 2**31))
def test_proposals_stay_in_the_space_unique_and_repeatable(sizes: list[int], done: int, n: int,
                                                            seed: int) -> None:
    space = tuple(Param(f"k{i}", "choice", choices=tuple(range(size)))
                  for i, size in enumerate(sizes))
    total = 1
    for size in sizes:
        total *= size
    recorded = propose(space, [], seed=seed, n=min(done, total), goal="min", total=total)
    records = [_done(i, p, float(sum(p.values()))) for i, p in enumerate(recorded)]
    got = propose(space, records, seed=seed, n=n, goal="min", total=total)
    assert got == propose(space, records, seed=seed, n=n, goal="min", total=total)
    assert len(got) == min(n, total - len(records))
    keys = [repr(sorted(p.items())) for p in [*recorded, *got]]
    assert len(keys) == len(set(keys))
    assert all(p[f"k{i}"] in range(size) for p in got for i, size in enumerate(sizes))


# --- rungs -------------------------------------------------------------------------------------


def test_rungs_are_thousandths_of_each_run() -> None:
    assert rung_resources(ASHA) == [100, 300, 900]
    assert rung_resources(EarlyStopSpec()) == [50, 150, 450]
    # Counted on the exact shares, not the rounded first one: 0.0625 x 4^2 and 1/9 x 3^2 are
    # the run's end, not rungs at 99.2 % and 99.9 % of it (issue 38, round C).
    assert rung_resources(EarlyStopSpec(min_fraction=0.0625, reduction_factor=4)) == [62, 248]
    assert rung_resources(EarlyStopSpec(min_fraction=1 / 9, reduction_factor=3)) == [111, 333]
    assert rung_resources(EarlyStopSpec(min_fraction=0.11, reduction_factor=3)) == [110, 330,
                                                                                   990]
    assert rung_step(100, 60) == 6 and rung_step(300, 61) == 19 and rung_step(50, 10) == 1
    curve = [(s, 2.0 - s / 100) for s in range(1, 21)]
    assert rung_value(curve, 25) is None
    step, value = rung_value(curve, 20) or (0, 0.0)
    assert step == 20 and value == pytest.approx((1.81 + 1.80) / 2)  # the last tenth, smoothed
    assert rung_value([(10, 1.5)], 8) == (10, 1.5)  # the first report past the rung


def _curve(level: float, steps: int = 100) -> list[tuple[int, float]]:
    return [(s, level + 1.0 / s) for s in range(1, steps + 1)]


def test_asha_stops_a_run_in_the_losing_part_of_a_rung_once() -> None:
    early = [RungRecord(0, 100, v) for v in (1.2, 1.3, 1.4)]
    trials = [TrialRecord(i, {"i": i}, TrialState.COMPLETE, 1.0 + i / 10, (r,))
              for i, r in enumerate(early)]
    running = TrialRecord(3, {"i": 3}, TrialState.RUNNING)
    # Trial 3 at step 10 of 100: 1.5 + noise, worse than the best of four (eta 3: one goes on).
    decision = decide(ASHA, [*trials, running], 3, _curve(1.4, 10), 100, study_name="s")
    assert isinstance(decision, Prune)
    assert (decision.rung, decision.resource, decision.step) == (0, 100, 10)
    assert decision.metric == "train.loss" and decision.cutoff == 1.2
    assert decision.value == pytest.approx(1.4 + 1 / 10)
    assert decision.recorded == (RungRecord(0, 100, decision.value),)
    # A better run goes on, and its rung is recorded; checked again, it is not rechecked.
    good = decide(ASHA, [*trials, running], 3, _curve(1.0, 10), 100, study_name="s")
    assert isinstance(good, Continue) and [r.resource for r in good.recorded] == [100]
    again = TrialRecord(3, {"i": 3}, TrialState.RUNNING, None, good.recorded)
    assert decide(ASHA, [*trials, again], 3, _curve(1.0, 12), 100,
                  study_name="s") == Continue(())


def test_the_first_runs_go_on_and_the_order_of_records_does_not_matter() -> None:
    first = decide(ASHA, [TrialRecord(0, {}, TrialState.RUNNING)], 0, _curve(3.0, 40), 100,
                   study_name="s")
    assert isinstance(first, Continue) and [r.resource for r in first.recorded] == [100, 300]
    trials = [TrialRecord(i, {}, TrialState.PRUNED, None, (RungRecord(0, 100, 1.0 + i),))
              for i in range(5)]
    me = TrialRecord(5, {}, TrialState.RUNNING)
    a = decide(ASHA, [*trials, me], 5, _curve(2.5, 10), 100, study_name="s")
    b = decide(ASHA, [me, *reversed(trials)], 5, _curve(2.5, 10), 100, study_name="s")
    assert a == b and isinstance(a, Prune)


def test_a_diverged_run_is_pruned_and_does_not_prune_the_runs_after_it() -> None:
    import math

    nan = float("nan")
    # A run whose loss turned `nan` at the rung is pruned there, though its losses before
    # were good (NaN weights do not come back), with its own rung index.
    gone = [(s, 1.0 if s < 10 else nan) for s in range(1, 11)]
    assert math.isnan(rung_value(gone, 10)[1])  # type: ignore[index]
    first = decide(ASHA, [TrialRecord(0, {}, TrialState.RUNNING)], 0, gone, 100,
                   study_name="s")
    assert isinstance(first, Prune) and (first.rung, first.resource) == (0, 100)
    assert math.isnan(first.value) and math.isnan(first.cutoff)  # nobody else at the rung
    # Its NaN rung, recorded, is no competitor: the best run after it goes on (a NaN among
    # optuna's competing values pruned every later run, whatever its value).
    dead = TrialRecord(0, {}, TrialState.PRUNED, None, (RungRecord(0, 100, nan),))
    others = [TrialRecord(i, {}, TrialState.COMPLETE, 1.0, (RungRecord(0, 100, 1.0 + i),))
              for i in (1, 2)]
    me = TrialRecord(3, {}, TrialState.RUNNING)
    assert isinstance(decide(ASHA, [dead, *others, me], 3, _curve(0.4, 10), 100,
                             study_name="s"), Continue)
    # At a later rung: the index is that rung's, the cutoff the others' (one of four goes on).
    passed = TrialRecord(3, {}, TrialState.RUNNING, None, (RungRecord(0, 100, 0.5),))
    later = [TrialRecord(i, {}, TrialState.COMPLETE, 1.0, (RungRecord(0, 100, 0.6 + i / 10),
                                                           RungRecord(1, 300, 0.5 + i / 10)))
             for i in (1, 2)]
    curve = [(s, 0.5 if s < 30 else nan) for s in range(1, 31)]
    pruned = decide(ASHA, [dead, *later, passed], 3, curve, 100, study_name="s")
    assert isinstance(pruned, Prune) and (pruned.rung, pruned.resource) == (1, 300)
    assert pruned.cutoff == pytest.approx(0.6)


def test_a_finished_run_records_every_rung_it_passed() -> None:
    trials = [TrialRecord(i, {}, TrialState.COMPLETE, 1.0, (RungRecord(0, 100, 1.0),
                                                            RungRecord(1, 300, 0.9)))
              for i in range(3)]
    me = TrialRecord(3, {}, TrialState.RUNNING)
    done = decide(ASHA, [*trials, me], 3, _curve(5.0), 100, study_name="s", finished=True)
    assert isinstance(done, Continue)
    assert [(r.rung, r.resource) for r in done.recorded] == [(0, 100), (1, 300), (2, 900)]


def test_hyperband_brackets_follow_the_study_name_and_trial_number() -> None:
    hyper = EarlyStopSpec(min_fraction=0.1, reduction_factor=3, pruner="hyperband")
    decisions = {}
    for name in ("sweep-a", "sweep-b"):
        trials = [TrialRecord(i, {}, TrialState.COMPLETE, 1.0) for i in range(12)]
        recorded = []
        for i in range(len(trials)):
            d = decide(hyper, [*trials[:i], TrialRecord(i, {}, TrialState.RUNNING)], i,
                       _curve(1.0 + i / 10), 100, study_name=name, finished=True)
            recorded.append(tuple(r.resource for r in d.recorded))
            trials[i] = TrialRecord(i, {}, TrialState.COMPLETE, 1.0, d.recorded)
        decisions[name] = recorded
        # The same name and records give the same brackets again.
        again = decide(hyper, [*trials[:5], TrialRecord(5, {}, TrialState.RUNNING)], 5,
                       _curve(1.5), 100, study_name=name, finished=True)
        assert tuple(r.resource for r in again.recorded) == recorded[5]
    # A trial's first recorded rung is its bracket's: 100, 300 or 900 thousandths.
    firsts = {r[0] for r in decisions["sweep-a"] + decisions["sweep-b"] if r}
    assert firsts <= {100, 300, 900} and len(firsts) >= 2


def test_best_is_the_best_complete_trial() -> None:
    trials = [_done(0, {}, 1.2), TrialRecord(1, {}, TrialState.PRUNED), _done(2, {}, 1.1),
              _done(3, {}, 1.1)]
    best = search.best(trials, "min")
    assert best is not None and best.number == 2
    top = search.best(trials, "max")
    assert top is not None and top.number == 0
    assert search.best([TrialRecord(0, {}, TrialState.RUNNING)], "min") is None


def test_optunas_own_storage_refuses_orchs_database(tmp_path: Path) -> None:
    """Why orch rebuilds studies in memory: optuna's RDBStorage keeps its schema version in
    Alembic's `alembic_version`, which orch's migrations own."""
    import optuna

    from orchestrator.records.store import open_store

    url = f"sqlite:///{tmp_path / 'orch.db'}"
    open_store(url)
    with pytest.raises(RuntimeError, match="no longer compatible with the table schema"):
        optuna.storages.RDBStorage(url)
    with sqlite3.connect(tmp_path / "orch.db") as con:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        (revision,) = con.execute("SELECT version_num FROM alembic_version").fetchone()
    # It wrote its tables into orch's database before it refused.
    assert {"studies", "trials", "version_info"} <= tables
    assert not revision.startswith("v")  # orch's revision, not one of optuna's (v3.0.0.a ...)


def test_a_trial_that_diverged_after_a_good_rung_is_not_among_the_good() -> None:
    # Trial 0 passed its first rung with the best value, then diverged (a NaN rung, pruned:
    # engine/pruning.Pruning.diverged). optuna's TPE ranks a pruned trial by its furthest
    # step first: given its values, it would be one of the two "good" trials and every next
    # proposal would come from its learning rate (40 of 40 seeds in review); given none, it
    # ranks below every other trial, and the search stays away from it.
    import math

    space = [Param("training.learning_rate", "float", low=1e-5, high=1e-1, log=True)]
    rows = [TrialRecord(0, {"training.learning_rate": 5e-2}, TrialState.PRUNED, None,
                        (RungRecord(0, 111, 1.0), RungRecord(1, 170, math.nan)))]
    rows += [TrialRecord(i, {"training.learning_rate": lr}, TrialState.PRUNED, None,
                         (RungRecord(0, 111, v),))
             for i, lr, v in ((1, 1e-4, 1.5), (2, 2e-5, 2.0), (3, 1e-5, 2.5))]
    rows += [TrialRecord(4, {"training.learning_rate": 3e-4}, TrialState.COMPLETE, 1.2,
                         (RungRecord(0, 111, 0.9),))]
    rows += [TrialRecord(i, {"training.learning_rate": 1e-5 * (i + 1)}, TrialState.PRUNED,
                         None, (RungRecord(0, 111, 3.0),)) for i in range(5, 20)]
    proposed = [propose(space, rows, seed=s, n=1, goal="min", total=40,
                        prune_goal="min")[0]["training.learning_rate"] for s in range(10)]
    assert all(lr < 1e-2 for lr in proposed), proposed
