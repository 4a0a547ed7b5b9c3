"""The pre-flight host check over real SSH on simulated hosts: good machines pass, each kind of
bad machine fails the check that measures it, and nothing is left for the job to trip over."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from conftest import PlaybookHostFactory, Reports

from playbooks import hostcheck, secrets, ssh
from playbooks.base import Fault, Host, HostPaths, PlaybookFailed, StepFailed
from playbooks.gpu import GpuExpectation
from playbooks.hostcheck import HostCheck, HostCheckSpec, dd_rate
from playbooks.hostreport import Check, HostReport, Thresholds, Verdict, thresholds
from playbooks.pipeline import run_pipeline
from simhost import SimHost

RENTAL = "axolotlai/axolotl-cloud:0.18.0-py3.12-cu130-2.12.0"
H100 = GpuExpectation("H100 SXM", 1, 80_000)
TOKEN = "hf_hostcheck_secret_0123456789"


def fast(**changes: dict[str, Any]) -> Thresholds:
    """The real thresholds with short measurements (tests run on a loaded 2-core machine)."""
    base = thresholds()
    sizes: dict[str, dict[str, Any]] = {"matmul": {"seconds": 0.2}, "disk": {"test_mib": 64},
                                        "hub": {"range_mib": 8}}
    for key, value in changes.items():
        sizes[key] = {**sizes[key], **value}
    return base.model_copy(update={k: getattr(base, k).model_copy(update=v)
                                   for k, v in sizes.items()})


def spec(**fields: Any) -> HostCheckSpec:
    values: dict[str, Any] = {"job_id": "job-1", "gpu": H100, "rated_tflops": 989.0,
                              "disk_need_bytes": 30 * 10**9, "repo": "Qwen/Qwen2.5-0.5B",
                              "limits": fast()}
    values.update(fields)
    return HostCheckSpec(**values)


def rental(playbook_host: PlaybookHostFactory, **options: Any) -> tuple[SimHost, Host]:
    return playbook_host(container_image=RENTAL, **options)


def probes(sim: SimHost) -> list[int]:
    """The host's processes running the matmul probe."""
    found = []
    for pid in sim.processes():
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if hostcheck.PROBE_MARKER.encode() in argv:
            found.append(pid)
    return found


def leftovers(sim: SimHost) -> list[str]:
    """Files (not folders) the check could have left in orch's directory on the host."""
    base = sim.path("/mnt/nvme/orch")
    if not base.exists():
        return []
    return sorted(str(p.relative_to(base)) for p in base.rglob("*") if not p.is_dir())


def test_a_healthy_rental_passes_every_check_and_leaves_nothing(
        playbook_host: PlaybookHostFactory, reports: Reports) -> None:
    sim, host = rental(playbook_host)
    report = hostcheck.run(host, spec(hf_token=TOKEN), reports)

    assert report.passed and report.failures == {}
    assert reports.outcomes() == dict.fromkeys([c.value for c in Check], "ok")
    assert {c: r.verdict for c, r in report.results().items()} == dict.fromkeys(Check,
                                                                                 Verdict.PASS)
    assert report.inventory is not None and report.inventory.gpus == ["NVIDIA H100 80GB HBM3"]
    assert report.driver is not None and report.driver.min_driver == "580.65.06"
    matmul = report.matmul
    assert matmul is not None and matmul.torch == "2.12.0+cu130"
    # The simulated H100 is a healthy one (989 x 0.80); the probe's own loop costs a little.
    assert 0.85 * 791.2 < matmul.tflops[0] <= 791.2 * 1.01
    assert report.delivered_fraction is not None and 0.85 < report.delivered_fraction <= 1.01
    disk = report.disk
    assert disk is not None and disk.path == "/mnt/nvme/orch"
    assert disk.write_bytes_per_s is not None and 1.0e9 < disk.write_bytes_per_s <= 2.0e9 * 1.01
    assert disk.need_bytes == 30 * 10**9 and disk.min_bytes_per_s == 125e6
    hub = report.hub
    assert hub is not None and hub.http_status == 206 and hub.bytes == 8 * 2**20
    assert hub.url.endswith("/Qwen/Qwen2.5-0.5B/resolve/main/model-00001-of-00002.safetensors")
    # A 80 GB machine: Vast's floor, 500 Mbit/s x 79.6 GiB / 192 = 207 Mbit/s.
    assert hub.min_bytes_per_s == pytest.approx(500e6 / 8 * 81559 / 1024 / 192)
    # The token reached the host only in the 0600 file, removed again; never a command line.
    assert not any(TOKEN in c for c in sim.ssh_commands())
    assert leftovers(sim) == [] and probes(sim) == []
    assert not sim.path("/mnt/nvme/orch/models").exists()
    assert not sim.path("/mnt/nvme/orch/jobs").exists()
    assert HostReport.model_validate_json(report.model_dump_json()) == report


