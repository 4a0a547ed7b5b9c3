"""Scoring a served model: the user's eval set over `/v1/completions`, lm-eval tasks.

The eval set (JSONL rows of `prompt`/`expected`) is scored at temperature 0; lm-evaluation-
harness tasks run against the same server with `--model local-completions`: on a Docker
host in a throwaway container of the trainer image (the host OS has no lm_eval; the image
does, real-hosts.md §1, §9), on a container rental natively in the rented image.
"""

from __future__ import annotations

import json
import logging
import re
import signal
import string
import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx

from providers import retrying

from . import images
from .base import (
    CONTAINER_ROOT,
    Fault,
    Host,
    Layout,
    StepFailed,
    StepReport,
    container_name,
)
from .vllm import SERVED_NAME, http_client

log = logging.getLogger(__name__)

PLAYBOOK = "evaluate"
# `sh -c` body run in the trainer image before lm_eval: add the `lm_eval[api]` extra to the
# image's venv with its uv ($1 uv, $2 the venv's python, $3 the requirement; images.yaml
# `lm_eval`), then run the rest. Values arrive as positional arguments, never inside the
# script text. lm_eval runs as the shell's child, not exec'd: when the OOM killer (or anyone)
# kills it, the shell exits 128 + the signal, where an exec'd process leaves SSH no exit
# status at all (-1). `--quiet` keeps uv's own lines out of the tail a failure reports (its
# errors still print).
ENSURE_API_EXTRA = ('"$1" pip install --quiet --python "$2" "$3" >&2 || exit; shift 3; "$@"; '
                    'exit $?')
# lm-eval's own max_length (images.yaml `lm_eval`): the context its requests are cut to.
LM_EVAL_MAX_LENGTH = int(images.catalog().lm_eval["max_length"])
# Lines of lm_eval's output a failure keeps in its message (the whole tail goes to stderr).
FAILURE_TAIL_LINES = 3


# --- scoring the user's eval set -------------------------------------------------------------

_ASCII_PUNCTUATION = frozenset(string.punctuation)


def normalise(text: str) -> str:
    """Text as exact match compares it.

    Unicode NFKC, case-folded, punctuation (Unicode category P and ASCII punctuation)
    removed, whitespace runs collapsed to one space and trimmed: "  Paris." == "paris".
    Removing (not spacing) punctuation makes "U.S.A." equal "USA", as SQuAD-style scoring
    does; articles and numbers are left alone.
    """
    text = unicodedata.normalize("NFKC", text).casefold()
    kept = "".join(ch for ch in text
                   if ch not in _ASCII_PUNCTUATION and not unicodedata.category(ch).startswith("P"))
    return " ".join(kept.split())


@dataclass(frozen=True)
class RowScore:
    """One eval row: what was asked, expected and answered, and how it scored."""

    index: int
    prompt: str
    expected: str
    answer: str
    exact_match: bool
    contains: bool


@dataclass(frozen=True)
class EvalScores:
    """The eval set's metrics and every row's result (kept for the job's report)."""

    metrics: dict[str, float]
    rows: list[RowScore]


def score_answer(answer: str, expected: str) -> tuple[bool, bool]:
    """(exact match, contains) after `normalise`; contains matches whole words only."""
    got, want = normalise(answer), normalise(expected)
    return got == want, f" {want} " in f" {got} "


def _row(index: int, row: Any) -> tuple[str, str]:
    if not (isinstance(row, Mapping) and isinstance(row.get("prompt"), str)
            and isinstance(row.get("expected"), str)):
        raise StepFailed(f"eval row {index + 1}: needs string 'prompt' and 'expected'",
                         fault=Fault.USER)
    return row["prompt"], row["expected"]


