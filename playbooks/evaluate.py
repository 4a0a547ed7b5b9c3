"""Serve the fine-tuned model with vLLM on the GPU host, score it, and stop the server.

Facts followed here (../shared/reference/pipeline-facts.md, "Serve and evaluate"):

- The server is the `vllm/vllm-openai` image, whose entrypoint is the server: we pass engine
  arguments only. Its port is published on the host's 127.0.0.1 only and reached through an
  SSH tunnel, never over the public interface.
- Ready means `GET /health` is 200 AND `GET /v1/models` lists the served name. While the
  model loads the port refuses connections, so readiness is polled with a deadline.
- An unmerged adapter is served with `--enable-lora --lora-modules ft=<dir>` and a
  `--max-lora-rank` from a fixed set of allowed ranks.
- The user's eval set (JSONL rows of `prompt`/`expected`) is scored over `/v1/completions`
  (temperature 0); lm-evaluation-harness tasks run on the host against the same server.

`evaluate()` ties it together as one playbook and always stops the server, also when a
step fails or the caller is interrupted: a forgotten vLLM server holds the GPU's memory.
"""

from __future__ import annotations

import json
import logging
import re
import string
import time
import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx
from fabric import Connection

from playbooks import ssh

from .base import (
    CONTAINER_ROOT,
    Emit,
    Fault,
    Host,
    Layout,
    Step,
    StepFailed,
    StepReport,
    container_name,
    last_line,
    run_playbook,
)

log = logging.getLogger(__name__)

PLAYBOOK = "evaluate"
SERVED_NAME = "ft"
CONTAINER_PORT = 8000  # the port vLLM listens on inside its container
# vLLM accepts only these values for --max-lora-rank.
ALLOWED_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
LOG_TAIL_LINES = 50
LM_EVAL_INSTALL_HINT = (
    "install lm_eval[api] in the host's Python environment "
    "(pip install 'lm_eval[api]'), or remove eval.tasks from the job"
)


# --- the server ------------------------------------------------------------------------------


def lora_rank_for(rank: int) -> int:
    """The smallest rank vLLM allows for `--max-lora-rank` that holds an adapter of `rank`."""
    if rank < 1:
        raise ValueError(f"a LoRA rank is at least 1 (got {rank})")
    for allowed in ALLOWED_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise StepFailed(
        f"LoRA rank {rank} is larger than vLLM serves (max {ALLOWED_LORA_RANKS[-1]}); "
        "merge the adapter instead of serving it unmerged",
        fault=Fault.USER,
    )


def adapter_rank(config: Mapping[str, Any]) -> int:
    """The largest rank in a PEFT `adapter_config.json` (`r`, or a higher `rank_pattern`)."""
    ranks = [int(config.get("r") or 16)]
    pattern = config.get("rank_pattern") or {}
    if isinstance(pattern, Mapping):
        ranks.extend(int(v) for v in pattern.values())
    return max(ranks)


def engine_args(
    model: str,
    max_model_len: int,
    served_name: str = SERVED_NAME,
    lora: str | None = None,
    lora_rank: int | None = None,
) -> list[str]:
    """vLLM engine arguments (paths as the container sees them).

    With `lora`, the adapter is the served name and the base model keeps its path as name;
    `lora_rank` (the adapter's own rank) is rounded up to an allowed `--max-lora-rank`.
    """
    if max_model_len < 1:
        raise ValueError(f"max_model_len must be positive (got {max_model_len})")
    args = ["--model", model]
    if lora is None:
        args += ["--served-model-name", served_name]
    args += ["--max-model-len", str(max_model_len)]
    if lora is not None:
        if "=" in served_name or "=" in lora:
            # vLLM splits `name=path` on '='; anything else would serve the wrong thing.
            raise ValueError(f"'=' is not allowed in a LoRA module name or path ({lora!r})")
        args += [
            "--enable-lora",
            "--lora-modules", f"{served_name}={lora}",
            "--max-lora-rank", str(lora_rank_for(lora_rank or 16)),
        ]  # fmt: skip
    return args