BAD_MACHINES = [
    ({"gpu_model": "NVIDIA GeForce RTX 4090", "gpu_memory_mib": 24564}, Check.INVENTORY,
     "promised 1x H100 SXM with >= 80000 MiB each, found 1x NVIDIA GeForce RTX 4090"),
    ({"gpu_count": 2}, Check.INVENTORY, "2 GPU(s) instead of 1"),
    ({"driver_version": "570.172.08", "cuda_version": "12.8"}, Check.DRIVER,
     "driver 570.172.08 is older than 580.65.06, the lowest NVIDIA lists for CUDA 13.0"),
    # Cut off at 1.5x what 125 MB/s allows for 64 MiB: a slow disk costs a second, not more.
    ({"disk_write_bytes_per_second": 50e6}, Check.DISK,
     "writing 64 MiB took over 0.8 s (under 84 MB/s)"),
    ({"disk_write_bytes_per_second": 110e6}, Check.DISK, "writes at 110 MB/s, under 125 MB/s"),
    ({"disk_free_bytes": 10 * 10**9}, Check.DISK, "10.0 GB free, the job needs 30.0 GB"),
    ({"hub_unreachable": True}, Check.HUB, "no route to the Hub (curl: (6) Could not resolve "
     "host: huggingface.co, curl exit 6)"),
    ({"download_bytes_per_second": 4e6}, Check.HUB,
     "downloads from the Hub at 32 Mbit/s, under 207 Mbit/s"),
    ({"gpu_speed": 0.4}, Check.MATMUL, "under 544 (55% of the rated 989; a healthy card "
     "reaches ~791)"),
]


@pytest.mark.parametrize(("options", "failing", "says"), BAD_MACHINES,
                         ids=["wrong-gpu", "gpu-count", "old-driver", "slow-disk",
                              "disk-under-floor", "full-disk",
                              "no-route-to-hub", "slow-hub", "slow-gpu"])
def test_each_bad_machine_fails_the_check_that_measures_it(
        playbook_host: PlaybookHostFactory, reports: Reports, options: dict[str, Any],
        failing: Check, says: str) -> None:
    sim, host = rental(playbook_host, **options)
    report = hostcheck.run(host, spec(), reports)

    assert not report.passed and list(report.failures) == [failing]
    assert says in report.failures[failing]
    order = list(Check)
    ran = order[:order.index(failing) + 1]
    assert list(report.results()) == ran  # the check stops at the first failure
    assert reports.items[-1].step == failing.value and reports.items[-1].fault == "provider"
    assert leftovers(sim) == [] and probes(sim) == []


def test_gpu_memory_another_process_holds_fails_the_check_when_the_job_needs_it(
        playbook_host: PlaybookHostFactory, reports: Reports) -> None:
    # 21 GiB of an H100's 81559 MiB held by the user's notebook (a Docker host: a kept
    # server's nvidia-smi names the process). Training needs 30000 MiB, which is free; the
    # evaluation's vLLM asks 0.9 of the card (73404 MiB) and would be refused after training.
    sim, host = playbook_host(gpu_memory_held_mib=21504)
    evaluates = replace(H100, free_mib=30_000, serve_utilization=0.9)
    report = hostcheck.run(host, spec(gpu=evaluates), reports)
    assert list(report.failures) == [Check.INVENTORY]
    assert report.inventory is not None and report.inventory.busy
    assert report.inventory.used_mib == [21504]
    why = report.failures[Check.INVENTORY]
    assert "GPU 0: 21504 of 81559 MiB in use" in why
    assert "vLLM takes 0.9 of a GPU's memory (73404 MiB, and 768 MiB for its CUDA context)" in why
    assert "held by pid 4242 (python3, 21504 MiB)" in why
    assert reports.items[-1].fault == "provider"
    assert not any("hf download" in c for c in sim.ssh_commands())
    # Without an evaluation, what training needs is free: the check passes it.
    assert hostcheck.run(host, spec(gpu=replace(evaluates, serve_utilization=0.0)),
                         reports).inventory.verdict is Verdict.PASS  # type: ignore[union-attr]
    # Training that needs more than is left fails it; a container rental's nvidia-smi does
    # not see the process of another PID namespace, and the reason says so.
    _, rented = rental(playbook_host, gpu_memory_held_mib=21504)
    report = hostcheck.run(rented, spec(gpu=replace(H100, free_mib=70_000)), reports)
    why = report.failures[Check.INVENTORY]
    assert "training needs 70000 MiB free" in why and "vLLM" not in why
    assert "no process holding it is visible" in why


