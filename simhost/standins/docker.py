"""`docker`: containers are host processes; the CLI answers from state under the host dir.

`docker run -d` forks a supervisor in its own session (it survives the SSH connection),
which runs the container's command and records its exit code. Paths inside the container
are translated through the `-v` mounts by the stand-ins that read files (axolotl, vllm, hf);
published ports are always bound on 127.0.0.1 of this machine (hosts share it: give each
concurrent server its own port). A `vllm/vllm-openai` image runs `vllm serve` with the
container's arguments, like the real image's entrypoint.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
import time
from pathlib import Path
from types import FrameType

from . import images as catalog
from .common import (
    SYSTEM_PATH,
    Host,
    SimError,
    alive,
    container_to_host,
    exit_with,
    image_bin,
    is_within,
    kill_process_group,
    process_starttime,
    say,
)

# shutil, subprocess and datetime: imported where used (see common.py's imports).
TYPE_CHECKING = False  # see common.py: typing is not imported at run time
if TYPE_CHECKING:
    import subprocess
    from typing import Any

VERSION = "27.5.1"
_NO_TIME = "0001-01-01T00:00:00Z"

_VALUE_FLAGS = {
    "--name", "-v", "--volume", "-p", "--publish", "-e", "--env", "--env-file", "--gpus",
    "--runtime", "--ipc", "--shm-size", "--ulimit", "-w", "--workdir", "--entrypoint",
    "--network", "--net", "--restart", "-u", "--user", "-m", "--memory", "--cpus", "-l",
    "--label", "--log-driver", "--log-opt", "--device", "--cap-add", "--cap-drop",
    "--security-opt", "-h", "--hostname", "--platform", "--pull", "--mount", "--add-host",
    "--stop-timeout", "--memory-swap", "--cpuset-cpus", "--pid", "--uts", "--userns",
    "--group-add", "--tmpfs", "--dns", "--stop-signal", "--pids-limit",
}  # fmt: skip
_BOOL_FLAGS = {
    "-d", "--detach", "--rm", "-i", "--interactive", "-t", "--tty", "--init", "--privileged",
    "-P", "--publish-all", "--read-only", "-q", "--quiet",
}  # fmt: skip


def _now() -> str:
    import datetime as dt

    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# --- the daemon --------------------------------------------------------------------------------


def daemon_state(host: Host) -> dict[str, Any]:
    """Whether dockerd runs, the daemon.json it loaded at its last start, pulled images."""
    state: dict[str, Any] = host.read_json(
        "docker/daemon.json", {"running": True, "config": {}, "images": [], "restarts": 0}
    )
    return state


def _load_daemon_json(host: Host) -> dict[str, Any]:
    path = host.path("/etc/docker/daemon.json")
    if not path.exists() or not path.read_text().strip():
        return {}
    config = json.loads(path.read_text())
    if not isinstance(config, dict):
        raise ValueError("daemon.json must hold an object")
    return config


def boot(host: Host) -> None:
    """Called when the host boots: dockerd starts with the current daemon.json."""
    state = daemon_state(host)
    try:
        state["config"] = _load_daemon_json(host)
        state["running"] = bool(host.options["has_docker"])
    except ValueError:
        state["running"] = False
    host.write_json("docker/daemon.json", state)


def restart_daemon(host: Host, reason: str) -> int:
    """Restart dockerd: it re-reads daemon.json and stops every running container."""
    try:
        config = _load_daemon_json(host)
    except ValueError:
        with host.lock():
            state = daemon_state(host)
            state["running"] = False
            host.write_json("docker/daemon.json", state)
        stopped = _stop_all(host)
        host.event("docker-restart", reason=reason, ok=False, stopped=stopped)
        raise SimError(
            "Job for docker.service failed because the control process exited with error code.\n"
            'See "systemctl status docker.service" and "journalctl -xeu docker.service".',
            1,
        ) from None
    stopped = _stop_all(host)
    with host.lock():
        state = daemon_state(host)
        state.update(running=True, config=config, restarts=state.get("restarts", 0) + 1)
        host.write_json("docker/daemon.json", state)
    host.event("docker-restart", reason=reason, ok=True, stopped=stopped)
    return 0


def stop_daemon(host: Host) -> None:
    """Stop dockerd and its containers."""
    stopped = _stop_all(host)
    with host.lock():
        state = daemon_state(host)
        state["running"] = False
        host.write_json("docker/daemon.json", state)
    host.event("docker-stop", stopped=stopped)


def _runtimes(host: Host) -> dict[str, Any]:
    runtimes: dict[str, Any] = {"io.containerd.runc.v2": {"path": "runc"}, "runc": {"path": "runc"}}
    configured = daemon_state(host)["config"].get("runtimes", {})
    if isinstance(configured, dict):
        runtimes.update(configured)
    return dict(sorted(runtimes.items()))


def _info(host: Host) -> dict[str, Any]:
    config = daemon_state(host)["config"]
    opts = " ".join(config.get("exec-opts", []))
    containers = _all(host)
    return {
        "ServerVersion": VERSION,
        "Runtimes": _runtimes(host),
        "DefaultRuntime": config.get("default-runtime", "runc"),
        "CgroupDriver": "cgroupfs" if "native.cgroupdriver=cgroupfs" in opts else "systemd",
        "Containers": len(containers),
        "ContainersRunning": sum(1 for c in containers if c["State"]["Running"]),
        "Driver": "overlay2",
        "OperatingSystem": "Ubuntu 24.04.1 LTS",
        "NCPU": os.cpu_count() or 1,
        "Name": f"simhost-{host.host_id[:8]}",
    }


# --- container records -------------------------------------------------------------------------


def _dir(host: Host) -> Path:
    return host.state / "docker" / "containers"


def _save(host: Host, record: dict[str, Any]) -> None:
    from .common import write_atomic

    write_atomic(_dir(host) / record["Name"].lstrip("/") / "container.json", json.dumps(record))


def _load(host: Host, name: str) -> dict[str, Any] | None:
    try:
        record: dict[str, Any] = json.loads((_dir(host) / name / "container.json").read_text())
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):
        return None
    return record


def _refresh(host: Host, record: dict[str, Any]) -> dict[str, Any]:
    """Notice a container whose process vanished (killed, or the host rebooted)."""
    state = record["State"]
    sim = record["Sim"]
    if state["Running"] and (
        sim["boot"] != host.boot or not alive(sim["pid"], sim.get("starttime"))
    ):
        with host.lock():
            current = _load(host, record["Name"].lstrip("/"))
            if current is None:
                return record
            if current["State"]["Running"]:
                code = 255 if sim["boot"] != host.boot else 137
                current["State"].update(
                    Status="exited", Running=False, ExitCode=code, Pid=0, FinishedAt=_now()
                )
                _save(host, current)
            record = current
    return record


def _all(host: Host) -> list[dict[str, Any]]:
    base = _dir(host)
    records = []
    if base.is_dir():
        for entry in sorted(base.iterdir()):
            record = _load(host, entry.name)
            if record is not None:
                records.append(_refresh(host, record))
    return sorted(records, key=lambda r: r["Created"])


def _find(host: Host, ref: str) -> dict[str, Any] | None:
    record = _load(host, ref.lstrip("/")) if "/" not in ref.lstrip("/") else None
    if record is None and re.fullmatch(r"[0-9a-f]{3,64}", ref):
        matches = [r for r in _all(host) if r["Id"].startswith(ref)]
        record = matches[0] if len(matches) == 1 else None
    return _refresh(host, record) if record is not None else None


def _finish(host: Host, name: str, code: int) -> None:
    with host.lock():
        record = _load(host, name)
        if record is None:
            return
        if record["State"]["Running"]:
            record["State"].update(
                Status="exited", Running=False, ExitCode=code, Pid=0, FinishedAt=_now()
            )
            _save(host, record)
        if record["HostConfig"]["AutoRemove"]:
            import shutil

            shutil.rmtree(_dir(host) / name, ignore_errors=True)


def _kill(host: Host, record: dict[str, Any]) -> None:
    if record["State"]["Running"]:
        kill_process_group(record["Sim"]["pid"], signal.SIGKILL)
        _finish(host, record["Name"].lstrip("/"), 137)


def _stop(host: Host, record: dict[str, Any], timeout: float) -> None:
    """SIGTERM the container's main process; SIGKILL the group after `timeout`."""
    if not record["State"]["Running"]:
        return
    pid = record["Sim"]["pid"]
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and alive(pid, record["Sim"].get("starttime")):
        time.sleep(0.05)
    if alive(pid, record["Sim"].get("starttime")):
        kill_process_group(pid, signal.SIGKILL)
        _finish(host, record["Name"].lstrip("/"), 137)
    else:
        # The supervisor recorded the exit code itself; wait for it to land.
        for _ in range(40):
            current = _load(host, record["Name"].lstrip("/"))
            if current is None or not current["State"]["Running"]:
                return
            time.sleep(0.025)
        _finish(host, record["Name"].lstrip("/"), 143)


