"""playbooks/remote/orch-job.sh, the wrapper that runs a job's trainer and vLLM detached on
hosts without Docker, run here as the host runs it (`sh`, dash on Debian and Ubuntu).

`stop` must leave nothing of the run: a trainer or vLLM engine process that outlives it holds
the GPU's memory, and the next job on that machine fails or pays for a host that cannot run it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest


def _wrapper() -> str:
    path = Path(__file__).resolve().parents[1] / "playbooks" / "remote" / "orch-job.sh"
    assert path.is_file(), path
    return str(path)


def job(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", _wrapper(), *args], capture_output=True, text=True,
                          timeout=60, check=check)


def session_of(run_dir: Path) -> int:
    return int((run_dir / "pid").read_text().split()[0])


def members(session: int) -> list[int]:
    """Processes of `session` that are not zombies, read from /proc as the wrapper does."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rpartition(") ")[2].split()
        if fields[3] == str(session) and fields[0] not in ("Z", "X"):
            found.append(int(entry))
    return found


def wait_for(predicate, what: str, limit: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + limit
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


# The sessions the tests started: whatever a failing test leaves is killed by them (a stop
# that failed may have removed the pid file).
STARTED: list[int] = []


@pytest.fixture
def run_dir(tmp_path: Path):  # type: ignore[no-untyped-def]
    yield tmp_path / "run"
    while STARTED:
        for pid in members(STARTED.pop()):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def start(run_dir: Path, script: str, processes: int) -> int:
    job("start", str(run_dir), "sh", "-c", script)
    session = session_of(run_dir)
    STARTED.append(session)
    wait_for(lambda: len(members(session)) >= processes,
             f"the run did not start {processes} processes")
    return session


def test_stop_waits_for_a_child_that_takes_seconds_to_handle_sigterm(run_dir: Path) -> None:
    # A trainer saving on SIGTERM, or vLLM's engine process shutting down, outlives the
    # wrapper's leader `sh`, which dies at once. The wrapper used to wait for that leader only.
    session = start(run_dir, "sh -c 'trap \"sleep 2; exit 0\" TERM; "
                             "while :; do sleep 0.1; done' & wait", processes=3)
    job("stop", str(run_dir))
    assert members(session) == []
    assert not (run_dir / "pid").exists()
    assert job("status", str(run_dir)).stdout.strip() == "missing"


def test_stop_kills_a_child_that_ignores_sigterm(run_dir: Path) -> None:
    # SIG_IGN survives exec: `sleep` here ignores SIGTERM, as a stuck process does.
    session = start(run_dir, "trap '' TERM; sleep 300", processes=2)
    job("stop", str(run_dir))
    assert members(session) == []
    assert not (run_dir / "pid").exists()


def test_stop_ends_the_children_of_a_run_whose_leader_is_gone(run_dir: Path) -> None:
    # The leader killed alone (an OOM kill, a stray `kill`): the run reads `lost`, and its
    # children still hold what they held.
    session = start(run_dir, "sleep 300 & sleep 300 & wait", processes=4)
    os.kill(session, signal.SIGKILL)
    wait_for(lambda: session not in members(session), "the leader did not die")
    assert job("status", str(run_dir)).stdout.strip() == "lost"
    assert len(members(session)) == 3  # `sh -c` and its two sleeps
    job("stop", str(run_dir))
    assert members(session) == []


def test_stop_signals_nothing_when_the_recorded_pid_names_another_process(
        tmp_path: Path) -> None:
    # After a reboot the recorded pid may be another process's: its start time differs.
    other = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        (run_dir / "pid").write_text(f"{other.pid} 1\n")
        job("stop", str(run_dir))
        assert other.poll() is None
        assert not (run_dir / "pid").exists()
    finally:
        other.kill()
        other.wait()


def test_stop_of_a_finished_run_clears_it(run_dir: Path) -> None:
    job("start", str(run_dir), "sh", "-c", "exit 3")
    wait_for(lambda: (run_dir / "exit_code").exists(), "the run did not finish")
    assert job("status", str(run_dir)).stdout.strip() == "exited 3"
    job("stop", str(run_dir))
    assert job("status", str(run_dir)).stdout.strip() == "missing"
    job("start", str(run_dir), "sh", "-c", "exit 0")


def test_clear_ends_what_a_finished_run_left_running(run_dir: Path) -> None:
    # A launcher that exits while its worker goes on (the leader writes the exit code):
    # forgetting the run must not leave the worker holding the GPU for the next one, as
    # Docker ends a container's processes when it exits.
    job("start", str(run_dir), "sh", "-c", "sleep 300 & exit 1")
    wait_for(lambda: (run_dir / "exit_code").exists(), "the run did not finish")
    session = session_of(run_dir)
    assert len(members(session)) == 1  # the sleep
    assert job("status", str(run_dir)).stdout.strip() == "exited 1"
    job("clear", str(run_dir))
    assert members(session) == []
    assert job("status", str(run_dir)).stdout.strip() == "missing"


def test_clear_refuses_a_running_run_and_signals_nothing(run_dir: Path) -> None:
    session = start(run_dir, "sleep 300", processes=2)
    refused = job("clear", str(run_dir), check=False)
    assert refused.returncode == 3 and "still running" in refused.stderr
    assert session in members(session)
    assert job("status", str(run_dir)).stdout.strip() == "running"
    job("stop", str(run_dir))


def test_stop_reads_a_process_whose_name_holds_a_newline_and_a_parenthesis(
        run_dir: Path) -> None:
    # /proc/PID/stat gives the name in parentheses as the process set it (prctl, 15 bytes):
    # it may hold ") " and newlines, and here a fake state letter. Read as one line, that
    # process once parsed as too few fields and the stop took it for gone.
    name = "x) 1 2\\nZ) y"
    script = (f"{sys.executable} -c \"import ctypes, signal, time; "
              f"signal.signal(signal.SIGTERM, signal.SIG_IGN); "
              f"ctypes.CDLL(None).prctl(15, b'{name}', 0, 0, 0); time.sleep(300)\"")
    session = start(run_dir, script, processes=2)
    wait_for(lambda: any("\n" in Path(f"/proc/{pid}/comm").read_text().rstrip("\n")
                         for pid in members(session)), "the name was not set")
    job("stop", str(run_dir))
    assert members(session) == []


def test_a_run_recorded_in_another_boot_or_container_signals_nothing(tmp_path: Path) -> None:
    # A container restarted with its disk kept: pids start again from 1, and a daemon whose
    # session leader has exited may now have the session id the old run recorded. Nothing
    # of that run can be left: the record's boot and PID namespace say so.
    daemon = subprocess.run(["setsid", "sh", "-c", "sleep 300 >/dev/null 2>&1 & echo $!"],
                            capture_output=True, text=True, check=True)
    pid = int(daemon.stdout)
    try:
        session = int(Path(f"/proc/{pid}/stat").read_text().rpartition(") ")[2].split()[3])
        assert session != pid and not Path(f"/proc/{session}").exists()  # its leader is gone
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        (run_dir / "pid").write_text(f"{session} 12345 another-boot/pid:[4026531836]\n")
        assert job("status", str(run_dir)).stdout.strip() == "lost"
        job("clear", str(run_dir))
        assert members(session) == [pid]
        assert job("status", str(run_dir)).stdout.strip() == "missing"
    finally:
        os.kill(pid, signal.SIGKILL)


def test_the_wrapper_is_shellcheck_clean() -> None:
    # It runs under whatever `sh` a rented image has (dash on Debian and Ubuntu): POSIX only.
    shellcheck = shutil.which("shellcheck")
    assert shellcheck, "shellcheck is missing: run `bash scripts/install --test`"
    result = subprocess.run([shellcheck, "-s", "sh", _wrapper()], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout
