"""Which port of the host's 127.0.0.1 the eval server takes: the one asked for if nothing
listens there, else the next free one.

A GPU host is not always a blank machine: a dedicated server may run the user's own
services, and preconfigured GPU images start theirs (a public deployment log of vLLM on a
cloud GPU image found Caddy on 8000, vLLM's default, one day, and the image's own container
publishing 8000 another).
Starting vLLM there fails, or worse: vLLM binds its socket with SO_REUSEPORT
(`create_server_socket` in vllm/entrypoints/openai/api_server.py), so a second vLLM on a port
another vLLM of the same user holds starts without error and the kernel splits the
connections between the two, and the evaluation scores whichever answers. So the port is
chosen on the host, at the moment the server starts, from the TCP sockets listening there
(`/proc/net/tcp` and `/proc/net/tcp6`: every Linux has them, no `ss` or Python needed), and a
start refused for the port (a socket bound but not yet listening is not in those tables:
Docker's own allocations, a server still loading) is tried again on the next one.

What this cannot see: another vLLM of the same user that is still loading (bound with
SO_REUSEPORT, not yet listening) takes no room in those tables, and a server started on its
port shares it once both listen. The readiness probe still waits for this job's model
(`vllm.probe`'s `root`), but scoring could reach the other. One job holds a machine at a
time, so on a real host that other server would be the user's own; on the test bench, where
every simulated host shares this machine's loopback, the engine draws the asked port at
random as the evaluation starts (`JobHooks.eval_port`), checking that nothing is
bound there.
"""

from __future__ import annotations

from collections.abc import Collection

from .base import Fault, Host, StepFailed

TRIES = 3  # starts on a refused port before the evaluation fails
SPAN = 100  # ports above the one asked for that are looked at
_LISTEN = "0A"  # TCP_LISTEN in the `st` column of /proc/net/tcp
# What a start refused for its port says: vLLM's bind (Python's OSError for EADDRINUSE), and
# Docker's publishing of it, for a port another process holds (`failed to bind host port
# ...: address already in use`) or another container (`port is already allocated`).
_REFUSED = ("address already in use", "port is already allocated")


def parse_listening(text: str) -> set[int]:
    """The local ports of the listening sockets in `/proc/net/tcp{,6}` text (header lines,
    other states and anything unparseable are skipped)."""
    ports: set[int] = set()
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 4 or fields[3] != _LISTEN:
            continue
        _address, _, port = fields[1].rpartition(":")
        try:
            ports.add(int(port, 16))
        except ValueError:
            continue
    return ports


def listening(host: Host) -> set[int]:
    """The TCP ports something listens on at the host (any address). A host without IPv6
    has no tcp6 table: `cat` prints the other and exits 1, which is fine."""
    return parse_listening(host.run(["cat", "/proc/net/tcp", "/proc/net/tcp6"]).stdout)


def pick(wanted: int, taken: Collection[int], span: int = SPAN) -> int:
    """`wanted` if it is not `taken`, else the lowest free port above it within `span`."""
    for port in range(wanted, min(wanted + span, 65536)):
        if port not in taken:
            return port
    raise StepFailed(f"no free port for the eval server on the host's 127.0.0.1 from {wanted} "
                     f"to {min(wanted + span, 65536) - 1}: something listens on each of them",
                     fault=Fault.HOST)


def refused(failure: StepFailed) -> bool:
    """Whether a server start failed because its port was taken."""
    text = f"{failure} {failure.stderr_tail}".lower()
    return any(sign in text for sign in _REFUSED)