def score_eval_set(
    base_url: str,
    eval_rows: Iterable[Mapping[str, Any]],
    served_name: str = SERVED_NAME,
    concurrency: int = 8,
    max_tokens: int = 64,
    *,
    timeout_s: float = 120.0,
    retries: int = 3,
) -> EvalScores:
    """Score prompt/expected rows over POST /v1/completions at temperature 0.

    Metrics: `eval.exact_match` and `eval.contains` (fractions of rows, see `normalise`)
    and `eval.count`. A 5xx or dropped connection is retried `retries` times with backoff;
    a row that still fails fails the whole scoring (partial metrics would mislead).
    """
    rows = [_row(i, row) for i, row in enumerate(eval_rows)]
    if not rows:
        return EvalScores({"eval.count": 0}, [])
    workers = max(1, min(concurrency, len(rows)))
    with http_client(base_url.rstrip("/"), timeout_s, workers) as client:

        def one(item: tuple[int, tuple[str, str]]) -> RowScore:
            index, (prompt, expected) = item
            answer = _complete(client, served_name, prompt, max_tokens, retries)
            exact, contains = score_answer(answer, expected)
            return RowScore(index, prompt, expected, answer, exact, contains)

        pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="eval")
        try:
            scored = list(pool.map(one, enumerate(rows)))
        finally:
            # On a failure, rows not yet sent are dropped rather than sent for nothing.
            pool.shutdown(wait=True, cancel_futures=True)
    n = len(scored)
    metrics: dict[str, float] = {
        "eval.exact_match": sum(r.exact_match for r in scored) / n,
        "eval.contains": sum(r.contains for r in scored) / n,
        "eval.count": n,
    }
    return EvalScores(metrics, scored)


class _Retryable(Exception):
    """A completion that failed for a passing reason: a 5xx or a dropped connection."""


def _complete(client: httpx.Client, model: str, prompt: str, max_tokens: int,
              retries: int) -> str:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}

    def once() -> str:
        try:
            response = client.post("/v1/completions", json=body)
        except httpx.TransportError as exc:
            raise _Retryable(f"{type(exc).__name__}: {exc}") from exc
        if response.status_code >= 500:
            raise _Retryable(f"HTTP {response.status_code}: {response.text[:300]}")
        if response.status_code != 200:
            raise StepFailed(
                f"POST /v1/completions for {model!r} returned {response.status_code}: "
                f"{response.text[:300]}", fault=Fault.HOST, stderr=response.text,
            )
        try:
            return str(response.json()["choices"][0]["text"])
        except (ValueError, KeyError, IndexError, TypeError):
            raise StepFailed(f"POST /v1/completions: unexpected response {response.text[:300]}",
                             fault=Fault.HOST) from None

    # 0.25 s, 0.5 s, … at most 4 s between tries, jittered: the rows are sent concurrently,
    # and a server that failed them together should not get them back together.
    try:
        return retrying.policy(_Retryable, attempts=retries + 1,
                               wait=retrying.backoff(0.25, 4.0, 0.25))(once)
    except _Retryable as exc:
        raise StepFailed(f"POST /v1/completions failed {retries + 1} times: {exc}",
                         fault=Fault.TRANSIENT) from None


# --- lm-evaluation-harness -------------------------------------------------------------------

_TASK = re.compile(r"[A-Za-z0-9_.:-]+")


def lm_eval_argv(
    tasks: Sequence[str],
    port: int,
    tokenizer_dir: str,
    output_dir: str,
    served_name: str = SERVED_NAME,
    num_concurrent: int = 8,
    max_retries: int = 3,
    limit: int | None = None,
    max_length: int = LM_EVAL_MAX_LENGTH,
) -> list[str]:
    """The `lm_eval --model local-completions ...` command (paths as the harness sees them).

    `max_length` is the server's context (`--max-model-len`): lm-eval truncates every
    request to it, so none is refused as too long. Requests go as token ids, encoded by
    the model's own tokenizer with its special tokens (`tokenized_requests=True,
    add_bos_token=True, tokenizer_backend=huggingface`): vLLM adds BOS to a text prompt
    (`add_special_tokens` defaults to true, vllm/entrypoints/openai/completion/protocol.py:88
    at v0.19.1) but not to token ids (vllm/renderers/base.py:423-433), while lm-eval counts
    a loglikelihood's context in its own encoding, without BOS unless add_bos_token
    (lm_eval 0.4.11 models/api_models.py:397-425, 551-572): with text prompts the scored span
    `token_logprobs[ctxlen:-1]` (openai_completions.py:113) slid one token into the context
    and shifted `acc_norm`. Token ids with BOS score the continuation, as the model saw text
    in training and as lm-eval's `hf` backend encodes it; lm-eval also checks and truncates
    generation contexts only for tokenized requests (api_models.py:713-760).

    `model_args` is a comma-separated key=value list, so a value holding ',' cannot be
    passed safely: that is refused rather than half-parsed by lm_eval.
    """
    if not tasks:
        raise ValueError("no lm-eval tasks given")
    bad = [t for t in tasks if not _TASK.fullmatch(t)]
    if bad:
        raise StepFailed(f"eval.tasks: invalid task name(s) {bad}", fault=Fault.USER)
    for value in (tokenizer_dir, served_name):
        if "," in value:
            raise ValueError(f"',' cannot be passed in lm_eval model_args ({value!r})")
    model_args = ",".join([
        f"model={served_name}",
        f"base_url=http://127.0.0.1:{port}/v1/completions",
        f"tokenizer={tokenizer_dir}",
        "tokenizer_backend=huggingface",
        "tokenized_requests=True",
        "add_bos_token=True",
        f"max_length={max_length}",
        f"num_concurrent={num_concurrent}",
        f"max_retries={max_retries}",
    ])  # fmt: skip
    argv = ["lm_eval", "--model", "local-completions", "--tasks", ",".join(tasks),
            "--model_args", model_args, "--output_path", output_dir]
    if limit is not None:
        argv += ["--limit", str(limit)]
    return argv


