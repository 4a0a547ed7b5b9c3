"""The vLLM server that evaluation scores against: its command line, start, readiness, stop.

Facts followed here (../shared/reference/pipeline-facts.md, "Serve and evaluate"):

- The server is the `vllm/vllm-openai` image, whose entrypoint is the server: we pass engine
  arguments only. Its port is published on the host's 127.0.0.1 only and reached through an
  SSH tunnel, never over the public interface.
- Ready means `GET /health` is 200 AND `GET /v1/models` lists the served name. While the
  model loads the port refuses connections, so readiness is polled with a deadline.
- An unmerged adapter is served with `--enable-lora --lora-modules ft=<dir>` and a
  `--max-lora-rank` from a fixed set of allowed ranks.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import ssl
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from fabric import Connection

from playbooks import gpu, ssh

from .base import (
    CONTAINER_ROOT,
    Fault,
    Host,
    Layout,
    StepFailed,
    container_name,
    last_line,
)

log = logging.getLogger(__name__)

SERVED_NAME = "ft"
CONTAINER_PORT = 8000  # the port vLLM listens on inside its container
# vLLM accepts only these values for --max-lora-rank.
ALLOWED_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
LOG_TAIL_LINES = 50


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


@dataclass(frozen=True)
class Serving:
    """How vLLM serves the job: the planner's choice (orchestrator/core/evalsizing.py).

    `served` "adapter": the base model quantized to 4-bit at load (bitsandbytes) with the
    LoRA adapter, what QLoRA trained; "merged": the merged (or fully fine-tuned) model.
    `--quantization bitsandbytes` alone also selects the bitsandbytes load format (vLLM
    engine/arg_utils.py `create_load_config`), so `--load-format` is not passed.
    """

    served: str = "merged"
    tensor_parallel: int = 1
    gpu_memory_utilization: float = 0.9
    max_num_seqs: int = 8

    @property
    def quantization(self) -> str | None:
        """vLLM's `--quantization` (in-flight 4-bit for the adapter path)."""
        return "bitsandbytes" if self.served == "adapter" else None


DEFAULT_SERVING = Serving()  # vLLM's defaults: the merged model on one GPU


def engine_args(
    model: str,
    max_model_len: int,
    served_name: str = SERVED_NAME,
    lora: str | None = None,
    lora_rank: int | None = None,
    serving: Serving = DEFAULT_SERVING,
) -> list[str]:
    """vLLM engine arguments (paths as the container sees them).

    The model is positional (`vllm serve MODEL`; `--model` is deprecated). With `lora`, the
    adapter is the served name and the base model keeps its path as name; `lora_rank` (the
    adapter's own rank) is rounded up to an allowed `--max-lora-rank`. `serving` sets the
    tensor-parallel size, the memory fraction and the concurrency the plan sized.
    """
    if max_model_len < 1:
        raise ValueError(f"max_model_len must be positive (got {max_model_len})")
    args = [model]
    if lora is None:
        args += ["--served-model-name", served_name]
    args += ["--max-model-len", str(max_model_len),
             "--tensor-parallel-size", str(serving.tensor_parallel),
             "--gpu-memory-utilization", f"{serving.gpu_memory_utilization:g}",
             "--max-num-seqs", str(serving.max_num_seqs)]
    if serving.quantization is not None:
        args += ["--quantization", serving.quantization]
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
    serving: Serving = DEFAULT_SERVING,
) -> ServerSpec:
    """The server for a job; with `lora` (an adapter dir) reads its rank from the host."""
    args = host_engine_args(host, model_dir_host, max_model_len, served_name, lora, serving,
                            layout.container)
    return ServerSpec(container_name("vllm", job_id), job_id, image, port, layout.base,
                      tuple(args))


def host_engine_args(host: Host, model_dir_host: str, max_model_len: int, served_name: str,
                     lora: str | None, serving: Serving,
                     path: Callable[[str], str] = str) -> list[str]:
    """`engine_args` for a model on `host` (paths as `path` maps them: the container's, or
    the host's own); with `lora`, the adapter's rank is read from its adapter_config.json."""
    rank: int | None = None
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
    return engine_args(path(model_dir_host), max_model_len, served_name,
                       None if lora is None else path(lora), rank, serving)


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


def _published(info: Mapping[str, Any], spec: ServerSpec) -> int | None:
    """The host port (on 127.0.0.1) a running container of `spec`'s image and arguments
    publishes vLLM's port on; None when it is not that server."""
    bindings = info["ports"].get(f"{CONTAINER_PORT}/tcp") or []
    published = {(b.get("HostIp"), str(b.get("HostPort"))) for b in bindings}
    if not (info["status"] == "running" and info["image"] == spec.image
            and list(info["cmd"]) == list(spec.args) and len(published) == 1):
        return None
    ip, port = next(iter(published))
    return int(port) if ip == "127.0.0.1" and port.isdigit() else None


