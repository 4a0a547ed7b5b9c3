"""NVIDIA Container Toolkit: apt repository, pinned packages, Docker runtime, verification.

Follows ../shared/reference/pipeline-facts.md ("NVIDIA Container Toolkit (apt)") and
NVIDIA's install guide. Every step checks the host first and changes only what differs, so
a second run changes nothing: no apt-get update, no install, and above all no Docker
restart (a restart kills running containers, e.g. another job's training on a monthly
server). Docker is restarted only when this run changed daemon.json, or when the running
daemon does not have the configuration daemon.json asks for (a run that died between the
two).

Server paths go through `host.paths(...)` (the simulated host keeps its filesystem under a
directory). Commands are argv lists; the one pipeline runs as `sh -c SCRIPT sh ARG...` with
the values as positional parameters, never interpolated into the script.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from playbooks.base import Fault, Host, Step, StepFailed, last_line

# The current release in NVIDIA's versions list (cloud-native-docs `versions1.json`: 1.20.0;
# the install guide's example pin, 1.17.8-1, is an older one still listed); one version for
# all four packages, which depend on each other at equal versions.
DEFAULT_VERSION = "1.20.0-1"
PACKAGES = (
    "nvidia-container-toolkit",
    "nvidia-container-toolkit-base",
    "libnvidia-container-tools",
    "libnvidia-container1",
)
# What fetching and dearmoring the key needs. gnupg2 is a transitional package on current
# Ubuntu; `gnupg` provides the same gpg, so either satisfies it.
PREREQUISITES = ("ca-certificates", "curl", "gnupg2")
_GNUPG_ALTERNATIVES = ("gnupg2", "gnupg")

GPGKEY_URL = "https://nvidia.github.io/libnvidia-container/gpgkey"
LIST_URL = "https://nvidia.github.io/libnvidia-container/stable/deb/nvidia-container-toolkit.list"
REPO = "nvidia.github.io/libnvidia-container/stable/deb"
KEYRING = "/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg"
LIST_FILE = "/etc/apt/sources.list.d/nvidia-container-toolkit.list"
DAEMON_JSON = "/etc/docker/daemon.json"
CGROUPFS = "native.cgroupdriver=cgroupfs"
# A Debian version (epoch:upstream-revision); anything else is refused before it reaches apt.
_DEB_VERSION = re.compile(r"([0-9]+:)?[0-9][A-Za-z0-9.+~-]*")
VERIFY = ["docker", "run", "--rm", "--runtime=nvidia", "--gpus", "all", "ubuntu", "nvidia-smi"]

# Non-interactive apt that waits for the dpkg lock (fresh cloud images run
# unattended-upgrades at boot) instead of failing at once.
_APT = ["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "-q",
        "-o", "DPkg::Lock::Timeout=180"]

# curl the armored key next to the keyring, dearmor it to a temporary name, then rename, so
# a killed run never leaves a half-written keyring that apt would reject. $1 = URL,
# $2 = keyring path. Without a pipe a failing curl reports its own error, not gpg's.
_KEYRING_SCRIPT = """set -e
mkdir -p "$(dirname "$2")"
trap 'rm -f "$2.asc" "$2.new"' EXIT
curl -fsSL -o "$2.asc" "$1"
gpg --batch --yes --dearmor -o "$2.new" "$2.asc"
chmod 0644 "$2.new"
mv -f "$2.new" "$2"
"""


@dataclass
class _Run:
    """What this run changed, which later steps' checks depend on."""

    list_changed: bool = False
    apt_updated: bool = False
    daemon_json_changed: bool = False
    # The apt-update check's look at the packages, reused once by the packages check
    # (saves a round trip; the re-check after an install always asks dpkg again).
    pending: dict[str, str] | None = None


def steps(version: str = DEFAULT_VERSION, *, cgroupfs: bool = False, keyring: str = KEYRING,
          list_file: str = LIST_FILE, daemon_json: str = DAEMON_JSON) -> list[Step]:
    """The toolkit playbook at `version` (one list per run: the steps share its changes).

    `cgroupfs=True` also switches Docker to the cgroupfs driver (`exec-opts`): NVIDIA's
    troubleshooting guide's workaround for containers losing their GPUs after a
    `systemctl daemon-reload` under the systemd driver, not a step of its install guide, so
    not done by default. The paths are server paths, mapped with `host.paths` when the
    steps run.
    """
    if not _DEB_VERSION.fullmatch(version):
        raise ValueError(f"not a Debian package version: {version!r} (e.g. {DEFAULT_VERSION})")
    t = _Toolkit(version, cgroupfs, keyring, list_file, daemon_json)
    playbook = [
        Step("docker", t.docker_present, timeout_s=60),
        Step("privileges", t.privileges, timeout_s=60),
        Step("prerequisites", t.prerequisites_ok, t.install_prerequisites, timeout_s=600),
        Step("keyring", lambda h: _keyring_ok(h, keyring), t.add_keyring, timeout_s=180),
        Step("apt-list", lambda h: _list_ok(h, keyring, list_file), t.write_list, timeout_s=180),
        Step("apt-update", t.lists_fresh, t.apt_update, timeout_s=600),
        Step("packages", t.packages_ok, t.install_packages, timeout_s=900),
        Step("runtime-configure", t.runtime_configured, t.configure_runtime, timeout_s=120),
    ]
    if cgroupfs:
        playbook.append(Step("cgroup-driver", t.cgroup_fixed, t.fix_cgroup, timeout_s=120))
    playbook += [
        Step("docker-restart", t.docker_current, t.restart_docker, timeout_s=300),
        Step("verify", t.verify, timeout_s=900),
    ]
    return playbook


