"""The NVIDIA Container Toolkit playbook over real SSH: install once, then change nothing."""

from __future__ import annotations

import json

import pytest
from conftest import PlaybookHostFactory, Reports

from playbooks import container_toolkit as toolkit
from playbooks.base import Fault, Host, PlaybookFailed, run_playbook
from simhost import SimHost

STEPS = ["docker", "privileges", "prerequisites", "keyring", "apt-list", "apt-update",
         "packages", "runtime-configure", "docker-restart", "verify"]
VERIFICATIONS = {"docker", "privileges", "verify"}
CHANGING = ("apt-install", "apt-update", "docker-restart", "nvidia-ctk-configure", "curl")


def counts(sim: SimHost) -> dict[str, int]:
    return {kind: len(sim.events(kind)) for kind in CHANGING}


def runtimes(host: Host) -> dict[str, object]:
    """What the running Docker daemon reports (`docker info`), as a user would check."""
    result = host.must(["docker", "info", "--format", "{{json .Runtimes}}"], "docker info")
    found: dict[str, object] = json.loads(result.stdout)
    return found


def test_fresh_host_installs_then_rerun_changes_nothing(playbook_host: PlaybookHostFactory,
                                                        reports: Reports) -> None:
    sim, host = playbook_host()
    run_playbook("toolkit", toolkit.steps(), host, reports)
    assert reports.outcomes() == {s: "ok" if s in VERIFICATIONS else "changed" for s in STEPS}
    assert sim.installed_packages() | dict.fromkeys(toolkit.PACKAGES, toolkit.DEFAULT_VERSION) \
        == sim.installed_packages()
    assert "gnupg2" in sim.installed_packages()
    assert "nvidia" in runtimes(host)
    config = json.loads(sim.daemon_json_path.read_text())
    # NVIDIA's install guide does not touch the cgroup driver (cgroupfs is a troubleshooting
    # workaround, asked for with cgroupfs=True).
    assert "nvidia" in config["runtimes"] and "exec-opts" not in config
    assert sim.keyrings_dir.joinpath("nvidia-container-toolkit-keyring.gpg").read_bytes()[:1] \
        != b"-"
    listing = sim.apt_sources_dir.joinpath("nvidia-container-toolkit.list").read_text()
    assert f"deb [signed-by={host.paths(toolkit.KEYRING)}] https://" in listing
    first = counts(sim)
    # Prerequisites and the toolkit were installed in one go each, each after an `apt-get
    # update` (a fresh image's lists are empty: installing curl first fails); Docker
    # restarted once.
    assert first["apt-install"] == 2 and first["apt-update"] == 2
    assert first["docker-restart"] == 1

    reports.clear()
    run_playbook("toolkit", toolkit.steps(), host, reports)
    assert reports.outcomes() == {s: "ok" if s in VERIFICATIONS else "skipped" for s in STEPS}
    assert counts(sim) == first
    assert len(sim.events("docker-run")) == 2  # only the two verification containers


def test_without_systemd_restarts_with_service_and_keeps_daemon_json_keys(
        playbook_host: PlaybookHostFactory, reports: Reports) -> None:
    sim, host = playbook_host(has_systemd=False)
    sim.daemon_json_path.parent.mkdir(parents=True, exist_ok=True)
    sim.daemon_json_path.write_text(json.dumps({
        "log-driver": "json-file", "log-opts": {"max-size": "10m"},
        "exec-opts": ["native.umask=normal", "native.cgroupdriver=systemd"],
        "data-root": "/mnt/nvme/docker"}))
    run_playbook("toolkit", toolkit.steps(cgroupfs=True), host, reports)
    assert reports.outcomes()["docker-restart"] == "changed"
    assert "service docker restart" in sim.ssh_commands()
    config = json.loads(sim.daemon_json_path.read_text())
    assert config["log-driver"] == "json-file" and config["log-opts"] == {"max-size": "10m"}
    assert config["data-root"] == "/mnt/nvme/docker" and "nvidia" in config["runtimes"]
    assert config["exec-opts"] == ["native.umask=normal", toolkit.CGROUPFS]
    assert len(sim.events("docker-restart")) == 1


def test_preinstalled_toolkit_changes_nothing(playbook_host: PlaybookHostFactory,
                                              reports: Reports) -> None:
    sim, host = playbook_host(toolkit_preinstalled=toolkit.DEFAULT_VERSION)
    before = counts(sim)
    # The preinstalled host has the runtime but not the cgroup fix: without the fix asked
    # for (the default), every step is already done.
    run_playbook("toolkit", toolkit.steps(), host, reports)
    assert reports.outcomes() == {s: "ok" if s in VERIFICATIONS else "skipped" for s in STEPS}
    assert counts(sim) == before
    assert "gnupg2" not in sim.installed_packages()  # not needed: the repo is set up

    # With the fix asked for, only daemon.json and the restart it needs change.
    reports.clear()
    run_playbook("toolkit", toolkit.steps(cgroupfs=True), host, reports)
    changed = {s for s, outcome in reports.outcomes().items() if outcome == "changed"}
    assert changed == {"cgroup-driver", "docker-restart"}
    assert counts(sim) == before | {"docker-restart": before["docker-restart"] + 1}


def test_other_pinned_version_replaces_the_installed_one(playbook_host: PlaybookHostFactory,
                                                         reports: Reports) -> None:
    sim, host = playbook_host(toolkit_preinstalled="1.18.1-1")
    run_playbook("toolkit", toolkit.steps(toolkit.DEFAULT_VERSION), host, reports)
    assert reports.outcomes()["apt-update"] == "changed"
    assert reports.outcomes()["packages"] == "changed"
    assert {sim.installed_packages()[p] for p in toolkit.PACKAGES} == {toolkit.DEFAULT_VERSION}


