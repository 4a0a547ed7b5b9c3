"""docs/job-file.md is generated from the models and current; `orch models` explains sizing."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import orchfork
from termutil import ROOT

from orchestrator.cli import jobdoc
from orchestrator.core.architectures import known_models
from orchestrator.core.spec import JobSpec, load_job
from orchestrator.core.sweepspec import SweepSpec

DOC = ROOT / "docs" / "job-file.md"


def orch(*args: str) -> str:
    env = {**os.environ, "COLUMNS": "200"}
    return orchfork.run(list(args), env=env, cwd=ROOT, check=True, timeout=60).stdout


def test_committed_doc_is_what_the_generator_prints() -> None:
    assert DOC.read_text() == jobdoc.render(), (
        "docs/job-file.md is stale: run `python -m orchestrator.cli.jobdoc > docs/job-file.md`")


def test_every_model_key_is_described() -> None:
    assert jobdoc.missing_descriptions() == []
    text = DOC.read_text()
    for dotted, _ in jobdoc.walk(JobSpec, "job") + jobdoc.walk(SweepSpec, "sweep"):
        assert f"| `{dotted.rsplit('.', 1)[-1]}` |" in text, dotted
    for words in ("HF_TOKEN", "orch models", "architecture", "objective", "loguniform"):
        assert words in text


def test_doc_tables_show_real_defaults_and_limits() -> None:
    text = DOC.read_text()
    assert re.search(r"\| `sequence_len` \| integer \| `2048` \| >= 16, <= 1048576 \|", text)
    assert "| `spot` | one of `allowed`, `required`, `never` | `allowed` |" in text
    assert "| `max_parallel` | integer | `4` | >= 1 |" in text


def test_the_docs_minimal_job_is_valid(tmp_path: Path) -> None:
    text = DOC.read_text()
    example = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text(
        '{"instruction": "Say hi", "input": "", "output": "hi"}\n')
    job = tmp_path / "job.yml"
    job.write_text(example)
    assert load_job(job).spec.method == "qlora"


def test_orch_models_lists_the_known_models_and_how_to_size_any_other(tmp_path: Path) -> None:
    out = orch("models")
    rows = [line.split("\t") for line in out.split("\n\n")[0].splitlines()[1:]]
    assert sorted(r[0] for r in rows) == sorted({m.repo for m in known_models().values()})
    data = json.loads(orch("models", "--json"))
    assert len(data["models"]) == len(rows)
    # The printed `architecture:` keys are exactly what sizing an unknown model needs.
    line = next(ln for ln in out.splitlines() if "architecture: {" in ln)
    keys = re.findall(r"(\w+): \.\.", line)
    assert keys == data["architecture_required"]
    fields = {"hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 16,
              "intermediate_size": 5632, "vocab_size": 32000}
    assert set(fields) == set(keys)
    (tmp_path / "train.jsonl").write_text('{"instruction": "a", "input": "", "output": "b"}\n')
    job = tmp_path / "job.yml"
    job.write_text("name: other\nmethod: lora\ndataset: {path: train.jsonl}\n"
                   "base_model: {repo: my-org/unknown-1b, architecture: "
                   + json.dumps(fields) + "}\n")
    assert load_job(job).architecture.hidden_size == 2048
    assert "HF_TOKEN" in out


def test_sweep_show_is_the_one_spelling_in_help() -> None:
    help_text = orch("--help")
    assert "sweep-show" not in help_text and "sweep " in help_text