def test_a_complete_check_runs_past_failures_and_skips_what_they_void(
        playbook_host: PlaybookHostFactory, reports: Reports) -> None:
    # A registered server's check (complete): it is not released, so it is told everything
    # at once: a full disk and no route to the Hub, and its GPUs measured all the same.
    sim, host = rental(playbook_host, disk_free_bytes=10 * 10**9, hub_unreachable=True)
    report = hostcheck.run(host, spec(complete=True), reports)
    assert list(report.failures) == [Check.DISK, Check.HUB]
    assert report.matmul is not None and report.matmul.verdict is Verdict.PASS
    assert leftovers(sim) == [] and probes(sim) == []
    # Without a working nvidia-smi, the driver and the GPUs' speed mean nothing: unknown.
    _, broken = rental(playbook_host, driver_broken=True)
    report = hostcheck.run(broken, spec(complete=True), reports)
    assert list(report.failures) == [Check.INVENTORY]
    assert report.driver is not None and report.matmul is not None
    assert (report.driver.verdict, report.matmul.verdict) == (Verdict.UNKNOWN, Verdict.UNKNOWN)
    assert report.matmul.reason == "not measured: the inventory check failed"
    assert report.disk is not None and report.disk.verdict is Verdict.PASS


def test_a_slow_gpu_is_measured_at_its_fraction(playbook_host: PlaybookHostFactory,
                                                reports: Reports) -> None:
    _, host = rental(playbook_host, gpu_speed=0.8)
    report = hostcheck.run(host, spec(), reports)
    # 0.8 of a healthy card is above the pass mark (0.55 of rated = 0.69 of a healthy card)...
    assert report.passed
    assert report.delivered_fraction == pytest.approx(0.8, abs=0.08)
    # ...and what it delivers is what placement prices it by (orchestrator/core/hostmemory.py).


def test_the_hub_gets_the_token_in_a_header_and_a_range(
        playbook_host: PlaybookHostFactory, reports: Reports, session_hub: Any) -> None:
    shard = os.urandom(3 * 2**20)
    index = b'{"metadata": {}, "weight_map": {"a": "model-00001-of-00001.safetensors"}}'
    session_hub.add_repo("acme/gated-hostcheck", {"model.safetensors.index.json": index,
                                                  "model-00001-of-00001.safetensors": shard},
                         gated=True, accepted=(TOKEN,))
    try:
        sim, host = rental(playbook_host)
        # What is checked here is the token and the range, not the speed (slow-hub has its
        # own test): the session's Hub stand-in, shared and on a loaded machine, once served
        # 24.9 MB/s against the 25.9 floor. A floor of 1 Mbit/s keeps the check passing.
        checked = spec(repo="acme/gated-hostcheck", hub_endpoint=session_hub.url,
                       limits=fast(hub={"range_mib": 1, "min_mbit_s": 1, "max_mbit_s": 1}))
        report = hostcheck.run(host, replace(checked, hf_token=TOKEN), reports)
        assert report.passed and report.hub is not None
        assert report.hub.http_status == 206 and report.hub.bytes == 2**20
        asked = [r for r in session_hub.requests if "gated-hostcheck/resolve" in r.path]
        assert [(r.path.rsplit("/", 1)[1], r.authorized, r.status) for r in asked] == [
            ("model.safetensors.index.json", True, 200),
            ("model-00001-of-00001.safetensors", True, 206)]
        assert not any(TOKEN in c for c in sim.ssh_commands()) and leftovers(sim) == []

        # Without a token the gated repo's files are refused: not the host's fault.
        reports.clear()
        report = hostcheck.run(host, checked, reports)
        assert report.passed and report.hub is not None
        assert report.hub.verdict is Verdict.UNKNOWN and report.hub.http_status == 401
        assert "not a verdict on the host" in report.hub.reason
    finally:
        session_hub.repos.pop(("model", "acme/gated-hostcheck"), None)


