"""The eval server's port is chosen on the host when it starts: the one asked for if nothing
listens there, else the next free one; a start refused for its port moves on (a Docker host
and a container rental, real sshd, the stand-ins binding real loopback ports)."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import PlaybookHostFactory, Reports
from test_evaluate_native import CLOUD_IMAGE
from test_pipeline import ANSWERS, make_job
from test_playbook_evaluate import IMAGE, ROWS, free_port, merged_model, setup

from playbooks import evalport
from playbooks.base import StepFailed, container_name, last_line
from playbooks.evaluate import evaluate
from playbooks.pipeline import PipelineRun, SimpleHooks, run_phases, run_pipeline

TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1
   1: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1
   2: 0100007F:1F41 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 3 1
"""
TCP6 = """\
  sl  local_address                         remote_address                        st tx_queue
   0: 00000000000000000000000001000000:1F42 00000000000000000000000000000000:0000 0A 0:0 0
   1: garbage
"""


def test_listening_ports_are_read_from_the_kernels_tables() -> None:
    # 8000 and 22 listen on IPv4, 8002 on IPv6; 8001 is a connection's end, not a listener.
    assert evalport.parse_listening(TCP + TCP6) == {8000, 22, 8002}
    with socket.socket() as listener:  # and the real table of this machine
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert port in evalport.parse_listening(Path("/proc/net/tcp").read_text())


def test_a_clis_help_pointer_is_not_taken_for_its_error() -> None:
    # Docker prints its help pointer after the daemon's error; the error is what is said.
    docker = ("docker: Error response from daemon: failed to set up container networking: "
              "... address already in use")
    assert last_line(f"{docker}\n\nRun 'docker run --help' for more information\n") == docker
    assert last_line("docker: manifest unknown.\nSee 'docker run --help'.") == (
        "docker: manifest unknown.")
    assert last_line("See 'docker run --help'.") == "See 'docker run --help'."  # nothing else


def test_the_asked_port_or_the_next_free_one() -> None:
    assert evalport.pick(8000, {22, 8080}) == 8000
    assert evalport.pick(8000, {8000, 8001, 8003}) == 8002
    with pytest.raises(StepFailed, match="no free port .* from 8000 to 8002"):
        evalport.pick(8000, {8000, 8001, 8002}, span=3)
    with pytest.raises(StepFailed, match="to 65535"):
        evalport.pick(65535, {65535}, span=5)


def said(reports: Reports) -> str:
    """What the evaluation's steps reported about the port (the job's event text)."""
    return " ".join(r.message for r in reports.items
                    if r.playbook == "evaluate" and r.step in ("vllm-server", "vllm-ready")
                    and r.message)


@contextlib.contextmanager
def held(port: int, listen: bool) -> Iterator[socket.socket]:
    """`port` on 127.0.0.1 taken by another program: listening (what `/proc/net/tcp` shows)
    or only bound (what it does not: Docker's own allocations, a server still loading)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        if listen:
            sock.listen()
        yield sock


@pytest.mark.parametrize("listen", [True, False], ids=["listening", "bound"])
def test_a_docker_host_whose_port_is_taken_serves_on_the_next(
        playbook_host: PlaybookHostFactory, reports: Reports, tmp_path: Path,
        listen: bool) -> None:
    sim, host = playbook_host(train_steps=2, train_step_seconds=0.05, vllm_startup_seconds=0.2)
    job = make_job(tmp_path, "lora")
    with held(job.vllm_port, listen):
        result = run_pipeline(host, job, reports)
    assert result.metrics["eval.exact_match"] == 1.0
    assert result.metrics["eval.count"] == len(ANSWERS)
    (run,) = (e for e in sim.events("docker-run") if e["container"].startswith("orch-vllm"))
    assert "--port" not in run["argv"]  # vLLM keeps 8000 in its container; the host side moved
    (served,) = sim.events("vllm-serving")
    assert served["port"] != job.vllm_port
    assert reports.outcomes("evaluate")["vllm-server"] == "changed"
    assert said(reports) == (f"serving on the host's 127.0.0.1:{served['port']} "
                             f"(port {job.vllm_port} is taken there)")


@pytest.mark.parametrize("listen", [True, False], ids=["listening", "bound"])
def test_a_rental_whose_port_is_taken_serves_on_the_next(
        playbook_host: PlaybookHostFactory, reports: Reports, tmp_path: Path,
        listen: bool) -> None:
    # Bound only: the first vLLM starts, fails to bind as it starts, and is started again.
    sim, host = playbook_host(has_docker=False, container_image=CLOUD_IMAGE, train_steps=2,
                              train_step_seconds=0.05)
    job = make_job(tmp_path, "lora")
    with held(job.vllm_port, listen):
        result = run_pipeline(host, job, reports)
    assert result.metrics["eval.exact_match"] == 1.0
    (served,) = sim.events("vllm-serving")
    assert served["port"] != job.vllm_port
    assert said(reports) == (f"serving on the host's 127.0.0.1:{served['port']} "
                             f"(port {job.vllm_port} is taken there)")
    assert sim.nvme_path is not None
    (run,) = Path(sim.nvme_path).rglob(f"jobs/{job.job_id}/run/vllm")
    # Bound only: the real bind error (in the first run's log, kept aside), then the second
    # start serving.
    refused = run / "log.1"
    assert refused.is_file() is not listen
    if not listen:
        assert refused.read_text().rstrip().endswith(
            "OSError: [Errno 98] Address already in use")
    assert "Address already in use" not in (run / "log").read_text()


def test_a_takeover_adopts_the_server_on_its_moved_port(
        playbook_host: PlaybookHostFactory, reports: Reports) -> None:
    # A worker served on the next port and was lost; the next one asks for the same port,
    # finds the job's server running on the other and scores through it, restarting nothing.
    sim, host, layout = setup(playbook_host, vllm_startup_seconds=0.2)
    model, port = merged_model(layout, "job-t"), free_port()
    with held(port, listen=True):
        first = evaluate(host, "job-t", model, layout, IMAGE, port, 1024, ROWS,
                         stop_after=False)
        reports.clear()
        again = evaluate(host, "job-t", model, layout, IMAGE, port, 1024, ROWS, emit=reports)
    assert first.metrics == again.metrics and again.metrics["eval.count"] == len(ROWS)
    assert reports.outcomes("evaluate")["vllm-server"] == "skipped"
    assert len(sim.events("docker-run")) == 1
    assert container_name("vllm", "job-t") not in sim.containers()


class _LeavesTheServer(SimpleHooks):
    """A worker lost after its evaluation started: its server is left running."""

    def stop_after_eval(self) -> bool:
        return False


def test_a_rental_takeover_adopts_its_server_on_the_moved_port(
        playbook_host: PlaybookHostFactory, reports: Reports, tmp_path: Path) -> None:
    # On a rental the port is read from the server's own command line (/proc/PID/cmdline).
    sim, host = playbook_host(has_docker=False, container_image=CLOUD_IMAGE, train_steps=2,
                              train_step_seconds=0.05)
    job = make_job(tmp_path, "lora")
    with held(job.vllm_port, listen=True):
        first = run_phases(PipelineRun(host, job), _LeavesTheServer(reports))
        reports.clear()
        again = run_pipeline(host, job, reports)
    assert first.metrics == again.metrics and again.metrics["eval.exact_match"] == 1.0
    assert reports.outcomes("evaluate")["vllm-server"] == "skipped"
    (served,) = sim.events("vllm-serving")  # started once, by the first worker
    assert served["port"] != job.vllm_port
