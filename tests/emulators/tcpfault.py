"""Network faults between orch and a simulated host, injected for real on loopback (issue 23).

`FaultyProxy` is a TCP proxy on 127.0.0.1 in front of one host's sshd. Each accepted
connection gets the next fault of its plan (then none):

- `"silent"`: the TCP connect succeeds, but no byte ever comes back (no SSH banner), as a
  host whose sshd hangs, or a port forwarded to a dead container, looks to a client;
- `("reset", n)`: bytes pass both ways until `n` bytes went from the client to the host,
  then both sides are closed with SO_LINGER 0, which sends a TCP RST (ECONNRESET at the
  client), as a NAT or a provider's proxy dropping a connection mid-transfer does;
- `None`: a plain pass-through.

`FaultyHosts` wraps an emulator's `SimHostBackend`: every host it boots is reached through a
proxy, with the faults planned for that instance (the first instance gets `plans[0]`, ...).
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

Fault = str | tuple[str, int] | None


def _reset(sock: socket.socket) -> None:
    """Close with an RST instead of a FIN (SO_LINGER on, timeout 0)."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


class FaultyProxy:
    """Forward 127.0.0.1:<port> to `target`, applying `faults` to the first connections."""

    def __init__(self, target: tuple[str, int], faults: Sequence[Fault] = ()) -> None:
        self.target = target
        self.faults: list[Fault] = list(faults)
        self.connections = 0
        self.resets = 0
        self.client_bytes = 0  # sent by clients towards the host, over all connections
        self._lock = threading.Lock()
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(32)
        self._sock.settimeout(0.1)
        self._stop = threading.Event()
        self._open: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True, name="faulty-proxy").start()

    @property
    def port(self) -> int:
        return int(self._sock.getsockname()[1])

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self.connections += 1
                fault = self.faults.pop(0) if self.faults else None
                self._open.append(client)
            if fault == "silent":
                continue  # held open, never answered
            threading.Thread(target=self._pump, args=(client, fault), daemon=True).start()

    def _pump(self, client: socket.socket, fault: Fault) -> None:
        limit = fault[1] if isinstance(fault, tuple) else None
        try:
            upstream = socket.create_connection(self.target, timeout=5)
        except OSError:
            _reset(client)
            return
        with self._lock:
            self._open.append(upstream)
        sent = 0
        try:
            while not self._stop.is_set():
                ready, _, _ = select.select([client, upstream], [], [], 0.2)
                for sock in ready:
                    data = sock.recv(65536)
                    if not data:
                        return
                    if sock is client and limit is not None and sent + len(data) >= limit:
                        upstream.sendall(data[: max(0, limit - sent)])
                        with self._lock:
                            self.resets += 1
                        _reset(client)
                        _reset(upstream)
                        return
                    (upstream if sock is client else client).sendall(data)
                    if sock is client:
                        sent += len(data)
                        with self._lock:
                            self.client_bytes += len(data)
        except OSError:
            return
        finally:
            for sock in (client, upstream):
                with contextlib.suppress(OSError):
                    sock.close()

    def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._sock.close()
        with self._lock:
            for sock in self._open:
                with contextlib.suppress(OSError):
                    sock.close()


class FaultyHosts:
    """An emulator's host backend whose hosts are reached through `FaultyProxy`s.

    `plans[i]` is the fault list of the i-th instance booted (later instances: none).
    Everything else (path mapping, stop, the hosts themselves) is the wrapped backend's.
    """

    def __init__(self, backend: Any, plans: Sequence[Sequence[Fault]]) -> None:
        self.backend = backend
        self.plans = [list(p) for p in plans]
        self.proxies: dict[str, FaultyProxy] = {}

    def start(self, instance_id: str, public_key: str, gpu_name: str, gpu_count: int,
              container: dict[str, Any] | None = None) -> tuple[str, int, str]:
        host, port, user = self.backend.start(instance_id, public_key, gpu_name, gpu_count,
                                              container)
        proxy = self.proxies.get(str(instance_id))
        if proxy is None:
            plan = self.plans.pop(0) if self.plans else []
            proxy = self.proxies[str(instance_id)] = FaultyProxy((host, port), plan)
        return "127.0.0.1", proxy.port, user

    def stop(self, instance_id: str) -> None:
        self.backend.stop(instance_id)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)

    def stop_all(self) -> None:
        for proxy in self.proxies.values():
            proxy.stop()
        self.backend.stop_all()

    @property
    def base_dir(self) -> Path:
        return Path(self.backend.base_dir)