def test_a_probe_left_by_a_killed_run_is_killed_and_the_check_repeats_cleanly(
        playbook_host: PlaybookHostFactory, reports: Reports) -> None:
    sim, host = rental(playbook_host)
    checker = HostCheck(spec())
    pid_file = Path(checker.pid_file(host))
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    # What a run killed mid-probe leaves: a probe still running, its pid file, the test file.
    stale = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                              hostcheck.PROBE_MARKER], start_new_session=True)
    pid_file.write_text(f"{stale.pid}\n")
    (pid_file.parent / checker.test_file).write_bytes(b"x" * 1000)
    try:
        first = hostcheck.run(host, spec(), reports)
        assert first.passed
        assert stale.wait(timeout=10) == -9  # killed by the new run, before it measured
        assert leftovers(sim) == []
        second = hostcheck.run(host, spec(), reports)
        assert {c: r.verdict for c, r in second.results().items()} == \
            {c: r.verdict for c, r in first.results().items()}
        assert leftovers(sim) == [] and probes(sim) == []
    finally:
        if stale.poll() is None:
            stale.kill()


def test_a_connection_lost_mid_probe_is_not_a_verdict_and_the_next_run_cleans_up(
        playbook_host: PlaybookHostFactory, ssh_factory: Any, reports: Reports) -> None:
    sim, host = rental(playbook_host)
    slow = spec(limits=fast(matmul={"seconds": 4.0}))
    failure: list[BaseException] = []

    def run() -> None:
        try:
            hostcheck.run(host, slow, reports)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            failure.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    deadline = time.monotonic() + 30
    while not probes(sim) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert probes(sim), "the probe never started"
    host.conn.close()  # orch dies (or its connection does) mid-probe
    worker.join(30)
    assert len(failure) == 1 and isinstance(failure[0], PlaybookFailed)
    assert failure[0].fault is Fault.TRANSIENT and failure[0].step == Check.MATMUL.value

    orphan = probes(sim)
    assert orphan, "the probe outlives its connection (until its own bound)"
    again = Host(ssh_factory.connect(sim.host, sim.port, sim.user, sim.host_key),
                 HostPaths(str(sim.root)), command_timeout=60)
    report = hostcheck.run(again, spec(), reports)
    assert report.passed
    # The orphan had seconds of probing left: the new run killed it (by its pid file) before
    # its own probe, and leaves no probe, no pid file, no test file behind.
    assert probes(sim) == [] and leftovers(sim) == []


def test_on_a_docker_host_the_probe_runs_in_the_trainer_image(
        playbook_host: PlaybookHostFactory, reports: Reports) -> None:
    sim, host = playbook_host(toolkit_preinstalled="1.18.1-1")
    report = hostcheck.run(host, spec(), reports)
    # The image is pulled by the job's own steps: until then the GPUs are not measured here.
    assert report.passed and report.matmul is not None
    assert report.matmul.verdict is Verdict.UNKNOWN and "is not on the host yet" in \
        report.matmul.reason
    assert not sim.events("docker-pull")

    image = "axolotlai/axolotl:0.18.0-py3.12-cu130-2.12.0"
    assert host.run(["docker", "pull", image], timeout=60).ok
    report = hostcheck.run(host, spec(), reports)
    assert report.matmul is not None and report.matmul.verdict is Verdict.PASS
    assert report.matmul.torch == "2.12.0+cu130"
    assert not sim.containers() and probes(sim) == [] and leftovers(sim) == []


