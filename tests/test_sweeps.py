"""Sweep files: expansion, overrides, file:line errors, idempotency keys, best run."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from orchestrator.core import sweepspec as sweeps
from orchestrator.core.spec import SpecError, load_job, spec_hash
from orchestrator.core.sweepspec import MAX_RUNS, Objective, load_sweep, sweep_key
from orchestrator.records.sweep.rules import best_run

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

BASE = """\
name: base-job
base_model: meta-llama/Llama-3.1-8B
method: qlora
lora: {r: 16}
training:
  learning_rate: 2.0e-4
dataset:
  path: data/train.jsonl
  tokens: 1000000
resources:
  spot: allowed
"""


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A base job file `jobs/base.yml` with its dataset in `jobs/data/`."""
    jobs = tmp_path / "jobs"
    (jobs / "data").mkdir(parents=True)
    (jobs / "data" / "train.jsonl").write_text(
        json.dumps({"instruction": "say hi", "output": "hi"}) + "\n")
    (jobs / "base.yml").write_text(BASE)
    return tmp_path


def write(folder: Path, text: str, name: str = "sweep.yml") -> Path:
    """The sweep file `name` in `folder` (its base is jobs/base.yml unless it says so)."""
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


def problems(path: Path) -> list[str]:
    with pytest.raises(SpecError) as info:
        load_sweep(path)
    return info.value.problems


def test_grid_expands_in_file_order_last_key_fastest(folder: Path) -> None:
    path = write(folder, """\
        name: lr
        base: jobs/base.yml
        grid:
          training.learning_rate: [1.0e-4, 2.0e-4, 5.0e-4]
          lora.r: [8, 16]
    """)
    sweep = load_sweep(path)
    assert [r.params for r in sweep.runs] == [
        {"training.learning_rate": lr, "lora.r": r}
        for lr in (1.0e-4, 2.0e-4, 5.0e-4) for r in (8, 16)]
    assert [r.index for r in sweep.runs] == list(range(6))
    assert [r.job.spec.name for r in sweep.runs] == [f"lr-{i:03d}" for i in range(6)]
    assert [(r.job.spec.training.learning_rate, r.job.spec.lora.r) for r in sweep.runs] == \
        [(lr, r) for lr in (1.0e-4, 2.0e-4, 5.0e-4) for r in (8, 16)]
    # Resolved as the base file: its dataset path stays relative to jobs/.
    assert all(r.job.path == folder / "jobs" / "base.yml" for r in sweep.runs)
    assert sweep.runs[0].job.dataset.tokens == 1_000_000
    assert sweep.spec.max_parallel == 4 and sweep.spec.budget is None
    assert sweep.base.spec.name == "base-job"


def test_nested_overrides_and_keys_the_base_does_not_set(folder: Path) -> None:
    path = write(folder, """\
        name: nested
        base: jobs/base.yml
        grid:
          resources.gpus: [[RTX 4090], [A100 80GB, H100 SXM]]
          trainer.image: ["axolotlai/axolotl:0.18.0-py3.12-cu130-2.11.0"]
          base_model.revision: [abc123]
          eval.tasks: [[mmlu]]
    """)
    runs = load_sweep(path).runs
    assert [r.job.spec.resources.gpus for r in runs] == [["RTX 4090"], ["A100 80GB", "H100 SXM"]]
    spec = runs[0].job.spec
    assert spec.trainer.image == "axolotlai/axolotl:0.18.0-py3.12-cu130-2.11.0"
    # `base_model: org/name` in the base becomes {repo, revision}.
    assert (spec.base_model.repo, spec.base_model.revision) == ("meta-llama/Llama-3.1-8B",
                                                                "abc123")
    assert spec.eval.tasks == ["mmlu"]
    assert spec.resources.spot == "allowed"  # the rest of the section is kept