def _stop_all(host: Host) -> list[str]:
    stopped = []
    for record in _all(host):
        if record["State"]["Running"]:
            _stop(host, record, timeout=2.0)
            stopped.append(record["Name"].lstrip("/"))
    return stopped


# --- templates ---------------------------------------------------------------------------------

_TEMPLATE = re.compile(r"\{\{\s*(json\s+)?\.([A-Za-z0-9_.]*)\s*\}\}")


def _go_str(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "<no value>"
    if isinstance(value, dict):
        return "map[" + " ".join(f"{k}:{_go_str(v)}" for k, v in value.items()) + "]"
    if isinstance(value, list):
        return "[" + " ".join(_go_str(v) for v in value) + "]"
    return str(value)


def render(template: str, data: dict[str, Any]) -> str:
    """The subset of Go templates the playbooks use: `{{.A.B}}` and `{{json .A}}`."""
    if "{{" in _TEMPLATE.sub("", template):
        raise SimError(f"simhost: template {template!r} is not simulated", 1)

    def substitute(match: re.Match[str]) -> str:
        value: Any = data
        for part in filter(None, match.group(2).split(".")):
            if not isinstance(value, dict) or part not in value:
                raise SimError(
                    f'template parsing error: template: :1: executing "" at <.{match.group(2)}>: '
                    f'map has no entry for key "{part}"',
                    1,
                )
            value = value[part]
        if match.group(1):
            return json.dumps(value, separators=(",", ":"))
        return _go_str(value)

    return _TEMPLATE.sub(substitute, template.replace("\\n", "\n").replace("\\t", "\t"))


# --- docker run --------------------------------------------------------------------------------


def _split_flags(args: list[str]) -> tuple[dict[str, list[str]], list[str]]:
    """Options (each flag -> its values) and the positional rest (IMAGE CMD...)."""
    flags: dict[str, list[str]] = {}
    while args:
        arg = args[0]
        if arg == "--":
            args.pop(0)
            break
        if not arg.startswith("-") or arg == "-":
            break
        args.pop(0)
        name, eq, value = arg.partition("=")
        if (
            not arg.startswith("--")
            and len(arg) > 2
            and all(f"-{c}" in _BOOL_FLAGS for c in arg[1:])
        ):
            for c in arg[1:]:
                flags.setdefault(f"-{c}", []).append("true")
            continue
        if name in _VALUE_FLAGS:
            if not eq:
                if not args:
                    raise SimError(f"flag needs an argument: {name}\nSee 'docker run --help'.", 125)
                value = args.pop(0)
            flags.setdefault(name, []).append(value)
        elif name in _BOOL_FLAGS:
            flags.setdefault(name, []).append(value or "true")
        else:
            raise SimError(f"unknown flag: {name}\nSee 'docker run --help'.", 125)
    return flags, args


def _flag(flags: dict[str, list[str]], *names: str) -> list[str]:
    values: list[str] = []
    for name in names:
        values.extend(flags.get(name, []))
    return values


def _parse_ports(specs: list[str]) -> list[tuple[str, int, int]]:
    """`[ip:]host:container[/tcp]` -> (ip, host port, container port)."""
    ports = []
    for spec in specs:
        parts = spec.split("/")[0].split(":")
        if len(parts) == 1:
            ip, hp, cp = "0.0.0.0", "0", parts[0]
        elif len(parts) == 2:
            ip, hp, cp = "0.0.0.0", parts[0], parts[1]
        else:
            ip, hp, cp = parts[0], parts[1], parts[2]
        try:
            ports.append((ip or "0.0.0.0", int(hp or 0), int(cp)))
        except ValueError:
            raise SimError(f"docker: invalid publish spec: {spec}", 125) from None
    return ports


def _manifest_unknown(image: str) -> str:
    # Docker's own words when the registry has no such tag.
    return (f"Error response from daemon: manifest for {image} not found: manifest unknown: "
            "manifest unknown")


def _hidden(mounts: list[list[str]], path: str) -> bool:
    """Whether a bind mount covers `path` of the image (the image's files there are hidden)."""
    return any(is_within(path, dest) for _src, dest in mounts)


def _image_argv(image: str, command: list[str], mounts: list[list[str]]) -> tuple[list[str], str]:
    """The container's argv and working directory as the image defines them.

    The axolotl images (real-hosts.md §1): WORKDIR /workspace/axolotl; the uv image's
    ENTRYPOINT is /workspace/axolotl/scripts/uv-entrypoint.sh (it execs its arguments),
    the cloud image's /root/cloud-entrypoint.sh with CMD `sleep infinity`. A mount over
    /workspace hides the entrypoint, the source and the venv, as on a real host.
    """
    if not catalog.is_axolotl(image):
        return (["vllm", "serve", *command] if _is_vllm(image) else command or ["true"]), ""
    workdir = catalog.layout("workdir")
    if catalog.is_cloud(image):
        entrypoint = catalog.layout("cloud_entrypoint")
        command = command or ["sleep", "infinity"]
    else:
        entrypoint = catalog.layout("entrypoint")
    if _hidden(mounts, entrypoint):
        raise SimError(
            "docker: Error response from daemon: failed to create task for container: failed "
            "to create shim task: OCI runtime create failed: runc create failed: unable to "
            f'start container process: exec: "{entrypoint}": stat {entrypoint}: no such file '
            "or directory: unknown.",
            127,
        )
    if command and _hidden(mounts, catalog.layout("venv")) and command[0] in _VENV_COMMANDS:
        # The entrypoint runs, but `exec "$@"` finds no venv on PATH.
        return ["sh", "-c", f'echo "{entrypoint}: exec: {command[0]}: not found" >&2; exit 127'
                ], workdir
    return command or ["true"], workdir


# Executables the image's venv provides (hidden with it).
_VENV_COMMANDS = frozenset({"axolotl", "accelerate", "python", "python3", "lm_eval", "hf"})


def _is_vllm(image: str) -> bool:
    return "vllm-openai" in image.rsplit(":", 1)[0]


def _container_env(
    host: Host, name: str, spec: RunSpec, runtime: str, rootfs: Path
) -> tuple[dict[str, str], list[str]]:
    """The container's environment (only `-e`/`--env-file`, not the session's) and the names
    `docker inspect` lists."""
    env = {
        "PATH": os.environ.get("PATH", SYSTEM_PATH),
        "HOME": str(rootfs),
        "LANG": "C.UTF-8",
        "SIMHOST_CONTAINER": name,
        "SIMHOST_MOUNTS": json.dumps(spec.mounts),
        "SIMHOST_NETWORK": spec.network,
    }
    for key in ("SIMHOST_DIR", "SIMHOST_ROOT", "SIMHOST_ID"):
        env[key] = os.environ.get(key, "")
    names: list[str] = []
    for env_file in spec.env_files:
        try:
            lines = Path(env_file).read_text().splitlines()
        except OSError as exc:
            raise SimError(f"docker: open {env_file}: {exc.strerror}", 125) from None
        for line in lines:
            if line.strip() and not line.lstrip().startswith("#"):
                key, eq, value = line.partition("=")
                if eq:
                    env[key.strip()] = value  # docker does no quote processing here
                elif key.strip() in os.environ:
                    env[key.strip()] = os.environ[key.strip()]
                names.append(key.strip())
    for item in spec.env:
        key, eq, value = item.partition("=")
        if eq:
            env[key] = value
        elif key in os.environ:
            env[key] = os.environ[key]  # `-e NAME` passes the CLI's own value: not on argv
        names.append(key)
    image = spec.image
    env["SIMHOST_IMAGE"] = image  # what the image's simulated torch was built for
    if catalog.is_axolotl(image):  # the image's venv is first on its PATH
        env["PATH"] = f"{image_bin(host)}:{env['PATH']}"
    if spec.gpus or "NVIDIA_VISIBLE_DEVICES" in env and runtime == "nvidia":
        env["SIMHOST_GPUS"] = ",".join(spec.gpus) or env["NVIDIA_VISIBLE_DEVICES"]
    env["SIMHOST_PORTS"] = json.dumps({str(cp): hp for _ip, hp, cp in spec.ports})
    if _is_vllm(image):  # the release the image tag names (v0.11.0 -> 0.11.0)
        env["SIMHOST_VLLM_VERSION"] = image.rpartition(":")[2]
    return env, names


class RunSpec:
    """`docker run`'s arguments, parsed and checked before anything is created, as the real
    CLI refuses a bad flag, name, volume or publish spec before it asks the daemon."""

    __slots__ = ("image", "command", "detach", "name", "gpus", "runtime", "mounts", "ports",
                 "env_files", "env", "network", "entrypoint", "workdir", "labels", "auto_remove",
                 "ipc", "shm_size")

    def __init__(self, args: list[str]) -> None:
        flags, rest = _split_flags(list(args))
        if not rest:
            raise SimError("docker: 'docker run' requires at least 1 argument.", 125)

        def last(*names: str) -> str | None:
            values = _flag(flags, *names)
            return values[-1] if values else None

        self.image: str = rest[0]
        self.command: list[str] = rest[1:]
        self.detach = bool(_flag(flags, "-d", "--detach"))
        self.name = last("--name")
        if self.name is not None and not re.fullmatch(r"[a-zA-Z0-9][a-zA-Z0-9_.-]*", self.name):
            raise SimError(
                f'docker: Error response from daemon: Invalid container name ("{self.name}").',
                125,
            )
        self.gpus = _flag(flags, "--gpus")
        self.runtime = last("--runtime")
        self.mounts = _parse_mounts(_flag(flags, "-v", "--volume"))
        self.ports = _parse_ports(_flag(flags, "-p", "--publish"))
        self.env_files = _flag(flags, "--env-file")
        self.env = _flag(flags, "-e", "--env")
        self.network = last("--network", "--net") or "bridge"
        self.entrypoint = last("--entrypoint")
        self.workdir = last("-w", "--workdir")
        self.labels = dict(label.partition("=")[::2] for label in _flag(flags, "-l", "--label"))
        self.auto_remove = bool(_flag(flags, "--rm"))
        self.ipc = last("--ipc") or "private"
        self.shm_size = last("--shm-size") or "64m"


def _parse_mounts(specs: list[str]) -> list[list[str]]:
    """`-v HOST:CONTAINER[:OPTS]` -> [host, container] (bind mounts only)."""
    mounts = []
    for spec in specs:
        parts = spec.split(":")
        if len(parts) < 2 or not parts[0].startswith("/"):
            raise SimError(f"docker: invalid volume spec {spec!r} (simhost: bind mounts only)", 125)
        mounts.append([parts[0], parts[1]])
    return mounts


_DRIVER_ERROR = (
    "docker: Error response from daemon: failed to create task for container: "
    "nvidia-container-cli: initialization error: load library failed: libnvidia-ml.so.1: "
    "cannot open shared object file: no such file or directory: unknown."
)


def _check_devices(host: Host, spec: RunSpec, runtime: str) -> None:
    """The runtime must be registered; GPUs need the toolkit and a working driver."""
    if runtime not in _runtimes(host):
        raise SimError(
            f"docker: Error response from daemon: unknown or invalid runtime name: {runtime}.", 125
        )
    opts = host.options
    if spec.gpus and "nvidia-container-toolkit" not in host.packages():
        raise SimError(
            'docker: Error response from daemon: could not select device driver "" with '
            "capabilities: [[gpu]].",
            125,
        )
    if (spec.gpus or runtime == "nvidia") and (opts["driver_missing"] or opts["driver_broken"]):
        raise SimError(_DRIVER_ERROR, 125)


def _check_free(host: Host, name: str, ports: list[tuple[str, int, int]]) -> None:
    """The name is unused and no running container holds a requested host port."""
    existing = _load(host, name)
    if existing is not None:
        raise SimError(
            f'docker: Error response from daemon: Conflict. The container name "/{name}" is '
            f'already in use by container "{existing["Id"]}". You have to remove (or rename) '
            "that container to be able to reuse that name.",
            125,
        )
    for other in _all(host):
        if other["State"]["Running"]:
            for binding in other["Sim"]["ports"]:
                if any(hp and hp == binding[1] for _ip, hp, _cp in ports):
                    raise SimError(
                        f"docker: Error response from daemon: Bind for 127.0.0.1:{binding[1]} "
                        "failed: port is already allocated.",
                        125,
                    )


def _taken_host_port(ports: list[tuple[str, int, int]]) -> tuple[str, int, int] | None:
    """The first published (ip, host port, container port) another process of this machine
    holds. Bound as docker-proxy binds (Go's listen: SO_REUSEADDR, no SO_REUSEPORT), so a
    listener or a bound socket there refuses it, and a closed connection's TIME_WAIT not."""
    import socket

    for ip, hp, cp in ports:
        if not hp:
            continue  # `-p CPORT`: Docker picks a free host port
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((ip or "0.0.0.0", hp))
            except OSError:
                return ip or "0.0.0.0", hp, cp
    return None


def _ensure_image(host: Host, image: str) -> None:
    """Pull an image that is not local yet; a tag the registry does not publish fails."""
    if image in daemon_state(host)["images"]:
        return
    say(f"Unable to find image '{image}' locally", err=True)
    if not catalog.published(image):
        raise SimError(f"docker: {_manifest_unknown(image)}.\nSee 'docker run --help'.", 125)
    say(f"{image}: Pulling from simhost", err=True)
    _pull(host, image)


def _process(host: Host, spec: RunSpec, rootfs: Path) -> tuple[list[str], str, str]:
    """The container's argv, its directory on this machine, and the image's WORKDIR."""
    image_workdir = ""
    if spec.entrypoint:
        argv = [spec.entrypoint, *spec.command]
    else:
        argv, image_workdir = _image_argv(spec.image, spec.command, spec.mounts)
    cwd = str(rootfs)
    if image_workdir and not spec.workdir:
        # The image's WORKDIR, as an (empty) directory of this container's filesystem:
        # relative paths resolve there, not in the host's or a mount's directories.
        inner = rootfs / image_workdir.lstrip("/")
        inner.mkdir(parents=True, exist_ok=True)
        cwd = str(inner)
    if spec.workdir:
        mapped = container_to_host(spec.workdir) if spec.mounts else spec.workdir
        if mapped != spec.workdir or spec.workdir.startswith(str(host.dir)):
            os.makedirs(mapped, exist_ok=True)
            cwd = mapped
    return argv, cwd, image_workdir


def _executable(exe: str, path: str, mounted: bool) -> str | None:
    """Where the container's first word is on this machine (None: not found)."""
    if "/" not in exe:
        import shutil

        return shutil.which(exe, path=path)
    found = container_to_host(exe) if mounted else exe
    return found if found and os.access(found, os.X_OK) else None


def _record(
    host: Host, cid: str, name: str, spec: RunSpec, runtime: str, argv: list[str],
    env: dict[str, str], env_names: list[str], cwd: str, image_workdir: str,
) -> dict[str, Any]:
    """What `docker inspect` shows (and, under "Sim", what the supervisor needs)."""
    ports = spec.ports
    return {
        "Id": cid,
        "Name": f"/{name}",
        "Created": _now(),
        "Image": spec.image,
        "Path": argv[0],
        "Args": argv[1:],
        "Config": {
            "Image": spec.image,
            "Cmd": spec.command,
            "Entrypoint": [spec.entrypoint] if spec.entrypoint else None,
            "Env": env_names,
            "WorkingDir": spec.workdir or image_workdir,
            "Labels": spec.labels,
        },
        "State": {
            "Status": "created", "Running": False, "Paused": False, "Restarting": False,
            "OOMKilled": False, "Dead": False, "Pid": 0, "ExitCode": 0, "Error": "",
            "StartedAt": _NO_TIME, "FinishedAt": _NO_TIME,
        },
        "HostConfig": {
            "AutoRemove": spec.auto_remove,
            "Runtime": runtime,
            "IpcMode": spec.ipc,
            "ShmSize": spec.shm_size,
            "Binds": [f"{h}:{c}" for h, c in spec.mounts],
            "PortBindings": {
                f"{cp}/tcp": [{"HostIp": ip, "HostPort": str(hp)}] for ip, hp, cp in ports
            },
            "NetworkMode": spec.network,
            "DeviceRequests": [{"Driver": "nvidia", "Count": -1}] if spec.gpus else None,
        },
        "Mounts": [
            {"Type": "bind", "Source": h, "Destination": c, "RW": True} for h, c in spec.mounts
        ],
        "Sim": {
            "pid": 0,
            "starttime": None,
            "boot": host.boot,
            "argv": argv,
            "cwd": cwd,
            "ports": [[ip, hp, cp] for ip, hp, cp in ports],
            "gpus": bool(env.get("SIMHOST_GPUS")),
        },
    }


def _run(host: Host, args: list[str]) -> int:
    spec = RunSpec(args)
    state = daemon_state(host)
    cid = os.urandom(32).hex()  # what secrets.token_hex(32) returns, without its import
    name = spec.name or f"sim_{cid[:12]}"
    runtime = spec.runtime or state["config"].get("default-runtime", "runc")
    _check_devices(host, spec, runtime)
    for source, _dest in spec.mounts:
        os.makedirs(source, exist_ok=True)  # docker creates a missing bind source
    for ip, _hp, cp in spec.ports:
        if ip != "127.0.0.1":
            host.event("docker-public-port", container=name, spec=f"{ip}:{cp}")

    with host.lock():
        _check_free(host, name, spec.ports)
        cdir = _dir(host) / name
        rootfs = cdir / "rootfs"
        rootfs.mkdir(parents=True, exist_ok=True)
        (cdir / "log").touch()
        _ensure_image(host, spec.image)
        env, env_names = _container_env(host, name, spec, runtime, rootfs)
        argv, cwd, image_workdir = _process(host, spec, rootfs)
        record = _record(host, cid, name, spec, runtime, argv, env, env_names, cwd, image_workdir)
        taken = _taken_host_port(spec.ports)
        if taken is not None:
            # Docker's proxy cannot listen on a published port another process holds: the
            # container is created, and not started.
            ip, hp, cp = taken
            record["State"].update(ExitCode=128, Error="address already in use")
            _save(host, record)
            raise SimError(
                "docker: Error response from daemon: failed to set up container networking: "
                f"driver failed programming external connectivity on endpoint {name} "
                f"({os.urandom(32).hex()}): failed to bind host port for "
                f"{ip}:{hp}:172.17.0.2:{cp}/tcp: address already in use",
                125,
            )
        exe_path = _executable(argv[0], env["PATH"], bool(spec.mounts))
        if exe_path is None:
            record["State"].update(ExitCode=127,
                                   Error=f'exec: "{argv[0]}": executable file not found')
            _save(host, record)
            raise SimError(
                "docker: Error response from daemon: failed to create task for container: failed "
                "to create shim task: OCI runtime create failed: runc create failed: unable to "
                f'start container process: exec: "{argv[0]}": executable file not found in '
                "$PATH: unknown.",
                127,
            )
        record["Sim"]["argv"] = [exe_path, *argv[1:]]
        if spec.detach:
            pid = _detach(host, name, env, cwd, cdir / "log")
            proc = None
        else:
            import subprocess

            proc = subprocess.Popen(record["Sim"]["argv"], env=env, cwd=cwd,
                                    stdin=subprocess.DEVNULL)
            pid = proc.pid
        record["State"].update(Status="running", Running=True, Pid=pid, StartedAt=_now())
        record["Sim"].update(pid=pid, starttime=process_starttime(pid))
        _save(host, record)
    host.event("docker-run", container=name, image=spec.image, argv=argv, detach=spec.detach,
               gpus=bool(spec.gpus))
    if proc is None:
        say(cid)
        return 0
    return _foreground(host, name, proc)


def _detach(host: Host, name: str, env: dict[str, str], cwd: str, log_path: Path) -> int:
    """Start the container's main process detached: a supervisor in its own session (it
    survives the SSH connection, as containerd's shim does) that runs the container's command
    with `env` in `cwd`, its output to the container's log, and records how it ended. Forked,
    not a new interpreter: this process has imported what it needs (~30 ms of CPU saved)."""
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:

        def supervise() -> int:
            os.setsid()
            for target, fd in enumerate((null, log, log)):
                os.dup2(fd, target)
            # Nothing else of the caller's: its lock on the host's state, its streams.
            os.closerange(3, os.sysconf("SC_OPEN_MAX"))
            os.chdir(cwd)
            os.environ.clear()
            os.environ.update(env)
            # A new view of the host: this one holds the caller's lock (re-entrantly).
            return _supervise(Host(host.dir), name)

        exit_with(supervise)
    os.close(log)
    os.close(null)
    return pid


def _foreground(host: Host, name: str, proc: subprocess.Popen[bytes]) -> int:
    def forward(signum: int, _frame: FrameType | None) -> None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    rc = proc.wait()
    code = rc if rc >= 0 else 128 - rc
    if not _host_died(host):
        _finish(host, name, code)
    return code


def _host_died(host: Host) -> bool:
    """Whether this boot of the host is dying (the host-dies fault): nothing is recorded."""
    try:
        return int((host.state / "died-in-boot").read_text()) == host.boot
    except (OSError, ValueError):
        return False


def _supervise(host: Host, name: str) -> int:
    """The detached container's main process (_detach): run its command, record its end."""
    record = None
    for _ in range(100):  # the CLI writes the record right after starting us
        record = _load(host, name)
        if record is not None and record["State"]["Running"]:
            break
        time.sleep(0.01)
    if record is None:
        return 1
    import subprocess

    proc = subprocess.Popen(
        record["Sim"]["argv"], cwd=record["Sim"]["cwd"], stdin=subprocess.DEVNULL
    )
    return _foreground(host, name, proc)


def _pull(host: Host, image: str) -> None:
    state = daemon_state(host)
    if image not in state["images"]:
        state["images"].append(image)
        host.write_json("docker/daemon.json", state)
        host.event("docker-pull", image=image)
    say(f"Status: Downloaded newer image for {image}", err=True)


# --- the other subcommands ---------------------------------------------------------------------


def _inspect(host: Host, args: list[str]) -> int:
    fmt: str | None = None
    names: list[str] = []
    while args:
        arg = args.pop(0)
        if arg in ("-f", "--format"):
            fmt = args.pop(0)
        elif arg.startswith("--format="):
            fmt = arg.split("=", 1)[1]
        elif arg.startswith("--type"):
            if "=" not in arg:
                args.pop(0)
        else:
            names.append(arg)
    found = []
    missing = False
    for ref in names:
        record = _find(host, ref)
        if record is None:
            say(f"Error: No such object: {ref}", err=True)
            missing = True
        else:
            found.append(record)
    public = [{k: v for k, v in r.items() if k != "Sim"} for r in found]
    if fmt is not None:
        say(*(render(fmt, r) for r in public))
    elif found:
        say(json.dumps(public, indent=4))
    else:
        say("[]")
    return 1 if missing else 0


def _logs(host: Host, args: list[str]) -> int:
    tail: int | None = None
    follow = False
    ref: str | None = None
    while args:
        arg = args.pop(0)
        if arg in ("-n", "--tail"):
            value = args.pop(0)
            tail = None if value == "all" else int(value)
        elif arg.startswith("--tail="):
            value = arg.split("=", 1)[1]
            tail = None if value == "all" else int(value)
        elif arg in ("-f", "--follow"):
            follow = True
        elif arg in ("-t", "--timestamps"):
            continue
        else:
            ref = arg
    record = _find(host, ref or "")
    if record is None:
        raise SimError(f"Error response from daemon: No such container: {ref}", 1)
    path = _dir(host) / record["Name"].lstrip("/") / "log"
    data = path.read_bytes() if path.exists() else b""
    if tail is not None:
        lines = data.splitlines(keepends=True)
        data = b"".join(lines[-tail:]) if tail > 0 else b""
    sys.stdout.buffer.write(data)
    sys.stdout.flush()
    if follow:
        offset = path.stat().st_size if path.exists() else 0
        while True:
            record = _find(host, ref or "")
            with open(path, "rb") as handle:
                handle.seek(offset)
                chunk = handle.read()
            offset += len(chunk)
            sys.stdout.buffer.write(chunk)
            sys.stdout.flush()
            if record is None or not record["State"]["Running"]:
                return 0
            time.sleep(0.1)
    return 0


def _rm(host: Host, args: list[str]) -> int:
    force = any(a in ("-f", "--force", "-fv", "-vf") for a in args)
    code = 0
    for ref in (a for a in args if not a.startswith("-")):
        record = _find(host, ref)
        if record is None:
            if not force:
                say(f"Error response from daemon: No such container: {ref}", err=True)
                code = 1
            continue
        if record["State"]["Running"]:
            if not force:
                say(
                    f'Error response from daemon: cannot remove container "/{ref}": container is '
                    "running: stop the container before removing or force remove",
                    err=True,
                )
                code = 1
                continue
            _kill(host, record)
        import shutil

        shutil.rmtree(_dir(host) / record["Name"].lstrip("/"), ignore_errors=True)
        host.event("docker-rm", container=record["Name"].lstrip("/"))
        say(ref)
    return code


def docker(host: Host, argv: list[str]) -> int:
    """The docker CLI subset the playbooks use (see README.md)."""
    args = list(argv)
    if args[:1] in (["--version"], ["-v"]):
        say(f"Docker version {VERSION}, build 9f9e405")
        return 0
    if not args:
        raise SimError("Usage:  docker [OPTIONS] COMMAND", 1)
    command, rest = args[0], args[1:]
    if command == "container" and rest:
        command, rest = rest[0], rest[1:]
    if command == "image" and rest[:1] == ["inspect"]:
        images = daemon_state(host)["images"]
        missing = [i for i in rest[1:] if not i.startswith("-") and i not in images]
        if missing:
            raise SimError(f"Error response from daemon: No such image: {missing[0]}", 1)
        return 0
    state = daemon_state(host)
    if not state["running"]:
        # `docker run` names itself in front of the daemon's answer; the others do not.
        raise SimError(
            ("docker: " if command == "run" else "")
            + "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. "
            "Is the docker daemon running?",
            1,
        )
    if command == "run":
        return _run(host, rest)
    if command == "inspect":
        return _inspect(host, rest)
    if command == "logs":
        return _logs(host, rest)
    if command == "rm":
        return _rm(host, rest)
    if command == "pull":
        for image in (r for r in rest if not r.startswith("-")):
            if not catalog.published(image):
                raise SimError(_manifest_unknown(image), 1)
            with host.lock():
                _pull(host, image)
        return 0
    if command == "info":
        fmt = None
        if "--format" in rest or "-f" in rest:
            i = rest.index("--format") if "--format" in rest else rest.index("-f")
            fmt = rest[i + 1]
        fmt = fmt or next((r.split("=", 1)[1] for r in rest if r.startswith("--format=")), None)
        info = _info(host)
        if fmt:
            say(render(fmt, info))
        else:
            say(
                f"Server Version: {info['ServerVersion']}",
                f"Runtimes: {' '.join(info['Runtimes'])}",
                f"Default Runtime: {info['DefaultRuntime']}",
                f"Cgroup Driver: {info['CgroupDriver']}",
            )
        return 0
    # A real subcommand the playbooks do not use is refused by name, so that a playbook
    # that starts using one fails in the tests instead of getting a made-up answer.
    raise SimError(f"simhost: `docker {command}` is not simulated (the playbooks use run, "
                   "inspect, logs, rm, pull, image inspect, info and --version)", 1)