def _matches(info: Mapping[str, Any], spec: ServerSpec) -> bool:
    return _published(info, spec) == spec.port


def serving_port(host: Host, spec: ServerSpec) -> int | None:
    """The port the job's container serves `spec`'s model on, whichever port it was given
    (a takeover finds the server the last worker started); None when none runs."""
    info = _inspect(host, spec.name)
    return None if info is None else _published(info, spec)


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


# vLLM V1 runs its engine in a process of its own. An engine that fails to start (out of
# memory, too little room for the KV cache, GPU memory another process holds) logs the cause
# under the engine's prefix, and the log then ends with the API server's own error, which only
# says so: "RuntimeError: Engine core initialization failed. See root cause above. Failed
# core proc(s): {}" (vllm/v1/engine/utils.py `wait_for_engine_startup`; public logs of
# 0.10 to 0.19 end so).
_ENGINE_FAILED = "Engine core initialization failed"
_LOG_PREFIX = re.compile(r"^\((?:EngineCore|APIServer|Worker|VllmWorker)[^)]*\)\s*"
                         r"(?:(?:ERROR|WARNING|INFO|DEBUG) \d\d-\d\d \d\d:\d\d:\d\d "
                         r"\[[^\]]*\]\s*)?")
_EXCEPTION = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception): ")
# vllm/v1/worker/utils.py `request_memory`: less free than gpu_memory_utilization x total.
FREE_MEMORY = "Free memory on device"
# Lines of a failed server's log read for its cause. The API server's own traceback alone is
# ~60 lines (vLLM 0.19, Python 3.12: 21 frames with their caret lines, in public logs), so the
# engine's error is never within the last LOG_TAIL_LINES; those are what the failure keeps.
CAUSE_LINES = 400


def last_lines(text: str, count: int = LOG_TAIL_LINES) -> str:
    """The last `count` lines of `text`."""
    return "\n".join(text.splitlines()[-count:])


def root_cause(log_text: str) -> str:
    """Why a vLLM server ended, from its log: the engine's own error when the log ends with
    the API server's "Engine core initialization failed", else the last line."""
    lines = [ln for ln in (_LOG_PREFIX.sub("", raw).strip() for raw in log_text.splitlines())
             if ln]
    # Searched back from the API server's line, which need not be the last: Python's
    # resource_tracker may warn of leaked shared memory after it (vllm-project/vllm#26898).
    wrapper = [i for i, line in enumerate(lines) if _ENGINE_FAILED in line]
    if wrapper:
        for line in reversed(lines[:wrapper[-1]]):
            if _EXCEPTION.match(line) and _ENGINE_FAILED not in line:
                return line[:400]
    return last_line("\n".join(lines)) if lines else last_line(log_text)


def failure(log_text: str, run: Callable[[list[str]], ssh.Result]) -> str:
    """`root_cause`, and when the GPUs had too little memory free, what nvidia-smi says holds
    it (`run` runs a command on the host)."""
    cause = root_cause(log_text)
    if FREE_MEMORY in cause:
        report = gpu.memory_report(run)
        if report:
            cause += f" [{report}]"
    return cause


def server_logs(conn: Connection, name: str, lines: int = LOG_TAIL_LINES) -> str:
    """The last `lines` of a container's log (stdout and stderr), or why there are none."""
    try:
        result = ssh.run(conn, ["docker", "logs", "--tail", str(lines), name], timeout=30)
    except ssh.SSHError as exc:
        return f"(no log: {exc})"
    text = (result.stdout + result.stderr).strip()
    return text or "(the container logged nothing)"


# --- readiness -------------------------------------------------------------------------------


def served_root(args: Sequence[str], served_name: str = SERVED_NAME) -> str | None:
    """What vLLM's `/v1/models` reports as `root` for `served_name` when started with `args`
    (`engine_args`'s): the adapter's path for a `--lora-modules NAME=PATH`, else the model's
    (the positional argument); vLLM's serving_models.py sets `root` from exactly these."""
    items = list(args)
    for flag, value in zip(items, items[1:], strict=False):
        if flag == "--lora-modules":
            name, _, path = value.partition("=")
            if name == served_name:
                return path
    return items[0] if items and not items[0].startswith("-") else None


