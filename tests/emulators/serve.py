"""A threaded HTTP/1.1 server on 127.0.0.1 (ephemeral port) that hands every request to one
function, and the start/stop/context-manager lifecycle every HTTP emulator shares over it
(the Vast.ai, RunPod and Hub emulators).

A provider's emulator can also answer as a hostile or broken server would (`answer_next`):
any bytes in place of the documented JSON (NaN, `1e999999`, nesting 100,000 deep, escape
sequences), a body of any size streamed from a generator without holding it (with or
without a `Content-Length`), or gzip-encoded. `raw_sent` counts what such answers wrote
before the client stopped reading.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
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


@dataclass
class RawAnswer:
    """The next `count` requests matching `method` and `path` (a prefix) get `body`: bytes,
    or a function giving the chunks to send (a body of any size, never held whole)."""

    body: bytes | Callable[[], Iterable[bytes]]
    status: int = 200
    count: int = 1
    method: str | None = None
    path: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    length: int | None = None  # the Content-Length to announce; None: the body's (chunked
    # when the body is a generator)

    def matches(self, method: str, path: str) -> bool:
        return ((self.method is None or self.method == method)
                and (self.path is None or path.startswith(self.path)))


class Served(ABC):
    """An emulator served by a `LoopbackServer`: `start`/`stop`, `with`, and `served_url`.

    Subclasses give `serve(request)` (every request of `METHODS`) and name their API root
    from `served_url`."""

    METHODS: tuple[str, ...] = ("GET", "HEAD", "POST", "PUT", "DELETE")
    _server: LoopbackServer | None = None
    _raw: list[RawAnswer] | None = None
    raw_sent: int = 0  # bytes of raw answers written (what the client let through)

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

    def answer_next(self, body: bytes | str | Callable[[], Iterable[bytes]], *,
                    status: int = 200, count: int = 1, method: str | None = None,
                    path: str | None = None, headers: dict[str, str] | None = None,
                    length: int | None = None) -> None:
        """Answer the next `count` matching requests with `body` as it is (see RawAnswer),
        `Content-Type: application/json` unless `headers` say otherwise."""
        data = body.encode() if isinstance(body, str) else body
        if self._raw is None:
            self._raw = []
        self._raw.append(RawAnswer(data, status, count, method, path,
                                   {"Content-Type": "application/json", **(headers or {})},
                                   length))

    def send_raw(self, request: BaseHTTPRequestHandler, path: str) -> int | None:
        """Answer `request` with the next matching raw answer and return its status; None
        when there is none. Call it first in `serve`, after reading the request's body."""
        raw = next((r for r in self._raw or [] if r.count > 0
                    and r.matches(request.command, path)), None)
        if raw is None:
            return None
        raw.count -= 1
        request.send_response(raw.status)
        for name, value in raw.headers.items():
            request.send_header(name, value)
        if isinstance(raw.body, bytes):
            chunks: Iterable[bytes] = [raw.body]
            length: int | None = len(raw.body) if raw.length is None else raw.length
        else:
            chunks, length = raw.body(), raw.length
        if length is None:
            request.send_header("Transfer-Encoding", "chunked")
        else:
            request.send_header("Content-Length", str(length))
        request.end_headers()
        request.close_connection = True
        try:
            for chunk in chunks:
                data = chunk if length is not None else b"%x\r\n%s\r\n" % (len(chunk), chunk)
                request.wfile.write(data)
                self.raw_sent += len(chunk)
            if length is None:
                request.wfile.write(b"0\r\n\r\n")
            request.wfile.flush()
        except OSError:  # the client stopped reading and closed: what a real server sees
            pass
        return raw.status

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def served_url(self) -> str:
        """`http://127.0.0.1:PORT` while serving."""
        assert self._server is not None, "start() the emulator first"
        return self._server.url
