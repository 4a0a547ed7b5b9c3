"""Hostile job files (issue 10 §5): each exits 2 with `file:line field: problem`, writes
nothing, and neither crashes, hangs nor eats memory.

Commands run in-process through typer's CliRunner (fast), except those that could hang or
exhaust memory before the fix, which run as real processes under a timeout and a memory cap.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from orchestrator.cli.app import app

HEAD = """\
name: t
base_model: meta-llama/Llama-3.2-1B
method: qlora
dataset: {path: train.jsonl}
resources: {providers: [sim]}
"""
ROW = {"instruction": "Say hi", "input": "", "output": "hi there"}


def job_file(tmp_path: Path, text: str) -> Path:
    (tmp_path / "train.jsonl").write_text(json.dumps(ROW) + "\n")
    path = tmp_path / "job.yml"
    path.write_text(text)
    return path


def env_for(tmp_path: Path) -> dict[str, str | None]:
    # None: ORCH_DB_URL unset (the default SQLite file); an empty value is an error.
    return {"XDG_DATA_HOME": str(tmp_path / "xdg"), "ORCH_DB_URL": None}


def invoke(tmp_path: Path, *args: str) -> Result:
    result = CliRunner().invoke(app, list(args), env=env_for(tmp_path))
    # Anything but SystemExit (typer.Exit included) escaping the command is a traceback.
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"orch {' '.join(args)} raised {result.exception!r}\n{result.output}")
    return result


def jobs_in_db(tmp_path: Path) -> int:
    db = tmp_path / "xdg" / "orch" / "orch.db"
    if not db.exists():
        return 0
    con = sqlite3.connect(db)
    try:
        return int(con.execute("SELECT count(*) FROM job").fetchone()[0])
    except sqlite3.OperationalError:
        return 0
    finally:
        con.close()


def assert_refused(tmp_path: Path, path: Path, *needles: str) -> str:
    """plan and submit --dry-run both exit 2, name the problem, and record nothing."""
    out = ""
    for args in (["plan", str(path)], ["submit", "--dry-run", str(path)]):
        result = invoke(tmp_path, *args)
        assert result.exit_code == 2, (args, result.exit_code, result.output)
        assert "Traceback" not in result.output
        for needle in needles:
            assert needle in result.output, (needle, result.output)
        out = result.output
    assert jobs_in_db(tmp_path) == 0
    return out


def test_recursive_alias_is_refused(tmp_path: Path) -> None:
    path = job_file(tmp_path, HEAD + "trainer: {extra: {a: &a [*a]}}\n")
    assert_refused(tmp_path, path, f"{path}:6", "recursive")


def test_an_integer_with_5000_digits_is_refused(tmp_path: Path) -> None:
    path = job_file(tmp_path, HEAD + "lora: {r: " + "9" * 5000 + "}\n")
    out = assert_refused(tmp_path, path, f"{path}:6", "lora.r")
    assert len(out) < 2000  # the number is not echoed back in full


def test_a_token_count_beyond_what_the_math_holds_is_refused(tmp_path: Path) -> None:
    text = HEAD.replace("dataset: {path: train.jsonl}",
                        "dataset: {path: train.jsonl, tokens: 99999999999999999999999999}")
    path = job_file(tmp_path, text)
    assert_refused(tmp_path, path, f"{path}:4 dataset.tokens", "<=")


@pytest.mark.parametrize("field", [
    "training: {gradient_accumulation_steps: 99999999999999999999}",
    "resources: {providers: [sim], max_cost: 1e30}",
    "resources: {providers: [sim], deadline_hours: .inf}",
    "lora: {alpha: 99999999999999999999}",
    "base_model: {repo: a/b, architecture: {hidden_size: 99999999999999999999, "
    "num_hidden_layers: 2, num_attention_heads: 2, intermediate_size: 8, vocab_size: 8}}",
])
def test_every_number_is_bounded(tmp_path: Path, field: str) -> None:
    key = field.split(":", 1)[0]
    text = HEAD.replace("resources: {providers: [sim]}\n", "") if key == "resources" else HEAD
    if key == "base_model":
        text = text.replace("base_model: meta-llama/Llama-3.2-1B\n", "")
    path = job_file(tmp_path, text + field + "\n")
    assert_refused(tmp_path, path, f"{path}:")


def test_trainer_extra_nested_too_deep_is_refused(tmp_path: Path) -> None:
    deep = "{a: " * 260 + "1" + "}" * 260
    path = job_file(tmp_path, HEAD + f"trainer: {{extra: {deep}}}\n")
    assert_refused(tmp_path, path, f"{path}:6", "deep")


@pytest.mark.parametrize(("key", "field"), [
    ("learning_rate", "training.learning_rate"),
    ("num_epochs", "training.epochs"),
    ("lora_r", "lora.r"),
    ("adapter", "method"),
])
def test_trainer_extra_cannot_replace_a_validated_key(tmp_path: Path, key: str,
                                                     field: str) -> None:
    path = job_file(tmp_path, HEAD + f"trainer:\n  extra:\n    {key}: -5\n")
    assert_refused(tmp_path, path, f"{path}:8 trainer.extra.{key}", field)


def test_trainer_extra_cannot_set_what_orch_owns(tmp_path: Path) -> None:
    path = job_file(tmp_path, HEAD + "trainer: {extra: {output_dir: /tmp/elsewhere}}\n")
    assert_refused(tmp_path, path, "trainer.extra.output_dir", "set by orch")


def test_trainer_extra_may_add_keys(tmp_path: Path) -> None:
    """Keys orch does not own pass: the job plans, and the trainer's config has them."""
    path = job_file(tmp_path, HEAD + "trainer: {extra: {warmup_steps: 10, "
                    "lr_scheduler: cosine}}\n")
    planned = invoke(tmp_path, "plan", "--json", str(path))
    assert planned.exit_code == 0, planned.output
    assert json.loads(planned.output)["job"] == "t"
    rendered = invoke(tmp_path, "render", "--json", str(path))
    assert rendered.exit_code == 0, rendered.output
    config = json.loads(rendered.output)["axolotl_config"]
    assert config["warmup_steps"] == 10 and config["lr_scheduler"] == "cosine"


