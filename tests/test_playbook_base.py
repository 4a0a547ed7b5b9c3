"""The step runner over real SSH: skip when done, change once, verify, fail with stderr."""

from __future__ import annotations

import pytest
from conftest import PlaybookHostFactory, Reports

from playbooks.base import (
    Fault,
    Host,
    HostPaths,
    Layout,
    PlaybookFailed,
    Step,
    StepFailed,
    container_name,
    run_playbook,
    safe_name,
)


def marker_steps(path: str) -> list[Step]:
    def done(h: Host) -> bool:
        return h.run(["test", "-f", path]).ok

    def make(h: Host) -> None:
        h.must(["sh", "-c", 'mkdir -p "$(dirname "$1")" && echo hi > "$1"', "sh", path],
               "writing the marker")

    return [
        Step("marker", done, make),
        Step("marker-readable", lambda h: h.read(path) == b"hi\n", message="marker unreadable"),
    ]


def test_fresh_run_changes_and_rerun_skips(playbook_host: PlaybookHostFactory,
                                           reports: Reports) -> None:
    sim, host = playbook_host()
    path = host.paths("/opt/orch-test/marker")
    run_playbook("demo", marker_steps(path), host, reports)
    assert reports.outcomes() == {"marker": "changed", "marker-readable": "ok"}
    reports.clear()
    run_playbook("demo", marker_steps(path), host, reports)
    assert reports.outcomes() == {"marker": "skipped", "marker-readable": "ok"}
    assert all(r.kind.startswith("step.") and r.data()["playbook"] == "demo"
               for r in reports.items)


def test_failure_stops_with_stderr_tail_and_fault(playbook_host: PlaybookHostFactory,
                                                  reports: Reports) -> None:
    _, host = playbook_host()

    def boom(h: Host) -> None:
        h.must(["sh", "-c", "echo 'disk on fire' >&2; exit 3"], "lighting the disk",
               fault=Fault.HOST)

    steps = [Step("first", lambda h: False, boom), Step("never", lambda h: True)]
    with pytest.raises(PlaybookFailed) as info:
        run_playbook("demo", steps, host, reports)
    assert info.value.step == "first" and info.value.fault is Fault.HOST
    assert "lighting the disk failed (exit 3): disk on fire" in str(info.value)
    (report,) = reports.items
    assert report.outcome == "failed" and "disk on fire" in report.stderr_tail


def test_apply_that_does_not_take_effect_is_a_failure(playbook_host: PlaybookHostFactory,
                                                      reports: Reports) -> None:
    _, host = playbook_host()
    with pytest.raises(PlaybookFailed, match="still is not in the desired state"):
        run_playbook("demo", [Step("noop", lambda h: False, lambda h: None)], host, reports)


def test_verification_failure_uses_its_message_and_fault(playbook_host: PlaybookHostFactory,
                                                         reports: Reports) -> None:
    _, host = playbook_host()
    step = Step("gpu", lambda h: False, message="wrong GPU", fault=Fault.PROVIDER)
    with pytest.raises(PlaybookFailed) as info:
        run_playbook("demo", [step], host, reports)
    assert info.value.fault is Fault.PROVIDER and info.value.reason == "wrong GPU"


def test_step_failed_carries_fault() -> None:
    exc = StepFailed("x", fault=Fault.USER, stderr="e" * 5000)
    assert exc.fault is Fault.USER and len(exc.stderr_tail) == 2000


def test_paths_layout_and_names() -> None:
    assert HostPaths()("/etc/x") == "/etc/x"
    assert HostPaths("/tmp/h/root")("/etc/x") == "/tmp/h/root/etc/x"
    with pytest.raises(ValueError):
        HostPaths()("relative")
    lay = Layout("/mnt/nvme/orch")
    assert lay.model_dir("meta-llama/Llama-3.1-8B") == \
        "/mnt/nvme/orch/models/meta-llama--Llama-3.1-8B/main"
    assert lay.model_dir("a/b_c") != lay.model_dir("a_b/c")
    assert lay.container(lay.config_file("j-1")) == "/workspace/data/jobs/j-1/config.yml"
    for hostile in ["../../etc", "a;rm -rf /", "$(reboot)", "x\ny", "'q'"]:
        name = safe_name(hostile)
        assert "/" not in name and ".." not in name and not set(name) & set(";$()'\n ")
    assert container_name("train", "j-1") == "orch-train-j-1"
