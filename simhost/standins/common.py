"""What every stand-in shares: the host's directories and options, state files, events, processes.

Stdlib only: these modules run as the commands of a simulated GPU host (`python -S`), where
no third-party package is importable.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import signal
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

# shutil, subprocess and datetime are imported where they are used (here and in docker.py,
# which most commands load): with bz2, lzma, selectors and threading behind them they were
# ~9 of the ~38 ms of CPU each command's start took (`python bench/standins.py`), paid
# ~56 times a simulated job, and most commands never use them.

# Only for type checkers: importing typing costs each stand-in command more than the
# rest of its start-up (`python -X importtime`), and the simulated hosts run hundreds.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

#: The package's stand-in commands (each a tiny script calling `standins.main`).
BIN_DIR = Path(__file__).resolve().parent.parent / "bin"

#: What the host's PATH holds after its own bin directory.
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

#: Stand-ins every host has on PATH.
ALWAYS = (
    "sudo",
    "id",
    "apt-get",
    "apt",
    "dpkg-query",
    "systemctl",
    "service",
    "lsblk",
    "df",
    "dd",
    "curl",
    "gpg",
    "hf",
    "axolotl",
    "vllm",
)
#: Stand-ins that exist only when the host has the thing (driver, Docker, toolkit).
# `uv` is never on a host's own PATH (Ubuntu has none; the axolotl images have it in
# /root/.local/bin, on their ENV PATH only): listed so that a uv on the build machine is masked.
CONDITIONAL = ("nvidia-smi", "docker", "nvidia-ctk", "lm_eval", "uv")


class SimError(Exception):
    """A stand-in fails: `message` goes to stderr and `code` is the exit status."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class Host:
    """The simulated host as a stand-in sees it: directories, options, state, events."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.root = directory / "root"
        self.state = directory / "state"
        self.bin = directory / "bin"
        self._options: dict[str, Any] | None = None
        self._lock_depth = 0

    @classmethod
    def from_env(cls) -> Host:
        """The host named by `SIMHOST_DIR` (set by the host's sshd for every session)."""
        value = os.environ.get("SIMHOST_DIR", "")
        if not value:
            raise SimError("not on a simulated host: SIMHOST_DIR is not set", 2)
        return cls(Path(value))

    @property
    def options(self) -> dict[str, Any]:
        """The SimHostOptions the host was started with, as a dict."""
        if self._options is None:
            self._options = json.loads((self.state / "options.json").read_text())
        return self._options

    @property
    def host_id(self) -> str:
        """The id every process of this host carries in its environment (SIMHOST_ID)."""
        return (self.state / "id").read_text().strip()

    @property
    def boot(self) -> int:
        """How many times the host was booted (a reboot ends every container)."""
        try:
            return int((self.state / "boot").read_text())
        except (OSError, ValueError):
            return 0

    def path(self, real: str | os.PathLike[str]) -> Path:
        """Where a path of the real server (`/etc/docker/daemon.json`) lives on this host.

        A path already inside the host directory is returned unchanged.
        """
        text = os.path.abspath(os.fspath(real))
        if is_within(text, self.dir):
            return Path(text)
        return self.root / text.lstrip("/")

    def writable(self, path: str | os.PathLike[str]) -> Path:
        """`path` if it lies inside the host directory; refuse anything else.

        The stand-ins run on the real machine: a playbook that forgot to map a system path
        (/usr/share/keyrings/...) must fail loudly instead of writing there.
        """
        text = os.path.abspath(os.fspath(path))
        if not is_within(text, self.dir):
            raise SimError(
                f"simhost: refusing to write {text}: outside the simulated host {self.dir} "
                "(map server paths with SimHost.path())",
                2,
            )
        return Path(text)

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Serialise read-modify-write of the host's state between concurrent commands.

        Re-entrant within one process (flock would deadlock on a second descriptor).
        """
        if self._lock_depth:
            self._lock_depth += 1
            try:
                yield
            finally:
                self._lock_depth -= 1
            return
        self.state.mkdir(parents=True, exist_ok=True)
        with open(self.state / ".lock", "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            self._lock_depth = 1
            try:
                yield
            finally:
                self._lock_depth = 0
                fcntl.flock(handle, fcntl.LOCK_UN)

    def read_json(self, name: str, default: Any) -> Any:
        """A state file's content, or `default` when it does not exist yet."""
        try:
            return json.loads((self.state / name).read_text())
        except FileNotFoundError:
            return default

    def write_json(self, name: str, data: Any) -> None:
        """Replace a state file atomically."""
        write_atomic(self.state / name, json.dumps(data, indent=1, sort_keys=True) + "\n")

    def event(self, kind: str, **fields: Any) -> None:
        """Append one event (`events.jsonl`) that tests and benchmarks read back."""
        record = {"t": round(time.time(), 3), "kind": kind, **fields}
        line = (json.dumps(record, sort_keys=True) + "\n").encode()
        fd = os.open(self.state / "events.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)

    def packages(self) -> dict[str, str]:
        """Installed apt packages: name -> version."""
        data: dict[str, str] = self.read_json("packages.json", {})
        return data

    def gpus_visible(self) -> bool:
        """Whether this process can use the GPUs (driver present; in a container: `--gpus`)."""
        if self.options["driver_missing"] or self.options["driver_broken"]:
            return False
        if os.environ.get("SIMHOST_CONTAINER"):
            return bool(os.environ.get("SIMHOST_GPUS"))
        return True


def is_within(path: str | os.PathLike[str], directory: str | os.PathLike[str]) -> bool:
    """Whether `path` is `directory` or below it (lexically)."""
    p = os.path.abspath(os.fspath(path))
    d = os.path.abspath(os.fspath(directory))
    return p == d or p.startswith(d.rstrip("/") + "/")


def write_atomic(path: Path, text: str | bytes, mode: int = 0o644) -> None:
    """Write a file so that readers see the old or the new content, never a mix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    data = text.encode() if isinstance(text, str) else text
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def container_to_host(path: str) -> str:
    """Translate a path seen inside a container to the host path through its `-v` mounts."""
    mounts: list[list[str]] = json.loads(os.environ.get("SIMHOST_MOUNTS", "[]"))
    best: tuple[str, str] | None = None
    for host_path, container_path in mounts:
        if is_within(path, container_path) and (best is None or len(container_path) > len(best[1])):
            best = (host_path, container_path)
    if best is None:
        return path
    rest = os.path.relpath(os.path.abspath(path), best[1])
    return best[0] if rest == "." else os.path.join(best[0], rest)


def say(*lines: str, err: bool = False) -> None:
    """Print lines and flush at once (stand-in output is read live through SSH and logs)."""
    stream = sys.stderr if err else sys.stdout
    for line in lines:
        stream.write(line + "\n")
    stream.flush()


# --- the host's PATH -------------------------------------------------------------------------

# Stand-ins that a container rental has only inside the image (its venv), never on the
# base PATH; vLLM is in no trainer image.
IMAGE_ONLY = ("axolotl", "hf", "vllm", "lm_eval")


def is_container(host: Host) -> bool:
    """Whether the host is a container rental (`SimHostOptions.container_image` set)."""
    return bool(host.options.get("container_image"))


# A Docker host (a monthly server on Ubuntu) has no Hugging Face CLI and no lm_eval on its
# OS: the trainer image has them (real-hosts.md §9), and containers of that image get them
# (`image_bin`).
DOCKER_HOST_LACKS = ("hf", "lm_eval")
# What the axolotl images provide on their PATH (standins/container.AXOLOTL_VENV_COMMANDS;
# uv from the uv base image's /root/.local/bin).
AXOLOTL_IMAGE_COMMANDS = ("axolotl", "hf", "lm_eval", "uv")


def base_path_excludes(host: Host) -> tuple[str, ...]:
    """Stand-ins that must not be on the host's base PATH (only inside the image)."""
    if is_container(host):
        return IMAGE_ONLY
    return DOCKER_HOST_LACKS if host.options["has_docker"] else ()


def image_bin(host: Host) -> Path:
    """The axolotl image's commands for containers that `docker run` starts from it."""
    return host.dir / "image-bin"


def image_python(python: str) -> str:
    """The script that is the axolotl image's `python`: this machine's interpreter with the
    simulated torch (simhost/torchsim) and nothing else importable beyond the stdlib."""
    path = f"{BIN_DIR.parent / 'torchsim'}:{BIN_DIR.parent}"
    return f'#!/bin/sh\nPYTHONPATH={shlex.quote(path)} exec {python} -S "$@"\n'


def _write_image_bin(host: Host, python: str) -> None:
    folder = image_bin(host)
    folder.mkdir(parents=True, exist_ok=True)
    scripts = {name: f'#!/bin/sh\nexec {python} -S -E {shlex.quote(str(BIN_DIR / name))} "$@"\n'
               for name in AXOLOTL_IMAGE_COMMANDS}
    scripts.update(dict.fromkeys(("python", "python3"), image_python(python)))
    for name, script in scripts.items():
        target = folder / name
        if not target.exists() or target.read_text() != script:
            write_atomic(target, script, 0o755)



def refresh_bin(host: Host) -> None:
    """Make the host's bin directory match what the host has installed right now."""
    opts = host.options
    wanted = set(ALWAYS)
    if not opts["driver_missing"]:
        wanted.add("nvidia-smi")
    if opts["has_docker"]:
        wanted.add("docker")
    if "nvidia-container-toolkit-base" in host.packages():
        wanted.add("nvidia-ctk")
    # A host without Docker is a container rental: the axolotl image is the runtime, and
    # it ships lm_eval (has_lm_eval None follows that; True/False force it).
    lm_eval = opts.get("has_lm_eval")
    if lm_eval or (lm_eval is None and not opts["has_docker"]):
        wanted.add("lm_eval")
    # A container rental has the image's commands only inside the image (standins/container).
    wanted -= set(base_path_excludes(host))
    host.bin.mkdir(parents=True, exist_ok=True)
    python = shlex.quote(sys.executable)
    if opts["has_docker"]:
        _write_image_bin(host, python)
    from .client import compiled, install

    client = compiled(BIN_DIR) if wanted else None
    for name in ALWAYS + CONDITIONAL:
        target = host.bin / name
        if name in wanted and client is not None:
            install(client, target)
            continue
        if name in wanted:
            script = f'#!/bin/sh\nexec {python} -S -E {shlex.quote(str(BIN_DIR / name))} "$@"\n'
        elif _which(name, SYSTEM_PATH):
            # The real machine has this command: mask it, the simulated host has none.
            script = f'#!/bin/sh\necho "sh: 1: {name}: not found" >&2\nexit 127\n'
        else:
            with contextlib.suppress(FileNotFoundError):
                target.unlink()
            continue
        if not target.exists() or target.read_bytes() != script.encode():
            write_atomic(target, script, 0o755)


# --- processes -------------------------------------------------------------------------------


def exit_with(run: Callable[[], int]) -> None:
    """In a forked child: `run()`, then end as the interpreter would end the same program
    (its status; a SystemExit's code or message; a traceback and 1 for anything else), with
    the streams flushed and without returning into the parent's code (os._exit)."""
    code = 1
    try:
        code = run()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, int | None):
            print(exc.code, file=sys.stderr)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code & 0xFF)