@dataclass(frozen=True)
class ServerSpec:
    """Everything `docker run` gets for one job's vLLM server."""

    name: str  # container name, derived from the job id
    job_id: str
    image: str
    port: int  # on the host's 127.0.0.1
    volume: str  # host directory mounted at CONTAINER_ROOT (/workspace/data)
    args: tuple[str, ...]  # engine arguments

    def docker_argv(self) -> list[str]:
        """The `docker run -d ...` command line."""
        return [
            "docker", "run", "-d", "--name", self.name,
            "--runtime", "nvidia", "--gpus", "all", "--ipc=host",
            # 127.0.0.1 only: the OpenAI API has no auth; it is reached through SSH.
            "-p", f"127.0.0.1:{self.port}:{CONTAINER_PORT}",
            "-v", f"{self.volume}:{CONTAINER_ROOT}",
            # Local model directories only: never wait on (or leak a request to) the Hub.
            "-e", "HF_HUB_OFFLINE=1",
            "--label", f"orch_job={self.job_id}", "--label", "orch_role=vllm",
            self.image, *self.args,
        ]  # fmt: skip


def server_spec(
    host: Host,
    job_id: str,
    model_dir_host: str,
    layout: Layout,
    image: str,
    port: int,
    max_model_len: int,
    served_name: str = SERVED_NAME,
    lora: str | None = None,
) -> ServerSpec:
    """The server for a job; with `lora` (an adapter dir) reads its rank from the host."""
    rank: int | None = None
    lora_container: str | None = None
    if lora is not None:
        raw = host.read(f"{lora.rstrip('/')}/adapter_config.json")
        if raw is None:
            raise StepFailed(f"no adapter_config.json in {lora}: train the adapter first",
                             fault=Fault.HOST)
        try:
            rank = adapter_rank(json.loads(raw))
        except (ValueError, TypeError) as exc:
            raise StepFailed(f"{lora}/adapter_config.json is not valid: {exc}",
                             fault=Fault.HOST) from None
        lora_container = layout.container(lora)
    args = engine_args(layout.container(model_dir_host), max_model_len, served_name,
                       lora_container, rank)
    return ServerSpec(container_name("vllm", job_id), job_id, image, port, layout.base,
                      tuple(args))


# Fields compared to decide whether a running container is the server we want.
_INSPECT = "\n".join([
    "{{json .State.Status}}", "{{json .Config.Image}}", "{{json .Config.Cmd}}",
    "{{json .HostConfig.PortBindings}}",
])  # fmt: skip


def _inspect(host: Host, name: str) -> dict[str, Any] | None:
    """State, image, command and ports of container `name`; None when there is none."""
    result = host.run(["docker", "inspect", "-f", _INSPECT, name])
    if not result.ok:
        if "no such" in (result.stderr + result.stdout).lower():
            return None
        raise StepFailed(f"docker inspect {name} failed: {last_line(result.stderr)}",
                         fault=Fault.HOST, stderr=result.stderr)
    try:
        status, image, cmd, ports = (json.loads(line) for line in result.stdout.splitlines()[:4])
    except ValueError:
        raise StepFailed(f"docker inspect {name}: unexpected output", fault=Fault.HOST,
                         stderr=result.stdout) from None
    return {"status": status, "image": image, "cmd": cmd or [], "ports": ports or {}}


def _matches(info: Mapping[str, Any], spec: ServerSpec) -> bool:
    bindings = info["ports"].get(f"{CONTAINER_PORT}/tcp") or []
    published = {(b.get("HostIp"), str(b.get("HostPort"))) for b in bindings}
    return (info["status"] == "running" and info["image"] == spec.image
            and list(info["cmd"]) == list(spec.args)
            and published == {("127.0.0.1", str(spec.port))})


def server_running(host: Host, spec: ServerSpec) -> bool:
    """Whether the job's container runs exactly this server (image, args, port)."""
    info = _inspect(host, spec.name)
    return info is not None and _matches(info, spec)


def ensure_server(host: Host, spec: ServerSpec) -> bool:
    """Start `spec` unless it already runs; True when a container was started.

    A container of that name that exited, or runs another model/port, is replaced: the
    name is the job's, so nothing else can own it.
    """
    info = _inspect(host, spec.name)
    if info is not None and _matches(info, spec):
        log.info("vLLM container %s already running: reused", spec.name)
        return False
    if info is not None:
        log.info("replacing vLLM container %s (%s)", spec.name, info["status"])
        _remove(host, spec.name)
    result = host.run(spec.docker_argv())
    if not result.ok:
        raise StepFailed(
            f"starting the vLLM server ({spec.image}) failed (exit {result.exit_code}): "
            f"{last_line(result.stderr or result.stdout)}",
            fault=Fault.HOST, stderr=result.stderr,
        )
    return True