def test_random_samples_are_reproducible_per_seed(folder: Path) -> None:
    text = """\
        name: rnd
        base: jobs/base.yml
        random:
          n: 8
          seed: {seed}
          params:
            training.learning_rate: {{loguniform: [1.0e-5, 1.0e-3]}}
            lora.r: {{choice: [8, 16, 32]}}
            training.micro_batch_size: {{int: [1, 4]}}
            lora.dropout: {{uniform: [0.0, 0.1]}}
    """
    a = load_sweep(write(folder, text.format(seed=1), "a.yml"))
    again = load_sweep(write(folder, text.format(seed=1), "b.yml"))
    other = load_sweep(write(folder, text.format(seed=2), "c.yml"))
    assert len(a.runs) == 8
    assert [r.params for r in a.runs] == [r.params for r in again.runs]
    assert [r.sweep_key for r in a.runs] == [r.sweep_key for r in again.runs]
    assert [r.params for r in a.runs] != [r.params for r in other.runs]
    for run in a.runs:
        lr = run.params["training.learning_rate"]
        assert 1.0e-5 <= lr <= 1.0e-3 and float(f"{lr:.6g}") == lr
        assert run.params["lora.r"] in (8, 16, 32)
        assert run.params["training.micro_batch_size"] in (1, 2, 3, 4)
        assert 0 <= run.job.spec.lora.dropout <= 0.1
        assert run.job.spec.training.learning_rate == lr


def test_grid_points_come_first_then_random_samples(folder: Path) -> None:
    path = write(folder, """\
        name: both
        base: jobs/base.yml
        grid:
          lora.r: [8, 32]
        random:
          n: 2
          params:
            training.learning_rate: {loguniform: [1.0e-5, 1.0e-3]}
    """)
    runs = load_sweep(path).runs
    assert [list(r.params) for r in runs] == [["lora.r"], ["lora.r"],
                                              ["training.learning_rate"],
                                              ["training.learning_rate"]]
    assert runs[2].job.spec.lora.r == 16  # a sample keeps the base's other values


def test_duplicate_runs_collapse_to_one(folder: Path) -> None:
    path = write(folder, """\
        name: dup
        base: jobs/base.yml
        grid:
          lora.r: [8, 16, 8]
          training.learning_rate: [2.0e-4, 0.0002]
    """)
    sweep = load_sweep(path)
    assert [r.params for r in sweep.runs] == [{"lora.r": 8, "training.learning_rate": 2.0e-4},
                                              {"lora.r": 16, "training.learning_rate": 2.0e-4}]
    assert sweep.duplicates == 4
    assert [r.job.spec.name for r in sweep.runs] == ["dup-000", "dup-001"]


def test_name_is_indexed_unless_overridden(folder: Path) -> None:
    path = write(folder, """\
        name: named
        base: jobs/base.yml
        grid:
          name: [first-try, second-try]
    """)
    assert [r.job.spec.name for r in load_sweep(path).runs] == ["first-try", "second-try"]


def test_sweep_key_is_stable_across_processes() -> None:
    here = sweep_key("lr-sweep", "ab" * 32)
    code = ("from orchestrator.core.sweepspec import sweep_key; "
            f"print(sweep_key('lr-sweep', '{'ab' * 32}'))")
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, cwd=Path(__file__).resolve().parent.parent).stdout.strip()
    assert here == there and len(here) == 64 and int(here, 16) >= 0
    assert sweep_key("lr-sweep", "cd" * 32) != here
    assert sweep_key("other", "ab" * 32) != here


def test_run_keys_survive_reordering_the_grid(folder: Path) -> None:
    # The key ignores the indexed job name: editing the grid does not resubmit old points.
    one = load_sweep(write(folder, """\
        name: keys
        base: jobs/base.yml
        grid:
          lora.r: [8, 16]
    """, "one.yml"))
    two = load_sweep(write(folder, """\
        name: keys
        base: jobs/base.yml
        grid:
          lora.r: [4, 16, 8]
    """, "two.yml"))
    by_r = {r.job.spec.lora.r: r.sweep_key for r in two.runs}
    assert [r.sweep_key for r in one.runs] == [by_r[8], by_r[16]]
    assert one.runs[0].job.spec.name == "keys-000" and two.runs[2].job.spec.name == "keys-002"
    assert one.runs[0].job.spec_hash == spec_hash(one.runs[0].job.spec)


def test_best_run_by_goal_ignoring_missing_values_and_keeping_the_earliest_tie() -> None:
    rows = [("a", 0.5), ("b", None), ("c", 0.7), ("d", 0.7), ("e", 0.1), ("f", float("nan"))]
    assert best_run(rows, Objective(metric="eval.exact_match", goal="max")) == "c"
    assert best_run(rows, Objective(metric="eval.loss", goal="min")) == "e"
    assert best_run([("x", None)], Objective(metric="m")) is None
    assert best_run([], Objective(metric="m")) is None


