"""The simulated host's init runs its short commands (simhost/bin/_relay.py), handed to it by
the compiled client (simhost/bin/relay.c) or the Python one: what a relayed command says,
does and exits with is what the same command says started on its own."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from typing import Any

import pytest
from test_simhost import GPGKEY, connect, sh

from playbooks.ssh import ConnectionFactory
from simhost import SimHost

# Each touches what a relayed process must take from its caller: exit status and both
# streams (a missing object, an unknown package), stdin (gpg reads the key from it), the
# working directory and umask (a relative output path, the new file's mode), the environment
# (a variable the command line sets is seen by a stand-in that prints it back through a
# failing option), and output past a pipe buffer.
SCRIPTS = [
    "docker --version",
    "id -u; id -un",
    "docker inspect -f '{{.State.Status}}' nope; echo exit=$?",
    "dpkg-query -W curl no-such-package; echo exit=$?",
    f"curl -fsSL {GPGKEY} | gpg --dearmor -o - | wc -c",
    "printf 'not a key' | gpg --dearmor -o k.gpg; echo exit=$?",
    f"mkdir -p d && cd d && umask 027 && curl -fsSL -o key.asc {GPGKEY} && "
    "gpg --batch --dearmor -o key.gpg key.asc && stat -c '%a %s' key.asc key.gpg",
    "LC_ALL=C.UTF-8 df -B1 --output=target . ; echo exit=$?",
    "curl --no-such-option x; echo exit=$?",
    "apt-get -q update > /dev/null; dpkg-query -W -f='${Package} ${Version}\\n' curl",
    "nvidia-smi --query-gpu=name,memory.total --format=csv,noheader",
    "for i in 1 2 3 4 5 6 7 8; do nvidia-smi -q; done | wc -c",
    # A detached container's process: its environment and working directory, only the three
    # streams open (not the CLI's lock on the host's state), a session of its own, its output
    # in the log, its exit status recorded. (ls lists its own: the three, and 3 for the list.)
    "docker run -d --name c -e FOO=bar -e OUTER=\"$(cut -d' ' -f6 /proc/$$/stat)\" ubuntu sh -c "
    "'echo $FOO; pwd; ls /proc/self/fd | tr \"\\n\" \" \"; echo; "
    "[ \"$(cut -d\" \" -f6 /proc/$$/stat)\" != \"$OUTER\" ] && echo own session; exit 3' "
    ">/dev/null; sleep 0.4; docker logs c; docker inspect -f '{{.State.Status}} "
    "{{.State.ExitCode}}' c; docker rm c",
    # A command init does not run is the process that was started: killed by its pid. (The
    # shell may or may not say "Killed", depending on when it reaps the job: not compared.)
    "{ docker run --name f ubuntu sleep 3 & p=$!; sleep 0.3; kill -9 $p; wait $p; "
    "echo exit=$?; } 2>/dev/null",
]


def relaying(host: SimHost, timeout: float = 20.0) -> SimHost:
    """The host once its init listens for relayed commands. Init imports every stand-in after
    it starts sshd, so on a loaded machine the first commands after boot run on their own (as
    they should: relaying saves time, it changes nothing else); a test of what is relayed
    waits for it."""
    # simhost/bin/_relay.py's SOCKET, an abstract socket ("@" in the table).
    name = f"@simhost-relay-{int((host.state_dir / 'init.pid').read_text())}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open("/proc/net/unix") as table:
            if any(line.split()[-1] == name for line in table.readlines()[1:]
                   if len(line.split()) > 7):
                return host
        time.sleep(0.05)
    raise AssertionError(f"the host's init does not listen on {name} after {timeout:.0f} s")


def said(factory: ConnectionFactory, host: SimHost) -> list[tuple[int, str, str]]:
    conn = connect(factory, host)
    out = []
    for script in SCRIPTS:
        result = sh(conn, script)
        out.append((result.exit_code, *(text.replace(str(host.dir), "<host>")
                                         for text in (result.stdout, result.stderr))))
    return out


@pytest.fixture
def hosts(simhost: Callable[..., SimHost], monkeypatch: pytest.MonkeyPatch
          ) -> tuple[SimHost, SimHost, SimHost]:
    """Relaying with the compiled client; relaying with the Python one; not relaying (the
    shell wrapper starts Python, which runs the command itself)."""
    relaying_host = relaying(simhost())
    monkeypatch.setenv("SIMHOST_CLIENT", "python")
    python_client = relaying(simhost())
    monkeypatch.setenv("SIMHOST_RELAY", "0")
    alone = simhost()
    return relaying_host, python_client, alone


def test_a_relayed_command_says_and_does_what_it_does_started_alone(
        hosts: tuple[SimHost, SimHost, SimHost], ssh_factory: ConnectionFactory) -> None:
    relaying, python_client, alone = hosts
    expected = said(ssh_factory, alone)
    assert said(ssh_factory, relaying) == expected
    assert said(ssh_factory, python_client) == expected
    # Every short command of the scripts ran in init on the two relaying hosts, none on the
    # other; `docker run` in the foreground did not.
    for host in (relaying, python_client):
        relayed = [e["cmd"] for e in host.events("command") if e.get("relayed")]
        assert {"docker", "id", "dpkg-query", "curl", "gpg", "df", "apt-get",
                "nvidia-smi"} == set(relayed), relayed
        alone_ran = [" ".join([e["cmd"], *e["argv"][:2]]) for e in host.events("command")
                     if not e.get("relayed")]
        assert alone_ran == ["docker run --name"], alone_ran
    assert not [e for e in alone.events("command") if e.get("relayed")]


def test_a_host_s_commands_are_the_compiled_client_when_there_is_a_compiler(
        hosts: tuple[SimHost, SimHost, SimHost]) -> None:
    relaying, python_client, _ = hosts
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler: the hosts' commands are the Python client")  # CI has one
    assert (relaying.bin_dir / "docker").read_bytes()[:4] == b"\x7fELF"
    assert (relaying.bin_dir / "id").stat().st_ino == (relaying.bin_dir / "docker").stat().st_ino
    assert (python_client.bin_dir / "docker").read_bytes().startswith(b"#!/bin/sh\n")


def test_long_running_and_process_starting_commands_are_not_relayed(
        simhost: Callable[..., SimHost], ssh_factory: ConnectionFactory) -> None:
    host = relaying(simhost())
    conn = connect(ssh_factory, host)
    script = ("docker run -d --name t ubuntu echo hi >/dev/null; sleep 0.5; docker logs -f t; "
              "docker stop t >/dev/null 2>&1; docker rm t >/dev/null; docker logs --tail 1 t "
              "2>/dev/null; docker run --rm ubuntu true; true")
    assert sh(conn, script).stdout == "hi\n"
    relayed: dict[str, Any] = {" ".join([e["cmd"], *e["argv"][:2]]): e.get("relayed", False)
                               for e in host.events("command")}
    assert not relayed["docker stop t"] and not relayed["docker logs -f"]
    assert not relayed["docker run --rm"]  # in the foreground: it waits on the container
    assert relayed["docker run -d"] and relayed["docker rm t"] and relayed["docker logs --tail"]


def test_init_still_reaps_an_orphan_as_soon_as_it_ends(
        simhost: Callable[..., SimHost], ssh_factory: ConnectionFactory) -> None:
    """Init waits on its relay socket now, not in os.wait(): a child's exit must still wake it,
    or a finished detached job stays a zombie that `kill -0` finds alive (up to its poll)."""
    conn = connect(ssh_factory, simhost())
    script = ("(sleep 0.2 >/dev/null 2>&1 & echo $! > orphan.pid); sleep 0.35; "
              "kill -0 $(cat orphan.pid) 2>/dev/null && echo alive || echo gone")
    assert [sh(conn, script).stdout for _ in range(3)] == ["gone\n"] * 3