class _Toolkit:
    """The toolkit playbook's checks and actions for one run, sharing what it changed."""

    def __init__(self, version: str, cgroupfs: bool, keyring: str, list_file: str,
                 daemon_json: str) -> None:
        self.version, self.cgroupfs, self.keyring = version, cgroupfs, keyring
        self.list_file, self.daemon_json = list_file, daemon_json
        self.versions = dict.fromkeys(PACKAGES, version)
        self.run = _Run()

    def docker_present(self, host: Host) -> bool:
        result = host.run(["docker", "--version"], timeout=30)
        if not result.ok:
            raise StepFailed(
                "Docker is not installed on the host (`docker --version` exit "
                f"{result.exit_code}); the toolkit needs Docker Engine: install docker-ce "
                "(https://docs.docker.com/engine/install/ubuntu/) or choose an offer with "
                "Docker.", fault=Fault.HOST, stderr=result.stderr)
        return True

    def privileges(self, host: Host) -> bool:
        """Root, or passwordless sudo (then every privileged step runs `sudo -n`)."""
        return check_privileges(host)

    def prerequisites_ok(self, host: Host) -> bool:
        # Only fetching and dearmoring the key needs them: a host whose repository is set
        # up already (toolkit preinstalled) gets no install it does not need.
        return not _missing_prerequisites(host) or (
            _keyring_ok(host, self.keyring) and _list_ok(host, self.keyring, self.list_file))

    def install_prerequisites(self, host: Host) -> None:
        # NVIDIA's guide runs `apt-get update` first: a fresh image has empty package lists
        # and apt cannot locate even curl without them.
        _apt(host, ["update"], "apt-get update", "check the host's apt sources and network "
             "access")
        _apt(host, ["install", "-y", "--no-install-recommends", *_missing_prerequisites(host)],
             "installing the prerequisites (ca-certificates curl gnupg2)",
             "check the host's apt sources and network access")

    def add_keyring(self, host: Host) -> None:
        target = host.paths(self.keyring)
        result = host.run(host.privileged(["sh", "-c", _KEYRING_SCRIPT, "sh", GPGKEY_URL,
                                           target]), timeout=120)
        if not result.ok:
            raise StepFailed(
                f"fetching NVIDIA's signing key failed (exit {result.exit_code}): "
                f"{last_line(result.stderr or result.stdout)}. Check that the host reaches "
                f"{GPGKEY_URL}.", fault=Fault.TRANSIENT, stderr=result.stderr)

    def write_list(self, host: Host) -> None:
        result = host.run(["curl", "-fsSL", LIST_URL], timeout=120)
        if not result.ok:
            raise StepFailed(
                f"fetching the NVIDIA apt list failed (exit {result.exit_code}): "
                f"{last_line(result.stderr or result.stdout)}. Check that the host reaches "
                f"{LIST_URL}.", fault=Fault.TRANSIENT, stderr=result.stderr)
        text = signed_list(result.stdout, host.paths(self.keyring))
        if REPO not in text:
            raise StepFailed(f"{LIST_URL} returned no NVIDIA repository line: "
                             f"{last_line(result.stdout)}", fault=Fault.TRANSIENT)
        host.put_text_privileged(text, host.paths(self.list_file), mode=0o644)
        self.run.list_changed = True

    def lists_fresh(self, host: Host) -> bool:
        # There is no cheap, portable "does apt know the pinned version?" check, so update
        # when the list just changed or the packages still have to be installed.
        if self.run.apt_updated:
            return True
        self.run.pending = _package_changes(host, self.versions)
        return not self.run.list_changed and not self.run.pending

    def apt_update(self, host: Host) -> None:
        _apt(host, ["update"], "apt-get update",
             f"check {self.list_file} and {self.keyring} (NO_PUBKEY means the keyring is wrong) "
             "and network access to nvidia.github.io")
        self.run.apt_updated = True

    def packages_ok(self, host: Host) -> bool:
        pending, self.run.pending = self.run.pending, None
        return not (pending if pending is not None else _package_changes(host, self.versions))

    def install_packages(self, host: Host) -> None:
        _apt(host, ["install", "-y", "--allow-downgrades",
                    *(f"{name}={v}" for name, v in self.versions.items())],
             f"installing NVIDIA Container Toolkit {self.version}",
             f"check that {self.version} exists (`apt-cache madison nvidia-container-toolkit`) "
             "or pin another version", timeout=600)

    def runtime_configured(self, host: Host) -> bool:
        runtimes = _daemon_config(host, self.daemon_json).get("runtimes")
        return isinstance(runtimes, dict) and "nvidia" in runtimes

    def configure_runtime(self, host: Host) -> None:
        host.must(host.privileged(["nvidia-ctk", "runtime", "configure", "--runtime=docker",
                                   f"--config={host.paths(self.daemon_json)}"]),
                  f"`nvidia-ctk runtime configure --runtime=docker` (fix {self.daemon_json})")
        self.run.daemon_json_changed = True

    def cgroup_fixed(self, host: Host) -> bool:
        options = _daemon_config(host, self.daemon_json).get("exec-opts")
        return isinstance(options, list) and CGROUPFS in options

    def fix_cgroup(self, host: Host) -> None:
        config = _daemon_config(host, self.daemon_json)
        config["exec-opts"] = with_cgroupfs(config.get("exec-opts"))
        host.put_text_privileged(json.dumps(config, indent=4) + "\n",
                                 host.paths(self.daemon_json), mode=0o644)
        self.run.daemon_json_changed = True

    def docker_current(self, host: Host) -> bool:
        if self.run.daemon_json_changed:
            return False
        runtimes, driver = _docker_runtime_state(host)
        return "nvidia" in runtimes and (not self.cgroupfs or driver == "cgroupfs")

    def restart_docker(self, host: Host) -> None:
        _restart_docker(host)
        self.run.daemon_json_changed = False

    def verify(self, host: Host) -> bool:
        result = host.run(VERIFY, timeout=600)
        if not result.ok:
            raise StepFailed(
                f"the GPU test container failed (exit {result.exit_code}): "
                f"{last_line(result.stderr or result.stdout)}. Check the driver (`nvidia-smi` "
                "on the host) and that `docker info` lists the nvidia runtime.",
                fault=Fault.HOST, stderr=result.stderr)
        return True


def check_privileges(host: Host) -> bool:
    """Set `host.sudo` for a non-root login with passwordless sudo; StepFailed without it.

    apt-get, nvidia-ctk's write to /etc/docker/daemon.json, the Docker restart and the
    apt list and keyring under /etc and /usr/share need root.
    """
    uid = host.run(["id", "-u"], timeout=30)
    if uid.ok and uid.stdout.strip() == "0":
        host.sudo = False
        return True
    probe = host.run(["sudo", "-n", "true"], timeout=30)
    if not probe.ok:
        raise StepFailed(
            "the SSH login is not root and has no passwordless sudo (`sudo -n true`: "
            f"{last_line(probe.stderr or probe.stdout) or 'exit ' + str(probe.exit_code)}): "
            "installing the NVIDIA Container Toolkit needs root. Log in as root, or give the "
            "user passwordless sudo (a sudoers line `USER ALL=(ALL) NOPASSWD:ALL`)",
            fault=Fault.HOST, stderr=probe.stderr)
    host.sudo = True
    return True


# --- pure helpers ----------------------------------------------------------------------------


def signed_list(text: str, keyring: str) -> str:
    """NVIDIA's .list with `deb https://` rewritten to `deb [signed-by=KEYRING] https://`."""
    lines = []
    for line in text.splitlines():
        if line.startswith("deb https://"):
            line = f"deb [signed-by={keyring}] https://" + line.removeprefix("deb https://")
        lines.append(line)
    return "\n".join(lines) + "\n"


def list_is_signed(text: str, keyring: str) -> bool:
    """Whether every active `deb` line of a .list uses NVIDIA's stable repo signed by `keyring`."""
    active = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("deb ")]
    return bool(active) and all(
        ln.startswith(f"deb [signed-by={keyring}] https://{REPO}") for ln in active)


def with_cgroupfs(exec_opts: Any) -> list[Any]:
    """daemon.json `exec-opts` with the cgroupfs driver (replacing any other cgroupdriver)."""
    options = list(exec_opts) if isinstance(exec_opts, list) else []
    kept = [o for o in options
            if not (isinstance(o, str) and o.replace(" ", "").startswith("native.cgroupdriver="))]
    return [*kept, CGROUPFS]


