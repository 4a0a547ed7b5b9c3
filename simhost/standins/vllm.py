"""`vllm serve MODEL` (also the `vllm/vllm-openai` image): a real OpenAI-compatible server.

It refuses connections for `vllm_startup_seconds` (the model "loads"), then serves on
127.0.0.1 only: `GET /health`, `GET /v1/models`, `POST /v1/completions` and
`POST /v1/chat/completions`. Answers are deterministic: SimHostOptions.completion_answers
(exact prompt), else what training learned from the dataset (`sim_memory.json` in the model
or adapter directory: the longest known prompt contained in the request), else
`completion_default`. In a container the port is the published host port of `--port`
(default 8000); an unpublished port is unreachable, as with real Docker networking.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import signal
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType

from . import gpumem, images, landscape, tokens
from .common import Host, SimError, container_to_host, say
from .disks import logical_size

TYPE_CHECKING = False  # see common.py: typing is not imported at run time
if TYPE_CHECKING:
    from typing import Any

_LORA_RANKS = {1, 8, 16, 32, 64, 128, 256, 320, 512}
GIB = 1024**3
# What vLLM holds besides weights and KV cache: CUDA context, graphs, the profile run's
# activations (orch's estimate, docs/sizing.md "Evaluation", is larger; the stand-in only
# refuses what cannot possibly load).
_OVERHEAD = 1.5 * GIB
# The CUDA context of the engine's process: vLLM measures the free memory after creating it
# (gpu_worker `init_device`); orch's evaluation sizing takes the same 0.75 GiB.
_CONTEXT = int(0.75 * GIB)


# transformers' LlamaConfig defaults (configuration_llama.py), for fields a config leaves out.
_LLAMA_DEFAULTS = {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                   "num_attention_heads": 32, "vocab_size": 32000}


def _version() -> tuple[int, ...]:
    """The vLLM release this process is: the image tag or the installed wheel's version
    (SIMHOST_VLLM_VERSION), else the release orch pins (playbooks/data/images.yaml)."""
    raw = os.environ.get("SIMHOST_VLLM_VERSION") or images.vllm()["version"]
    try:
        return tuple(int(p) for p in raw.lstrip("v").split(".")[:3])
    except ValueError:  # `latest` and other moving tags: the newest
        return (99,)


# vLLM's bitsandbytes layer on CUDA (model_executor/layers/quantization/bitsandbytes.py:31-46
# at v0.19.1): the wheel does not require bitsandbytes; the vllm-openai image installs it.
_BITSANDBYTES_MIN = (0, 48, 1)


def _check_bitsandbytes() -> None:
    """`--quantization bitsandbytes` needs bitsandbytes >= 0.48.1 where vLLM runs: a venv
    `uv pip install` made (SIMHOST_VLLM_VENV) has what was installed into it (installed.json);
    the vllm-openai image has it."""
    venv = os.environ.get("SIMHOST_VLLM_VENV")
    if not venv:
        return
    record = Path(venv) / "installed.json"
    installed: dict[str, str] = json.loads(record.read_text()) if record.is_file() else {}
    version = installed.get("bitsandbytes")
    try:
        ok = version is not None and tuple(int(p) for p in version.split(".")[:3]) >= (
            _BITSANDBYTES_MIN)
    except ValueError:
        ok = False
    if not ok:
        need = ".".join(str(p) for p in _BITSANDBYTES_MIN)
        raise SimError(f"ImportError: Please install bitsandbytes>={need} via `pip install "
                       f"bitsandbytes>={need}` to use bitsandbytes quantizer.", 1)


def _check_tokenizer(model_dir: Path, model: str) -> None:
    """transformers 4 (every vLLM before 0.19.1) cannot load what transformers 5 saved."""
    path = model_dir / "tokenizer_config.json"
    if not path.is_file():
        return
    cls = json.loads(path.read_text()).get("tokenizer_class")
    first5 = tuple(int(p) for p in images.vllm()["transformers5_from"].split("."))
    if cls == "TokenizersBackend" and _version() < first5:
        raise SimError(f"ValueError: Tokenizer class {cls} does not exist or is not currently "
                       f"imported. (loading the tokenizer of {model} with transformers 4)", 1)


def _engine_failed(cause: str) -> SimError:
    """What `vllm serve` prints when its engine core fails to start (vLLM V1: the engine runs
    in a process of its own): the cause with the engine process's log prefix, then the API
    server's own error, which is the log's last line (vllm/v1/engine/utils.py
    `wait_for_engine_startup`, as public logs of 0.10-0.19 end)."""
    stamp = time.strftime("%m-%d %H:%M:%S", time.gmtime())
    engine = f"(EngineCore_DP0 pid={os.getpid() + 1}) ERROR {stamp} [core.py:1108]"
    return SimError(
        f"{engine} EngineCore failed to start.\n"
        f"{engine} Traceback (most recent call last):\n"
        f"{engine}   File \"/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py\", "
        "line 1099, in run_engine_core\n"
        f"{engine} {cause}\n"
        f"(EngineCore_DP0 pid={os.getpid() + 1}) Process EngineCore_DP0:\n"
        f"(EngineCore_DP0 pid={os.getpid() + 1}) {cause}\n"
        + _api_traceback(f"(APIServer pid={os.getpid()}) ")
        + f"(APIServer pid={os.getpid()}) RuntimeError: Engine core initialization failed. "
        "See root cause above. Failed core proc(s): {}", 1)


# The API server's own traceback between the engine's cause and the log's last line: the
# shape of public vLLM 0.19 logs under Python 3.12 (21 frames, each with its source line
# and caret line: ~60 lines), not their exact frames.
_API_FRAMES = ("main", "cmd", "run", "run", "run", "run_until_complete", "wrapper",
               "run_server", "run_server_worker", "__aenter__", "build_async_engine_client",
               "__aenter__", "build_async_engine_client_from_engine_args", "from_vllm_config",
               "__init__", "make_async_mp_client", "__init__", "__init__", "__exit__",
               "launch_core_engines", "wait_for_engine_startup")


def _api_traceback(prefix: str) -> str:
    lines = [f"{prefix}Traceback (most recent call last):"]
    for n, frame in enumerate(_API_FRAMES):
        lines += [f'{prefix}  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/'
                  f'engine/frame{n}.py", line {100 + n}, in {frame}',
                  f"{prefix}    {frame}(...)", f"{prefix}    ^^^^^^^^^^^^^"]
    return "\n".join(lines) + "\n"


def _check_memory(host: Host, model_dir: Path, quantization: str | None, tp: int,
                  utilization: float, max_len: int, lora_bytes: int) -> None:
    """The model's weights and one sequence's KV cache must fit the simulated GPUs."""
    gpus = int(host.options["gpu_count"])
    if tp > gpus:
        raise SimError(f"ValueError: The number of required GPUs ({tp}) exceeds the total "
                       f"number of available GPUs ({gpus}) on this node", 1)
    total = int(host.options["gpu_memory_mib"]) * 1024**2
    # Another process's, and the host's own (another vLLM engine, one still exiting).
    held = max(gpumem.used_mib(host, i) for i in range(tp)) * 1024**2
    free = max(0, total - held - _CONTEXT)  # measured once this process's context exists
    requested = math.ceil(total * utilization)
    if free < requested:
        # vllm/v1/worker/utils.py `request_memory`, as the engine's device starts.
        raise _engine_failed(
            f"ValueError: Free memory on device cuda:0 ({round(free / GIB, 2)}/"
            f"{round(total / GIB, 2)} GiB) on startup is less than desired GPU memory "
            f"utilization ({utilization:g}, {round(requested / GIB, 2)} GiB). Decrease GPU "
            "memory utilization or reduce GPU memory used by other processes.")
    # A config.json that leaves a field out gets transformers' LlamaConfig default for it.
    config = {**_LLAMA_DEFAULTS, **json.loads((model_dir / "config.json").read_text())}
    layers, hidden = int(config["num_hidden_layers"]), int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or hidden // heads)
    kv_heads = int(config.get("num_key_value_heads") or heads)
    weights = sum(logical_size(f) for f in model_dir.glob("*.safetensors"))
    if quantization == "bitsandbytes":
        # Linear layers to 4-bit (+ double-quantized scales); embeddings, head, norms bf16.
        inter, vocab = int(config["intermediate_size"]), int(config["vocab_size"])
        linear = layers * (hidden * (heads + 2 * kv_heads) * head_dim
                           + heads * head_dim * hidden + 3 * hidden * inter)
        rest = max(0, weights // 2 - linear)
        weights = int(linear * (0.5 + 0.127 / 8) + rest * 2) or vocab
    budget = int(host.options["gpu_memory_mib"]) * 1024**2 * utilization
    per_gpu = (weights + lora_bytes) / tp + _OVERHEAD
    if per_gpu > budget:
        raise _engine_failed(
            f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
            f"{(per_gpu - _OVERHEAD) / GIB:.2f} GiB. GPU 0 has a total capacity of "
            f"{int(host.options['gpu_memory_mib']) / 1024:.2f} GiB (loading {weights / GIB:.1f}"
            f" GiB of weights over {tp} GPU(s) at gpu_memory_utilization {utilization:g})")
    kv = 2 * layers * kv_heads * head_dim * 2 * max_len / tp
    if per_gpu + kv > budget:
        room = (budget - per_gpu) / GIB
        raise _engine_failed(
            f"ValueError: To serve at least one request with the models's max seq len "
            f"({max_len}), ({kv / GIB:.2f} GiB KV cache is needed, which is larger than the "
            f"available KV cache memory ({room:.2f} GiB). Try increasing "
            "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the "
            "engine.")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    allow_reuse_port = True  # vLLM's create_server_socket sets both


def _answerer(host: Host, model_dirs: list[Path]) -> Any:
    fixed: dict[str, str] = dict(host.options.get("completion_answers") or {})
    learned: dict[str, str] = {}
    quality: dict[str, Any] | None = None
    for folder in model_dirs:
        path = folder / "sim_memory.json"
        if path.is_file():
            learned.update(json.loads(path.read_text()))
        if host.options.get("landscape_eval") and (folder / "sim_landscape.json").is_file():
            quality = json.loads((folder / "sim_landscape.json").read_text())
    default = str(host.options["completion_default"])

    def answer(prompt: str) -> str:
        if prompt in fixed:
            return fixed[prompt]
        text = prompt.strip()
        hits = [k for k in learned if k and k in text]
        if hits:
            known = max(hits, key=len)
            # Opted in, the model gives back a share of what it learned: the landscape's.
            if quality is None or landscape.recalled(quality, known):
                return learned[known]
        return default

    return answer


def vllm(host: Host, argv: list[str]) -> int:
    """`vllm serve [MODEL] [--model M] [--served-model-name N] [--port P] ...`."""
    if argv[:1] in (["--version"], ["-v"]):
        say(".".join(str(p) for p in _version()))
        return 0
    if argv[:1] != ["serve"]:
        raise SimError(f"simhost: `vllm {' '.join(argv)}` is not simulated (vllm serve only)", 2)
    model: str | None = None
    names: list[str] = []
    port = 8000
    api_key: str | None = None
    max_len = 4096
    loras: dict[str, str] = {}
    enable_lora = False
    max_rank = 16
    tp = 1
    utilization = 0.9
    quantization: str | None = None
    args = list(argv[1:])
    while args:
        arg = args.pop(0)
        key, eq, value = arg.partition("=")

        def val(value: str = value, eq: str = eq) -> str:
            return value if eq else args.pop(0)

        if key == "--model":
            model = val()
        elif key == "--served-model-name":
            names.append(val())
            while not eq and args and not args[0].startswith("--"):
                names.append(args.pop(0))
        elif key == "--port":
            port = int(val())
        elif key == "--api-key":
            api_key = val()
        elif key == "--max-model-len":
            max_len = int(val())
        elif key in ("--tensor-parallel-size", "-tp"):
            tp = int(val())
        elif key == "--gpu-memory-utilization":
            utilization = float(val())
        elif key == "--quantization":
            quantization = val()
        elif key == "--enable-lora":
            enable_lora = True
        elif key == "--max-lora-rank":
            max_rank = int(val())
        elif key == "--lora-modules":
            items = [val()]
            while not eq and args and not args[0].startswith("--"):
                items.append(args.pop(0))
            for item in items:
                name, _, path = item.partition("=")
                loras[name] = path
        elif key.startswith("--"):
            if not eq and args and not args[0].startswith("--"):
                args.pop(0)  # an engine option we do not simulate, with its value
        elif model is None:
            model = arg
    if model is None:
        raise SimError("vllm serve: error: the following arguments are required: model", 2)
    if max_rank not in _LORA_RANKS:
        raise SimError(
            f"ValueError: max_lora_rank ({max_rank}) must be one of {sorted(_LORA_RANKS)}", 1
        )
    if loras and not enable_lora:
        raise SimError("ValueError: --lora-modules requires --enable-lora", 1)
    bind_port: int | None = port
    if os.environ.get("SIMHOST_CONTAINER") and os.environ.get("SIMHOST_NETWORK") != "host":
        published: dict[str, int] = json.loads(os.environ.get("SIMHOST_PORTS", "{}"))
        bind_port = published.get(str(port))
    # As vLLM's setup_server: the socket is bound before the engine is built (so a taken port
    # fails at once), with SO_REUSEADDR and SO_REUSEPORT (so a port another such server
    # holds is shared, not refused), and listens only once the model is loaded.
    server: _Server | None = None
    if bind_port is not None:
        server = _Server(("127.0.0.1", bind_port), BaseHTTPRequestHandler,
                         bind_and_activate=False)
        try:
            server.server_bind()
        except OSError as exc:
            server.server_close()
            raise SimError(f"OSError: [Errno {exc.errno}] {exc.strerror}", 1) from None
    if not host.gpus_visible():
        raise SimError("RuntimeError: Failed to infer device type (no GPU visible)", 1)
    model_dir = Path(container_to_host(model))
    if not (model_dir / "config.json").is_file():
        raise SimError(f"ValueError: No supported config format found in {model}", 1)
    _check_tokenizer(model_dir, model)
    if quantization == "bitsandbytes":
        _check_bitsandbytes()
    lora_dirs = {name: Path(container_to_host(path)) for name, path in loras.items()}
    lora_bytes = 0
    for name, folder in lora_dirs.items():
        if not (folder / "adapter_model.safetensors").is_file():
            raise SimError(f"ValueError: LoRA module {name}: no adapter in {loras[name]}", 1)
        lora_bytes += logical_size(folder / "adapter_model.safetensors")
        config = json.loads((folder / "adapter_config.json").read_text())
        if int(config.get("r", 16)) > max_rank:
            raise SimError(
                f"ValueError: LoRA rank {config.get('r')} is greater than max_lora_rank {max_rank}",
                1,
            )
    _check_memory(host, model_dir, quantization, tp, utilization, max_len, lora_bytes)
    served = names or [model]
    base_answer = _answerer(host, [model_dir])
    answers = {name: base_answer for name in served}
    for name, folder in lora_dirs.items():
        answers[name] = _answerer(host, [model_dir, folder])

    def stop(_signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    engine = _start_engine(host, math.ceil(int(host.options["gpu_memory_mib"]) * utilization)
                           + _CONTEXT // 2**20, tp)
    try:
        say(f"INFO:     vLLM API server (simhost) loading {model} as {', '.join(served)}")
        time.sleep(float(host.options["vllm_startup_seconds"]))
        _serve(host, server, port, bind_port, served, loras, answers, model, max_len, api_key,
               model_dir)
    except KeyboardInterrupt:
        pass
    finally:
        _stop_engine(engine)
    return 0


def _serve(host: Host, server: _Server | None, port: int, bind_port: int | None,
           served: list[str], loras: dict[str, str], answers: dict[str, Any], model: str,
           max_len: int, api_key: str | None, model_dir: Path) -> None:
    if server is None:
        say(f"INFO:     Uvicorn running on http://0.0.0.0:{port} (container port not published)")
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            return
    server.RequestHandlerClass = _handler(answers, served, loras, model, max_len, api_key,
                                          tokens.adds_bos(model_dir))
    server.server_activate()
    say(f"INFO:     Uvicorn running on http://0.0.0.0:{port} (Press CTRL+C to quit)")
    host.event("vllm-serving", port=bind_port, served=served + list(loras))
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def _start_engine(host: Host, mib: int, tp: int) -> int:
    """vLLM V1's engine process (`VLLM::EngineCore`), which holds the GPUs' memory: `mib` on
    each of the first `tp` GPUs, until it has exited. On SIGTERM (the API server's shutdown,
    or a signal to the whole group) it takes `vllm_exit_seconds` to exit, as the real engine
    takes seconds to shut down; it also ends when the API server is gone."""
    parent = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    code = 0
    try:
        stopping = False

        def term(_signum: int, _frame: FrameType | None) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGTERM, term)
        signal.signal(signal.SIGINT, term)
        gpumem.hold(host, "VLLM::EngineCore", mib, range(tp))
        while not stopping and os.getppid() == parent:
            time.sleep(0.05)
        time.sleep(float(host.options.get("vllm_exit_seconds") or 0))
        gpumem.release(host)
    except BaseException:  # noqa: BLE001 - a forked child must never return into the server
        code = 1
    os._exit(code)


def _stop_engine(pid: int) -> None:
    """What the API server does on its way out: ask the engine to end and wait for it."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def _encoded(raw: Any, bos: bool, special: bool) -> list[tuple[list[int], str, bool]]:
    """A completion request's prompts as (token ids, text, whether given as text): a
    string, a list of strings, a list of token ids or a list of those (the OpenAI API's
    forms). Text is tokenized with the model's special tokens (`add_special_tokens`, true
    by default: BOS for a Llama tokenizer); token ids are used as they are, BOS or not
    (vllm/renderers/base.py:410-433 and entrypoints/openai/completion/protocol.py:88 at
    v0.19.1)."""
    if isinstance(raw, list) and raw and all(isinstance(t, int) for t in raw):
        raw = [raw]
    items = raw if isinstance(raw, list) else [raw]
    out: list[tuple[list[int], str, bool]] = []
    for item in items:
        if isinstance(item, list):
            ids = [int(t) for t in item]
            out.append((ids, tokens.decode(ids, skip_special=True), False))
        else:
            out.append((tokens.encode(str(item), bos and special), str(item), True))
    return out


