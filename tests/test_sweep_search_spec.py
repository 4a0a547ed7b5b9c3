"""A sweep file's `search:` and `early_stop:`: validation with file:line, draws, identities."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from orchestrator.core.searchspec import EarlyStopSpec, rung_fractions, space_size
from orchestrator.core.spec import SpecError
from orchestrator.core.sweepspec import load_sweep, run_for

BASE = """\
name: base-job
base_model: Qwen/Qwen2.5-0.5B
method: lora
lora: {r: 16}
training:
  learning_rate: 2.0e-4
dataset:
  path: data/train.jsonl
  tokens: 100000
resources:
  providers: [sim]
"""
EVAL_SPLIT = "trainer: {extra: {eval_steps: 10}}\n"


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    jobs = tmp_path / "jobs"
    (jobs / "data").mkdir(parents=True)
    (jobs / "data" / "train.jsonl").write_text(
        json.dumps({"instruction": "say hi", "output": "hi"}) + "\n")
    (jobs / "base.yml").write_text(BASE)
    (jobs / "split.yml").write_text(BASE.replace("training:\n", "training:\n  val_set_size: 0.05\n")
                                    + EVAL_SPLIT)
    return tmp_path


def write(folder: Path, text: str) -> Path:
    path = folder / "sweep.yml"
    path.write_text(textwrap.dedent(text))
    return path


def problems(path: Path) -> list[str]:
    with pytest.raises(SpecError) as info:
        load_sweep(path)
    return info.value.problems


GRID = """\
    name: s
    base: jobs/base.yml
    grid:
      training.learning_rate: [1.0e-4, 2.0e-4, 5.0e-4]
      lora.r: [8, 16, 32]
      training.epochs: [1, 2, 3]
    objective: {metric: train.eval_loss, goal: min}
"""


def test_a_file_without_the_new_sections_keeps_its_identity(folder: Path) -> None:
    plain = load_sweep(write(folder, GRID))
    assert "search" not in plain.spec_json and "early_stop" not in plain.spec_json
    explicit = load_sweep(write(folder, GRID + "    search: {sampler: grid}\n"))
    # Given, even at its default, a section is part of the identity (it was written).
    assert '"search":{"sampler":"grid","seed":0,"trials":null}' in explicit.spec_json
    assert [r.sweep_key for r in explicit.runs] == [r.sweep_key for r in plain.runs]


def test_grid_sampler_runs_every_point_and_refuses_trials(folder: Path) -> None:
    sweep = load_sweep(write(folder, GRID + "    search: {sampler: grid}\n"))
    assert len(sweep.runs) == 27 and sweep.sampler == "grid"
    path = write(folder, GRID + "    search: {sampler: grid, trials: 5}\n")
    assert problems(path) == [
        f"{path}:8 search.trials: a grid runs every combination of grid; remove trials, or use "
        "sampler: random or tpe to run only that many"]


def test_random_sampler_draws_trials_over_grid_lists_and_distributions(folder: Path) -> None:
    sweep = load_sweep(write(folder, GRID + """\
    search: {sampler: random, trials: 6, seed: 3}
    random:
      params:
        lora.dropout: {uniform: [0.0, 0.1]}
    """))
    assert len(sweep.runs) == 6
    for run in sweep.runs:
        assert list(run.params) == ["training.learning_rate", "lora.r", "training.epochs",
                                    "lora.dropout"]
        assert run.params["lora.r"] in (8, 16, 32)
        assert 0.0 <= run.params["lora.dropout"] <= 0.1
    again = load_sweep(folder / "sweep.yml")
    assert [r.params for r in again.runs] == [r.params for r in sweep.runs]


def test_random_sampler_without_grid_draws_what_the_random_section_draws(folder: Path) -> None:
    params = """\
      params:
        training.learning_rate: {loguniform: [1.0e-5, 1.0e-3]}
        lora.r: {choice: [8, 16, 32]}
    """
    old = load_sweep(write(folder, """\
    name: s
    base: jobs/base.yml
    random:
      n: 4
      seed: 9
""" + params))
    new = load_sweep(write(folder, """\
    name: s
    base: jobs/base.yml
    search: {sampler: random, trials: 4, seed: 9}
    random:
