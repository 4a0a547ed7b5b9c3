"""How every stand-in command starts: in the host's init when it can, else in this process.

A stand-in imports ~25 ms of CPU worth of modules (json, pathlib and the stand-ins) before it
does anything, and a simulated job runs ~60 of them. The host's init (standins/init.py) has
imported them once: for the short commands below, this process hands its argv, environment,
working directory, umask and three standard streams to init, which forks a process that
runs the command with them and says how it ended. This process then ends the same way (its
exit status, or the signal that killed the command), and passes on the signals it gets
meanwhile. Long-running commands, and those whose own process others find, wait on or signal
by its pid (`docker run` and its container's commands, `docker stop`, vLLM, axolotl, `hf
download`, ...), always run in this process, as does any
command when init does not answer (it does not listen when the host was started with
`SIMHOST_RELAY=0` in the environment).

Only builtin modules are imported here (`_socket`, `_signal`: not `socket` or `signal`,
which import enum; `typing` only for type checkers), so a relayed command costs little
more than a bare `python -S -E`.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    import _socket
    from types import FrameType

# Commands that run in init: each is short and nothing looks for its own process (what one
# starts, e.g. `systemctl restart docker`, is reparented to init, as it is when the command
# runs alone). command -> its first arguments that may be relayed (None: any).
RELAYED: dict[str, set[str] | None] = {
    "docker": {"inspect", "logs", "--version", "version", "info", "image", "rm", "run"},
    "dpkg-query": None,
    "nvidia-smi": None,
    "lsblk": None,
    "df": None,
    "id": None,
    "curl": None,
    "gpg": None,
    "nvidia-ctk": None,
    "apt-get": None,
    "apt": None,
    "systemctl": None,
    "service": None,
}
# Set once, read by init and by tests: the abstract socket init listens on.
SOCKET = "simhost-relay-{pid}"


def relayable(name: str, argv: list[str]) -> bool:
    """Whether `name argv` may run in init (see RELAYED)."""
    if name not in RELAYED:
        return False
    first = RELAYED[name]
    if first is None:
        return True
    if not argv or argv[0] not in first:
        return False
    if argv[0] == "image":
        return argv[1:2] == ["inspect"]
    if argv[0] == "run":
        # Detached, as the playbooks start containers (`docker run -d ...`): the command
        # returns once the container runs, in a process of its own (docker.py's supervisor).
        # In the foreground, the command waits on the container: it is not short.
        return argv[1:2] == ["-d"]
    # `docker logs -f` follows the container until it ends: not short.
    return not (argv[0] == "logs" and ("-f" in argv or "--follow" in argv))


def _init_pid() -> int | None:
    host = os.environ.get("SIMHOST_DIR")
    if not host:
        return None
    try:
        with open(os.path.join(host, "state", "init.pid"), "rb") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def encode(name: str, argv: list[str]) -> bytes:
    """The request: NUL-separated fields (no field can hold a NUL: argv, environment)."""
    umask = os.umask(0)
    os.umask(umask)
    fields = [name, str(len(argv)), *argv, os.getcwd(), str(umask)]
    fields += [f"{k}={v}" for k, v in os.environ.items()]
    return b"\0".join(os.fsencode(f) for f in fields)


def relay(name: str, argv: list[str]) -> int | None:
    """Run the command in init; its exit status, or None when init cannot take it."""
    pid = _init_pid()
    if pid is None:
        return None
    import _socket

    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.connect(b"\0" + SOCKET.format(pid=pid).encode())
        body = encode(name, argv)
        fds = b"".join(fd.to_bytes(4, sys.byteorder) for fd in (0, 1, 2))
        sock.sendmsg([len(body).to_bytes(8, "big") + body],
                     [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)])
    except OSError:  # no init listening (stopped, or an older one), or a stream is closed
        sock.close()
        return None
    return _wait(sock)


def _wait(sock: _socket.socket) -> int | None:
    """Read the command's pid, pass signals on to it, and return how it ended (None: init
    does not run this command)."""
    import _signal

    said = b""
    child: int | None = None

    def forward(signum: int, _frame: FrameType | None) -> None:
        if child is not None:
            try:
                os.kill(child, signum)
            except ProcessLookupError:
                pass

    for signum in (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP, _signal.SIGQUIT):
        _signal.signal(signum, forward)
    while True:
        chunk = sock.recv(64)
        if not chunk:
            break
        said += chunk
        lines = said.split(b"\n")
        if lines[0] == b"-":
            break
        if child is None and len(lines) > 1:
            child = int(lines[0])
        if len(lines) > 2:
            break
    sock.close()
    lines = said.split(b"\n")
    if lines[0] == b"-":  # init does not run this command (not one of RELAYED)
        return None
    if len(lines) < 3:
        sys.stderr.write("simhost: the host's init stopped while running the command\n")
        return 255
    status = int(lines[1])
    if status < 0:  # killed by a signal: end the same way, as the shell then sees it
        _signal.signal(-status, _signal.SIG_DFL)
        os.kill(os.getpid(), -status)
        return 128 - status
    return status


def run(name: str) -> None:
    """The stand-in script's whole body: relay `name sys.argv[1:]`, else run it here."""
    argv = sys.argv[1:]
    code = relay(name, argv) if relayable(name, argv) else None
    if code is None:
        here = os.path.dirname(os.path.realpath(__file__))
        sys.path.insert(0, os.path.realpath(os.path.join(here, "..", "..")))
        from simhost.standins import main

        code = main(name, argv)
    sys.exit(code)
