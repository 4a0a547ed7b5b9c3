"""`sim`: a simulated per-second GPU cloud on this machine, for trying orch with no account.

Its offers are the static catalog's per-second GPU models at the catalog's prices; its
instances are simulated GPU hosts (`simhost`: a real sshd on 127.0.0.1 with a stand-in GPU
stack) under `<state_dir>/instances/<id>/`. It can be told to be out of capacity (`capacity`),
slow to boot (`boot_seconds`) and to preempt spot instances (`preempt_after_s`, `preempt(id)`,
or a replayed spot market's trace: `spot_market`, spotmarket.py).

Everything the cloud knows lives in `<state_dir>/sim.json` (written atomically, under an
advisory lock), so another process on the same state_dir (the engine, a second worker,
`orch reconcile`) sees the same instances. Hosts run detached from the process that created
them, as a real cloud's machines outlive a crashed client; only `terminate` stops them. The
automatic preemption is done by a small detached watchdog process per spot instance (and
also, lazily, by any `get`/`list` past the deadline), so it happens on time even when the
creating process has died.

State mapping: booting (until `boot_seconds` after create) → PROVISIONING; preempted →
INTERRUPTED (host stopped, disks kept, like a paused spot instance); a host that powered
off on its own (the `host_dies_at_step` fault) → INTERRUPTED as well; a record whose
creating process died before its host booted → FAILED; terminated or unknown → NotFound.

Billing: per second, each started second counted, from create to terminate (or now), at the
offer's price; preemption does not stop the meter (the instance is held until terminated).

Like Vast.ai and RunPod it keeps no volume: a job's checkpoints outlive a lost instance as
orch's own copy of them (`playbooks/checkpoints.py`), uploaded to the next one. Its hosts
download models from its own Hub (`hub.py`), which the check before renting asks over HTTP.

Machines: every instance lands on a machine of its GPU model's pool, whose stable id it
reports (`Instance.machine_id`); a `market` (providers/sim/market.py) makes a seeded share of
them bad (slow GPU, wrong GPU, slow disk, old driver, no or a slow route to the Hub) and can
sell one offer per machine, as Vast.ai does.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from providers import catalog
from providers.base import (
    AuthError,
    Billing,
    CapacityError,
    Instance,
    InstanceState,
    NotFound,
    Offer,
    OptInOnly,
    Requirements,
    Simulated,
    job_of,
    tag_for,
)
from providers.catalog import gpus as gpu_specs
from providers.catalog import load
from providers.sim import hub
from providers.sim.local import carries as _carries
from providers.sim.local import proc_state as _proc_state
from providers.sim.local import read_pid as _read_pid
from providers.sim.local import write_atomic as _write_atomic

if TYPE_CHECKING:
    from providers.sim import market, spotmarket
    from simhost import SimHost

# The market modules (machines, spot traces) are imported where a rental is offered or made:
# `orch plan` imports this class only to read what it declares (`OptInOnly`), and their
# imports (statistics, random, the trace models) were ~6 % of its start-up (valgrind).

# Catalog name → the product name the simulated nvidia-smi prints for it (what
# playbooks/gpu.py matches), from gpus.yaml's `spellings: sim`.
NVIDIA_SMI_NAMES: dict[str, str] = {canonical: names[0]
                                    for canonical, names in catalog.spellings("sim").items()}

CATALOG_PROVIDER = "cloud"  # the catalog whose models and prices sim sells
STATE_FILE = "sim.json"
_MIB = 1024**2
_COST_QUANTUM = Decimal("0.000001")
_SECONDS_PER_HOUR = Decimal(3600)


def _utc_iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds")


class _Settings(NamedTuple):
    boot_seconds: float
    preempt_after_s: float | None


class SimCloud(OptInOnly, Simulated):
    # Capabilities it has by its methods: HostPathMapping (`host_root`), HubMirror
    # (`hub_endpoint`), PriceList (`price_list`).
    """A simulated per-second cloud whose instances are simulated GPU hosts (see module doc)."""

    name = "sim"
    billing = Billing.PER_SECOND

    def __init__(
        self,
        state_dir: Path,
        *,
        gpus: list[str] | None = None,
        capacity: dict[str, int] | None = None,
        boot_seconds: float = 0.0,
        preempt_after_s: float | None = None,
        spot_market: spotmarket.SpotMarket | None = None,
        host_options: dict[str, Any] | None = None,
        keep_disks: bool = False,
        market: market.Market | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.state_dir = Path(state_dir).resolve()
        known = gpu_specs()
        for gpu in [*(gpus or []), *(capacity or {})]:
            if gpu not in known:
                raise ValueError(f"sim: unknown GPU model {gpu!r} (known: {', '.join(known)})")
        self.gpus = None if gpus is None else frozenset(gpus)
        self.capacity = dict(capacity or {})  # GPU model → live instances at most; absent = any
        if boot_seconds < 0 or (preempt_after_s is not None and preempt_after_s < 0):
            raise ValueError("sim: boot_seconds and preempt_after_s must be >= 0")
        self.settings = _Settings(boot_seconds, preempt_after_s)
        self.spot_market = spot_market  # spot gone and preempted as its trace says
        self.host_options = dict(host_options or {})
        self.keep_disks = keep_disks  # terminated hosts' directories go to terminated/<id>/
        if market is None:
            from providers.sim.market import Market

            market = Market()  # every machine good
        self.market = market  # its machines (providers/sim/market.py)
        self.clock = clock
        self._hosts: dict[str, SimHost] = {}  # hosts this object started (their init is our child)
        self._thread_lock = threading.RLock()

    def _host_options(self, offer: Offer, machine: market.Machine) -> Any:
        """A host's SimHostOptions on `machine`; AuthError if this account's login shell runs
        nothing."""
        from providers.sim import market
        from simhost import SimHostOptions
        from simhost.host import login_shell_problem

        if (shell := login_shell_problem()) is not None:
            raise AuthError(shell)
        return SimHostOptions(**{
            "gpu_model": NVIDIA_SMI_NAMES[offer.gpu], "gpu_count": offer.gpu_count,
            "gpu_memory_mib": catalog.gpus()[offer.gpu].memory_bytes // _MIB,
            "hf_gated_repos": hub.gated_repos(),  # as huggingface.co gates them
            **market.host_options(machine), **self.host_options})

    def hub_endpoint(self) -> str:
        """Where this cloud's Hub answers (`providers.base.HubMirror`): its hosts' `hf` gates
        the same repos (a loopback server in this process, started when first asked)."""
        gated = self.host_options.get("hf_gated_repos")
        return hub.serve(hub.gated_repos() if gated is None else tuple(gated))

    @staticmethod
    def price_list() -> list[Offer]:
        """Everything this cloud sells (`providers.base.PriceList`): what `orch plan` ranks
        for a job that names it."""
        return catalog_offers()

    # --- the Provider protocol -----------------------------------------------------------------

    def offers(self, req: Requirements) -> list[Offer]:
        """The catalog's per-second offers this cloud has capacity for, filtered by `req`."""
        from providers.sim import market, spotmarket

        found: list[Offer] = []
        for o in market.offers(self.market, catalog_offers(self.settings.boot_seconds)):
            if self.gpus is not None and o.gpu not in self.gpus:
                continue
            if self.capacity.get(o.gpu, 1) <= 0 or \
                    not spotmarket.can_rent(self.spot_market, o, self.clock()):
                continue
            if req.gpus is not None and o.gpu not in req.gpus:
                continue
            if o.gpu_count != req.gpu_count or o.gpu_memory_bytes < req.min_gpu_memory_bytes:
                continue
            if req.interruptible is not None and o.interruptible != req.interruptible:
                continue
            if req.max_price_per_hour is not None and o.price_per_hour is not None \
                    and o.price_per_hour > req.max_price_per_hour:
                continue
            found.append(o)
        return found

    def create(self, offer: Offer, ssh_public_key: str, job_id: str, image: str | None = None,
               disk_gb: int = 100) -> Instance:
        """Boot a simulated host for `offer`, tagged `tag_for(job_id)`; CapacityError if full."""
        from providers.sim import spotmarket
        from simhost import SimHost, SimHostError

        if offer.provider != self.name:
            raise ValueError(f"sim: offer {offer.offer_id!r} is from {offer.provider!r}, not sim")
        if offer.gpu not in NVIDIA_SMI_NAMES or offer.price_per_hour is None:
            raise CapacityError(f"sim: offer {offer.offer_id!r} is not sold here")
        if self.gpus is not None and offer.gpu not in self.gpus:
            raise CapacityError(f"sim: no {offer.gpu} in this cloud")
        instance_id = f"sim-{secrets.token_hex(6)}"
        host_dir = self.state_dir / "instances" / instance_id
        with self._state() as state:  # the machine: the offer's, else the provider's pick
            machine = self._machine(offer, state.setdefault("rentals", {}))
        host = SimHost(host_dir, ssh_public_key, self._host_options(offer, machine),
                       die_with_parent=False)
        now = self.clock()
        preempt_at = spotmarket.preempt_at(self.spot_market, self.settings.preempt_after_s,
                                           offer, now)
        record: dict[str, Any] = {
            "id": instance_id,
            "label": tag_for(job_id),
            "offer": _offer_json(offer),
            "gpu": offer.gpu,
            "gpu_count": offer.gpu_count,
            "price_per_hour": str(offer.price_per_hour),
            "interruptible": offer.interruptible,
            "image": image,
            "disk_gb": disk_gb,
            "created_at": _utc_iso(now),
            "created_epoch": now,
            "ready_epoch": now + self.settings.boot_seconds,
            "preempt_epoch": preempt_at,
            "preempted_at": None,
            "host_dir": str(host_dir),
            "host_id": host.id,
            "machine_id": machine.machine_id,
            "ssh_user": host.user,
            "ssh_port": None,
            "host_key": None,
            "authorized_key": host.authorized_key,
            "status": "starting",
            "creator_pid": os.getpid(),
        }
        with self._state() as state:
            limit = self.capacity.get(offer.gpu)
            live = sum(1 for r in state["instances"].values() if r["gpu"] == offer.gpu)
            if limit is not None and live >= limit:
                raise CapacityError(
                    f"sim: out of {offer.gpu} capacity ({live} of {limit} in use); "
                    "try another offer"
                )
            state["instances"][instance_id] = record
            state["billing"][instance_id] = {
                "price_per_hour": record["price_per_hour"], "start": now, "end": None,
            }  # fmt: skip
        try:
            host.start()
        except (SimHostError, OSError) as exc:
            self._forget(instance_id, bill=False)
            host.stop()
            raise CapacityError(f"sim: host for {offer.offer_id} failed to boot: {exc}") from exc
        with self._state() as state:
            current = state["instances"].get(instance_id)
            if current is not None:
                current.update(ssh_port=host.port, host_key=host.host_key, status="up")
        if current is None:  # terminated (by someone else) while booting
            host.stop()
            raise CapacityError(f"sim: {instance_id} was terminated while it booted")
        with self._thread_lock:
            self._hosts[instance_id] = host
        if preempt_at is not None and self.clock is time.time:
            self._spawn_watchdog(instance_id, preempt_at)
        return self.get(instance_id)

    def _machine(self, offer: Offer, rentals: dict[str, int]) -> market.Machine:
        from providers.sim import market

        named = offer.machine_id and market.machine(self.market, offer.gpu, offer.machine_id)
        if named:
            return named
        rentals[offer.gpu] = rentals.get(offer.gpu, 0) + 1
        return market.draw(self.market, offer.gpu, rentals[offer.gpu] - 1)

    def get(self, instance_id: str) -> Instance:
        """The instance's state now; NotFound when terminated or unknown."""
        record = self._load()["instances"].get(instance_id)
        if record is None:
            raise NotFound(f"sim: no instance {instance_id} (terminated or never created)")
        if self._due_for_preemption(record):
            with contextlib.suppress(NotFound):
                self.preempt(instance_id)
            record = self._load()["instances"].get(instance_id)
            if record is None:
                raise NotFound(f"sim: no instance {instance_id} (terminated)")
        return self._instance(record)

    def list(self, job_id: str | None = None) -> list[Instance]:
        """Instances tagged as orch's (for `job_id`, or all of them)."""
        found: list[Instance] = []
        for instance_id, record in sorted(self._load()["instances"].items()):
            if job_of(record["label"]) is None:
                continue
            if job_id is not None and record["label"] != tag_for(job_id):
                continue
            with contextlib.suppress(NotFound):
                found.append(self.get(instance_id))
        return found

    def terminate(self, instance_id: str) -> None:
        """Stop the host and forget the instance (frees capacity); already gone = success."""
        record = self._forget(instance_id, bill=True)
        if record is None:
            return
        self._kill_watchdog(instance_id)
        self._stop_host(record)
        host_dir = Path(record["host_dir"])
        if self.keep_disks:
            target = self.state_dir / "terminated" / instance_id
            target.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(OSError):
                host_dir.rename(target)
        else:
            shutil.rmtree(host_dir, ignore_errors=True)

    def host_root(self, instance: Instance) -> str:
        """Where `/` of the instance's simulated server is (`providers.base.HostPathMapping`)."""
        # Where `create` put the host; known without reading the state (an instance that was
        # terminated meanwhile fails at its first command, not here).
        return str((self.state_dir / "instances" / instance.instance_id).resolve() / "root")

    # --- sim's own controls --------------------------------------------------------------------

    def preempt(self, instance_id: str) -> None:
        """Preempt the instance now: its host powers off (disks kept), state INTERRUPTED."""
        with self._state() as state:
            record = state["instances"].get(instance_id)
            if record is None:
                raise NotFound(f"sim: no instance {instance_id}")
            already = record["preempted_at"] is not None
            if not already:
                record["preempted_at"] = _utc_iso(self.clock())
        self._stop_host(record)

    def charged_seconds(self, instance_id: str) -> int:
        """Seconds billed so far: every started second from create to terminate (or now)."""
        bill = self._load()["billing"].get(instance_id)
        if bill is None:
            raise NotFound(f"sim: no billing record for {instance_id}")
        end = bill["end"] if bill["end"] is not None else self.clock()
        return max(0, math.ceil(float(end) - float(bill["start"]) - 1e-6))

    def billed(self) -> dict[str, int]:
        """Every instance ever created here (terminated too) -> seconds billed so far."""
        return {iid: self.charged_seconds(iid) for iid in sorted(self._load()["billing"])}

    def cost(self, instance_id: str) -> Decimal:
        """What the instance cost so far: charged seconds × the offer's hourly price / 3600."""
        bill = self._load()["billing"].get(instance_id)
        if bill is None:
            raise NotFound(f"sim: no billing record for {instance_id}")
        seconds = self.charged_seconds(instance_id)
        cost = Decimal(bill["price_per_hour"]) * seconds / _SECONDS_PER_HOUR
        return cost.quantize(_COST_QUANTUM, rounding=ROUND_HALF_UP)

    def terminate_all(self) -> None:
        """Terminate every instance of this state_dir (tests, `orch` teardown of the sim)."""
        for instance_id in sorted(self._load()["instances"]):
            self.terminate(instance_id)

    # --- internals -------------------------------------------------------------------------------

    @property
    def _state_path(self) -> Path:
        return self.state_dir / STATE_FILE

    def _load(self) -> dict[str, Any]:
        try:
            state: dict[str, Any] = json.loads(self._state_path.read_text())
        except FileNotFoundError:
            state = {}
        state.setdefault("instances", {})
        state.setdefault("billing", {})
        return state

    @contextlib.contextmanager
    def _state(self) -> Iterator[dict[str, Any]]:
        """Read-modify-write of the state file under an exclusive lock (all processes)."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with self._thread_lock, open(self.state_dir / "sim.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                state = self._load()
                yield state
                _write_atomic(self._state_path, json.dumps(state, indent=1, sort_keys=True))
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _forget(self, instance_id: str, *, bill: bool) -> dict[str, Any] | None:
        with self._state() as state:
            record: dict[str, Any] | None = state["instances"].pop(instance_id, None)
            if record is not None:
                if bill:
                    state["billing"][instance_id]["end"] = self.clock()
                else:
                    state["billing"].pop(instance_id, None)
        return record

    def _due_for_preemption(self, record: dict[str, Any]) -> bool:
        due = record.get("preempt_epoch")
        return record["preempted_at"] is None and due is not None and self.clock() >= due

    def _host_up(self, record: dict[str, Any]) -> bool:
        host = self._hosts.get(record["id"])
        if host is not None and not host.running:  # also reaps our dead child
            return False
        pid = _read_pid(Path(record["host_dir"]) / "state" / "init.pid")
        return pid is not None and _carries(pid, f"SIMHOST_ID={record['host_id']}".encode())

    def _instance(self, record: dict[str, Any]) -> Instance:
        state, raw, message = InstanceState.RUNNING, "running", ""
        if record["preempted_at"] is not None:
            state, raw = InstanceState.INTERRUPTED, "preempted"
            message = f"preempted at {record['preempted_at']}; the host is stopped, disks kept"
        elif record["status"] == "starting":
            if _proc_state(record["creator_pid"]) in (None, "Z", "X"):
                state, raw = InstanceState.FAILED, "failed"
                message = "the process creating it died before the host booted"
            else:
                state, raw = InstanceState.PROVISIONING, "starting"
        elif not self._host_up(record):
            state, raw, message = InstanceState.INTERRUPTED, "stopped", "the host powered off"
        elif self.clock() < record["ready_epoch"]:
            state, raw = InstanceState.PROVISIONING, "booting"
        running = state is InstanceState.RUNNING
        return Instance(
            provider=self.name, instance_id=record["id"], state=state, label=record["label"],
            gpu=record["gpu"], gpu_count=record["gpu_count"],
            interruptible=record["interruptible"],
            price_per_hour=Decimal(record["price_per_hour"]),
            ssh_host="127.0.0.1" if running else None,
            ssh_port=record["ssh_port"] if running else None,
            ssh_user=record["ssh_user"], raw_status=raw, message=message,
            machine_id=record.get("machine_id"),
        )  # fmt: skip

    def _stop_host(self, record: dict[str, Any]) -> None:
        """Power the host off, whichever process started it (its processes carry its id)."""
        from simhost import SimHost

        with self._thread_lock:
            host = self._hosts.pop(record["id"], None)
        if host is None:
            host = SimHost(record["host_dir"], record["authorized_key"], die_with_parent=False)
            host.id = record["host_id"]
            # Let the host's init stop its tree itself first; stop() SIGKILLs what is left.
            pid = _read_pid(Path(record["host_dir"]) / "state" / "init.pid")
            needle = f"SIMHOST_ID={record['host_id']}".encode()
            if pid is not None and _carries(pid, needle):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGTERM)
                deadline = time.monotonic() + 5
                while _carries(pid, needle) and time.monotonic() < deadline:
                    time.sleep(0.02)
        host.stop()

    def _watchdog_pidfile(self, instance_id: str) -> Path:
        return self.state_dir / "watchdogs" / f"{instance_id}.pid"

    def _spawn_watchdog(self, instance_id: str, at: float) -> None:
        """A detached process that preempts the instance at `at`, outliving this one."""
        self._watchdog_pidfile(instance_id).parent.mkdir(parents=True, exist_ok=True)
        repo = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (repo, os.environ.get("PYTHONPATH", "")) if p)}
        args = [sys.executable, "-m", "providers.sim.compute", "preempt-at",
                str(self.state_dir), instance_id, repr(at)]
        # Double fork (sh backgrounds it and exits): the watchdog is never our zombie.
        launcher = "\"$@\" </dev/null >/dev/null 2>&1 &"
        subprocess.run(["sh", "-c", launcher, "sh", *args], env=env, check=True,
                       start_new_session=True)  # fmt: skip

    def _kill_watchdog(self, instance_id: str) -> None:
        path = self._watchdog_pidfile(instance_id)
        pid = _read_pid(path)
        if pid is not None and _carries(pid, instance_id.encode(), "cmdline"):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def catalog_offers(boot_seconds: float = 0.0) -> list[Offer]:
    """Everything sim sells: the per-second catalog's GPU models and prices, cheapest first.

    Also what `orch plan` ranks for a job that names `sim` in resources.providers.
    """
    found: list[Offer] = []
    for base in load().offers:
        if base.provider != CATALOG_PROVIDER or base.price_per_hour is None:
            continue
        if base.gpu not in NVIDIA_SMI_NAMES:
            continue
        found.append(
            Offer(
                provider=SimCloud.name, offer_id=base.offer_id, gpu=base.gpu,
                gpu_count=base.gpu_count, gpu_memory_bytes=base.gpu_memory_bytes,
                billing=SimCloud.billing, interruptible=base.interruptible,
                price_per_hour=base.price_per_hour, region="local", reliability=1.0,
                boot_minutes=boot_seconds / 60, pull_gbps=base.pull_gbps,
            )
        )  # fmt: skip
    found.sort(key=lambda o: (o.price_per_hour or Decimal(0), o.offer_id))
    return found


def _offer_json(offer: Offer) -> dict[str, Any]:
    return {k: (str(v) if isinstance(v, Decimal) else v) for k, v in vars(offer).items()}


def _watchdog(state_dir: str, instance_id: str, at: float) -> int:
    cloud = SimCloud(Path(state_dir))
    path = cloud._watchdog_pidfile(instance_id)
    path.write_text(f"{os.getpid()}\n")
    try:
        while (left := at - time.time()) > 0:
            time.sleep(min(left, 1.0))
            if instance_id not in cloud._load()["instances"]:
                return 0
        with contextlib.suppress(NotFound):
            cloud.preempt(instance_id)
    finally:
        with contextlib.suppress(FileNotFoundError):
            if _read_pid(path) == os.getpid():
                path.unlink()
    return 0


def main(argv: list[str]) -> int:
    """`python -m providers.sim.compute preempt-at STATE_DIR ID EPOCH` (the preemption watchdog)."""
    if len(argv) == 4 and argv[0] == "preempt-at":
        return _watchdog(argv[1], argv[2], float(argv[3]))
    print("usage: python -m providers.sim.compute preempt-at STATE_DIR INSTANCE_ID EPOCH",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