def test_a_login_with_passwordless_sudo_installs_through_sudo(
        playbook_host: PlaybookHostFactory, reports: Reports) -> None:
    """Issue 19 §4.3: the simulated server refuses apt-get, nvidia-ctk and systemctl from a
    non-root user; orch runs them (and its writes under /etc) through `sudo -n`."""
    sim, host = playbook_host(login="sudoer")
    assert host.run(["apt-get", "update"]).exit_code == 100  # as the real apt: "are you root?"
    run_playbook("toolkit", toolkit.steps(), host, reports)
    assert reports.outcomes() == {s: "ok" if s in VERIFICATIONS else "changed" for s in STEPS}
    ran = sim.ssh_commands()
    for privileged in ("sudo -n env DEBIAN_FRONTEND=noninteractive apt-get",
                       "sudo -n nvidia-ctk runtime configure", "sudo -n systemctl restart docker",
                       "sudo -n install -D -m 644"):
        assert any(c.startswith(privileged) for c in ran), privileged
    assert "nvidia" in runtimes(host)
    assert (sim.apt_sources_dir / "nvidia-container-toolkit.list").is_file()


def test_a_login_without_sudo_stops_before_any_change(playbook_host: PlaybookHostFactory,
                                                     reports: Reports) -> None:
    sim, host = playbook_host(login="user")
    with pytest.raises(PlaybookFailed) as info:
        run_playbook("toolkit", toolkit.steps(), host, reports)
    assert info.value.step == "privileges" and info.value.fault is Fault.HOST
    assert "no passwordless sudo" in info.value.reason and "NOPASSWD" in info.value.reason
    assert "a password is required" in info.value.reason
    assert not sim.events("apt-install") and not sim.events("apt-update")


def test_the_default_pin_is_nvidias_current_release() -> None:
    # cloud-native-docs container-toolkit versions1.json lists 1.20.0 as current
    # (../shared/reference/real-hosts.md §9); the install guide's 1.17.8-1 is an older one.
    assert toolkit.DEFAULT_VERSION == "1.20.0-1"
    assert "cgroup-driver" not in [s.name for s in toolkit.steps()]
    assert "cgroup-driver" in [s.name for s in toolkit.steps(cgroupfs=True)]


def test_apt_failure_reports_stderr_tail(playbook_host: PlaybookHostFactory,
                                         reports: Reports) -> None:
    _, host = playbook_host()
    with pytest.raises(PlaybookFailed) as info:
        run_playbook("toolkit", toolkit.steps("9.9.9-1"), host, reports)
    assert info.value.step == "packages" and info.value.fault is Fault.HOST
    assert "installing NVIDIA Container Toolkit 9.9.9-1 failed (exit 100)" in info.value.reason
    assert "apt-cache madison" in info.value.reason
    failed = reports.items[-1]
    assert failed.outcome == "failed" and failed.step == "packages"
    assert "Version '9.9.9-1' for 'nvidia-container-toolkit' was not found" in failed.stderr_tail


def test_invalid_daemon_json_stops_with_advice(playbook_host: PlaybookHostFactory,
                                               reports: Reports) -> None:
    sim, host = playbook_host(toolkit_preinstalled=toolkit.DEFAULT_VERSION)
    sim.daemon_json_path.write_text('{"runtimes": ')
    with pytest.raises(PlaybookFailed) as info:
        run_playbook("toolkit", toolkit.steps(), host, reports)
    assert info.value.step == "runtime-configure"
    assert "not valid JSON" in info.value.reason and "fix or remove" in info.value.reason


def test_host_without_docker_fails_first(playbook_host: PlaybookHostFactory,
                                         reports: Reports) -> None:
    sim, host = playbook_host(has_docker=False)
    with pytest.raises(PlaybookFailed) as info:
        run_playbook("toolkit", toolkit.steps(), host, reports)
    assert info.value.step == "docker" and "install docker-ce" in info.value.reason
    assert not sim.events("apt-install")


def test_pure_helpers() -> None:
    raw = ("deb https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH) /\n"
           "#deb https://nvidia.github.io/libnvidia-container/experimental/deb/$(ARCH) /\n")
    signed = toolkit.signed_list(raw, "/k.gpg")
    assert signed.splitlines()[0].startswith("deb [signed-by=/k.gpg] https://nvidia.github.io/")
    assert signed.splitlines()[1].startswith("#deb https://")
    assert toolkit.list_is_signed(signed, "/k.gpg")
    assert not toolkit.list_is_signed(raw, "/k.gpg") and not toolkit.list_is_signed("", "/k")
    for bad in ["", "latest", "1.17.8-1 --allow-unauthenticated", "1;reboot", "$(id)"]:
        with pytest.raises(ValueError, match="Debian package version"):
            toolkit.steps(bad)
    assert toolkit.with_cgroupfs(None) == [toolkit.CGROUPFS]
    assert toolkit.with_cgroupfs(["a", "native.cgroupdriver=systemd"]) == ["a", toolkit.CGROUPFS]


@pytest.mark.parametrize(("login", "expected"), [("root", "root"), ("sudoer", "sudo"),
                                                 ("user", "none")])
def test_servers_add_reports_the_logins_privileges(playbook_host: PlaybookHostFactory,
                                                   login: str, expected: str) -> None:
    from orchestrator.cli.serverprobe import privileges

    _, host = playbook_host(login=login)
    assert privileges(host) == expected
