"""One SSH connection used from several threads (issue 10 §1), and deadlines on every call.

`playbooks.pipeline.prepare` runs the model download and the Container Toolkit install side
by side over one connection. paramiko's SFTP client matches replies to requests by reading
the one channel: two threads on one client steal each other's replies and both wait forever.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from playbooks import ssh
from playbooks.ssh import ConnectionFactory, read_file, write_secret_env
from simhost import SimHost

SimHostFactory = Callable[..., SimHost]
ROUNDS = 150
# Generous for a loaded 2-core machine: the loops take a few seconds alone. A hang never ends.
JOIN_S = 90.0


def _loop(errors: list[BaseException], body: Callable[[int], None]) -> threading.Thread:
    def run() -> None:
        try:
            for i in range(ROUNDS):
                body(i)
        except BaseException as exc:  # reported by the test, not lost in the thread
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_secret_upload_and_reads_from_two_threads_on_one_connection_do_not_hang(
        simhost: SimHostFactory, ssh_factory: ConnectionFactory) -> None:
    host = simhost()
    conn = ssh_factory.connect(host.host, host.port, host.user, host.host_key)
    secret_path = f"{host.root}/orch/secrets/hf.env"
    probe = host.root / "probe.txt"
    probe.write_text("keyring\n")
    errors: list[BaseException] = []
    writer = _loop(errors, lambda i: write_secret_env(conn, secret_path, {"HF_TOKEN": f"t{i}"}))
    reader = _loop(errors, lambda i: read_file(conn, str(probe)))
    deadline = time.monotonic() + JOIN_S
    for thread in (writer, reader):
        thread.join(max(0.0, deadline - time.monotonic()))
    hung = [t for t in (writer, reader) if t.is_alive()]
    # Unblock a hung thread before failing, so the test run itself goes on.
    ssh_factory.close_all()
    assert not hung, f"{len(hung)} SFTP thread(s) blocked on one shared SFTP channel"
    assert not errors, errors
    assert read_file(ssh_factory.connect(host.host, host.port, host.user, host.host_key),
                     secret_path) == f"HF_TOKEN=t{ROUNDS - 1}\n".encode()


def test_an_sftp_call_that_gets_no_reply_fails_at_its_deadline(
        simhost: SimHostFactory, ssh_factory: ConnectionFactory) -> None:
    host = simhost()
    conn = ssh_factory.connect(host.host, host.port, host.user, host.host_key)
    (host.root / "f.txt").write_text("x")
    assert read_file(conn, str(host.root / "f.txt")) == b"x"
    # Stop the sftp-server in its tracks: requests are sent, no reply ever comes.
    stopped = _signal_sftp_servers(host, signal.SIGSTOP)
    assert stopped, "no sftp-server process found to stop"
    try:
        with pytest.raises(ssh.CommandTimeout, match="no reply"):
            read_file(conn, str(host.root / "f.txt"), timeout=1.0)
    finally:
        _signal_sftp_servers(host, signal.SIGCONT)
    # The stalled channel was dropped: the next call opens a fresh one and works.
    assert read_file(conn, str(host.root / "f.txt")) == b"x"


def _signal_sftp_servers(host: SimHost, sig: signal.Signals) -> list[int]:
    found = []
    for pid in host.processes():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"sftp-server" in cmdline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
                found.append(pid)
    return found
