"""A threaded HTTP/1.1 server on 127.0.0.1 (ephemeral port) that hands every request to one
function: the lifecycle emulators share (new emulators use it; older ones have their own)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


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
