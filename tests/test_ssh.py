"""playbooks.ssh against a real sshd (simulated hosts on 127.0.0.1), no mocks."""

from __future__ import annotations

import logging
import os
import secrets
import shlex
import shutil
import socket
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import paramiko
import pytest

from playbooks.ssh import (
    AuthenticationFailed,
    CommandFailed,
    CommandTimeout,
    ConnectionFactory,
    ConnectionLost,
    HostKeyMismatch,
    HostUnreachable,
    build_command,
    fingerprint,
    format_host_key,
    get_file,
    parse_host_key,
    put_file,
    read_file,
    run,
    trust_on_first_use,
    write_secret_env,
)
from simhost import SimHost

SimHostFactory = Callable[..., SimHost]


def connect(factory: ConnectionFactory, host: SimHost):  # noqa: ANN201 - fabric Connection
    return factory.connect(host.host, host.port, host.user, host.host_key)


def log_since(host: SimHost, offset: int) -> str:
    with open(host.sshd_log_path, "rb") as handle:
        handle.seek(offset)
        return handle.read().decode(errors="replace")


def cmdlines() -> list[str]:
    """Every process's command line on this machine (the hosts run here)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                raw = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            found.append(raw.replace(b"\0", b" ").decode(errors="replace"))
    return found


def test_run_quotes_every_argument(simhost: SimHostFactory, ssh_factory: ConnectionFactory) -> None:
    host = simhost()
    conn = connect(ssh_factory, host)
    hostile = [
        "a; touch pwned1",
        "$(touch pwned2)",
        "`touch pwned3`",
        "it's",
        'say "hi" > pwned4',
        "line\ntouch pwned5",
        "*",
        "",
        "${HOME}",
    ]
    result = run(conn, ["printf", "%s\\0", *hostile], timeout=30)
    assert result.ok, result.stderr
    assert result.stdout.split("\0")[:-1] == hostile
    assert result.command == shlex.join(["printf", "%s\\0", *hostile])
    assert not list(host.home.glob("pwned*"))
    assert host.ssh_commands()[-1] == result.command


def test_exit_status_stderr_and_check(
    simhost: SimHostFactory, ssh_factory: ConnectionFactory
) -> None:
    conn = connect(ssh_factory, simhost())
    result = run(conn, ["sh", "-c", "echo out; echo oops >&2; exit 3"], timeout=30)
    assert (result.exit_code, result.stdout, result.stderr) == (3, "out\n", "oops\n")
    with pytest.raises(CommandFailed, match="exited with status 3: oops"):
        result.check()


def test_command_timeout(simhost: SimHostFactory, ssh_factory: ConnectionFactory) -> None:
    conn = connect(ssh_factory, simhost())
    started = time.monotonic()
    with pytest.raises(CommandTimeout, match="sleep .* within 0.5s"):
        run(conn, ["sleep", "10"], timeout=0.5)
    assert time.monotonic() - started < 15  # the 10 s sleep did not run to its end


def test_one_connection_per_host_port_user(
    simhost: SimHostFactory, ssh_factory: ConnectionFactory
) -> None:
    a, b = simhost(), simhost()
    first = connect(ssh_factory, a)
    assert connect(ssh_factory, a) is first
    assert connect(ssh_factory, b) is not first
    ssh_factory.close(a.host, a.port, a.user)
    again = connect(ssh_factory, a)
    assert again is not first and again.is_connected
    assert run(again, ["true"], timeout=30).ok


def test_trust_on_first_use_returns_the_host_key(
    simhost: SimHostFactory, ssh_factory: ConnectionFactory
) -> None:
    host = simhost()
    key = trust_on_first_use(host.host, host.port, timeout=5)
    assert format_host_key(key) == host.host_key
    assert fingerprint(key) == host.host_key_fingerprint
    assert parse_host_key(host.host_key + " comment").asbytes() == key.asbytes()
    conn = ssh_factory.connect(host.host, host.port, host.user, key)
    assert run(conn, ["true"], timeout=30).ok


def test_a_host_that_never_sends_its_banner_is_unreachable_after_three_tries(
    simhost: SimHostFactory, ssh_factory: ConnectionFactory
) -> None:
    # Accepts TCP, never says a word (issue 23 §3); the deadline is far away.
    from emulators.blackhole import BlackHole

    with BlackHole() as hole:
        port = int(hole.url.split(":")[2].split("/")[0])
        with pytest.raises(HostUnreachable) as raised:
            trust_on_first_use("127.0.0.1", port, timeout=0.5, deadline=600)
        assert raised.value.attempts == 3 and "no SSH banner" in str(raised.value)
        host = simhost()
        known = parse_host_key(host.host_key)
        factory = ConnectionFactory(ssh_factory.key_filename, connect_timeout=0.5,
                                    connect_deadline=600)
        with pytest.raises(HostUnreachable) as raised:
            factory.connect("127.0.0.1", port, host.user, known)
        assert raised.value.attempts == 3
    assert hole.connections == 6


@pytest.mark.parametrize("after", [60_000, 200_000, 600_000])
def test_a_reset_mid_upload_is_a_lost_connection_not_a_file_error(
    simhost: SimHostFactory, ssh_factory: ConnectionFactory, tmp_path: Path, after: int
) -> None:
    # Issue 23 §2: an RST in the middle of an SFTP upload surfaced as "upload ... failed:
    # Socket is closed", a plain SSHError the engine took for a host fault. It must be
    # ConnectionLost (the engine connects again and re-runs the step).
    from emulators.tcpfault import FaultyProxy

    host = simhost()
    proxy = FaultyProxy((host.host, host.port), [("reset", after)])
    try:
        conn = ssh_factory.connect("127.0.0.1", proxy.port, host.user, host.host_key)
        local = tmp_path / "big.bin"
        local.write_bytes(os.urandom(1 << 20))
        with pytest.raises(ConnectionLost):
            put_file(conn, local, str(host.path("/tmp/big.bin")))
        assert proxy.resets == 1
        assert not host.path("/tmp/big.bin").exists()
    finally:
        proxy.stop()


def test_changed_host_key_is_refused_before_authentication(
    simhost: SimHostFactory, ssh_factory: ConnectionFactory
) -> None:
    real, impostor = simhost(), simhost()
    offset = real.sshd_log_path.stat().st_size
    started = time.monotonic()
    with pytest.raises(HostKeyMismatch) as caught:
        ssh_factory.connect(real.host, real.port, real.user, impostor.host_key)
    assert time.monotonic() - started < 10  # refused at once, not retried to the deadline
    message = str(caught.value)
    assert f"127.0.0.1:{real.port}" in message
    assert impostor.host_key_fingerprint in message and real.host_key_fingerprint in message
    log = log_since(real, offset)
    assert log.count("Connection from") == 1  # not retried
    assert "Accepted publickey" not in log  # refused before our key was offered


def test_host_key_of_another_type_is_refused(
    simhost: SimHostFactory, ssh_factory: ConnectionFactory
) -> None:
    host = simhost()
    other = paramiko.ECDSAKey.generate()
    with pytest.raises(HostKeyMismatch, match="offers no ecdsa-sha2-nistp256 key"):
        ssh_factory.connect(host.host, host.port, host.user, format_host_key(other))


def test_wrong_key_fails_without_retry(simhost: SimHostFactory, keypair_factory: Any) -> None:
    host = simhost()
    stranger = keypair_factory("stranger")
    offset = host.sshd_log_path.stat().st_size
    started = time.monotonic()
    with ConnectionFactory(stranger.private, connect_timeout=5, connect_deadline=30) as factory:
        with pytest.raises(AuthenticationFailed, match="refused key"):
            connect(factory, host)
    assert time.monotonic() - started < 20  # no retries up to the 30 s deadline
    assert log_since(host, offset).count("Connection from") == 1


def test_connection_refused_is_retried_until_the_deadline(ssh_keypair: Any) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIG6wJ9Cw8aCBFp2zr6lX5bKkS6yqS8dc5iC9N8KxVdVb"
    started = time.monotonic()
    with ConnectionFactory(ssh_keypair.private, connect_timeout=1, connect_deadline=1.5) as factory:
        with pytest.raises(HostUnreachable) as caught:
            factory.connect("127.0.0.1", port, "root", key)
    elapsed = time.monotonic() - started
    assert caught.value.attempts >= 3
    assert 1.2 <= elapsed < 10  # retried until the 1.5 s deadline, then gave up
    assert f"127.0.0.1:{port}" in str(caught.value)


def test_secret_env_file_is_private_and_never_on_a_command_line(
    simhost: SimHostFactory, ssh_factory: ConnectionFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    host = simhost()
    conn = connect(ssh_factory, host)
    secret = f'hf_{secrets.token_hex(12)}\'$(x);`y` "z"'
    path = f"{host.home}/.orch/secrets/job1.env"
    write_secret_env(conn, path, {"HF_TOKEN": secret, "OTHER": "plain"})
    local = Path(path)
    assert stat.S_IMODE(local.stat().st_mode) == 0o600
    assert stat.S_IMODE(local.parent.stat().st_mode) == 0o700
    assert not [p for p in local.parent.iterdir() if p != local]  # no temporary left behind

    outcome: dict[str, object] = {}

    def background() -> None:
        outcome["result"] = run(
            conn, ["sh", "-c", "sleep 1.5; printenv HF_TOKEN"], timeout=30, env_file=path
        )

    worker = threading.Thread(target=background)
    worker.start()
    deadline = time.monotonic() + 5
    sleeper: int | None = None
    while sleeper is None and time.monotonic() < deadline:
        for pid in host.processes():
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if argv.startswith(b"sleep\x001.5"):
                sleeper = pid
        time.sleep(0.05)
    assert sleeper is not None, "the remote command did not start"
    assert secret.encode() in Path(f"/proc/{sleeper}/environ").read_bytes()  # it got the secret
    assert not [line for line in cmdlines() if secret in line]
    if shutil.which("ps"):  # procps; the /proc scan above is the check that always runs
        ps = run(connect(ssh_factory, host), ["ps", "-eo", "args"], timeout=30)
        assert ps.ok and "sleep 1.5" in ps.stdout and secret not in ps.stdout
    worker.join(timeout=10)
    result = outcome["result"]
    assert result.stdout.rstrip("\n") == secret  # type: ignore[attr-defined]
    assert secret not in result.command  # type: ignore[attr-defined]
    assert not [c for c in host.ssh_commands() if secret in c]
    assert secret not in caplog.text


def test_put_get_and_read_file(
    simhost: SimHostFactory, ssh_factory: ConnectionFactory, tmp_path: Path
) -> None:
    host = simhost()
    conn = connect(ssh_factory, host)
    data = os.urandom(200_000)
    source = tmp_path / "dataset.jsonl"
    source.write_bytes(data)
    remote = f"{host.home}/jobs/j1/data/train.jsonl"
    put_file(conn, source, remote, mode=0o640)
    assert Path(remote).read_bytes() == data
    assert stat.S_IMODE(Path(remote).stat().st_mode) == 0o640
    back = tmp_path / "back.jsonl"
    get_file(conn, remote, back)
    assert back.read_bytes() == data
    assert read_file(conn, remote) == data
    assert read_file(conn, f"{host.home}/missing") is None
    assert sorted(p.name for p in Path(remote).parent.iterdir()) == ["train.jsonl"]


def test_host_death_surfaces_as_connection_lost(
    simhost: SimHostFactory, ssh_factory: ConnectionFactory
) -> None:
    host = simhost()
    conn = connect(ssh_factory, host)
    assert run(conn, ["true"], timeout=30).ok
    host.kill()
    with pytest.raises(ConnectionLost):
        run(conn, ["true"], timeout=10)


def test_build_command_sources_env_file_without_interpolation() -> None:
    command = build_command(["echo", "$HOME"], env_file="/root/.orch/a b.env")
    assert shlex.split(command) == [
        "sh",
        "-c",
        'set -a; . "$1"; set +a; shift; exec "$@"',
        "sh",
        "/root/.orch/a b.env",
        "echo",
        "$HOME",
    ]
    with pytest.raises(ValueError):
        build_command(["true"], env_file="relative.env")
    with pytest.raises(ValueError):
        build_command([])
