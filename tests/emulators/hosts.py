"""Real machines behind the cloud emulators: each emulated instance can be a simulated GPU host.

An emulator given `hosts=` (a `HostBackend`) boots a host when it creates an instance, reports
that host's SSH endpoint once the instance is running, and powers the host off when the
instance is preempted or destroyed. `SimHostBackend` implements it with `simhost`
(a real sshd on 127.0.0.1 with stand-in nvidia-smi/docker/axolotl/vllm)::

    backend = SimHostBackend(tmp_path / "hosts", {"train_steps": 3})
    with VastEmulator(api_key="k", hosts=backend) as vast:
        ...                           # create through VastAI, poll get() until RUNNING, ssh in
        backend.host("9001").events()  # inspect (or fault) the instance's host
    backend.stop_all()

Hosts are started with `die_with_parent=True`, whose parent-death signal follows the *thread*
that forked the host's init. The emulators' HTTP handler threads end with their connection,
so `SimHostBackend` forks every host from one long-lived launcher thread of its own.
"""

from __future__ import annotations

import base64
import re
import shlex
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from queue import Queue
from typing import Any, Protocol, TypeVar

from simhost import SimHost, SimHostOptions

T = TypeVar("T")
_MIB = 1024**2


class HostBackend(Protocol):
    """What an emulator needs to give its instances real SSH endpoints."""

    def start(self, instance_id: str, public_key: str, gpu_name: str, gpu_count: int,
              container: dict[str, Any] | None = None) -> tuple[str, int, str]:
        """Boot the instance's host authorising `public_key`; returns (host, port, user).

        `container`: `SimHostOptions` fields of a container rental (`container_image`,
        `volume_mount`, `persisted_env`, `nvme_mount`), set by the emulator from the create.
        """
        ...

    def stop(self, instance_id: str) -> None:
        """Power the instance's host off (idempotent; unknown ids are ignored)."""
        ...


# -- GPU names --------------------------------------------------------------------------------


def canonical_gpu(gpu_name: str) -> str | None:
    """The catalog model of an emulator GPU name (Vast `gpu_name` or RunPod GPU id), or None."""
    from providers import catalog
    from providers.runpod.compute import canonical_gpu as runpod_gpu
    from providers.vastai.compute import GPU_MAP

    if gpu_name in catalog.gpus():
        return gpu_name
    for model, (names, _min_ram) in GPU_MAP.items():
        if gpu_name in names:
            return model
    return runpod_gpu(gpu_name)


def nvidia_smi_gpu(gpu_name: str) -> tuple[str, int | None]:
    """(the product name nvidia-smi prints, MiB per GPU or None) for an emulator GPU name.

    RunPod's GPU ids are NVIDIA's product names already ("NVIDIA GeForce RTX 4090"), so an
    "NVIDIA ..." name is reported as it is; a Vast name ("H100 SXM") goes through the catalog
    model to `providers.sim.compute.NVIDIA_SMI_NAMES`. Memory comes from the catalog's GPU spec.
    """
    from providers import catalog
    from providers.sim.compute import NVIDIA_SMI_NAMES

    model = canonical_gpu(gpu_name)
    memory = catalog.gpus()[model].memory_bytes // _MIB if model else None
    if gpu_name.startswith("NVIDIA "):
        return gpu_name, memory
    if model in NVIDIA_SMI_NAMES:
        return NVIDIA_SMI_NAMES[model], memory
    runpod_ids = catalog.spellings("runpod").get(model or "")
    if runpod_ids:  # RunPod's ids are the names nvidia-smi prints ("RTX 6000Ada" on Vast)
        return runpod_ids[0], memory
    return f"NVIDIA {gpu_name}", memory


# -- public keys ------------------------------------------------------------------------------

_KEY_TYPES = r"(?:ssh-ed25519|ssh-rsa|ssh-dss|ecdsa-sha2-nistp(?:256|384|521)|sk-[a-z0-9@.-]+)"
_KEY_LINE = re.compile(rf"({_KEY_TYPES})\s+([A-Za-z0-9+/]+={{0,3}})(?:\s+(.*))?")
_KEY_ANYWHERE = re.compile(rf"(?<![\w-])({_KEY_TYPES})\s+([A-Za-z0-9+/]+={{0,3}})")


def _valid_blob(kind: str, blob: str) -> bool:
    """Whether `blob` is base64 of an SSH key of type `kind` (its first field names the type)."""
    try:
        raw = base64.b64decode(blob, validate=True)
    except ValueError:
        return False
    if len(raw) < 4:
        return False
    size = int.from_bytes(raw[:4], "big")
    return raw[4:4 + size] == kind.encode()


def public_keys_in(script: str | None) -> list[str]:
    """The OpenSSH public keys a shell script (e.g. Vast's `onstart`) writes, in order.

    The script is split the way sh would (so `echo 'ssh-ed25519 AAAA... c'` yields the key
    with its comment); when that fails (unbalanced quotes) or finds nothing, keys are searched
    in the raw text (type and blob only). Keys whose blob is not a key of their type are left
    out.
    """
    if not script:
        return []
    found: list[str] = []
    try:
        words = shlex.split(script, comments=False, posix=True)
    except ValueError:
        words = []
    for word in words:
        for line in word.splitlines():
            match = _KEY_LINE.fullmatch(line.strip())
            if match and _valid_blob(match[1], match[2]):
                comment = (match[3] or "").strip()
                found.append(f"{match[1]} {match[2]}" + (f" {comment}" if comment else ""))
    if not found:
        found = [f"{m[1]} {m[2]}" for m in _KEY_ANYWHERE.finditer(script)
                 if _valid_blob(m[1], m[2])]
    return list(dict.fromkeys(found))


# -- the simulated-host backend ---------------------------------------------------------------


class _Launcher:
    """One daemon thread that runs the calls given to it, in order (see the module doc)."""

    def __init__(self) -> None:
        self._queue: Queue[tuple[Callable[[], Any], Future[Any]] | None] = Queue()
        self._thread = threading.Thread(target=self._loop, name="emu-host-launcher",
                                        daemon=True)
        self._thread.start()

    def call(self, fn: Callable[[], T]) -> T:
        if threading.current_thread() is self._thread:
            return fn()
        future: Future[T] = Future()
        self._queue.put((fn, future))
        return future.result()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        while (item := self._queue.get()) is not None:
            fn, future = item
            try:
                future.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                future.set_exception(exc)


class SimHostBackend:
    """Simulated GPU hosts for emulated instances, one directory each under `base_dir`.

    `options` are `SimHostOptions` fields applied to every host (they override the GPU model,
    count and memory derived from the instance). Hosts stay known after `stop` (`host(id)`
    still returns the powered-off `SimHost`); starting a stopped id again boots the same host.
    """

    def __init__(self, base_dir: Path, options: dict[str, Any] | None = None) -> None:
        self.base_dir = Path(base_dir)
        self.options: dict[str, Any] = dict(options or {})
        SimHostOptions(**self.options)  # unknown fields fail here, not at the first create
        self._hosts: dict[str, SimHost] = {}
        self._lock = threading.RLock()
        self._launcher: _Launcher | None = None

    def _run(self, fn: Callable[[], T]) -> T:
        with self._lock:
            if self._launcher is None:
                self._launcher = _Launcher()
            launcher = self._launcher
        return launcher.call(fn)

    def host_options(self, gpu_name: str, gpu_count: int,
                     container: dict[str, Any] | None = None) -> SimHostOptions:
        """The options a host for `gpu_count` × `gpu_name` boots with (a container rental
        when `container` is given: what the provider made of the create request)."""
        model, memory = nvidia_smi_gpu(gpu_name)
        derived: dict[str, Any] = {"gpu_model": model, "gpu_count": int(gpu_count)}
        if memory:
            derived["gpu_memory_mib"] = memory
        return SimHostOptions(**{**derived, **self.options, **(container or {})})

    def start(self, instance_id: str, public_key: str, gpu_name: str, gpu_count: int,
              container: dict[str, Any] | None = None) -> tuple[str, int, str]:
        """Boot (or boot again) the instance's host; returns (host, port, user)."""
        instance_id = str(instance_id)
        with self._lock:
            host = self._hosts.get(instance_id)
            if host is None:
                folder = self.base_dir / re.sub(r"[^A-Za-z0-9_.-]", "_", instance_id)
                options = self.host_options(gpu_name, gpu_count, container)
                host = SimHost(folder, public_key, options, die_with_parent=True)
                self._hosts[instance_id] = host
        self._run(host.start)
        return host.host, host.port, host.user

    def stop(self, instance_id: str) -> None:
        """Power the host off (idempotent; unknown ids are ignored)."""
        with self._lock:
            host = self._hosts.get(str(instance_id))
        if host is not None:
            self._run(host.stop)

    def host(self, instance_id: str | int) -> SimHost:
        """The instance's SimHost (running or not); KeyError when none was started for it."""
        with self._lock:
            return self._hosts[str(instance_id)]

    @property
    def instance_ids(self) -> list[str]:
        """Ids of the instances a host was started for, in order."""
        with self._lock:
            return list(self._hosts)

    def host_root(self, instance_id: str) -> str:
        """Where `/` of the instance's simulated server is (its `SimHost.root`)."""
        return str(self.host(instance_id).root)

    def serving(self, provider: Any) -> WithHostPaths:
        """`provider` (an adapter talking to an emulator with these hosts) as the engine
        must see it: the adapter itself, plus the hosts' path mapping."""
        return WithHostPaths(provider, self.host_root)

    def stop_all(self) -> None:
        """Power every host off and end the launcher thread (a later `start` makes a new one)."""
        with self._lock:
            hosts = list(self._hosts.values())
        errors: list[Exception] = []
        for host in hosts:
            try:
                self._run(host.stop)
            except Exception as exc:  # noqa: BLE001 - stop the others first
                errors.append(exc)
        with self._lock:
            launcher, self._launcher = self._launcher, None
        if launcher is not None:
            launcher.close()
        if errors:
            raise errors[0]


class WithHostPaths:
    """A real provider whose machines are simulated hosts (the emulators' instances, a
    registered server that is a `SimHost`): every attribute is the provider's own, plus
    `host_root` (`providers.base.HostPathMapping`), which a real provider does not have. The
    engine asks it where the simulated server's `/` is, as it asks `sim`."""

    def __init__(self, provider: Any, root_of: Callable[[str], str]) -> None:
        self._provider = provider
        self._root_of = root_of  # instance id -> the simulated server's root

    def __getattr__(self, name: str) -> Any:
        return getattr(self._provider, name)

    def host_root(self, instance: Any) -> str:
        """The simulated server's root for `instance` (an `Instance` of the provider)."""
        return self._root_of(instance.instance_id)
