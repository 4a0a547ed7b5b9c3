"""A black-holed API on 127.0.0.1: it accepts TCP connections and never answers.

What a provider API behind a broken load balancer looks like to a client: the connect
succeeds, the request is sent, no byte comes back until the client's read timeout. Counts
the connections it accepted, so a test can assert who was (not) asked.
"""

from __future__ import annotations

import socket
import threading


class BlackHole:
    """Accept and hold connections until `stop()`; `connections` counts them."""

    def __init__(self) -> None:
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self._sock.settimeout(0.1)
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        self.connections = 0
        self._thread = threading.Thread(target=self._serve, daemon=True, name="blackhole")

    @property
    def url(self) -> str:
        """An http:// base URL on the black hole."""
        return f"http://127.0.0.1:{self._sock.getsockname()[1]}/api/v0"

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            self._held.append(conn)  # never read from, never answered

    def __enter__(self) -> BlackHole:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Close the listener and every held connection."""
        self._stop.set()
        self._thread.join(timeout=5)
        for conn in self._held:
            conn.close()
        self._sock.close()
