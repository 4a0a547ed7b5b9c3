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

import hashlib
import json
import os
import signal
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from typing import Any

from .common import Host, SimError, container_to_host, say

_LORA_RANKS = {1, 8, 16, 32, 64, 128, 256, 320, 512}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def _answerer(host: Host, model_dirs: list[Path]) -> Any:
    fixed: dict[str, str] = dict(host.options.get("completion_answers") or {})
    learned: dict[str, str] = {}
    for folder in model_dirs:
        path = folder / "sim_memory.json"
        if path.is_file():
            learned.update(json.loads(path.read_text()))
    default = str(host.options["completion_default"])

    def answer(prompt: str) -> str:
        if prompt in fixed:
            return fixed[prompt]
        text = prompt.strip()
        hits = [k for k in learned if k and k in text]
        if hits:
            return learned[max(hits, key=len)]
        return default

    return answer


def vllm(host: Host, argv: list[str]) -> int:
    """`vllm serve [MODEL] [--model M] [--served-model-name N] [--port P] ...`."""
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
    if not host.gpus_visible():
        raise SimError("RuntimeError: Failed to infer device type (no GPU visible)", 1)
    model_dir = Path(container_to_host(model))
    if not (model_dir / "config.json").is_file():
        raise SimError(f"ValueError: No supported config format found in {model}", 1)
    lora_dirs = {name: Path(container_to_host(path)) for name, path in loras.items()}
    for name, folder in lora_dirs.items():
        if not (folder / "adapter_model.safetensors").is_file():
            raise SimError(f"ValueError: LoRA module {name}: no adapter in {loras[name]}", 1)
        config = json.loads((folder / "adapter_config.json").read_text())
        if int(config.get("r", 16)) > max_rank:
            raise SimError(
                f"ValueError: LoRA rank {config.get('r')} is greater than max_lora_rank {max_rank}",
                1,
            )
    served = names or [model]
    base_answer = _answerer(host, [model_dir])
    answers = {name: base_answer for name in served}
    for name, folder in lora_dirs.items():
        answers[name] = _answerer(host, [model_dir, folder])

    bind_port: int | None = port
    if os.environ.get("SIMHOST_CONTAINER") and os.environ.get("SIMHOST_NETWORK") != "host":
        published: dict[str, int] = json.loads(os.environ.get("SIMHOST_PORTS", "{}"))
        bind_port = published.get(str(port))
    say(f"INFO:     vLLM API server (simhost) loading {model} as {', '.join(served)}")
    time.sleep(float(host.options["vllm_startup_seconds"]))

    def stop(_signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    if bind_port is None:
        say(f"INFO:     Uvicorn running on http://0.0.0.0:{port} (container port not published)")
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            return 0
    handler = _handler(answers, served, list(loras), model, max_len, api_key)
    try:
        server = _Server(("127.0.0.1", bind_port), handler)
    except OSError as exc:
        raise SimError(
            f"OSError: [Errno {exc.errno}] error while attempting to bind on address "
            f"('127.0.0.1', {bind_port}): {exc.strerror}",
            1,
        ) from None
    say(f"INFO:     Uvicorn running on http://0.0.0.0:{port} (Press CTRL+C to quit)")
    host.event("vllm-serving", port=bind_port, served=served + list(loras))
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


def _handler(
    answers: dict[str, Any],
    served: list[str],
    loras: list[str],
    root: str,
    max_len: int,
    api_key: str | None,
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
                        "root": n,
                        "parent": served[0],
                        "max_model_len": max_len,
                    }
                    for n in loras
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
                raw = request.get("prompt", "")
                prompts = [str(p) for p in raw] if isinstance(raw, list) else [str(raw)]
                choices = [
                    {"index": i, "text": answer(p), "logprobs": None, "finish_reason": "stop"}
                    for i, p in enumerate(prompts)
                ]
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
