"""`lm_eval` (lm-evaluation-harness 0.4.11, shipped in the axolotl images): the
`local-completions` backend, the one orch runs.

What orch runs against the vLLM server, in a container of the trainer image on a Docker
host and natively in the rented image on a container rental:
`lm_eval --model local-completions --model_args model=NAME,base_url=URL,tokenizer=DIR,...
--tasks T[,T...] [--include_path DIR] --output_path OUT [--log_samples] [--batch_size N|auto]
[--limit N]`. Any other backend (the `hf` one orch ran until issue 19, lm_eval's default
when `--model` is left out) is refused as not simulated: orch must never come to rely on it.
Every task's requests are POSTed to `base_url` (real HTTP requests to the vLLM stand-in),
built and read as lm-eval 0.4.11 does for the `model_args` given (standins/lm_eval_api.py).
As the real one (`models/api_models.py` `TemplateAPI.__init__` @v0.4.11) it refuses to
start without the `lm_eval[api]` extra's packages (`aiohttp`, `tqdm`, `tenacity`,
`requests`): the axolotl image pins bare `lm_eval`, and tenacity is no dependency of
anything else it installs (⚠ inferred from axolotl v0.18.0 `pyproject.toml`; the image's
package list was not inspected). `uv pip install --python <image venv>/bin/python
'lm_eval[api]==0.4.11'` in the same container adds them (standins/uv.py). A container on
Docker's default bridge network has its own 127.0.0.1: a server published on the host's
loopback is reachable only with `--network host`.

Refuses what the real one refuses: an unknown flag (argparse, exit 2), an unknown task, a
server it cannot reach; and a model type other than `local-completions` (not simulated).
Tasks are the few built-in ones below (fixed scores) and `generate_until` tasks read from
`--include_path` (`*.yaml`; orch writes them as JSON, which YAML reads too) over a local
JSON-lines `data_files` set: each row's `doc_to_text` (a field name, or `{{field}}`
templates) is answered like the vLLM stand-in answers (what training learned), and scored by
exact match with `doc_to_target`.

Output as lm_eval lays it out (`loggers/evaluation_tracker.py`):
`OUT/<model name sanitized>/results_<ISO time>.json` and, with `--log_samples`,
`samples_<task>_<ISO time>.jsonl` (doc_id, doc, target, resps, filtered_resps, ...).
"""

from __future__ import annotations

import json
import os
import re
import signal
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from .common import Host, SimError, container_to_host, say
from .lm_eval_api import ApiModel

TYPE_CHECKING = False  # see common.py: typing is not imported at run time
if TYPE_CHECKING:
    from typing import Any
#: Where `uv pip install` in a container of the axolotl image records what it added to the
#: image's venv (in the container's own root: gone with the container, as on Docker).
IMAGE_VENV_RECORD = ".simhost-image-venv.json"
API_EXTRA = "lm_eval[api]"

VERSION = "0.4.11"
# Built-in tasks the stand-in knows, with the metrics (and fixed values) it reports.
BUILTIN: dict[str, dict[str, float]] = {
    "gsm8k": {"exact_match,strict-match": 0.25, "exact_match,flexible-extract": 0.3},
    "hellaswag": {"acc,none": 0.5, "acc_norm,none": 0.625},
    "arc_easy": {"acc,none": 0.7, "acc_norm,none": 0.68},
    "mmlu": {"acc,none": 0.45},
}
# What a built-in task sends, in tokens: a few-shot generation's context, or a multiple-choice
# question's context (then one loglikelihood request per choice). ⚠ Estimated, not measured
# (no data set is read here): gsm8k is 5-shot (tasks/gsm8k/gsm8k.yaml `num_fewshot: 5` at
# v0.4.11), five worked examples of ~150 tokens and the question; the others are 0-shot.
BUILTIN_REQUESTS: dict[str, dict[str, int]] = {
    "gsm8k": {"generate": 900},
    "hellaswag": {"context": 120},
    "arc_easy": {"context": 60},
    "mmlu": {"context": 200},
}
_VALUE_FLAGS = {"--model", "-M", "--model_args", "-a", "--tasks", "-t", "--include_path",
                "--output_path", "-o", "--batch_size", "-b", "--limit", "-L", "--device",
                "--gen_kwargs", "--num_fewshot", "-f", "--seed", "--max_batch_size",
                "--verbosity", "-v"}
_SWITCHES = {"--log_samples", "-s", "--trust_remote_code", "--apply_chat_template"}
_ALIASES = {"-M": "--model", "-a": "--model_args", "-t": "--tasks", "-o": "--output_path",
            "-b": "--batch_size", "-L": "--limit", "-f": "--num_fewshot", "-s": "--log_samples",
            "-v": "--verbosity"}


