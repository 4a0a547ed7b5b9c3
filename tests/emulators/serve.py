"""A threaded HTTP/1.1 server on 127.0.0.1 (ephemeral port) that hands every request to one
function, and the start/stop/context-manager lifecycle every HTTP emulator shares over it
(the Vast.ai, RunPod and Hub emulators)."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self


class LoopbackServer:
    """`handle(request)` for every `methods` request, served from a daemon thread."""

    def __init__(self, handle: Callable[[BaseHTTPRequestHandler], None],
                 methods: tuple[str, ...] = ("GET", "HEAD", "POST", "PUT", "DELETE")) -> None:
        def dispatch(request: BaseHTTPRequestHandler) -> None:
            handle(request)

        attrs: dict[str, Any] = {
            "protocol_version": "HTTP/1.1",  # keep-alive, as HTTP clients' pools expect
            "log_message": lambda self, format, *args: None,
            **{f"do_{m}": dispatch for m in methods},
        }
        handler = type("Handler", (BaseHTTPRequestHandler,), attrs)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class Served(ABC):
    """An emulator served by a `LoopbackServer`: `start`/`stop`, `with`, and `served_url`.

    Subclasses give `serve(request)` (every request of `METHODS`) and name their API root
    from `served_url`."""

    METHODS: tuple[str, ...] = ("GET", "HEAD", "POST", "PUT", "DELETE")
    _server: LoopbackServer | None = None

    @abstractmethod
    def serve(self, request: BaseHTTPRequestHandler) -> None:
        """Answer one request (read its body, write the status, headers and body)."""

    def start(self) -> Self:
        """Bind 127.0.0.1:0 and serve from a daemon thread."""
        self._server = LoopbackServer(self.serve, self.METHODS)
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        if self._server is not None:
            self._server.close()
            self._server = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def served_url(self) -> str:
        """`http://127.0.0.1:PORT` while serving."""
        assert self._server is not None, "start() the emulator first"
        return self._server.url