""" + params))
    assert [r.params for r in new.runs] == [r.params for r in old.runs]


def test_tpe_proposes_later_but_checks_every_value_now(folder: Path) -> None:
    sweep = load_sweep(write(folder, GRID + "    search: {sampler: tpe, trials: 9}\n"))
    assert sweep.sampler == "tpe" and sweep.runs == ()
    assert [p.key for p in sweep.space] == ["training.learning_rate", "lora.r",
                                           "training.epochs"]
    assert space_size(sweep.space) == 27
    run = run_for(sweep, {"training.learning_rate": 5.0e-4, "lora.r": 32,
                          "training.epochs": 2}, 7)
    assert run.job.spec.name == "s-007" and run.job.spec.lora.r == 32
    assert run.index == 7 and len(run.sweep_key) == 64
    # A value the base job refuses is reported at its line when the file is loaded.
    path = write(folder, GRID.replace("[8, 16, 32]", "[8, 0]")
                 + "    search: {sampler: tpe, trials: 4}\n")
    assert problems(path) == [f"{path}:5 grid.lora.r[1]: must be > 0 (got 0)"]


def test_search_problems_name_the_line_and_the_fix(folder: Path) -> None:
    path = write(folder, """\
    name: s
    base: jobs/base.yml
    grid:
      lora.r: [8, 16]
    random:
      n: 2
      params: {lora.dropout: {uniform: [0.0, 0.1]}}
    search: {sampler: tpe}
    """)
    assert problems(path) == [
        f"{path}:6 random.n: with search.sampler tpe the number of runs is search.trials; "
        "remove random.n (random.params stay the space)",
        f"{path}:8 search.sampler: sampler tpe needs search.trials: how many runs in all, "
        "e.g. trials: 12",
        f"{path}:8 search.sampler: tpe proposes runs from the ended runs' objective: add "
        "objective: {metric: ..., goal: min or max}",
    ]
    path = write(folder, GRID + "    search: {sampler: random, trials: 28}\n")
    assert problems(path) == [
        f"{path}:8 search.trials: the space has 27 points (grid and random choices); "
        "trials: 28 would repeat runs; at most 27"]
    path = write(folder, GRID + "    search: {sampler: tpa, trials: 3, sed: 1}\n")
    assert problems(path) == [
        f"{path}:8 search.sampler: must be one of grid, random, tpe (got 'tpa'); did you "
        "mean 'tpe'?",
        f"{path}:8 search.sed: unknown key; did you mean 'seed'?"]


def test_early_stop_problems(folder: Path) -> None:
    path = write(folder, GRID + """\
    early_stop:
      metric: train.eval_loss
      min_fraction: 1.5
      reduction_factor: 1
    """)
    assert problems(path) == [
        f"{path}:10 early_stop.min_fraction: must be < 1 (got 1.5)",
        f"{path}:11 early_stop.reduction_factor: must be >= 2 (got 1)"]
    path = write(folder, GRID + "    early_stop: {metric: train.eval_loss}\n")
    assert problems(path) == [
        f"{path}:8 early_stop.metric: train.eval_loss is reported only when the base job "
        "holds out an eval split: add training: {val_set_size: 0.05} and trainer: "
        "{extra: {eval_steps: 10}} to the base job file, or use metric: train.loss"]
    split = write(folder, GRID.replace("jobs/base.yml", "jobs/split.yml")
                  + "    early_stop: {metric: train.eval_loss, min_fraction: 0.1}\n")
    loaded = load_sweep(split)
    assert loaded.spec.early_stop is not None and len(loaded.runs) == 27
    assert '"early_stop":{"goal":"min","metric":"train.eval_loss"' in loaded.spec_json


def test_rungs_are_shares_of_a_run() -> None:
    assert rung_fractions(EarlyStopSpec(min_fraction=0.1, reduction_factor=3)) == \
        pytest.approx([0.1, 0.3, 0.9])
    assert rung_fractions(EarlyStopSpec(min_fraction=0.5, reduction_factor=2)) == [0.5]
    assert len(rung_fractions(EarlyStopSpec(min_fraction=0.001, reduction_factor=2))) == 8


def test_the_docs_sweep_file_loads_beside_the_examples(tmp_path: Path) -> None:
    import re
    import shutil

    root = Path(__file__).resolve().parent.parent
    text = (root / "docs" / "sweeps-search.md").read_text()
    block = re.search(r"```yaml\n(.*?)```", text, re.S)
    assert block is not None
    shutil.copytree(root / "examples", tmp_path / "examples")
    path = tmp_path / "examples" / "sweep-search.yml"
    path.write_text(block.group(1))
    loaded = load_sweep(path)
    assert loaded.sampler == "tpe" and space_size(loaded.space) == 27
    assert loaded.spec.early_stop is not None and loaded.spec.search is not None
    assert loaded.spec.search.trials == 22