def _parse(argv: list[str]) -> dict[str, Any]:
    flags: dict[str, Any] = {}
    args = list(argv[1:] if argv[:1] == ["run"] else argv)
    unknown: list[str] = []
    while args:
        arg = args.pop(0)
        key, eq, value = arg.partition("=")
        if key in _VALUE_FLAGS:
            if not eq:
                if not args:
                    raise SimError(f"lm-eval run: error: argument {key}: expected one argument",
                                   2)
                value = args.pop(0)
            flags[_ALIASES.get(key, key)] = value
        elif arg in _SWITCHES:
            flags[_ALIASES.get(arg, arg)] = True
        else:
            unknown.append(arg)
    if unknown:
        raise SimError(f"lm-eval: error: unrecognized arguments: {' '.join(unknown)}", 2)
    return flags


def _model_args(text: str) -> dict[str, str]:
    # lm_eval splits model_args on ',' then on '=' (utils.simple_parse_args_string).
    pairs = [p for p in text.split(",") if p]
    return dict(p.split("=", 1) for p in pairs)


def _include_tasks(include: str | None) -> dict[str, dict[str, Any]]:
    tasks: dict[str, dict[str, Any]] = {}
    for folder in filter(None, (include or "").split(":")):
        for path in sorted(Path(folder).rglob("*.yaml")):
            try:
                config = json.loads(path.read_text())
            except ValueError as exc:  # the stand-in reads JSON-shaped YAML only
                raise SimError(f"simhost: {path}: only JSON-shaped task YAML is simulated "
                               f"({exc})", 2) from None
            if isinstance(config, dict) and isinstance(config.get("task"), str):
                tasks[config["task"]] = config
    return tasks


def _render(template: str, doc: dict[str, Any]) -> str:
    # As lm-eval: a feature name is that field's value, anything else a Jinja template.
    if template in doc:
        return str(doc[template])
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: str(doc.get(m.group(1), "")), template)


def _run_generate(config: dict[str, Any], answer: Callable[[str], str],
                  limit: int | None) -> tuple[dict[str, float], list[dict[str, Any]]]:
    if config.get("output_type", "generate_until") != "generate_until":
        raise SimError(f"simhost: output_type {config.get('output_type')!r} is not simulated", 2)
    if config.get("dataset_path") != "json":
        raise SimError("simhost: only dataset_path: json tasks are simulated", 2)
    split = str(config.get("test_split") or "test")
    files = ((config.get("dataset_kwargs") or {}).get("data_files") or {}).get(split)
    if not files or not Path(files).is_file():
        raise SimError(f"FileNotFoundError: Unable to find '{files}'", 1)
    docs = [json.loads(line) for line in Path(files).read_text().splitlines() if line.strip()]
    if limit is not None:
        docs = docs[:limit]
    samples = []
    hits = 0
    for doc_id, doc in enumerate(docs):
        prompt = _render(str(config.get("doc_to_text") or ""), doc)
        target = _render(str(config.get("doc_to_target") or ""), doc)
        response = answer(prompt)
        hit = response.strip() == target.strip()
        hits += hit
        samples.append({"doc_id": doc_id, "doc": doc, "target": target,
                        "arguments": [[prompt, config.get("generation_kwargs") or {}]],
                        "resps": [[response]], "filtered_resps": [response],
                        "filter": "none", "metrics": ["exact_match"]})
    return {"exact_match,none": hits / len(docs) if docs else 0.0,
            "exact_match_stderr,none": 0.0}, samples


def _api_extras_installed(host: Host) -> bool:
    record = Path(os.environ.get("HOME", "/nonexistent")) / IMAGE_VENV_RECORD
    added = json.loads(record.read_text()) if record.is_file() else {}
    return bool(host.options.get("lm_eval_api_extras")) or API_EXTRA in added


def _api_model(host: Host, margs: dict[str, str]) -> ApiModel:
    """`local-completions`: prompts POSTed to the server at `base_url`."""
    if not _api_extras_installed(host):
        raise SimError(
            "ModuleNotFoundError: Attempted to use an API model, but the required packages "
            "['tenacity'] are not installed. Please install these via `pip install "
            "lm-eval[api]` or `pip install -e .\"[api]\"`", 1)
    model, base_url = margs.get("model"), margs.get("base_url")
    if not model or not base_url:
        raise SimError("ValueError: local-completions needs model= and base_url= in "
                       "model_args", 1)
    tokenizer = margs.get("tokenizer", model)
    if not (Path(container_to_host(tokenizer)) / "config.json").is_file():
        raise SimError(f"OSError: Can't load tokenizer for '{tokenizer}'. If you were trying "
                       "to load it from 'https://huggingface.co/models', make sure you don't "
                       "have a local directory with the same name.", 1)
    where = urllib.parse.urlsplit(base_url)
    own_loopback = (os.environ.get("SIMHOST_CONTAINER")
                    and os.environ.get("SIMHOST_NETWORK") != "host")
    if own_loopback and where.hostname in ("127.0.0.1", "localhost"):
        # The container's 127.0.0.1 is its own: nothing listens there.
        raise SimError(f"aiohttp.client_exceptions.ClientConnectorError: Cannot connect to "
                       f"host {where.hostname}:{where.port} ssl:default [Connect call failed "
                       f"('{where.hostname}', {where.port})]", 1)
    return ApiModel(host, margs)