def proc_table() -> dict[int, tuple[int, str]]:
    """Every live process: pid -> (ppid, state letter), read from /proc."""
    table: dict[int, tuple[int, str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                raw = handle.read().decode(errors="replace")
        except OSError:
            continue
        fields = raw[raw.rfind(")") + 2 :].split()
        table[int(entry)] = (int(fields[1]), fields[0])
    return table


def alive(pid: int, starttime: int | None = None) -> bool:
    """Whether `pid` runs (zombies do not count) and, if given, started at `starttime`."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            raw = handle.read().decode(errors="replace")
    except OSError:
        return False
    fields = raw[raw.rfind(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return False
    return starttime is None or int(fields[19]) == starttime


def process_starttime(pid: int) -> int | None:
    """The kernel's start time of `pid` (clock ticks since boot), to detect pid reuse."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            raw = handle.read().decode(errors="replace")
    except OSError:
        return None
    return int(raw[raw.rfind(")") + 2 :].split()[19])


def descendants(root: int, table: dict[int, tuple[int, str]] | None = None) -> set[int]:
    """Live processes below `root` in the process tree (not `root` itself)."""
    table = proc_table() if table is None else table
    children: dict[int, list[int]] = {}
    for pid, (ppid, _state) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if pid in found:
            continue
        found.add(pid)
        todo.extend(children.get(pid, []))
    return {pid for pid in found if table[pid][1] not in ("Z", "X")}


def tagged(host_id: str) -> set[int]:
    """Live processes whose environment carries `SIMHOST_ID=<host_id>`."""
    needle = f"SIMHOST_ID={host_id}".encode()
    found: set[int] = set()
    for pid, (_ppid, state) in proc_table().items():
        if state in ("Z", "X") or pid == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as handle:
                env = handle.read().split(b"\0")
        except OSError:
            continue
        if needle in env:
            found.add(pid)
    return found


def signal_all(pids: Iterable[int], sig: int = signal.SIGKILL) -> None:
    """Send `sig` to each pid, ignoring those already gone."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def cut_power(pids: Iterable[int]) -> None:
    """SIGKILL `pids` as a power cut ends them: all at the same moment. Each is stopped
    (SIGSTOP) before any is killed, so none runs in between to see another die: a shell
    reaping its killed child, and sshd sending the client that exit status (137), before
    the connection drops. On a real host the client sees only the connection drop."""
    pids = list(pids)
    signal_all(pids, signal.SIGSTOP)
    signal_all(pids, signal.SIGKILL)


def kill_process_group(pgid: int, sig: int = signal.SIGKILL) -> bool:
    """Signal a whole process group; False when it no longer exists."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


# --- privileges --------------------------------------------------------------------------------


def privileged(host: Host) -> bool:
    """Whether this command runs as root: a root login, or under `sudo`."""
    return host.options.get("login", "root") == "root" or os.environ.get("SIMHOST_SUDO") == "1"


def require_root(host: Host, message: str, code: int) -> None:
    """Refuse a privileged command as the real one refuses a non-root user."""
    if not privileged(host):
        raise SimError(message, code)


def _which(name: str, path: str) -> str | None:
    """`shutil.which`, importing shutil only when called (see the imports above)."""
    import shutil

    return shutil.which(name, path=path)