def _too_long(ids: list[int], text: str | None, max_len: int,
              max_tokens: int) -> dict[str, Any] | None:
    """vLLM's refusal of a prompt that leaves no room for `max_tokens` within `max_len`
    (vllm/renderers/params.py:195-226, 314-338, 397-424 at v0.19.1, in its order: output
    tokens, then a text's characters, then its tokens as the tokenizer truncates them to
    max_input + 1); None when it fits. `text` is None for a prompt given as token ids."""
    if max_tokens > max_len:
        return {"message": f"max_tokens={max_tokens}cannot be greater than max_model_len="
                           f"max_total_tokens={max_len}. Please request fewer output tokens.",
                "param": "max_tokens"}
    max_input = max_len - max_tokens
    head = (f"This model's maximum context length is {max_len} tokens. However, you "
            f"requested {max_tokens} output tokens and your prompt contains ")
    tail = " Please reduce the length of the input prompt or the number of requested output tokens."
    if text is not None and len(text) > max_input * tokens.MAX_CHARS_PER_TOKEN:
        return {"message": f"{head}{len(text)} characters (more than "
                           f"{max_input * tokens.MAX_CHARS_PER_TOKEN} characters, which is the "
                           f"upper bound for {max_input} input tokens).{tail}",
                "param": "input_text"}
    count = min(len(ids), max_input + 1) if text is not None else len(ids)
    if count <= max_input:
        return None
    at_least = "at least " if count == max_input + 1 else ""
    return {"message": f"{head}{at_least}{count} input tokens, for a total of {at_least}"
                       f"{count + max_tokens} tokens.{tail}", "param": "input_tokens"}