def test_after_set_up_a_docker_hosts_gpu_is_measured_pulling_the_image(
        playbook_host: PlaybookHostFactory, reports: Reports) -> None:
    # Issue 40: once the job's set-up installed the toolkit, the matmul the first check could
    # not run is measured (the image pulled as the training step would pull it).
    sim, host = playbook_host(toolkit_preinstalled="1.18.1-1", gpu_speed=0.4)
    first = hostcheck.run(host, spec(), reports)
    assert first.passed and first.matmul is not None
    assert first.matmul.verdict is Verdict.UNKNOWN
    done = hostcheck.measure_gpu(host, spec(), first, reports)
    assert list(done.failures) == [Check.MATMUL] and done.matmul is not None
    assert "under 544" in done.matmul.reason
    assert (done.inventory, done.driver, done.disk, done.hub) == (
        first.inventory, first.driver, first.disk, first.hub)
    assert done.seconds > first.seconds
    assert [e["image"] for e in sim.events("docker-pull")] == [
        "axolotlai/axolotl:0.18.0-py3.12-cu130-2.12.0"]
    assert not sim.containers() and probes(sim) == [] and leftovers(sim) == []


def test_torch_refuses_a_driver_older_than_its_cuda(playbook_host: PlaybookHostFactory,
                                                    reports: Reports) -> None:
    # The driver check stops such a host first; the probe alone fails in torch's words.
    _, host = rental(playbook_host, driver_version="570.172.08", cuda_version="12.8")
    checker = HostCheck(spec())
    with pytest.raises(StepFailed, match="host check matmul: torch could not run a matmul on "
                       "the GPUs: RuntimeError: The NVIDIA driver on your system is too old "
                       r"\(found version 12080\)"):
        checker.steps()[-1].check(host)
    assert checker.results[Check.MATMUL].verdict is Verdict.FAIL


def test_a_token_file_left_by_a_killed_run_is_scrubbed(playbook_host: PlaybookHostFactory
                                                       ) -> None:
    sim, host = playbook_host()
    left = sim.path("/mnt/nvme/orch/secrets/hostcheck.env")
    left.parent.mkdir(parents=True)
    left.write_text(f"HF_TOKEN={TOKEN}\n")
    assert secrets.scrub(host, str(sim.path("/mnt/nvme/orch"))) == [str(left)]
    assert not left.exists()


def test_dd_statistics_are_read_from_the_real_dd(tmp_path: Path) -> None:
    result = subprocess.run(["dd", "if=/dev/zero", f"of={tmp_path / 'f'}", "bs=1M", "count=4",
                             "conv=fdatasync"], capture_output=True, text=True,
                            env={**os.environ, "LC_ALL": "C"}, check=True)
    found = dd_rate(result.stderr)
    assert found is not None and found[0] == 4 * 2**20 and found[1] > 0
    assert dd_rate("1+0 records in\n1+0 records out\n1 byte copied, 0.0001 s, 10 kB/s\n") == \
        (1, 0.0001)
    assert dd_rate("dd: error writing 'f': No space left on device\n") is None


@pytest.mark.parametrize(("vram_mib", "mbit"), [(24_564, 100), (81_559, 207.4),
                                                 (8 * 81_559, 500)])
def test_the_hub_floor_is_vasts_verification_floor(vram_mib: int, mbit: float) -> None:
    # vast-cli 1.9.1 vastai/cli/util.py required_inet_mbps: min(500, max(100, 500*GiB/192)).
    floor = thresholds().hub.min_bytes_per_s(vram_mib)
    assert floor * 8 / 1e6 == pytest.approx(mbit, abs=0.1)


# --- in the pipeline: first, before the model download and the image's heavy work ----------


def test_a_rejected_rental_never_downloads_the_model(playbook_host: PlaybookHostFactory,
                                                     reports: Reports, tmp_path: Path) -> None:
    from test_pipeline import make_job

    sim, host = rental(playbook_host, disk_write_bytes_per_second=40e6)
    job = replace(make_job(tmp_path, "lora"), host_check=spec())
    with pytest.raises(hostcheck.HostRejected) as info:
        run_pipeline(host, job, reports)
    assert info.value.fault is Fault.PROVIDER and info.value.step == "disk"
    assert info.value.report.failures == {
        Check.DISK: "writing 64 MiB took over 0.8 s (under 84 MB/s)"}
    assert {r.playbook for r in reports.items} == {"hostcheck"}  # nothing else ran
    assert not sim.events("hf-download") and not sim.path("/mnt/nvme/orch/models").exists()