def start_server(
    host: Host,
    job_id: str,
    model_dir_host: str,
    layout: Layout,
    image: str,
    port: int,
    max_model_len: int,
    served_name: str = SERVED_NAME,
    lora: str | None = None,
) -> ServerSpec:
    """Start (or reuse) the job's vLLM container on 127.0.0.1:`port`; returns its spec.

    `model_dir_host` is the merged model, or the base model when `lora` names an unmerged
    adapter directory; both must lie under `layout.base` (mounted at CONTAINER_ROOT).
    """
    spec = server_spec(host, job_id, model_dir_host, layout, image, port, max_model_len,
                       served_name, lora)
    ensure_server(host, spec)
    return spec


def _remove(host: Host, name: str) -> bool:
    result = host.run(["docker", "rm", "-f", name])
    if result.ok:
        return bool(result.stdout.strip())  # docker prints the name of what it removed
    if "no such container" in (result.stderr + result.stdout).lower():
        return False  # older Docker: -f still complains about a missing container
    raise StepFailed(f"docker rm -f {name} failed: {last_line(result.stderr)}",
                     fault=Fault.HOST, stderr=result.stderr)


def stop_server(host: Host, job_id: str) -> bool:
    """Remove the job's vLLM container; True if one was removed (absent is fine)."""
    return _remove(host, container_name("vllm", job_id))


def server_logs(conn: Connection, name: str, lines: int = LOG_TAIL_LINES) -> str:
    """The last `lines` of a container's log (stdout and stderr), or why there are none."""
    try:
        result = ssh.run(conn, ["docker", "logs", "--tail", str(lines), name], timeout=30)
    except ssh.SSHError as exc:
        return f"(no log: {exc})"
    text = (result.stdout + result.stderr).strip()
    return text or "(the container logged nothing)"


# --- readiness -------------------------------------------------------------------------------


def probe(client: httpx.Client, served_name: str = SERVED_NAME) -> tuple[bool, str]:
    """One readiness probe: (ready, what was seen)."""
    try:
        health = client.get("/health")
        if health.status_code != 200:
            return False, f"GET /health: {health.status_code}"
        models = client.get("/v1/models")
    except httpx.TransportError as exc:
        # A refused port closes the tunnel's local connection: it shows up as a transport
        # error (disconnect/reset), the normal state while the model loads.
        return False, f"not accepting connections yet ({type(exc).__name__})"
    if models.status_code != 200:
        return False, f"GET /v1/models: {models.status_code}"
    try:
        ids = [str(m.get("id")) for m in models.json().get("data", [])]
    except (ValueError, AttributeError):
        return False, "GET /v1/models: not a model list"
    if served_name not in ids:
        return False, f"GET /v1/models lists {ids}, not {served_name!r}"
    return True, "ready"


def probe_once(conn: Connection, port: int, served_name: str = SERVED_NAME) -> bool:
    """Whether the server on the host's 127.0.0.1:`port` is ready right now."""
    with ssh.tunnel(conn, port) as local, _client(f"http://127.0.0.1:{local}", 5.0) as client:
        return probe(client, served_name)[0]


def _client(base_url: str, timeout: float, connections: int = 4) -> httpx.Client:
    # trust_env=False: no proxy from the environment may sit between us and the tunnel.
    return httpx.Client(
        base_url=base_url,
        timeout=httpx.Timeout(timeout, connect=10.0),
        limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
        trust_env=False,
    )


def wait_ready(
    conn: Connection,
    port: int,
    deadline_s: float,
    *,
    served_name: str = SERVED_NAME,
    container: str | None = None,
    poll_s: float = 0.1,
) -> float:
    """Poll the server through an SSH tunnel until ready; returns the seconds it took.

    Refused connections and 5xx are the loading phase and are retried until `deadline_s`.
    With `container`, its state is checked every few seconds so a crashed server fails at
    once instead of at the deadline; either failure is a StepFailed with its log tail.
    """
    started = time.monotonic()
    next_state_check = started + 1.0  # a crash at start-up shows within a second
    seen = "no answer yet"
    wait = poll_s
    with ssh.tunnel(conn, port) as local, _client(f"http://127.0.0.1:{local}", 5.0) as client:
        while True:
            ready, seen = probe(client, served_name)
            now = time.monotonic()
            if ready:
                log.info("vLLM on port %s ready after %.1fs", port, now - started)
                return now - started
            if not conn.is_connected:
                # A dead tunnel looks like a server still loading: do not wait out the deadline.
                raise ssh.ConnectionLost(f"{conn.host}:{conn.port}: connection lost while "
                                         "waiting for vLLM")
            if container is not None and now >= next_state_check:
                next_state_check = now + 2.0
                _fail_if_exited(conn, container, now - started)
            if now - started >= deadline_s:
                tail = server_logs(conn, container) if container else ""
                raise StepFailed(
                    f"vLLM on the host's 127.0.0.1:{port} was not ready within {deadline_s:g}s "
                    f"(last: {seen})" + (f"; log: {last_line(tail)}" if tail else ""),
                    fault=Fault.HOST, stderr=tail,
                )
            time.sleep(min(wait, max(0.0, deadline_s - (now - started))))
            wait = min(wait * 1.5, 2.0)