# --- paths that are not regular files: run as processes, bounded in time and memory -----


def orch_process(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("orch", path=str(Path(sys.executable).parent)) or "orch"
    env = {k: v for k, v in {**os.environ, **env_for(tmp_path)}.items() if v is not None}

    def limit_memory() -> None:  # 2 GiB of address space: plenty for orch, not for /dev/zero
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    return subprocess.run([exe, *args], env=env, capture_output=True, text=True, timeout=60,
                          preexec_fn=limit_memory)


@pytest.mark.parametrize("target", ["/dev/zero", "fifo"])
def test_config_that_is_not_a_regular_file_is_refused(tmp_path: Path, target: str) -> None:
    if target == "fifo":
        os.mkfifo(tmp_path / "config.json")
        target = "config.json"
    text = HEAD.replace("base_model: meta-llama/Llama-3.2-1B",
                        f"base_model: {{repo: a/b, config: {target}}}")
    path = job_file(tmp_path, text)
    proc = orch_process(tmp_path, "plan", str(path))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"{path}:2 base_model.config" in proc.stderr and "regular file" in proc.stderr


@pytest.mark.parametrize("field", ["dataset", "eval_set", "job"])
def test_fifo_inputs_do_not_block(tmp_path: Path, field: str) -> None:
    path = job_file(tmp_path, HEAD + "eval: {eval_set: eval.jsonl}\n")
    (tmp_path / "eval.jsonl").write_text(json.dumps({"prompt": "a", "expected": "b"}) + "\n")
    name = {"dataset": "train.jsonl", "eval_set": "eval.jsonl", "job": "job.yml"}[field]
    (tmp_path / name).unlink()
    os.mkfifo(tmp_path / name)
    proc = orch_process(tmp_path, "plan", str(path))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "regular file" in proc.stderr


def test_a_huge_job_file_is_refused_without_reading_it_all(tmp_path: Path) -> None:
    path = job_file(tmp_path, HEAD + "#" + "x" * (2 << 20) + "\n")
    result = invoke(tmp_path, "plan", str(path))
    assert result.exit_code == 2 and "MiB" in result.output, result.output


def test_tokens_times_epochs_is_bounded(tmp_path: Path) -> None:
    text = HEAD.replace("dataset: {path: train.jsonl}",
                        "dataset: {path: train.jsonl, tokens: 1000000000000000}")
    path = job_file(tmp_path, text + "training: {epochs: 1000}\n")
    assert_refused(tmp_path, path, f"{path}:6 training.epochs", "more than")
