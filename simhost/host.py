"""A simulated GPU host: a real OpenSSH sshd on 127.0.0.1 whose sessions find GPU stand-ins.

`SimHost` boots a per-host init (a child subreaper) that runs `sshd -D` on a free loopback
port with the host's own ed25519 host key and the caller's authorized key. sshd's
`SetEnv` gives every session `PATH=<host>/bin:<system>`, `HOME` inside the host and the
`SIMHOST_*` variables the stand-ins read; a `ForceCommand` wrapper starts each command in
that home and records it (`ssh_commands()`). Everything is stdlib so the stand-ins can share it.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import pwd
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import Any

from .standins import container as container_standin
from .standins import docker as docker_standin
from .standins.common import (
    BIN_DIR,
    SYSTEM_PATH,
    Host,
    alive,
    cut_power,
    descendants,
    kill_process_group,
    proc_table,
    process_starttime,
    refresh_bin,
    tagged,
    write_atomic,
)
from .standins.system import _KEY_PACKET, TOOLKIT_PACKAGES

_SFTP_SERVERS = (
    "/usr/lib/openssh/sftp-server",
    "/usr/libexec/openssh/sftp-server",
    "/usr/libexec/sftp-server",
    "/usr/lib/ssh/sftp-server",
)


class SimHostError(RuntimeError):
    """The simulated host could not start (the message carries sshd's log tail)."""


@dataclass(frozen=True)
class SimHostOptions:
    """What the simulated host has and which faults it injects (see README.md)."""

    # GPUs and driver
    gpu_model: str = "NVIDIA H100 80GB HBM3"
    gpu_count: int = 1
    gpu_memory_mib: int = 81559
    # An R580 driver: the first to support CUDA 13.0, which the pinned cu130 trainer needs.
    driver_version: str = "580.65.06"
    cuda_version: str = "13.0"
    driver_missing: bool = False  # no nvidia-smi at all (command not found)
    driver_broken: bool = False  # nvidia-smi exists but fails (exit 9)
    # What one healthy GPU of this host reaches in a bf16 matmul (TFLOPS; the default: the
    # H100 SXM's rated 989 x 0.80, standins/torchsim), and the fraction of a healthy card's
    # speed this host's GPUs deliver (< 1: a throttled or power-capped card): the matmul of
    # the image's torch and every training step run at that fraction.
    gpu_matmul_tflops: float = 791.2
    gpu_speed: float = 1.0
    # MiB of each GPU's memory held by a process outside the job (the user's notebook on a
    # kept server, a server left running, a crashed tenant's leftover): nvidia-smi reports it
    # in use (its process listed outside a container, as nvidia-smi in a container sees no
    # other PID namespace), and vLLM and the image's torch find that much less free.
    gpu_memory_held_mib: int = 0
    # system
    has_docker: bool = True
    has_lm_eval: bool | None = None  # None: on PATH exactly when there is no Docker
    # Whether the image's lm_eval has the `lm_eval[api]` extra (tenacity, aiohttp, ...) that
    # `--model local-completions` needs; the axolotl images pin bare lm_eval (lm_eval.py).
    lm_eval_api_extras: bool = False
    # The kernel's OOM killer ends lm_eval (SIGKILL) once it has sent its first request.
    lm_eval_oom_killed: bool = False
    has_systemd: bool = True
    # Who the SSH login is: "root"; "sudoer" (a user with passwordless sudo); "user" (no
    # sudo rights). Not root, privileged commands (apt-get, nvidia-ctk runtime configure,
    # systemctl, service) are refused unless run through `sudo`.
    login: str = "root"
    preinstalled_packages: tuple[str, ...] = ("ca-certificates", "curl")
    toolkit_versions: tuple[str, ...] = ("1.17.8-1", "1.18.0-1", "1.18.1-1", "1.19.0-1",
                                         "1.20.0-1")
    toolkit_preinstalled: str | None = None  # a version: toolkit installed and configured
    # disks
    nvme_mount: str | None = "/mnt/nvme"  # None: the host has no NVMe disk
    disk_total_bytes: int = 3_840_000_000_000
    disk_free_bytes: int | None = None  # free NVMe bytes at boot (None: all of it)
    # What `dd` measures on the NVMe disk (bytes/s). None: a PCIe 4 NVMe's figures for `dd`
    # (2 GB/s write, 3 GB/s read) and no limit for other tools; set, `hf download` writes no
    # faster either.
    disk_write_bytes_per_second: float | None = None
    disk_read_bytes_per_second: float | None = None
    # Hugging Face downloads
    model_size_bytes: int = 2_471_645_184
    model_shards: int = 2
    model_config: dict[str, Any] | None = None  # overrides keys of the default config.json
    download_bytes_per_second: float | None = None  # None: instant
    # No route to the Hub: `curl` to huggingface.co cannot resolve it, `hf download` fails
    # with the ConnectError huggingface_hub's httpx raises.
    hub_unreachable: bool = False
    download_failures: int = 0  # that many `hf download` runs fail (then they succeed)
    download_fail_after_files: int = 1  # a failing run dies after writing this many files
    hf_gated_repos: tuple[str, ...] = ()  # need a token
    hf_repos_not_found: tuple[str, ...] = ()
    hf_revisions_not_found: tuple[str, ...] = ()  # revisions no repo has
    hf_token: str | None = None  # the only valid token (None: any non-empty token)
    # training and serving
    train_steps: int = 6  # per epoch (the run: ceil(train_steps * num_epochs), or max_steps)
    train_step_seconds: float = 0.1
    train_crash_at_step: int | None = None
    train_crash_repeats: bool = False  # False: the crash happens once per host
    host_dies_at_step: int | None = None  # once per host; at a save step: partial checkpoint
    merge_seconds: float = 0.1
    vllm_startup_seconds: float = 0.3
    # How long vLLM's engine process takes to exit after SIGTERM (holding the GPU memory
    # meanwhile): an assumption, not a measurement; a large model's engine takes longer.
    vllm_exit_seconds: float = 0.5
    completion_answers: dict[str, str] = field(default_factory=dict)
    completion_default: str = "I do not know."
    # The loss landscape (standins/landscape.py, docs/sim-landscape.md): its noise seed, and
    # whether the served model's answers follow it (False: it gives back every trained answer).
    landscape_seed: int = 0
    landscape_eval: bool = False
    # container rentals (Vast.ai, RunPod): the machine is a container of this image, with no
    # Docker and no systemd (see standins/container.py); None: a server or VM
    container_image: str | None = None
    volume_mount: str | None = None  # where the provider mounts the job's volume
    persisted_env: tuple[str, ...] = ()  # files the boot wrote the image's environment to


# Shells that run nothing: an account with one cannot run a command over SSH.
NO_LOGIN_SHELLS = ("nologin", "false")


def login_shell_problem(entry: pwd.struct_passwd | None = None) -> str | None:
    """Why this user (`entry`: its passwd line) cannot run a simulated host's commands, or
    None. Each host's sshd runs them as this user, through its login shell (sshd(8): the
    command is run with the user's shell and `-c`); a nologin shell answers every one with
    "This account is currently not available"."""
    entry = entry or pwd.getpwuid(os.getuid())
    shell = entry.pw_shell or "/bin/sh"
    if os.path.basename(shell) not in NO_LOGIN_SHELLS and os.access(shell, os.X_OK):
        return None
    return (f"the simulated hosts run their commands over SSH as {entry.pw_name}, and sshd "
            f"runs each with that account's login shell, {shell}, which runs nothing "
            "(\"This account is currently not available\"): give the account a shell "
            f"(`usermod --shell /bin/sh {entry.pw_name}`) or run `sim` jobs as another user")


def _sshd_binary() -> str:
    override = os.environ.get("SIMHOST_SSHD")
    if override:
        return override
    found = shutil.which("sshd", path=SYSTEM_PATH + ":" + os.environ.get("PATH", ""))
    if not found:
        raise SimHostError(
            "OpenSSH sshd not found: install openssh-server (apt-get install -y openssh-server)"
        )
    return os.path.abspath(found)  # sshd re-executes itself and needs an absolute path


def _sftp_server() -> str:
    for candidate in _SFTP_SERVERS:
        if os.access(candidate, os.X_OK):
            return candidate
    raise SimHostError("sftp-server not found (Debian: openssh-sftp-server)")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _public_key_text(key: str | os.PathLike[str]) -> str:
    text = os.fspath(key)
    if not text.startswith(("ssh-", "ecdsa-", "sk-")) and os.path.exists(text):
        text = Path(text).read_text()
    text = text.strip()
    if not text.startswith(("ssh-", "ecdsa-", "sk-")) or "\n" in text:
        raise ValueError("authorized_key must be one OpenSSH public key line or a .pub file")
    return text


class SimHost:
    """One simulated GPU host: `start()` it, reach it over SSH, `stop()` it (or use `with`).

    `die_with_parent=True` makes the host power off when the thread that started it ends
    (Linux parent-death signal): right for test fixtures, wrong for the `sim` provider, whose
    hosts must outlive an orch process that is killed.
    """

    host = "127.0.0.1"

    def __init__(
        self,
        directory: str | os.PathLike[str],
        authorized_key: str | os.PathLike[str],
        options: SimHostOptions | None = None,
        *,
        die_with_parent: bool = False,
    ) -> None:
        self.dir = Path(directory).resolve()
        if any(c in str(self.dir) for c in '"\n\\'):
            raise ValueError(f"unsupported character in host directory {self.dir}")
        options = options or SimHostOptions()
        if options.container_image:  # a container rental has neither (real-hosts.md §4, §5)
            options = replace(options, has_docker=False, has_systemd=False)
        self.options = options
        self.authorized_key = _public_key_text(authorized_key)
        self.die_with_parent = die_with_parent
        self.user = pwd.getpwuid(os.getuid()).pw_name
        self.root = self.dir / "root"
        self.state_dir = self.dir / "state"
        self.bin_dir = self.dir / "bin"
        self.sshd_dir = self.dir / "sshd"
        self.sshd_log_path = self.sshd_dir / "sshd.log"
        self.host_key_path = self.sshd_dir / "ssh_host_ed25519_key"
        self.home = self.path(pwd.getpwuid(os.getuid()).pw_dir)
        self.nvme_path: Path | None = (
            self.path(self.options.nvme_mount) if self.options.nvme_mount else None
        )
        self.daemon_json_path = self.path("/etc/docker/daemon.json")
        self.apt_sources_dir = self.path("/etc/apt/sources.list.d")
        self.keyrings_dir = self.path("/usr/share/keyrings")
        self.id = uuid.uuid4().hex
        self.port = 0
        self._init: subprocess.Popen[bytes] | None = None
        self._view = Host(self.dir)

    # --- paths and what the host recorded ----------------------------------------------------

    def path(self, real: str | os.PathLike[str]) -> Path:
        """Where a path of the real server (e.g. `/etc/docker/daemon.json`) is on this host."""
        return Host(self.dir).path(real)

    @property
    def host_key(self) -> str:
        """The host's public key, `ssh-ed25519 AAAA...` (what a provider would report)."""
        kind, blob = (self.host_key_path.with_suffix(".pub")).read_text().split()[:2]
        return f"{kind} {blob}"

    @property
    def host_key_fingerprint(self) -> str:
        """`SHA256:...` of the host key, as `ssh-keygen -l` prints it."""
        blob = base64.b64decode(self.host_key.split()[1])
        return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")

    @property
    def running(self) -> bool:
        """Whether the host is up (its init runs)."""
        return self._init is not None and self._init.poll() is None

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        """What the stand-ins recorded (`command`, `apt-install`, `hf-download`, ...)."""
        path = self.state_dir / "events.jsonl"
        if not path.exists():
            return []
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return [r for r in records if kind is None or r["kind"] == kind]

    def ssh_commands(self) -> list[str]:
        """Every command string received over SSH, in order (SFTP sessions excluded)."""
        path = self.state_dir / "ssh_commands.log"
        if not path.exists():
            return []
        return [c for c in path.read_bytes().decode(errors="replace").split("\0") if c]

    def installed_packages(self) -> dict[str, str]:
        """apt packages installed on the host: name -> version."""
        return self._view.packages()

    def containers(self) -> dict[str, dict[str, Any]]:
        """The host's Docker containers as `docker inspect` would show them, by name."""
        base = self.state_dir / "docker" / "containers"
        found: dict[str, dict[str, Any]] = {}
        if base.is_dir():
            for entry in sorted(base.iterdir()):
                with contextlib.suppress(OSError, ValueError):
                    found[entry.name] = json.loads((entry / "container.json").read_text())
        return found

    def processes(self) -> set[int]:
        """Live processes of this host: init's tree plus anything carrying its SIMHOST_ID."""
        pids = tagged(self.id)
        if self.running and self._init is not None:
            pids |= {self._init.pid} | descendants(self._init.pid, proc_table())
        return pids

    # --- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> SimHost:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self, timeout: float = 10.0) -> SimHost:
        """Boot the host (again, after `stop()`/`kill()`: same key, same disks, port if free)."""
        if self.running:
            return self
        sshd = _sshd_binary()
        shell = login_shell_problem()
        if shell is not None:
            raise SimHostError(shell)
        self._prepare()
        if os.geteuid() == 0:
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privsep directory
        last_error = ""
        for attempt in range(5):
            port = self.port if (self.port and attempt == 0) else _free_port()
            self._write_sshd_config(port)
            check = subprocess.run(
                [sshd, "-t", "-f", str(self.sshd_dir / "sshd_config")],
                capture_output=True,
                text=True,
            )
            if check.returncode != 0:
                raise SimHostError(f"sshd rejects its config: {check.stderr.strip()}")
            self._boot_state()
            offset = self.sshd_log_path.stat().st_size if self.sshd_log_path.exists() else 0
            self._spawn_init(sshd)
            ok, last_error = self._wait_ready(port, offset, timeout)
            if ok:
                self.port = port
                return self
            self.stop()
        raise SimHostError(f"sshd did not start on 127.0.0.1: {last_error}")

    def stop(self) -> None:
        """Power the host off: every process of it is killed; its disks and state remain."""
        init = self._init
        if init is not None:
            if init.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    init.send_signal(signal.SIGTERM)
                try:
                    init.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    cut_power(descendants(init.pid) | {init.pid})
                    init.wait(timeout=5)
            self._init = None
        # sshd rewrites its environment for its process title, so neither it nor its
        # per-connection children carry SIMHOST_ID: with init gone before it ended its tree
        # (SIGKILLed by a stop in another process), only sshd's pid file leads to them.
        sshd = self._own_sshd()
        killed: dict[int, int | None] = {}
        if sshd is not None:
            killed = {pid: process_starttime(pid) for pid in descendants(sshd) | {sshd}}
            cut_power(killed)
        for record in self.containers().values():
            if record["State"]["Running"] and record["Sim"]["pid"]:
                kill_process_group(record["Sim"]["pid"])  # in case a job left init's tree
        # Powered off means gone: a SIGKILLed process lives on (stopped) until the kernel next
        # runs it, which on a loaded machine can be after this returns. So wait for sshd's
        # tree too, not only for the processes that carry the host's id (sshd's do not).
        for _ in range(100):
            leftover = tagged(self.id) | {pid for pid, t in killed.items() if alive(pid, t)}
            if not leftover:
                break
            cut_power(leftover)
            time.sleep(0.02)
        with contextlib.suppress(FileNotFoundError):
            (self.state_dir / "init.pid").unlink()

    def _own_sshd(self) -> int | None:
        """The pid in sshd's pid file while that process is this host's sshd (its title
        names this host's config), else None."""
        try:
            pid = int((self.sshd_dir / "sshd.pid").read_text())
            title = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            return None
        return pid if str(self.sshd_dir / "sshd_config").encode() in title else None

    def kill(self) -> None:
        """The host dies at once (power loss): like `stop()`; `start()` boots it again."""
        self.stop()

    # --- internals -----------------------------------------------------------------------------

    def _prepare(self) -> None:
        for folder in (self.sshd_dir, self.state_dir, self.bin_dir, self.home):
            folder.mkdir(parents=True, exist_ok=True)
        if self.nvme_path is not None:
            self.nvme_path.mkdir(parents=True, exist_ok=True)
        if not self.host_key_path.exists():
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "simhost",
                 "-f", str(self.host_key_path)],
                check=True,
                capture_output=True,
            )  # fmt: skip
        (self.sshd_dir / "authorized_keys").write_text(self.authorized_key + "\n")
        (self.state_dir / "id").write_text(self.id + "\n")
        write_atomic(self.state_dir / "options.json", json.dumps(asdict(self.options), indent=1))
        if not (self.state_dir / "packages.json").exists():
            self._first_boot()
        self._view = Host(self.dir)
        refresh_bin(self._view)
        container_standin.install(self._view)
        self._write_session_wrapper()

    def _first_boot(self) -> None:
        opts = self.options
        packages = dict.fromkeys(opts.preinstalled_packages, "sim-1")
        if opts.has_docker:
            packages["docker-ce"] = "5:27.5.1-1~ubuntu.24.04~noble"
        if opts.toolkit_preinstalled:
            packages.update(dict.fromkeys(TOOLKIT_PACKAGES, opts.toolkit_preinstalled))
            keyring = self.keyrings_dir / "nvidia-container-toolkit-keyring.gpg"
            write_atomic(keyring, _KEY_PACKET)
            write_atomic(
                self.apt_sources_dir / "nvidia-container-toolkit.list",
                f"deb [signed-by={keyring}] "
                "https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH) /\n",
            )
            runtimes = {"nvidia": {"args": [], "path": "nvidia-container-runtime"}}
            write_atomic(self.daemon_json_path, json.dumps({"runtimes": runtimes}, indent=4))
            Host(self.dir).write_json("apt_lists.json", {"nvidia": True})
        Host(self.dir).write_json("packages.json", packages)

    def _boot_state(self) -> None:
        boot = Host(self.dir).boot + 1
        (self.state_dir / "boot").write_text(f"{boot}\n")
        docker_standin.boot(Host(self.dir))

    def _write_session_wrapper(self) -> None:
        sftp = shlex.quote(_sftp_server())
        script = f"""#!/bin/sh
# ForceCommand of a simulated host: start in its home, record the command, run it.
cd "$HOME" 2>/dev/null || cd /
# Login reads /etc/environment (pam_env: NAME=VALUE lines), and nothing else of the image's.
if [ -r "$SIMHOST_ROOT/etc/environment" ]; then
    while IFS= read -r line || [ -n "$line" ]; do
        name=${{line%%=*}}
        case "$line" in *=*) ;; *) continue ;; esac
        case "$name" in ''|[0-9]*|*[!A-Za-z0-9_]*|SIMHOST_*|HOME) continue ;; esac
        export "$line"
    done < "$SIMHOST_ROOT/etc/environment"
fi
if [ -z "${{SSH_ORIGINAL_COMMAND+set}}" ]; then
    exec "${{SHELL:-/bin/sh}}" -l
fi
if [ "$SSH_ORIGINAL_COMMAND" = {sftp} ]; then
    exec {sftp} -d "$HOME"
fi
printf '%s\\0' "$SSH_ORIGINAL_COMMAND" >> "$SIMHOST_DIR/state/ssh_commands.log"
exec "${{SHELL:-/bin/sh}}" -c "$SSH_ORIGINAL_COMMAND"
"""
        write_atomic(self.sshd_dir / "session", script, 0o755)

    def _write_sshd_config(self, port: int) -> None:
        env = {
            "PATH": f"{self.bin_dir}:{SYSTEM_PATH}",
            "HOME": str(self.home),
            "SIMHOST_DIR": str(self.dir),
            "SIMHOST_ROOT": str(self.root),
            "SIMHOST_ID": self.id,
            "LANG": "C.UTF-8",
        }
        setenv = " ".join(f'"{k}={v}"' for k, v in env.items())
        root_login = "PermitRootLogin prohibit-password\n" if os.geteuid() == 0 else ""
        config = f"""# sshd of a simulated GPU host (simhost)
Port {port}
ListenAddress 127.0.0.1
AddressFamily inet
HostKey {self.host_key_path}
PidFile {self.sshd_dir / "sshd.pid"}
AuthorizedKeysFile {self.sshd_dir / "authorized_keys"}
StrictModes no
UsePAM no
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
{root_login}AllowUsers {self.user}
AllowTcpForwarding local
AllowStreamLocalForwarding no
AllowAgentForwarding no
GatewayPorts no
X11Forwarding no
PermitTunnel no
PermitUserEnvironment no
PrintMotd no
UseDNS no
MaxStartups 100:30:200
MaxSessions 100
LoginGraceTime 30
SetEnv {setenv}
ForceCommand {self.sshd_dir / "session"}
Subsystem sftp {_sftp_server()}
LogLevel VERBOSE
"""
        write_atomic(self.sshd_dir / "sshd_config", config)

    def _spawn_init(self, sshd: str) -> None:
        env = {
            "PATH": SYSTEM_PATH,
            "LANG": "C.UTF-8",
            "SIMHOST_DIR": str(self.dir),
            "SIMHOST_ID": self.id,
            "SIMHOST_SSHD": sshd,
        }
        if "SIMHOST_RELAY" in os.environ:  # 0: every command starts its own interpreter
            env["SIMHOST_RELAY"] = os.environ["SIMHOST_RELAY"]
        with contextlib.suppress(FileNotFoundError):
            (self.sshd_dir / "sshd.pid").unlink()
        with open(self.state_dir / "init.log", "ab") as init_log:
            self._init = self._popen_init(env, init_log)

    def _popen_init(self, env: dict[str, str], log: Any) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [
                sys.executable, "-S", "-E", str(BIN_DIR / "simhost-init"),
                str(self.dir), str(self.sshd_dir / "sshd_config"), str(self.sshd_log_path),
                str(os.getpid() if self.die_with_parent else 0),
            ],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
            start_new_session=True,
        )  # fmt: skip

    def _wait_ready(self, port: int, offset: int, timeout: float) -> tuple[bool, str]:
        """Wait until *our* sshd listens on `port` (pid file written, banner answered)."""
        deadline = time.monotonic() + timeout
        pidfile = self.sshd_dir / "sshd.pid"
        while time.monotonic() < deadline:
            log = self._log_since(offset)
            if "Cannot bind" in log or "Address already in use" in log or "fatal" in log.lower():
                return False, log.strip()[-2000:]
            if self._init is None or self._init.poll() is not None:
                return False, "init exited: " + log.strip()[-2000:]
            if pidfile.exists():
                with contextlib.suppress(OSError, ValueError):
                    pid = int(pidfile.read_text())
                    if self._init is not None and pid in descendants(self._init.pid):
                        if self._banner(port):
                            return True, ""
            time.sleep(0.02)
        return False, "timed out: " + self._log_since(offset).strip()[-2000:]

    def _log_since(self, offset: int) -> str:
        try:
            with open(self.sshd_log_path, "rb") as handle:
                handle.seek(offset)
                return handle.read().decode(errors="replace")
        except OSError:
            return ""

    @staticmethod
    def _banner(port: int) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
                return sock.recv(64).startswith(b"SSH-")
        except OSError:
            return False