def _fail_if_exited(conn: Connection, container: str, elapsed: float) -> None:
    result = ssh.run(conn, ["docker", "inspect", "-f",
                            "{{.State.Status}} {{.State.ExitCode}}", container], timeout=30)
    if result.ok and result.stdout.split()[:1] == ["running"]:
        return
    state = result.stdout.strip() if result.ok else "missing"
    tail = server_logs(conn, container)
    raise StepFailed(
        f"the vLLM container {container} stopped while loading ({state}, after "
        f"{elapsed:.0f}s): {last_line(tail)}",
        fault=Fault.HOST, stderr=tail,
    )


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

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return asdict(self)


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
    with _client(base_url.rstrip("/"), timeout_s, workers) as client:

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


def _complete(client: httpx.Client, model: str, prompt: str, max_tokens: int,
              retries: int) -> str:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    problem = ""
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(min(4.0, 0.25 * 2 ** (attempt - 1)))
        try:
            response = client.post("/v1/completions", json=body)
        except httpx.TransportError as exc:
            problem = f"{type(exc).__name__}: {exc}"
            continue
        if response.status_code >= 500:
            problem = f"HTTP {response.status_code}: {response.text[:300]}"
            continue
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
    raise StepFailed(f"POST /v1/completions failed {retries + 1} times: {problem}",
                     fault=Fault.TRANSIENT)


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
) -> list[str]:
    """The `lm_eval --model local-completions ...` command, run on the host itself.

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
        f"num_concurrent={num_concurrent}",
        f"max_retries={max_retries}",
        "tokenized_requests=False",
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


def lm_eval_available(host: Host) -> bool:
    """Whether `lm_eval` is on the host's PATH."""
    return host.run(["sh", "-c", "command -v lm_eval"]).ok


def run_lm_eval(
    host: Host,
    tasks: Sequence[str],
    port: int,
    tokenizer_dir: str,
    output_dir: str,
    served_name: str = SERVED_NAME,
    timeout_s: float = 4 * 3600,
) -> tuple[dict[str, float], str]:
    """Run lm-eval tasks on the host against the server; (metrics, results file)."""
    if not lm_eval_available(host):
        raise StepFailed(f"lm_eval is not installed on the host: {LM_EVAL_INSTALL_HINT}",
                         fault=Fault.HOST)
    argv = lm_eval_argv(tasks, port, tokenizer_dir, output_dir, served_name)
    host.must(["mkdir", "-p", output_dir], "creating the lm_eval output directory")
    # lm_eval writes <output>/<model name>/results_<timestamp>.json. The new file is the
    # one that was not there before (host mtimes are not comparable with our clock).
    before = _results_files(host, output_dir)
    host.must(argv, "lm_eval", fault=Fault.HOST, timeout=timeout_s)
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


# --- the playbook ----------------------------------------------------------------------------


@dataclass
class EvalResult:
    """What evaluation produced: metrics to store, per-row results, and what each step did."""

    metrics: dict[str, float] = field(default_factory=dict)
    rows: list[RowScore] = field(default_factory=list)
    lm_eval_results: str | None = None  # host path of lm_eval's results JSON
    reports: list[StepReport] = field(default_factory=list)
    server_removed: bool = False


def _ignore(_report: StepReport) -> None:
    return None