def test_a_checked_rental_runs_the_job_and_a_kept_server_is_only_reported(
        playbook_host: PlaybookHostFactory, reports: Reports, tmp_path: Path) -> None:
    from test_pipeline import make_job

    _, host = rental(playbook_host, train_steps=2, train_step_seconds=0.05,
                     vllm_startup_seconds=0.2)
    job = replace(make_job(tmp_path, "lora"), host_check=spec(), eval_set=None)
    result = run_pipeline(host, job, reports)
    assert result.host_report is not None and result.host_report.passed
    assert result.train_status.state.value == "succeeded"
    assert reports.items[0].playbook == "hostcheck"
    playbooks = [r.playbook for r in reports.items]
    assert playbooks.index("model_cache") > max(i for i, p in enumerate(playbooks)
                                                if p == "hostcheck")

    # A registered server with a slow disk: the result is the user's to act on, not a reason
    # to refuse the job (the disk is slow, not broken).
    reports.clear()
    # (A small model: at 40 MB/s the simulated download of 2.5 GB would take a minute.)
    _, server = rental(playbook_host, train_steps=2, train_step_seconds=0.05,
                       disk_write_bytes_per_second=40e6, model_size_bytes=200_000_000)
    (tmp_path / "kept").mkdir()
    kept = replace(make_job(tmp_path / "kept", "lora"), host_check=spec(), eval_set=None,
                   kept_on="box1")
    result = run_pipeline(server, kept, reports)
    assert result.host_report is not None and not result.host_report.passed
    assert list(result.host_report.failures) == [Check.DISK]
    assert result.train_status.state.value == "succeeded"


# --- the remote scripts with this machine's real tools ---------------------------------------
# The stand-ins reproduce GNU dd's and curl's output; these run the scripts with the real
# coreutils and curl, so the parsing is checked against the tools themselves.


def local(argv: list[str], env: dict[str, str] | None = None,
          stdin: str | None = None) -> ssh.Result:
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, input=stdin,
                          timeout=120)
    return ssh.Result(tuple(argv), " ".join(argv), done.returncode, done.stdout, done.stderr,
                      time.monotonic() - started)


def test_the_disk_test_reads_real_df_du_and_dd(tmp_path: Path) -> None:
    base = tmp_path / "orch"
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "w.bin").write_bytes(b"\0" * 300_000)
    result = local(["sh", "-c", hostcheck.DISK_SCRIPT, "sh", str(base), "t.tmp", "8", "30",
                    str(tmp_path / "model")])
    disk = HostCheck(spec(disk_need_bytes=10**6)).judge_disk(result, str(base), 0.1)
    assert disk.free_bytes > 0 and disk.need_bytes < 10**6  # the cached bytes count
    assert disk.write_bytes_per_s is not None and disk.write_bytes_per_s > 0
    # Direct reads need O_DIRECT: measured where the filesystem has it, else said so.
    assert disk.read_bytes_per_s is not None or "read not measured" in disk.reason
    assert list(base.iterdir()) == []  # the test file is gone


def test_dd_cut_off_by_timeout_fails_the_disk_whether_or_not_it_printed() -> None:
    # `timeout -s INT` (the disk test's bound): real dd usually prints its statistics on
    # SIGINT, but not always (GNU dd 9.1 here: nothing, about 1 run in 4), so the verdict
    # rests on timeout's exit status 124, never on dd's last words.
    result = local(["sh", "-c", "LC_ALL=C timeout -s INT 0.3 dd if=/dev/zero of=/dev/null "
                    "bs=1M 2>&1; echo \"--rc $?\""])
    assert "--rc 124" in result.stdout
    found = dd_rate(result.stdout)
    assert found is None or found[0] > 0
    for printed in (result.stdout.replace("--rc 124", "").strip(), ""):
        out = f"free 9000000000\ncached 0\n--write\n{printed}\n--rc 124\n"
        disk = HostCheck(spec(disk_need_bytes=10**6)).judge_disk(
            local(["printf", "%s", out]), "/mnt", 0.0)
        assert disk.verdict is Verdict.FAIL and "took over" in disk.reason, disk.reason