# --- host checks -----------------------------------------------------------------------------


def _installed(host: Host, names: tuple[str, ...]) -> dict[str, str]:
    """name -> version of those `names` that dpkg has fully installed (status `ii`)."""
    result = host.run(["dpkg-query", "-W", "-f=${Package}\\t${Version}\\t${db:Status-Abbrev}\\n",
                       *names], timeout=60)
    # Exit 1 only means some name is unknown to dpkg; anything else is a broken dpkg.
    if result.exit_code not in (0, 1):
        raise StepFailed(f"dpkg-query failed (exit {result.exit_code}): "
                         f"{last_line(result.stderr)}", stderr=result.stderr)
    found: dict[str, str] = {}
    for line in result.stdout.splitlines():
        parts = line.split("\t")
        if len(parts) >= 3 and parts[2].strip() == "ii":
            found[parts[0]] = parts[1]
    return found


def _missing_prerequisites(host: Host) -> list[str]:
    installed = _installed(host, (*PREREQUISITES, "gnupg"))
    missing = [p for p in PREREQUISITES if p not in installed and p not in _GNUPG_ALTERNATIVES]
    if not any(p in installed for p in _GNUPG_ALTERNATIVES):
        missing.append("gnupg2")
    return missing


def _package_changes(host: Host, versions: dict[str, str]) -> dict[str, str]:
    installed = _installed(host, tuple(versions))
    return {n: v for n, v in versions.items() if installed.get(n) != v}


def _keyring_ok(host: Host, keyring: str) -> bool:
    data = host.read(host.paths(keyring))
    # apt ignores an ASCII-armored key in a .gpg keyring: it must be dearmored (binary).
    return data is not None and bool(data.strip()) and not data.lstrip().startswith(b"-----BEGIN")


def _list_ok(host: Host, keyring: str, list_file: str) -> bool:
    data = host.read(host.paths(list_file))
    return data is not None and list_is_signed(data.decode(errors="replace"),
                                               host.paths(keyring))


def _daemon_config(host: Host, daemon_json: str) -> dict[str, Any]:
    """daemon.json as a dict ({} when absent or empty); invalid JSON stops the playbook."""
    data = host.read(host.paths(daemon_json))
    if data is None or not data.strip():
        return {}
    try:
        config = json.loads(data)
    except ValueError as exc:
        raise StepFailed(f"{daemon_json} is not valid JSON ({exc}); Docker cannot start with "
                         "it either: fix or remove the file, then run again.") from None
    if not isinstance(config, dict):
        raise StepFailed(f"{daemon_json} must hold a JSON object; fix or remove it.")
    return config


def _docker_runtime_state(host: Host) -> tuple[dict[str, Any], str]:
    """The running daemon's runtimes and cgroup driver; ({}, "") when it does not answer."""
    result = host.run(["docker", "info", "--format", "{{json .Runtimes}} {{.CgroupDriver}}"],
                      timeout=60)
    if not result.ok:
        return {}, ""  # daemon down: a restart is what brings it back
    runtimes_json, _, driver = result.stdout.strip().rpartition(" ")
    try:
        runtimes = json.loads(runtimes_json)
    except ValueError:
        return {}, driver
    return (runtimes if isinstance(runtimes, dict) else {}), driver


# --- host changes ----------------------------------------------------------------------------


def _apt(host: Host, args: list[str], what: str, hint: str, timeout: float = 600) -> None:
    result = host.run(host.privileged([*_APT, *args]), timeout=timeout)
    if not result.ok:
        raise StepFailed(f"{what} failed (exit {result.exit_code}): "
                         f"{last_line(result.stderr or result.stdout)}. What to do: {hint}.",
                         fault=Fault.HOST, stderr=result.stderr or result.stdout)


_NO_SYSTEMD = ("has not been booted with systemd", "Failed to connect to bus",
               "systemd is not running")


def _restart_docker(host: Host) -> None:
    """`systemctl restart docker`; without systemd (container rentals) `service docker restart`."""
    result = host.run(host.privileged(["systemctl", "restart", "docker"]), timeout=240)
    if result.ok:
        return
    if result.exit_code == 127 or any(s in result.stderr for s in _NO_SYSTEMD):
        result = host.run(host.privileged(["service", "docker", "restart"]), timeout=240)
        if result.ok:
            return
    raise StepFailed(f"restarting Docker failed (exit {result.exit_code}): "
                     f"{last_line(result.stderr or result.stdout)}. Check `systemctl status "
                     "docker` / `journalctl -u docker` and /etc/docker/daemon.json.",
                     fault=Fault.HOST, stderr=result.stderr)