def parse_lm_eval_results(data: Mapping[str, Any] | str | bytes) -> dict[str, float]:
    """Metrics from an lm_eval results JSON: `results.<task>.<"metric,filter">`.

    Named `lm_eval.<task>.<metric>` for the usual filter `none`, else
    `lm_eval.<task>.<metric>.<filter>` (gsm8k reports both strict-match and
    flexible-extract). `*_stderr` twins, `alias` and non-numeric values ("N/A") are skipped.
    """
    doc = json.loads(data) if isinstance(data, str | bytes) else data
    results = doc.get("results")
    if not isinstance(results, Mapping):
        raise ValueError("not an lm_eval results file (no 'results' object)")
    metrics: dict[str, float] = {}
    for task, values in results.items():
        if not isinstance(values, Mapping):
            continue
        for key, value in values.items():
            metric, _, filt = str(key).partition(",")
            if metric.endswith("_stderr") or metric == "alias":
                continue
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue
            name = f"lm_eval.{task}.{metric}"
            if filt and filt != "none":
                name += f".{filt}"
            metrics[name] = float(value)
    return metrics


def _results_files(host: Host, output_dir: str) -> dict[str, float]:
    listing = host.must(["find", output_dir, "-type", "f", "-name", "results_*.json",
                         "-printf", "%T@ %p\\0"], "finding lm_eval's results")
    files: dict[str, float] = {}
    for entry in filter(None, listing.stdout.split("\0")):
        stamp, _, path = entry.partition(" ")
        try:
            files[path] = float(stamp)
        except ValueError:
            continue
    return files


@dataclass(frozen=True)
class LmEvalContainer:
    """Where lm-eval runs on a Docker host: a throwaway container of the trainer image that
    mounts orch's directory (`layout.base`) at /workspace/data."""

    job_id: str
    image: str
    layout: Layout

    @property
    def name(self) -> str:
        """The container's name (a leftover of a killed run is removed first)."""
        return container_name("lm-eval", self.job_id)

    def inside(self, path: str) -> str:
        """A host path as the harness sees it (under the mount)."""
        return self.layout.container(path)

    def argv(self, lm_eval: Sequence[str]) -> list[str]:
        """`docker run` of `lm_eval` (built with container paths) in the trainer image."""
        return [
            "docker", "run", "--rm", "--name", self.name,
            # vLLM is published on the host's 127.0.0.1 only; a container on Docker's bridge
            # has a loopback of its own, so the harness shares the host's network.
            "--network", "host",
            "-v", f"{self.layout.base}:{CONTAINER_ROOT}",
            "--label", f"orch_job={self.job_id}", "--label", "orch_role=lm-eval",
            # uv by name: the container gets the image's ENV PATH (/root/.local/bin on it).
            self.image, *with_api_extra(lm_eval, "uv"),
        ]  # fmt: skip

    @property
    def label(self) -> str:
        """Where it runs, for messages."""
        return self.image


def with_api_extra(lm_eval: Sequence[str], uv: str) -> list[str]:
    """`lm_eval` run in the axolotl image's venv once `uv pip install` (`uv`: a name on the
    image's PATH or a path) has added the `lm_eval[api]` extra `local-completions` needs (the
    image pins bare `lm_eval`)."""
    return ["sh", "-c", ENSURE_API_EXTRA, "lm-eval", uv, f"{images.layout().venv}/bin/python",
            images.catalog().lm_eval["api_requirement"], *lm_eval]