def test_the_hub_test_sends_the_token_by_stdin_with_real_curl(session_hub: Any) -> None:
    session_hub.add_repo("acme/curl-hostcheck", {"model.safetensors": os.urandom(2**20)},
                         gated=True, accepted=(TOKEN,))
    try:
        url = f"{session_hub.url}/acme/curl-hostcheck/resolve/main/model.safetensors"
        argv = ["sh", "-c", hostcheck.HUB_SCRIPT, "sh", url, "30", str(2**19 - 1), "/dev/null"]
        result = local(argv, env={"PATH": os.environ["PATH"], "HF_TOKEN": TOKEN})
        stats = hostcheck.CURL_STATS.findall(result.stdout)
        assert stats and stats[-1][:2] == ("206", str(2**19)), result.stdout + result.stderr
        assert TOKEN not in " ".join(argv)
        refused = local(argv, env={"PATH": os.environ["PATH"]})  # no token: the gate's 401
        assert hostcheck.CURL_STATS.findall(refused.stdout)[-1][0] == "401"
        asked = [(r.authorized, r.status) for r in session_hub.requests
                 if r.path.startswith("/acme/curl-hostcheck/")]
        assert asked == [(True, 206), (False, 401)]
    finally:
        session_hub.repos.pop(("model", "acme/curl-hostcheck"), None)


def test_the_token_does_not_follow_a_redirect_to_another_host_with_real_curl() -> None:
    # The Hub redirects a file to its CDN (another host): the real curl sends the token's
    # header to the Hub only (libcurl CURLOPT_UNRESTRICTED_AUTH.md: not to another host
    # name, scheme or port), and the range to both.
    import http.server
    import threading

    seen: list[tuple[str, str | None, str | None]] = []

    class Cdn(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(("cdn", self.headers.get("Authorization"), self.headers.get("Range")))
            self.send_response(206)
            self.send_header("Content-Length", "1024")
            self.end_headers()
            self.wfile.write(b"x" * 1024)

        def log_message(self, *_args: Any) -> None:
            pass

    class Hub(Cdn):
        def do_GET(self) -> None:
            seen.append(("hub", self.headers.get("Authorization"), self.headers.get("Range")))
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.1:{cdn.server_port}/blob")
            self.send_header("Content-Length", "0")
            self.end_headers()

    hub = http.server.HTTPServer(("127.0.0.1", 0), Hub)
    cdn = http.server.HTTPServer(("127.0.0.1", 0), Cdn)
    for server in (hub, cdn):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{hub.server_port}/acme/m/resolve/main/model.safetensors"
        argv = ["sh", "-c", hostcheck.HUB_SCRIPT, "sh", url, "30", "1023", "/dev/null"]
        result = local(argv, env={"PATH": os.environ["PATH"], "HF_TOKEN": TOKEN})
    finally:
        hub.shutdown()
        cdn.shutdown()
    assert hostcheck.CURL_STATS.findall(result.stdout)[-1][:2] == ("206", "1024")
    assert seen == [("hub", f"Bearer {TOKEN}", "bytes=0-1023"), ("cdn", None, "bytes=0-1023")]


def test_a_padded_free_space_is_read() -> None:
    # df right-aligns `--output=avail` under its header: a value narrower than "Avail" comes
    # with spaces before it.
    stats = "1+0 records in\n1+0 records out\n1048576 bytes (1.0 MB, 1.0 MiB) copied, 0.001 s,"
    out = f"free  9000\ncached 0\n--write\n{stats} 1 GB/s\n--rc 0\n--read\n{stats} 1 GB/s\n--rc 0\n"
    disk = HostCheck(spec(disk_need_bytes=10**6)).judge_disk(
        local(["printf", "%s", out]), "/mnt", 0.0)
    assert disk.free_bytes == 9000 and disk.verdict is Verdict.FAIL
    assert "GB free, the job needs" in disk.reason


def test_a_host_without_a_disk_for_the_model_fails_the_disk_check(
        playbook_host: PlaybookHostFactory, reports: Reports) -> None:
    # No NVMe and none of the usual mounts: a verdict on the host, not an error of the check.
    _, host = playbook_host(nvme_mount=None)
    report = hostcheck.run(host, spec(), reports)
    assert list(report.failures) == [Check.DISK]
    assert "no NVMe filesystem is mounted" in report.failures[Check.DISK]