def probe(client: httpx.Client, served_name: str = SERVED_NAME,
          root: str | None = None) -> tuple[bool, str]:
    """One readiness probe: (ready, what was seen).

    With `root`, the server must also serve `served_name` from that path: another job's
    vLLM left on the same port (a kept server's 8000, a port reused on loopback) answers
    under the same name and would be scored instead of this job's model."""
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
        cards = {str(m.get("id")): m.get("root") for m in models.json().get("data", [])}
    except (ValueError, AttributeError):
        return False, "GET /v1/models: not a model list"
    if served_name not in cards:
        return False, f"GET /v1/models lists {list(cards)}, not {served_name!r}"
    if root is not None and cards[served_name] != root:
        return False, (f"GET /v1/models serves {served_name!r} from {cards[served_name]!r}, "
                       f"not {root!r}: another server holds this port")
    return True, "ready"


def probe_once(conn: Connection, port: int, served_name: str = SERVED_NAME,
               root: str | None = None) -> bool:
    """Whether the server on the host's 127.0.0.1:`port` is ready right now."""
    with ssh.tunnel(conn, port) as local, http_client(f"http://127.0.0.1:{local}", 5.0) as client:
        return probe(client, served_name, root)[0]


@functools.cache
def _tls() -> ssl.SSLContext:
    """httpx's default TLS context, built once per process.

    httpx builds one for every client, and building it loads the CA bundle (~20 ms of CPU); a
    job makes a client per readiness probe and per scoring run. The server is plain HTTP
    through the SSH tunnel, so the context is never used to connect: sharing it changes
    nothing but the cost.
    """
    return httpx.create_ssl_context()


def http_client(base_url: str, timeout: float, connections: int = 4) -> httpx.Client:
    # trust_env=False: no proxy from the environment may sit between us and the tunnel.
    return httpx.Client(
        base_url=base_url,
        timeout=httpx.Timeout(timeout, connect=10.0),
        limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
        trust_env=False,
        verify=_tls(),
    )


def wait_ready(
    conn: Connection,
    port: int,
    deadline_s: float,
    *,
    served_name: str = SERVED_NAME,
    container: str | None = None,
    poll_s: float = 0.1,
    alive: Callable[[float], None] | None = None,
    root: str | None = None,
) -> float:
    """Poll the server through an SSH tunnel until ready; returns the seconds it took.

    Refused connections and 5xx are the loading phase and are retried until `deadline_s`.
    With `container` (or `alive`, a check that raises), its state is checked every few
    seconds so a crashed server fails at once instead of at the deadline; either failure is
    a StepFailed with its log tail. With `root` (`served_root`), a server serving the name
    from another path (another job's) is not this one, and is waited past, not scored.
    """
    started = time.monotonic()
    next_state_check = started + 1.0  # a crash at start-up shows within a second
    seen = "no answer yet"
    wait = poll_s
    with ssh.tunnel(conn, port) as local, http_client(f"http://127.0.0.1:{local}", 5.0) as client:
        while True:
            ready, seen = probe(client, served_name, root)
            now = time.monotonic()
            if ready:
                log.info("vLLM on port %s ready after %.1fs", port, now - started)
                return now - started
            if not conn.is_connected:
                # A dead tunnel looks like a server still loading: do not wait out the deadline.
                raise ssh.ConnectionLost(f"{conn.host}:{conn.port}: connection lost while "
                                         "waiting for vLLM")
            if (container is not None or alive is not None) and now >= next_state_check:
                next_state_check = now + 2.0
                if container is not None:
                    _fail_if_exited(conn, container, now - started)
                if alive is not None:
                    alive(now - started)
            if now - started >= deadline_s:
                logged = server_logs(conn, container, CAUSE_LINES) if container else ""
                raise StepFailed(
                    f"vLLM on the host's 127.0.0.1:{port} was not ready within {deadline_s:g}s "
                    f"(last: {seen})" + (f"; log: {root_cause(logged)}" if logged else ""),
                    fault=Fault.HOST, stderr=last_lines(logged),
                )
            time.sleep(min(wait, max(0.0, deadline_s - (now - started))))
            wait = min(wait * 1.5, 2.0)


def _fail_if_exited(conn: Connection, container: str, elapsed: float) -> None:
    result = ssh.run(conn, ["docker", "inspect", "-f",
                            "{{.State.Status}} {{.State.ExitCode}}", container], timeout=30)
    if result.ok and result.stdout.split()[:1] == ["running"]:
        return
    state = result.stdout.strip() if result.ok else "missing"
    logged = server_logs(conn, container, CAUSE_LINES)
    raise StepFailed(
        f"the vLLM container {container} stopped while loading ({state}, after "
        f"{elapsed:.0f}s): {failure(logged, lambda argv: ssh.run(conn, argv, timeout=30))}",
        fault=Fault.HOST, stderr=last_lines(logged),
    )