@dataclass(frozen=True)
class LmEvalNative:
    """Where lm-eval runs on a container rental: natively in the rented trainer image, whose
    venv has `lm_eval` (the `[api]` extra is added to it first, as in the Docker host's
    container), against the vLLM server orch runs there. `wrap` restores the image's
    environment (SSH sessions on a rental do not see the image's PATH)."""

    wrap: Callable[[Sequence[str]], list[str]]
    uv: str  # the image's uv, by its path (the session's PATH lacks /root/.local/bin)
    name: None = None  # no container to clear before a run
    label: str = "the rented image"  # where it runs, for messages

    def inside(self, path: str) -> str:
        """Host paths are the harness's own: it runs on the host."""
        return path

    def argv(self, lm_eval: Sequence[str]) -> list[str]:
        """`lm_eval` in the image's venv, after `uv pip install` of the `[api]` extra."""
        return self.wrap(with_api_extra(lm_eval, self.uv))


LmEvalPlace = LmEvalContainer | LmEvalNative


def lm_eval_place_argv(where: LmEvalPlace, tasks: Sequence[str], port: int,
                           tokenizer_dir: str, output_dir: str,
                           served_name: str = SERVED_NAME,
                       max_length: int = LM_EVAL_MAX_LENGTH) -> list[str]:
    """The whole command `run_lm_eval` runs (host paths in, the harness's paths on the argv)."""
    return where.argv(lm_eval_argv(tasks, port, where.inside(tokenizer_dir),
                                   where.inside(output_dir), served_name,
                                   max_length=max_length))


def run_lm_eval(
    host: Host,
    where: LmEvalPlace,
    tasks: Sequence[str],
    port: int,
    tokenizer_dir: str,
    output_dir: str,
    served_name: str = SERVED_NAME,
    timeout_s: float = 4 * 3600,
    max_length: int = LM_EVAL_MAX_LENGTH,
) -> tuple[dict[str, float], str]:
    """Run lm-eval tasks in the trainer image against the server; (metrics, results file).

    `tokenizer_dir` and `output_dir` are host paths (under the layout's base); `max_length`
    the server's context."""
    argv = lm_eval_place_argv(where, tasks, port, tokenizer_dir, output_dir, served_name,
                              max_length)
    host.must(["mkdir", "-p", output_dir], "creating the lm_eval output directory")
    if where.name is not None:
        host.run(["docker", "rm", "-f", where.name])  # a killed run's leftover (absent: fine)
    # lm_eval writes <output>/<model name>/results_<timestamp>.json. The new file is the
    # one that was not there before (host mtimes are not comparable with our clock).
    before = _results_files(host, output_dir)
    result = host.run(argv, timeout=timeout_s)
    if not result.ok:
        raise lm_eval_failed(where.label, result.exit_code, result.stderr, result.stdout)
    found = [(mtime, path) for path, mtime in _results_files(host, output_dir).items()
             if before.get(path) != mtime]
    if not found:
        raise StepFailed(f"lm_eval finished but wrote no results_*.json under {output_dir}",
                         fault=Fault.HOST)
    path = max(found)[1]
    raw = host.read(path)
    if raw is None:
        raise StepFailed(f"lm_eval results vanished: {path}", fault=Fault.HOST)
    return parse_lm_eval_results(raw), path


def lm_eval_failed(label: str, exit_code: int, stderr: str, stdout: str) -> StepFailed:
    """Why lm_eval ended badly: killed by a signal (named) or its exit status, with the last
    lines it printed (stderr, its log, else stdout)."""
    output = stderr.strip() or stdout.strip()
    lines = [ln.rstrip() for ln in output.splitlines() if ln.strip()]
    if exit_code == -1:  # no exit status: an exec'd process killed by a signal
        how = "was killed by a signal (no exit status came back)"
    elif exit_code > 128 and (name := _signal_name(exit_code - 128)) is not None:
        how = f"was killed by {name} (exit {exit_code})"
        if name == "SIGKILL":
            how += ("; the kernel's OOM killer sends SIGKILL when the machine runs out of "
                    "memory")
    else:
        how = f"failed (exit {exit_code})"
    said = (" | ".join(ln.strip()[:300] for ln in lines[-FAILURE_TAIL_LINES:]) if lines
            else "it printed nothing")
    return StepFailed(f"lm_eval in {label} {how}: {said}", fault=Fault.HOST,
                      stderr="\n".join(lines))


def _signal_name(number: int) -> str | None:
    try:
        return signal.Signals(number).name
    except ValueError:
        return None


@dataclass
class EvalResult:
    """What evaluation produced: metrics to store, per-row results, and what each step did."""

    metrics: dict[str, float] = field(default_factory=dict)
    rows: list[RowScore] = field(default_factory=list)
    lm_eval_results: str | None = None  # host path of lm_eval's results JSON
    reports: list[StepReport] = field(default_factory=list)
    server_removed: bool = False