def _filler(task: str, size: int, end: str) -> str:
    """A prompt of `size` bytes (tokens of the simulated tokenizer) ending with `end`."""
    unit = f"Question: a question of {task}, as the task words it. Answer: its answer. "
    body = (unit * (size // len(unit) + 1))[:max(0, size - len(end))]
    return body + end


def _ask_builtin(api: ApiModel, task: str) -> None:
    """The requests a built-in task sends (one document of its typical size)."""
    shape = BUILTIN_REQUESTS[task]
    api.task = task
    if "generate" in shape:
        api.generate(_filler(task, shape["generate"], "Answer:"), ["Question:"])
        return
    context = _filler(task, shape["context"], "Answer:")
    for choice in (" A", " B", " C", " D"):
        api.loglikelihood(context, choice)


def lm_eval(host: Host, argv: list[str]) -> int:
    """`lm_eval [run] --model local-completions ...` (see the module docstring)."""
    if argv[:1] in (["--version"], ["-V"]):
        say(f"lm-eval {VERSION}")
        return 0
    flags = _parse(argv)
    model = flags.get("--model", "hf")  # lm_eval's default
    if model != "local-completions":
        raise SimError(f"simhost: lm_eval --model {model} is not simulated on this host "
                       "(local-completions is: what orch runs)", 2)
    margs = _model_args(str(flags.get("--model_args") or ""))
    if flags.get("--log_samples") and not flags.get("--output_path"):
        raise SimError("ValueError: Specify --output_path if providing --log_samples", 1)
    if "--tasks" not in flags:
        raise SimError("lm-eval run: error: the following arguments are required: --tasks", 2)
    wanted = [t for t in str(flags["--tasks"]).split(",") if t]
    included = _include_tasks(flags.get("--include_path"))
    missing = [t for t in wanted if t not in BUILTIN and t not in included]
    if missing:
        raise SimError(f"ValueError: Tasks not found: {', '.join(missing)}. Try `lm-eval ls "
                       "tasks` to list available tasks.", 1)
    api = _api_model(host, margs)
    name = api.model

    def answer(prompt: str) -> str:
        return api.generate(prompt, [])
    limit = int(flags["--limit"]) if flags.get("--limit") else None
    results: dict[str, dict[str, Any]] = {}
    samples: dict[str, list[dict[str, Any]]] = {}
    for task in wanted:
        if task in included:
            scores, samples[task] = _run_generate(included[task], answer, limit)
        else:
            _ask_builtin(api, task)
            scores = dict(BUILTIN[task])
        if host.options.get("lm_eval_oom_killed"):
            # The kernel's OOM killer: SIGKILL, nothing flushed or handled after it.
            say(f"Requesting API: {task}: 1 request sent", err=True)
            os.kill(os.getpid(), signal.SIGKILL)
        results[task] = {"alias": task, **scores}
    host.event("lm-eval", backend=model, model=name, peft=margs.get("peft"), tasks=wanted,
               batch_size=flags.get("--batch_size"), include_path=flags.get("--include_path"),
               container=os.environ.get("SIMHOST_CONTAINER") or None)
    out = flags.get("--output_path")
    if out:
        _write_output(Path(container_to_host(str(out))), name, model, margs, results, samples,
                      bool(flags.get("--log_samples")))
    say(f"{model} ({','.join(f'{k}={v}' for k, v in margs.items())}), limit: {limit}")
    for task, values in results.items():
        say(f"|{task}| " + " ".join(f"{k}={v}" for k, v in values.items() if k != "alias"))
    return 0


def _write_output(out: Path, name: str, model: str, margs: dict[str, str],
                  results: dict[str, dict[str, Any]], samples: dict[str, list[dict[str, Any]]],
                  log_samples: bool) -> None:
    """`OUT/<model name sanitized>/results_<ISO time>.json` (+ samples), as lm_eval does."""
    folder = out / re.sub(r"[\"<>:/|\\?*\[\]]+", "__", name)
    folder.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).replace(tzinfo=None).isoformat().replace(":", "-")
    doc = {"results": results, "config": {"model": model, "model_args": margs},
           "lm_eval_version": VERSION}
    (folder / f"results_{stamp}.json").write_text(json.dumps(doc, indent=2))
    if log_samples:
        for task, rows in samples.items():
            (folder / f"samples_{task}_{stamp}.jsonl").write_text(
                "".join(json.dumps(r) + "\n" for r in rows))