def test_unknown_keys_name_the_line_and_the_valid_keys(folder: Path) -> None:
    path = write(folder, """\
        name: bad
        base: jobs/base.yml
        grid:
          training.lerning_rate: [1.0e-4]
          bogus: [1]
          resources.max_gpus.x: [1]
        objective: {metric: m, goal: maximum}
        retries: 3
    """)
    assert problems(path) == [
        f"{path}:4 grid.training.lerning_rate: not a job-file key; did you mean "
        "'training.learning_rate'? training has: sequence_len, micro_batch_size, "
        "gradient_accumulation_steps, epochs, learning_rate, optimizer, "
        "gradient_checkpointing, packing, cross_entropy, activation_offloading, val_set_size, "
        "stop_on_nan",
        f"{path}:5 grid.bogus: not a job-file key; a job file has: name, base_model, method, "
        "lora, training, dataset, datasets, eval, resources, trainer, output, tracking, notify",
        f"{path}:6 grid.resources.max_gpus.x: resources.max_gpus is a single value, not a "
        "section; override it as a whole",
        f"{path}:7 objective.goal: must be one of max, min (got 'maximum'); did you mean "
        "'max'?",
        f"{path}:8 retries: unknown key; allowed here: name, base, grid, random, max_parallel, "
        "budget, objective, search, early_stop, notify",
    ]


def test_invalid_values_point_at_the_grid_value_and_its_key(folder: Path) -> None:
    path = write(folder, """\
        name: vals
        base: jobs/base.yml
        grid:
          training.learning_rate:
            - 1.0e-4
            - -1
          resources.gpus: [[B9000]]
          lora.r: []
        max_parallel: 0
        budget: -5
    """)
    got = problems(path)
    assert f"{path}:8 grid.lora.r: must list at least one value" in got
    assert f"{path}:9 max_parallel: must be >= 1 (got 0)" in got
    assert f"{path}:10 budget: must be > 0 (got -5)" in got
    fixed = path.read_text().replace("  lora.r: []\n", "").replace("max_parallel: 0", "") \
        .replace("budget: -5", "")
    path.write_text(fixed)
    got = problems(path)
    assert got[0] == f"{path}:6 grid.training.learning_rate[1]: must be > 0 (got -1)"
    assert got[1].startswith(f"{path}:7 grid.resources.gpus[0]: resources.gpus[0]: unknown "
                             "GPU 'B9000'")
    assert len(got) == 2


def test_bad_distributions(folder: Path) -> None:
    path = write(folder, """\
        name: dist
        base: jobs/base.yml
        random:
          n: 4
          params:
            training.learning_rate: {loguniform: [0, 1.0e-3]}
            training.epochs: {uniform: [3, 1]}
            lora.r: {int: [16, 8]}
            lora.alpha: {choice: []}
            lora.dropout: {normal: [0, 1]}
            training.micro_batch_size: {int: [1, 2, 3]}
    """)
    assert problems(path) == [
        f"{path}:6 random.params.training.learning_rate: loguniform needs lo > 0 "
        "(got [0.0, 0.001])",
        f"{path}:7 random.params.training.epochs: uniform needs lo < hi (got [3.0, 1.0])",
        f"{path}:8 random.params.lora.r: int needs lo <= hi (got [16, 8])",
        f"{path}:9 random.params.lora.alpha: choice must list at least one value",
        f"{path}:10 random.params.lora.dropout.normal: unknown distribution 'normal'; "
        "supported: loguniform, uniform, choice, int",
        f"{path}:11 random.params.training.micro_batch_size: int takes [lo, hi] "
        "(got [1, 2, 3])",
    ]


def test_a_sample_that_makes_the_job_invalid_is_reported_once(folder: Path) -> None:
    path = write(folder, """\
        name: drawn
        base: jobs/base.yml
        random:
          n: 10
          params:
            lora.dropout: {uniform: [2, 3]}
    """)
    got = problems(path)
    assert len(got) == 1
    assert got[0].startswith(f"{path}:6 random.params.lora.dropout: sample 1 of 10: must be "
                             "< 1 (got 2.")


