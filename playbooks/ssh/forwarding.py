"""Port forwarding: a local 127.0.0.1 port carried to a port on the host over SSH."""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from collections.abc import Iterator

import paramiko
from fabric import Connection

from playbooks.ssh.errors import ConnectionLost


class _Forwarder:
    """Accepts on a free 127.0.0.1 port; each connection becomes a direct-tcpip channel.

    A channel the server cannot open (the remote port refuses, e.g. a server still loading)
    closes that one local connection and the forwarder keeps accepting, so callers can poll
    readiness through it.
    """

    def __init__(self, transport: paramiko.Transport, remote_host: str, remote_port: int) -> None:
        self.transport = transport
        self.remote = (remote_host, remote_port)
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.listener.settimeout(0.2)
        self.local_port: int = self.listener.getsockname()[1]
        self.stopping = threading.Event()
        self.sockets: set[socket.socket | paramiko.Channel] = set()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._accept, name="ssh-tunnel", daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                client, _addr = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            channel = self.transport.open_channel(
                "direct-tcpip", self.remote, client.getpeername(), timeout=10
            )
        except (paramiko.SSHException, EOFError, OSError):
            client.close()
            return
        with self.lock:
            self.sockets.update((client, channel))
        try:
            while not self.stopping.is_set():
                readable, _w, _x = select.select([client, channel], [], [], 0.5)
                if client in readable:
                    data = client.recv(65536)
                    if not data:
                        break
                    channel.sendall(data)
                if channel in readable:
                    data = channel.recv(65536)
                    if not data:
                        break
                    client.sendall(data)
        except (OSError, EOFError, paramiko.SSHException):
            pass
        finally:
            with self.lock:
                self.sockets.discard(client)
                self.sockets.discard(channel)
            channel.close()
            client.close()

    def close(self) -> None:
        self.stopping.set()
        self.listener.close()
        self.thread.join(timeout=2)
        with self.lock:
            for item in list(self.sockets):
                with contextlib.suppress(Exception):
                    item.close()


@contextlib.contextmanager
def tunnel(conn: Connection, remote_port: int, remote_host: str = "127.0.0.1") -> Iterator[int]:
    """Forward a free local 127.0.0.1 port to remote_host:remote_port on the host; yields it."""
    if not conn.is_connected:
        raise ConnectionLost(f"{conn.host}:{conn.port}: not connected (use the factory first)")
    forwarder = _Forwarder(conn.transport, remote_host, remote_port)
    try:
        yield forwarder.local_port
    finally:
        forwarder.close()