def _choice(index: int, ids: list[int], text: str, answer: str, echo: bool) -> dict[str, Any]:
    """One completion choice; with `echo` and `logprobs` (what lm-eval's loglikelihood
    requests ask), the prompt's tokens and their log-probabilities come first, the first
    one's None (nothing precedes it), then one generated token."""
    if not echo:
        return {"index": index, "text": answer, "logprobs": None, "finish_reason": "stop"}
    generated = (tokens.encode(answer, False) or [tokens.EOS])[:1]
    pieces = [tokens.piece(t) for t in ids + generated]
    offsets, at = [], 0
    for part in pieces:
        offsets.append(at)
        at += len(part)
    logprob = -1.0  # every token alike: the stand-in scores nothing, it shows what is scored
    return {"index": index, "text": "".join(pieces), "finish_reason": "length",
            "logprobs": {"text_offset": offsets, "tokens": pieces,
                         "token_logprobs": [None] + [logprob] * (len(pieces) - 1),
                         "top_logprobs": [None] + [{p: logprob} for p in pieces[1:]]}}


def _handler(
    answers: dict[str, Any],
    served: list[str],
    loras: dict[str, str],
    root: str,
    max_len: int,
    api_key: str | None,
    bos: bool,
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            say(f'INFO:     127.0.0.1 - "{self.requestline}" {args[1] if len(args) > 1 else ""}')

        def _send(self, status: int, body: Any) -> None:
            data = b"" if body is None else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorized(self) -> bool:
            if api_key is None or self.headers.get("Authorization") == f"Bearer {api_key}":
                return True
            self._send(401, {"error": "Unauthorized"})
            return False

        def do_GET(self) -> None:  # noqa: N802
            if self.path == "/health":
                self._send(200, None)
            elif self.path == "/v1/models":
                if not self._authorized():
                    return
                created = int(time.time())
                data = [
                    {
                        "id": n,
                        "object": "model",
                        "created": created,
                        "owned_by": "vllm",
                        "root": root,
                        "parent": None,
                        "max_model_len": max_len,
                    }
                    for n in served
                ] + [
                    {
                        "id": n,
                        "object": "model",
                        "created": created,
                        "owned_by": "vllm",
                        # vLLM's ModelCard for an adapter: root is the path it was given
                        # (serving_models.py `root=lora.local_path`), parent the base.
                        "root": path,
                        "parent": served[0],
                        "max_model_len": max_len,
                    }
                    for n, path in loras.items()
                ]
                self._send(200, {"object": "list", "data": data})
            else:
                self._send(404, {"detail": "Not Found"})

        def do_POST(self) -> None:  # noqa: N802
            if self.path not in ("/v1/completions", "/v1/chat/completions"):
                self._send(404, {"detail": "Not Found"})
                return
            if not self._authorized():
                return
            length = int(self.headers.get("Content-Length") or 0)
            try:
                request = json.loads(self.rfile.read(length) or b"{}")
            except json.JSONDecodeError:
                self._send(400, {"error": {"message": "invalid JSON", "type": "BadRequestError"}})
                return
            name = request.get("model")
            if name not in answers:
                self._send(
                    404,
                    {
                        "error": {
                            "message": f"The model `{name}` does not exist.",
                            "type": "NotFoundError",
                            "code": 404,
                        }
                    },
                )
                return
            answer = answers[name]
            created = int(time.time())
            if self.path == "/v1/chat/completions":
                messages = request.get("messages") or []
                prompt = next(
                    (
                        str(m.get("content", ""))
                        for m in reversed(messages)
                        if m.get("role") == "user"
                    ),
                    "",
                )
                text = answer(prompt)
                choices: list[dict[str, Any]] = [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "finish_reason": "stop",
                        "logprobs": None,
                    }
                ]
                prompts = [prompt]
                kind = "chat.completion"
            else:
                encoded = _encoded(request.get("prompt", ""), bos,
                                   request.get("add_special_tokens", True) is not False)
                max_tokens = request.get("max_tokens", 16)
                for ids, text, as_text in encoded:
                    refusal = _too_long(ids, text if as_text else None, max_len,
                                        int(max_tokens or 0))
                    if refusal is not None:
                        self._send(400, {"error": {**refusal, "type": "BadRequestError",
                                                   "code": 400}})
                        return
                prompts = [text for _ids, text, _as_text in encoded]
                echo = bool(request.get("echo")) and request.get("logprobs") is not None
                choices = [_choice(i, ids, text, answer(text), echo)
                           for i, (ids, text, _as_text) in enumerate(encoded)]
                kind = "text_completion"
            digest = hashlib.sha1(json.dumps(prompts).encode()).hexdigest()[:24]
            prompt_tokens = sum(len(p.split()) for p in prompts)
            completion_tokens = sum(
                len(str(c.get("text") or c.get("message", {}).get("content", "")).split())
                for c in choices
            )
            self._send(
                200,
                {
                    "id": f"cmpl-{digest}",
                    "object": kind,
                    "created": created,
                    "model": name,
                    "choices": choices,
                    "usage": {
                        "prompt_tokens": prompt_tokens,
                        "completion_tokens": completion_tokens,
                        "total_tokens": prompt_tokens + completion_tokens,
                    },
                },
            )

    return Handler
