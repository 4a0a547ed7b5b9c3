"""Evaluation on a container rental (no Docker): lm-eval's `hf` backend in the trainer image.

Vast.ai and RunPod rent containers: the axolotl image is the runtime, there is no Docker to
start `vllm/vllm-openai` in, and the image has no vLLM, but it ships lm-eval 0.4.11 with
transformers (real-hosts.md §1, §6, §7). So the job's eval set and its lm-eval tasks run in
ONE `lm_eval --model hf` process (the model is loaded once):

- the eval set becomes an lm-eval `generate_until` task (`orch_eval_set`) over the uploaded
  JSON-lines rows, greedy, at most `max_tokens` new tokens; its generations come back
  through `--log_samples` and are scored here with the same `score_answer` as the vLLM
  path, so `eval.exact_match` / `eval.contains` mean the same on both kinds of host;
- the user's `eval.tasks` run in the same process; their metrics are named as on the vLLM
  path (`lm_eval.<task>.<metric>`).

Why not vLLM in a venv on the host: docs/playbooks.md ("Evaluation on container rentals")
has the cost estimate; for eval sets of the size jobs carry, installing vLLM costs more
GPU time than its faster generation saves.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .base import Emit, Fault, Host, Layout, Step, StepFailed, last_line, run_playbook
from .evalscore import (
    _TASK,
    PLAYBOOK,
    EvalResult,
    RowScore,
    _row,
    parse_lm_eval_results,
    score_answer,
)

EVAL_SET_TASK = "orch_eval_set"

Wrap = Callable[[Sequence[str]], list[str]]


def task_config(data_file: str, max_tokens: int) -> dict[str, Any]:
    """The lm-eval task that generates an answer for every eval row (written as JSON YAML)."""
    return {
        "task": EVAL_SET_TASK,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": data_file}},
        "test_split": "test",
        "output_type": "generate_until",
        # Field names, not Jinja templates: lm-eval then passes the row's text unchanged
        # (a template would drop a prompt's trailing newline).
        "doc_to_text": "prompt",
        "doc_to_target": "expected",
        # Greedy like the vLLM path's temperature 0; no stop string (vLLM uses none).
        "generation_kwargs": {"until": [], "max_gen_toks": max_tokens, "do_sample": False},
        "metric_list": [{"metric": "exact_match"}],
    }


def native_argv(model_dir: str, tasks: Sequence[str], include_path: str | None,
                output_dir: str, max_model_len: int, lora: str | None = None) -> list[str]:
    """`lm_eval --model hf ...` for the merged model (or base + `lora` adapter)."""
    bad = [t for t in tasks if not _TASK.fullmatch(t)]
    if bad:
        raise StepFailed(f"eval.tasks: invalid task name(s) {bad}", fault=Fault.USER)
    for value in (model_dir, lora or ""):
        if "," in value:
            raise ValueError(f"',' cannot be passed in lm_eval model_args ({value!r})")
    model_args = [f"pretrained={model_dir}", "dtype=bfloat16", f"max_length={max_model_len}"]
    if lora:
        model_args.append(f"peft={lora}")
    argv = ["env", "HF_HUB_OFFLINE=1", "lm_eval", "--model", "hf",
            "--model_args", ",".join(model_args), "--tasks", ",".join(tasks),
            "--batch_size", "auto", "--output_path", output_dir, "--log_samples"]
    if include_path:
        argv += ["--include_path", include_path]
    return argv


def _newest(host: Host, folder: str, pattern: str) -> str | None:
    found = host.must(["find", folder, "-type", "f", "-name", pattern, "-printf", "%T@ %p\\n"],
                      "finding lm_eval's output").stdout.splitlines()
    entries = [line.split(" ", 1) for line in found if " " in line]
    return max(entries, key=lambda e: float(e[0]))[1] if entries else None


def score_samples(samples: Iterable[Mapping[str, Any]],
                  rows: Sequence[tuple[str, str]]) -> tuple[dict[str, float], list[RowScore]]:
    """The eval set's metrics from lm_eval's logged samples (one per row, by doc_id)."""
    answers: dict[int, str] = {}
    for sample in samples:
        filtered = sample.get("filtered_resps") or [""]
        answers[int(sample["doc_id"])] = str(filtered[0])
    if set(answers) != set(range(len(rows))):
        raise StepFailed(f"lm_eval answered {len(answers)} of {len(rows)} eval rows",
                         fault=Fault.HOST)
    scored = []
    for index, (prompt, expected) in enumerate(rows):
        exact, contains = score_answer(answers[index], expected)
        scored.append(RowScore(index, prompt, expected, answers[index], exact, contains))
    n = len(scored)
    metrics: dict[str, float] = {
        "eval.exact_match": sum(r.exact_match for r in scored) / n if n else 0.0,
        "eval.contains": sum(r.contains for r in scored) / n if n else 0.0,
        "eval.count": n,
    }
    return metrics, scored


def evaluate_native(host: Host, job_id: str, model_dir_host: str, layout: Layout,
                    max_model_len: int, eval_rows: Iterable[Mapping[str, Any]] | None,
                    *, tasks: Sequence[str] = (), lora: str | None = None,
                    max_tokens: int = 64, timeout_s: float = 4 * 3600,
                    emit: Emit, wrap: Wrap = list) -> EvalResult:
    """Steps `lm-eval-present`, `upload-eval-set` (with rows), `lm-eval`: see the docstring.

    `wrap` restores the trainer image's environment around a native command
    (`train.NativeEnv.wrap`): SSH sessions on a rental do not see the image's PATH.
    """
    result = EvalResult()
    rows = [_row(i, row) for i, row in enumerate(eval_rows)] if eval_rows is not None else None
    eval_dir = f"{layout.job_dir(job_id)}/eval"
    data_file, task_dir = f"{eval_dir}/eval_set.jsonl", f"{eval_dir}/tasks"
    output = f"{eval_dir}/lm_eval_hf"
    names = list(tasks) + ([EVAL_SET_TASK] if rows else [])
    done: set[str] = set()  # steps applied in this call (each check reads it)

    def present(h: Host) -> bool:
        if not h.run(wrap(["sh", "-c", "command -v lm_eval"])).ok:
            raise StepFailed("lm_eval is not installed on the host (the axolotl images ship "
                             "it: is the job's image one of them?): use an axolotl image, or "
                             "remove eval.tasks from the job", fault=Fault.HOST)
        return True

    def upload(h: Host) -> None:
        assert rows is not None
        h.must(["mkdir", "-p", task_dir], "creating the eval directory")
        with tempfile.TemporaryDirectory(prefix="orch-eval-") as tmp:
            local = Path(tmp)
            (local / "rows.jsonl").write_text("".join(
                json.dumps({"prompt": p, "expected": e}) + "\n" for p, e in rows))
            (local / "task.yaml").write_text(json.dumps(task_config(data_file, max_tokens),
                                                        indent=1))
            h.put(str(local / "rows.jsonl"), data_file)
            h.put(str(local / "task.yaml"), f"{task_dir}/{EVAL_SET_TASK}.yaml")
        done.add("upload")

    def run(h: Host) -> None:
        h.must(["rm", "-rf", output], "clearing earlier lm_eval output")
        argv = native_argv(model_dir_host, names, task_dir if rows else None, output,
                           max_model_len, lora)
        proc = h.run(wrap(argv), timeout=timeout_s)
        if not proc.ok:
            raise StepFailed(f"lm_eval --model hf failed (exit {proc.exit_code}): "
                             f"{last_line(proc.stderr or proc.stdout)}", fault=Fault.HOST,
                             stderr=proc.stderr)
        path = _newest(h, output, "results_*.json")
        raw = h.read(path) if path else None
        if raw is None:
            raise StepFailed(f"lm_eval finished but wrote no results_*.json under {output}",
                             fault=Fault.HOST)
        metrics = parse_lm_eval_results(raw)
        result.metrics.update({k: v for k, v in metrics.items()
                               if not k.startswith(f"lm_eval.{EVAL_SET_TASK}.")})
        if tasks:
            result.lm_eval_results = path
        if rows:
            samples_path = _newest(h, output, f"samples_{EVAL_SET_TASK}_*.jsonl")
            text = h.read(samples_path) if samples_path else None
            if text is None:
                raise StepFailed("lm_eval wrote no samples for the eval set", fault=Fault.HOST)
            samples = [json.loads(line) for line in text.decode().splitlines() if line.strip()]
            scores, result.rows = score_samples(samples, rows)
            result.metrics.update(scores)
        done.add("run")

    steps = [Step("lm-eval-present", present, timeout_s=60)]
    if rows:
        steps.append(Step("upload-eval-set", lambda h: "upload" in done, upload,
                          timeout_s=600))
    if names:
        steps.append(Step("lm-eval", lambda h: "run" in done, run, timeout_s=timeout_s + 300))
    elif rows is not None:
        result.metrics["eval.count"] = 0
    result.reports += run_playbook(PLAYBOOK, steps, host, emit)
    return result