def evaluate(
    host: Host,
    job_id: str,
    model_dir_host: str,
    layout: Layout,
    image: str,
    port: int,
    max_model_len: int,
    eval_rows: Iterable[Mapping[str, Any]] | None = None,
    *,
    tasks: Sequence[str] = (),
    lora: str | None = None,
    tokenizer_dir: str | None = None,
    served_name: str = SERVED_NAME,
    ready_deadline_s: float = 900.0,
    concurrency: int = 8,
    max_tokens: int = 64,
    lm_eval_timeout_s: float = 4 * 3600,
    emit: Emit = _ignore,
    stop_after: bool = True,
    runner: str = "docker",
    native_wrap: Callable[[Sequence[str]], list[str]] = list,
) -> EvalResult:
    """Serve, wait until ready, score the eval set, run lm-eval tasks, always stop the server.

    Steps (reported to `emit` like any playbook): vllm-server, vllm-ready, score-eval-set
    (with `eval_rows`), lm-eval (with `tasks`), stop-server. A failing step raises
    PlaybookFailed after the server was stopped. `tokenizer_dir` defaults to the model.
    `stop_after=False` leaves a successful server running, for a machine that is destroyed
    next (stopping a large model's server gracefully is billed time for nothing).
    On a host without Docker (`runner` "process": a container rental) nothing is served:
    `evaluate_native` runs lm-eval's `hf` backend in the trainer image instead.
    """
    if runner != "docker":
        from .evaluate_native import evaluate_native

        return evaluate_native(host, job_id, model_dir_host, layout, max_model_len, eval_rows,
                               tasks=tasks, lora=lora, max_tokens=max_tokens,
                               timeout_s=lm_eval_timeout_s, emit=emit, wrap=native_wrap)
    result = EvalResult()
    specs: list[ServerSpec] = []
    scores: list[EvalScores] = []
    lm_results: list[tuple[dict[str, float], str]] = []

    def spec(h: Host) -> ServerSpec:
        if not specs:  # reads adapter_config.json once
            specs.append(server_spec(h, job_id, model_dir_host, layout, image, port,
                                     max_model_len, served_name, lora))
        return specs[0]

    def score(h: Host) -> None:
        with ssh.tunnel(h.conn, port) as local:
            scores.append(score_eval_set(f"http://127.0.0.1:{local}", eval_rows or [],
                                         served_name, concurrency, max_tokens))

    def lm_eval(h: Host) -> None:
        output = f"{layout.job_dir(job_id)}/eval/lm_eval"
        lm_results.append(run_lm_eval(h, tasks, port, tokenizer_dir or model_dir_host,
                                      output, served_name, lm_eval_timeout_s))

    def serve(h: Host) -> None:
        ensure_server(h, spec(h))

    def ready(h: Host) -> None:
        wait_ready(h.conn, port, ready_deadline_s, served_name=served_name,
                   container=spec(h).name)

    steps = [
        Step("vllm-server", lambda h: server_running(h, spec(h)), serve, timeout_s=300),
        Step("vllm-ready", lambda h: probe_once(h.conn, port, served_name), ready,
             timeout_s=ready_deadline_s + 120),
    ]
    if eval_rows is not None:
        steps.append(Step("score-eval-set", lambda h: bool(scores), score, timeout_s=3600))
    if tasks:
        steps.append(Step("lm-eval", lambda h: bool(lm_results), lm_eval,
                          timeout_s=lm_eval_timeout_s + 300))

    def stopped(h: Host) -> bool:
        return _inspect(h, container_name("vllm", job_id)) is None

    def stop(h: Host) -> None:
        result.server_removed = stop_server(h, job_id)

    try:
        result.reports += run_playbook(PLAYBOOK, steps, host, emit)
    except BaseException as exc:
        # Stop the server, but never let a failure to stop hide why evaluation failed.
        try:
            result.reports += run_playbook(PLAYBOOK, [Step("stop-server", stopped, stop,
                                                           timeout_s=120)], host, emit)
        except Exception as stop_exc:  # reported on the original error instead
            log.error("stopping vLLM for job %s failed: %s", job_id, stop_exc)
            exc.add_note(f"stopping the vLLM server also failed: {stop_exc}")
        raise
    if stop_after:
        result.reports += run_playbook(PLAYBOOK, [Step("stop-server", stopped, stop,
                                                       timeout_s=120)], host, emit)
    if scores:
        result.metrics.update(scores[0].metrics)
        result.rows = scores[0].rows
    if lm_results:
        result.metrics.update(lm_results[0][0])
        result.lm_eval_results = lm_results[0][1]
    return result