def test_a_combination_the_base_rejects_names_both_files(folder: Path) -> None:
    path = write(folder, """\
        name: combo
        base: jobs/base.yml
        grid:
          method: [full]
    """)
    base = folder / "jobs" / "base.yml"
    assert problems(path) == [
        f"{base}:4 lora: only used by method qlora or lora; remove it for a full fine-tune "
        f"(in the run with method='full' from {path}:4)"]


def test_too_many_and_no_runs(folder: Path) -> None:
    path = write(folder, f"""\
        name: big
        base: jobs/base.yml
        grid:
          lora.r: {list(range(1, 101))}
          training.learning_rate: {[i / 1000 for i in range(1, 11)]}
          training.epochs: [1, 2]
    """)
    assert problems(path) == [
        f"{path}:3 grid: the sweep expands to 2,000 runs (2,000 grid points + 0 samples); at "
        f"most {MAX_RUNS:,}: trim the grid, split it into several sweeps, or sample randomly"]
    empty = write(folder, """\
        name: none
        base: jobs/base.yml
        grid: {}
    """, "empty.yml")
    assert problems(empty) == [f"{empty}:3 grid: the sweep expands to no runs; give grid "
                               "values or random.n > 0"]
    lonely = write(folder, """\
        name: lonely
        base: jobs/base.yml
        random: {n: 3}
    """, "lonely.yml")
    assert problems(lonely) == [f"{lonely}:3 random.n: draws 3 samples but random.params is "
                                "empty; add a distribution or set n: 0"]


def test_missing_base_and_bad_name(folder: Path) -> None:
    path = write(folder, """\
        name: -bad name
        base: jobs/nope.yml
        grid:
          lora.r: [8]
    """)
    got = problems(path)
    assert got[0].startswith(f"{path}:1 name: must be 1-60 letters, digits")
    assert got[1] == (f"{path}:2 base: file not found: {folder / 'jobs' / 'nope.yml'}; give "
                      "the job file's path (relative to the sweep file)")
    bare = write(folder, "grid: {lora.r: [8]}\n", "bare.yml")
    assert problems(bare) == [
        f"{bare}:1 name: required; add it (see examples/sweep-lr.yml)",
        f"{bare}:1 base: required; add it (see examples/sweep-lr.yml)",
    ]


def test_a_base_with_its_own_problems_is_reported_under_its_name(folder: Path) -> None:
    base = folder / "jobs" / "base.yml"
    base.write_text(BASE.replace("learning_rate: 2.0e-4", "learning_rate: -2"))
    path = write(folder, """\
        name: broken-base
        base: jobs/base.yml
        grid:
          lora.r: [8]
    """)
    assert problems(path) == [f"{base}:6 training.learning_rate: must be > 0 (got -2)"]


def test_not_a_sweep_file(folder: Path) -> None:
    assert problems(folder / "absent.yml") == [f"{folder / 'absent.yml'}: file not found"]
    listy = write(folder, "- 1\n", "list.yml")
    assert problems(listy)[0].startswith(f"{listy}:1 (top level): must be a mapping")


def test_the_example_sweep_loads() -> None:
    assert (EXAMPLES / "qlora-8b.yml").is_file()
    assert load_job(EXAMPLES / "qlora-8b.yml").spec.eval.eval_set
    sweep = load_sweep(EXAMPLES / "sweep-lr.yml")
    assert len(sweep.runs) == 6 and sweep.duplicates == 0
    assert sweep.spec.max_parallel == 2 and str(sweep.spec.budget) == "25"
    assert sweep.spec.objective == Objective(metric="eval.exact_match", goal="max")
    assert {r.job.spec.lora.r for r in sweep.runs} == {8, 16}
    assert all(r.job.spec.eval.eval_set for r in sweep.runs)
    assert len({r.sweep_key for r in sweep.runs}) == 6
    assert json.loads(sweep.spec_json)["budget"] == "25"


def test_check_key() -> None:
    assert sweeps.check_key("training.learning_rate") is None
    assert sweeps.check_key("trainer.extra.anything") is None
    assert sweeps.check_key("dataset.path.hf") is None
    assert sweeps.check_key("training..lr") == ("must be a dotted job-file key such as "
                                                "training.learning_rate")
