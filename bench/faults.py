"""Faults injected for real, and what they cost: the crash matrix and provider outages.

Each scenario runs the real engine on the simulated cloud (`orch` processes killed -9) or
on the Vast.ai emulator (real HTTP, real sshd hosts) and prints, per scenario:

  leaked    instances still running at the provider (or open in the database) at the end
  lost/dup  jobs not finished nor queued with a reason / duplicated jobs or metric rows
  idle s    billed instance-seconds while no process drove the job (crash → takeover or
            teardown), against its bound: the lease (the crash is noticed when it lapses)
            plus one grace period (IDLE_GRACE_S; this bench sets ORCH_IDLE_GRACE_S=10 so
            the foreground scenario finishes quickly) plus, when nothing but `orch
            reconcile` runs, the interval between its runs
  recover s fault over (crash, or outage end) → the job driven again (claimed / placed)

Targets: 0, 0, <= one grace period, < 30 s. Asserts nothing (shared machines are noisy);
prints side by side. Usage:
    python bench/faults.py [--only NAME]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

ORCH = shutil.which("orch", path=str(Path(sys.executable).parent)) or "orch"
GRACE_S = 10.0
LEASE_S = 3.0
CRASH_POINTS = ["after-create", "training", "merging", "evaluating", "releasing",
                "after-terminate"]


@dataclass
class Result:
    """One scenario's numbers."""

    name: str
    leaked: int
    lost: int
    duplicates: int
    idle_s: float
    recover_s: float | None
    note: str = ""
    bound_s: float = LEASE_S + GRACE_S


def _utc(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)


def _q(db: Path, sql: str, *args: object) -> list[tuple[Any, ...]]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        return con.execute(sql, args).fetchall()
    finally:
        con.close()


def _training(db: Path) -> bool:
    try:
        return _q(db, "SELECT count(*) FROM event WHERE kind = 'train.progress'")[0][0] >= 1
    except sqlite3.OperationalError:  # the file exists, the schema not yet
        return False


def _wait(pred: Callable[[], object], timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.1)
    raise TimeoutError("condition not reached")


def _idle(db: Path, since: datetime, until: datetime) -> float:
    """Instance-seconds alive within [since, until] (nobody drove the job then)."""
    total = 0.0
    for created, ended in _q(db, "SELECT created_at, terminated_at FROM instance"):
        start = max(_utc(created), since)
        stop = min(_utc(ended) if ended else until, until)
        total += max(0.0, (stop - start).total_seconds())
    return total


def _counts(db: Path) -> tuple[int, int]:
    """(lost jobs, duplicate job/metric rows)."""
    lost = _q(db, "SELECT count(*) FROM job WHERE status NOT IN ('succeeded', 'failed', "
                  "'cancelled', 'queued')")[0][0]
    dups = _q(db, "SELECT count(*) FROM (SELECT 1 FROM metric GROUP BY job_id, name, "
                  "coalesce(step, -1) HAVING count(*) > 1)")[0][0]
    return int(lost), int(dups)


class SimEnv:
    """A fresh orch data dir with the simulated cloud; `orch` run as a real process."""

    def __init__(self, tmp: Path, **extra: str) -> None:
        self.env = {**os.environ, "XDG_DATA_HOME": str(tmp), "ORCH_LEASE_S": str(LEASE_S),
                    "ORCH_SIM_TRAIN_STEPS": "6", "ORCH_SIM_STEP_S": "0.2",
                    "ORCH_IDLE_GRACE_S": str(GRACE_S), **extra}
        for key in ("ORCH_DB_URL", "VAST_API_KEY", "RUNPOD_API_KEY", "ORCH_FAILPOINT"):
            self.env.pop(key, None)
        self.db = tmp / "orch" / "orch.db"

    def orch(self, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([ORCH, *args], env={**self.env, **extra}, cwd=ROOT,
                              capture_output=True, text=True, timeout=300)

    def live(self) -> int:
        from providers.sim.compute import SimCloud

        return len(SimCloud(Path(self.env["XDG_DATA_HOME"]) / "orch" / "sim").list())

    def lapse(self) -> None:
        _wait(lambda: _q(self.db, "SELECT lease_expires_at < strftime('%Y-%m-%dT%H:%M:%fZ', "
                                  "'now') FROM job")[0][0], timeout=30)

    def claimed_at(self, owner_kind: str) -> datetime | None:
        rows = _q(self.db, "SELECT at FROM event WHERE kind = 'state' AND message LIKE ? "
                           "ORDER BY id", f"provisioning (claimed by {owner_kind}:%")
        return _utc(rows[0][0]) if rows else None


def crash(point: str, tmp: Path) -> Result:
    """`orch submit` killed -9 at `point`; a worker takes the job over."""
    s = SimEnv(tmp)
    out = s.orch("submit", "examples/quickstart.yml", ORCH_FAILPOINT=point)
    crashed = datetime.now(UTC)
    assert out.returncode == -signal.SIGKILL, out.stderr[-500:]
    s.lapse()
    worker = s.orch("worker", "--once")
    assert worker.returncode == 0, worker.stderr[-500:]
    claimed = s.claimed_at("worker") or datetime.now(UTC)
    lost, dups = _counts(s.db)
    status = _q(s.db, "SELECT status FROM job")[0][0]
    rented = _q(s.db, "SELECT count(*) FROM instance")[0][0]
    return Result(f"kill -9 at {point}", s.live(), lost + (status != "succeeded"), dups,
                  _idle(s.db, crashed, claimed), (claimed - crashed).total_seconds(),
                  f"{status}; {rented} instance(s) rented in all")


def foreground(tmp: Path) -> Result:
    """`orch submit` killed -9 mid-training and no worker runs: reconcile (run every
    second, as a timer would) requeues the job, then tears the idle instance down."""
    s = SimEnv(tmp, ORCH_SIM_TRAIN_STEPS="1000")
    proc = subprocess.Popen([ORCH, "submit", "examples/quickstart.yml"], env=s.env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait(lambda: s.db.exists() and _training(s.db))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        proc.kill()
    crashed = datetime.now(UTC)
    end = time.monotonic() + GRACE_S + 60
    runs, started = 0, time.monotonic()
    while s.live() and time.monotonic() < end:
        s.orch("reconcile")
        runs += 1
        time.sleep(1)
    done = datetime.now(UTC)
    interval = (time.monotonic() - started) / max(1, runs)
    lost, dups = _counts(s.db)
    status = _q(s.db, "SELECT status FROM job")[0][0]
    return Result("kill -9 of foreground submit, no worker", s.live(), lost, dups,
                  _idle(s.db, crashed, done), None,
                  f"{status}; torn down by reconcile (run every {interval:.1f}s) after the "
                  f"{GRACE_S:.0f}s grace", LEASE_S + GRACE_S + interval)


def _vast_rig(tmp: Path) -> tuple[Any, Any, Any, Any]:
    from emulators.hosts import SimHostBackend
    from emulators.vast import VastEmulator

    from orchestrator.records.store import open_store

    os.environ["XDG_DATA_HOME"] = str(tmp / "xdg")
    store = open_store(f"sqlite:///{tmp / 'orch.db'}")
    hosts = SimHostBackend(tmp / "hosts", {"train_steps": 4, "train_step_seconds": 0.1,
                                           "vllm_startup_seconds": 0.2,
                                           "merge_seconds": 0.05})
    emu = VastEmulator(api_key="bench-key", hosts=hosts).start()
    emu.add_offer(id=1, gpu_name="RTX 4090", dph_base=0.40, min_bid=0.20)
    return store, hosts, emu, tmp


def _queue(store: Any, tmp: Path, provider: str) -> str:
    from orchestrator.core.spec import load_job
    from orchestrator.engine.submission import record_job

    folder = tmp / "jobs"
    if not folder.exists():
        shutil.copytree(ROOT / "examples" / "data", folder / "data")
    path = folder / f"job-{len(list(folder.glob('*.yml')))}.yml"
    path.write_text((ROOT / "examples" / "quickstart.yml").read_text()
                    .replace("providers: [sim]", f"providers: [{provider}]"))
    job, _ = record_job(store, load_job(path))
    return str(job.id)


def outage(tmp: Path, seconds: float = 15.0, jobs: int = 3) -> Result:
    """A `seconds`-long run of 503s on Vast.ai offer search while a worker has `jobs`
    queued; the worker loop (claim, run, sleep --poll when nothing may start) runs on."""
    from orchestrator.engine.runner import JobRunner, Options, owner_id
    from providers.vastai.compute import VastAI

    store, hosts, emu, _ = _vast_rig(tmp)
    try:
        ids = [_queue(store, tmp, "vastai") for _ in range(jobs)]
        emu.fail_next(1_000_000, 503, method="POST", path="/api/v0/bundles")
        ended: list[float] = []

        def heal() -> None:
            time.sleep(seconds)
            emu.faults.clear()
            ended.append(time.monotonic())

        threading.Thread(target=heal, daemon=True).start()
        # The real retry policy; the hosts say where their simulated filesystem lives.
        adapter = hosts.serving(VastAI("bench-key", base_url=emu.url))
        owner = owner_id("worker")
        opts = Options(poll_s=0.2, watch_s=0.2, lease_s=5, boot_deadline_s=30,
                       connect_deadline_s=20)  # the default outage backoff
        placed: dict[str, float] = {}
        stop = time.monotonic() + 300
        while time.monotonic() < stop:
            if all(store.get_job(j).status in ("succeeded", "failed") for j in ids):
                break
            job = store.claim_next(owner, opts.lease_s)
            if job is None:
                time.sleep(0.5)  # `orch worker --poll`
                continue
            JobRunner(store, {"vastai": adapter}, owner, opts, on_signal="requeue").run(job.id)
            for e in store.events(job.id):
                if e.kind == "instance.created" and job.id not in placed:
                    placed[job.id] = time.monotonic()
        recover = (min(placed.values()) - ended[0]) if placed and ended else None
        statuses = [store.get_job(j).status for j in ids]
        failed = statuses.count("failed")
        lost, dups = _counts(Path(str(store.engine.url.database)))
        return Result(f"{seconds:.0f}s of 503 on Vast.ai search, {jobs} jobs", len(emu.instances),
                      lost + failed, dups, 0.0, recover,
                      f"{statuses.count('succeeded')}/{jobs} succeeded, {failed} failed")
    finally:
        emu.stop()
        hosts.stop_all()
        store.close()


def long_retry_after(tmp: Path) -> Result:
    """429 with Retry-After: 3600 on offer search: requeued at once, not slept through."""
    from orchestrator.engine.runner import JobRunner, Options, owner_id
    from providers.vastai.compute import VastAI

    store, hosts, emu, _ = _vast_rig(tmp)
    try:
        job_id = _queue(store, tmp, "vastai")
        emu.fail_next(1_000_000, 429, method="POST", path="/api/v0/bundles",
                      headers={"Retry-After": "3600"})
        owner = owner_id("worker")
        store.claim_job(job_id, owner, 5)
        t = time.monotonic()
        job = JobRunner(store, {"vastai": VastAI("bench-key", base_url=emu.url)}, owner,
                        Options(lease_s=5), on_signal="requeue").run(job_id)
        took = time.monotonic() - t
        wait = (job.not_before - job.updated_at).total_seconds() if job.not_before else 0
        lost, dups = _counts(Path(str(store.engine.url.database)))
        return Result("429 Retry-After 3600 on search", len(emu.instances), lost, dups, 0.0,
                      None, f"{job.status} in {took:.1f}s; retried after {wait:.0f}s")
    finally:
        emu.stop()
        hosts.stop_all()
        store.close()


def black_hole(tmp: Path) -> Result:
    """A sim job with Vast.ai configured but black-holed (accepts, never answers)."""
    from emulators.blackhole import BlackHole

    from orchestrator.engine.runner import JobRunner, Options, ensure_key, owner_id
    from orchestrator.records.store import open_store
    from providers.sim.compute import SimCloud
    from providers.vastai.compute import VastAI

    os.environ["XDG_DATA_HOME"] = str(tmp / "xdg")
    store = open_store(f"sqlite:///{tmp / 'orch.db'}")
    cloud = SimCloud(tmp / "sim", host_options={"train_steps": 4, "train_step_seconds": 0.1,
                                                "vllm_startup_seconds": 0.2,
                                                "merge_seconds": 0.05})
    key, _ = ensure_key(tmp / "key")
    times: dict[str, float] = {}
    try:
        with BlackHole() as hole:
            for label, providers in (("sim only", {"sim": cloud}),
                                     ("sim + black-holed vastai",
                                      {"sim": cloud, "vastai": VastAI("k", base_url=hole.url)})):
                job_id = _queue(store, tmp, "sim")
                owner = owner_id("bench")
                store.claim_job(job_id, owner, 5)
                t = time.monotonic()
                JobRunner(store, providers, owner, Options(poll_s=0.2, watch_s=0.2, lease_s=5,
                                                           ssh_key=key)).run(job_id)
                times[label] = time.monotonic() - t
            asked = hole.connections
        lost, dups = _counts(tmp / "orch.db")
        a, b = times["sim only"], times["sim + black-holed vastai"]
        return Result("black-holed Vast.ai, sim jobs", len(cloud.list()), lost, dups, 0.0,
                      None, f"job {a:.1f}s alone vs {b:.1f}s ({b / a:.2f}x); vastai asked "
                            f"{asked} times")
    finally:
        cloud.terminate_all()
        store.close()


# --- database faults (issue 23) -------------------------------------------------------------


def _sim_rig(tmp: Path, steps: int = 40) -> tuple[Any, Any, Path]:
    """A SQLite store, a sim cloud whose jobs train ~steps/4 s, and orch's key under tmp."""
    from orchestrator.engine.runner import ensure_key
    from orchestrator.records.store import open_store
    from providers.sim.compute import SimCloud

    os.environ["XDG_DATA_HOME"] = str(tmp / "xdg")
    store = open_store(f"sqlite:///{tmp / 'orch.db'}")
    cloud = SimCloud(tmp / "sim", host_options={"train_steps": steps, "train_step_seconds": 0.25,
                                                "vllm_startup_seconds": 0.2,
                                                "merge_seconds": 0.05})
    return store, cloud, ensure_key(tmp / "key")[0]


def db_lock(tmp: Path, hold_s: float = 15.0, wait_s: str = "") -> Result:
    """Another process holds SQLite's write lock `hold_s` mid-training (BEGIN IMMEDIATE);
    with `wait_s` (ORCH_DB_LOCK_WAIT_S) shorter than the hold, the job is requeued."""
    from emulators.machinefaults import SqliteLock

    from orchestrator.engine.runner import JobRunner, Options, owner_id

    os.environ["ORCH_DB_LOCK_WAIT_S"] = wait_s
    store, cloud, key = _sim_rig(tmp)
    opts = Options(poll_s=0.2, watch_s=0.2, lease_s=5, ssh_key=key)
    try:
        job_id = _queue(store, tmp, "sim")
        held: list[SqliteLock] = []

        def hold() -> None:
            _wait(lambda: any(e.kind == "train.progress" for e in store.events(job_id)))
            held.append(SqliteLock(tmp / "orch.db", hold_s))

        threading.Thread(target=hold, daemon=True).start()
        owner = owner_id("worker")
        store.claim_job(job_id, owner, 5)
        left = 0
        try:
            first = JobRunner(store, {"sim": cloud}, owner, opts,
                              on_signal="requeue").run(job_id).status
        except Exception as exc:  # DatabaseBusy (named, not imported: runs on older orch too)
            first, left = type(exc).__name__, len(cloud.list())
        released = held[0].released()
        status = store.get_job(job_id).status
        if status == "queued":  # requeued: a worker resumes it
            store.claim_job(job_id, owner, 5)
            JobRunner(store, {"sim": cloud}, owner, opts, on_signal="requeue").run(job_id)
        job = store.get_job(job_id)
        lost, dups = _counts(tmp / "orch.db")
        waited = job.finished_at is not None and job.finished_at > released
        return Result(f"SQLite lock held {hold_s:.0f}s mid-training"
                      + (f", wait {wait_s}s" if wait_s else ""), len(cloud.list()),
                      lost + (job.status != "succeeded"), dups, 0.0, None,
                      f"{first} ({status}; {left} instance(s) left at the error); then "
                      f"{job.status}; ended after the lock: {waited} "
                      f"{(job.failure_reason or '')[:60]}")
    finally:
        os.environ.pop("ORCH_DB_LOCK_WAIT_S", None)
        cloud.terminate_all()
        store.close()


def db_lock_past_wait(tmp: Path) -> Result:
    """The lock held 6 s while writers wait 2 s in all: requeued, instance torn down."""
    return db_lock(tmp, hold_s=6.0, wait_s="2")


def clock_ahead(tmp: Path, skew_s: int = 120) -> Result:
    """`orch reconcile` on a machine whose clock runs `skew_s` ahead, mid-training, against
    one PostgreSQL: a live job must not be requeued."""
    import pgserver
    from emulators.machinefaults import skewed_clock_env

    from orchestrator.engine.runner import JobRunner, Options, ensure_key, owner_id
    from orchestrator.records.store import open_store
    from providers.sim.compute import SimCloud

    server = pgserver.start()
    try:
        url = server.create_database("skew")
        os.environ["XDG_DATA_HOME"] = str(tmp / "xdg")
        store = open_store(url)
        cloud = SimCloud(tmp / "sim", host_options={"train_steps": 40, "train_step_seconds": 0.25,
                                                    "vllm_startup_seconds": 0.2})
        env = {**os.environ, "ORCH_DB_URL": url, **skewed_clock_env(tmp / "skew", skew_s)}
        job_id = _queue(store, tmp, "sim")
        actions: list[str] = []

        def reconcile() -> None:
            _wait(lambda: any(e.kind == "train.progress" for e in store.events(job_id)))
            out = subprocess.run([ORCH, "reconcile", "--json"], env=env, cwd=ROOT,
                                 capture_output=True, text=True, timeout=120)
            actions.extend(a["kind"] for a in json.loads(out.stdout)["actions"])

        threading.Thread(target=reconcile, daemon=True).start()
        owner = owner_id("worker")
        store.claim_job(job_id, owner, 5)
        job = JobRunner(store, {"sim": cloud}, owner, Options(
            poll_s=0.2, watch_s=0.2, lease_s=5, ssh_key=ensure_key(tmp / "key")[0]),
            on_signal="requeue").run(job_id)
        leaked = len(cloud.list())
        cloud.terminate_all()
        store.close()
        return Result(f"reconcile with a clock {skew_s}s ahead (PostgreSQL)", leaked,
                      int(job.status != "succeeded"), 0, 0.0, None,
                      f"{job.status}; reconcile requeued it: {'requeue' in actions}")
    finally:
        server.stop()


def disk_full(tmp: Path) -> Result:
    """The disk under the SQLite file fills mid-training (a tmpfs filled to ENOSPC): the
    worker stops with one line, the instance is torn down, the next `orch` repairs."""
    from emulators.machinefaults import SmallDisk

    disk = SmallDisk(tmp / "dbfs")
    s = SimEnv(tmp, ORCH_SIM_TRAIN_STEPS="60", ORCH_SIM_STEP_S="0.1")
    s.env["ORCH_DB_URL"] = f"sqlite:///{disk.mount / 'orch.db'}"  # SimEnv drops the caller's
    copy = tmp / "copy.db"

    def ask(sql: str) -> list[tuple[Any, ...]]:
        # A copy read here (see SmallDisk); a stale -wal copy would replay old pages.
        for suffix in ("", "-wal"):
            Path(f"{copy}{suffix}").unlink(missing_ok=True)
            if (disk.path / f"orch.db{suffix}").exists():
                shutil.copy(disk.path / f"orch.db{suffix}", f"{copy}{suffix}")
        return _q(copy, sql)

    def run_in(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*disk.enter(ROOT), ORCH, *args], env=s.env, cwd=ROOT,
                              capture_output=True, text=True, timeout=300)

    try:
        run_in("submit", "examples/quickstart.yml", "--detach")
        worker = subprocess.Popen([*disk.enter(ROOT), ORCH, "worker", "--once"], env=s.env,
                                  cwd=ROOT, stderr=subprocess.PIPE, text=True)
        _wait(lambda: ask("SELECT count(*) FROM event WHERE kind = 'train.progress'")[0][0])
        disk.fill()
        full = datetime.now(UTC)
        _, err = worker.communicate(timeout=120)
        # Billed after the disk filled, at most: the worker terminates before it exits (the
        # row stays open until the resuming worker closes it, so the rows cannot say).
        billed = (datetime.now(UTC) - full).total_seconds()
        left = s.live()
        line = err.strip().splitlines()[-1] if err.strip() else ""
        disk.free()
        time.sleep(LEASE_S + 0.5)
        run_in("jobs")
        requeued = ask("SELECT status FROM job")[0][0]
        run_in("worker", "--once")
        status = ask("SELECT status FROM job")[0][0]
        lost, dups = _counts(copy)
        return Result("disk full under SQLite mid-training", s.live() + left, lost, dups,
                      billed, None,
                      f"worker exit {worker.returncode}, traceback: {'Traceback' in err}; "
                      f"{left} instance(s) left; next orch: {requeued}; then {status}; "
                      f"said: {line[:60]}")
    finally:
        disk.close()
# --- network and provider faults (issue 23) ---------------------------------------------------


def _net_rig(tmp: Path, plans: list[list[Any]]) -> tuple[Any, Any, Any]:
    """A store and the Vast.ai emulator whose hosts sit behind `tcpfault` proxies."""
    from emulators.hosts import SimHostBackend
    from emulators.tcpfault import FaultyHosts
    from emulators.vast import VastEmulator

    from orchestrator.records.store import open_store

    os.environ["XDG_DATA_HOME"] = str(tmp / "xdg")
    store = open_store(f"sqlite:///{tmp / 'orch.db'}")
    hosts = FaultyHosts(SimHostBackend(tmp / "hosts", {
        "train_steps": 4, "train_step_seconds": 0.1, "vllm_startup_seconds": 0.2,
        "merge_seconds": 0.05}), plans)
    emu = VastEmulator(api_key="bench-key", hosts=hosts).start()
    emu.add_offer(id=1, gpu_name="RTX 4090", dph_base=0.40, min_bid=0.20)
    emu.add_offer(id=2, gpu_name="RTX 5090", gpu_ram=32768, dph_base=0.60, min_bid=0.30)
    return store, hosts, emu


def _drive(store: Any, emu: Any, hosts: Any, job_id: str, **adapter: Any) -> tuple[Any, float]:
    """Claim and run one job as `orch worker` does, with the real retry policy."""
    from orchestrator.engine.runner import JobRunner, Options, owner_id
    from providers.vastai.compute import VastAI

    owner = owner_id("worker")
    store.claim_job(job_id, owner, 5)
    t = time.monotonic()
    job = JobRunner(store, {"vastai": hosts.serving(VastAI("bench-key", base_url=emu.url,
                                                           **adapter))},
                    owner, Options(poll_s=0.2, watch_s=0.2, lease_s=5),
                    on_signal="requeue").run(job_id)
    return job, time.monotonic() - t


def _net_result(name: str, store: Any, emu: Any, job: Any, note: str,
                recover: float | None = None) -> Result:
    lost, dups = _counts(Path(str(store.engine.url.database)))
    rows = [r.end_reason for r in store.instances_of(job.id)]
    return Result(name, len(emu.instances), lost, dups, 0.0, recover,
                  f"{job.status}{': ' + job.failure_reason[:70] if job.failure_reason else ''}"
                  f"; instances {rows}; {note}")


def ssh_reset(tmp: Path) -> Result:
    """RST of the session's SSH connection 200 KB into a ~0.5 MB dataset upload; the same
    job without the fault first, for the time it costs."""
    store, hosts, emu = _net_rig(tmp, [[], [None, ("reset", 200_000)]])
    try:
        shutil.copytree(ROOT / "examples" / "data", tmp / "jobs" / "data")
        line = json.dumps({"instruction": "Repeat.", "input": "", "output": "x" * 100})
        (tmp / "jobs" / "data" / "train.jsonl").write_text(f"{line}\n" * 4000)
        plain, plain_s = _drive(store, emu, hosts, _queue(store, tmp, "vastai"))
        job, took = _drive(store, emu, hosts, _queue(store, tmp, "vastai"))
        again = sum(e.kind == "ssh.reconnect" for e in store.events(job.id))
        return _net_result("SSH reset mid-upload", store, emu, job,
                           f"{again} reconnect(s); job {took:.1f}s vs {plain_s:.1f}s "
                           f"without the reset ({plain.status})")
    finally:
        emu.stop()
        hosts.stop_all()
        store.close()


def no_banner(tmp: Path) -> Result:
    """The cheapest offer's host accepts TCP and never sends an SSH banner (default
    connect deadline 300 s); a second offer is fine."""
    store, hosts, emu = _net_rig(tmp, [["silent"] * 1000])
    try:
        job, took = _drive(store, emu, hosts, _queue(store, tmp, "vastai"))
        created = [e.at for e in store.events(job.id) if e.kind == "instance.created"]
        moved = ((created[1] - created[0]).total_seconds() if len(created) > 1 else None)
        return _net_result("host sends no SSH banner", store, emu, job,
                           f"job {took:.1f}s", moved)
    finally:
        emu.stop()
        hosts.stop_all()
        store.close()


def dripping_search(tmp: Path, interval_s: float = 2.0, cap_s: float = 300.0) -> Result:
    """One byte every 2 s on the offer search, the adapter's defaults (30 s per read,
    120 s per round of retries): how long the job stays in `provisioning` (capped)."""
    store, hosts, emu = _net_rig(tmp, [])
    try:
        emu.drip_next(1_000_000, interval_s, method="POST", path="/api/v0/bundles")
        job_id = _queue(store, tmp, "vastai")
        done: list[Any] = []
        threading.Thread(target=lambda: done.append(_drive(store, emu, hosts, job_id)),
                         daemon=True).start()
        t = time.monotonic()
        while not done and time.monotonic() - t < cap_s:
            time.sleep(0.5)
        if not done:
            job = store.get_job(job_id)
            return _net_result("search drips 1 byte / 2 s", store, emu, job,
                               f"still {job.status} after {cap_s:.0f}s")
        job, took = done[0]
        return _net_result("search drips 1 byte / 2 s", store, emu, job,
                           f"left provisioning after {took:.1f}s (docs: 120 s)")
    finally:
        emu.stop()
        hosts.stop_all()
        store.close()


def price_changed(tmp: Path) -> Result:
    """The 4090's minimum bid rises between orch's search and its create (HTTP 400
    invalid_price)."""
    store, hosts, emu = _net_rig(tmp, [])
    try:
        emu.reprice_before_create(1, min_bid=0.25)
        job, took = _drive(store, emu, hosts, _queue(store, tmp, "vastai"))
        bids = [r.json.get("price") for r in emu.requests_to("PUT", "/api/v0/asks")]
        return _net_result("price changed before create", store, emu, job,
                           f"bids {bids}; job {took:.1f}s")
    finally:
        emu.stop()
        hosts.stop_all()
        store.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--only", help="run the scenarios whose name contains this text")
    args = ap.parse_args()
    import logging

    logging.getLogger("paramiko").setLevel(logging.CRITICAL)  # probes of booting hosts
    scenarios: dict[str, Callable[[Path], Result]] = {
        **{f"crash:{p}": (lambda tmp, p=p: crash(p, tmp)) for p in CRASH_POINTS},
        "foreground": foreground,
        "outage": outage,
        "retry-after": long_retry_after,
        "black-hole": black_hole,
        "db-lock": db_lock,
        "db-lock-past-wait": db_lock_past_wait,
        "db-clock-ahead": clock_ahead,
        "db-disk-full": disk_full,
        "ssh-reset": ssh_reset,  # issue 23 §2-§5
        "no-banner": no_banner,
        "drip": dripping_search,
        "price-changed": price_changed,
    }
    print(f"{'scenario':44} {'leaked':>6} {'lost':>5} {'dup':>4} {'idle s':>7} "
          f"{'bound':>6} {'recover s':>9}  note")
    for key, scenario in scenarios.items():
        if args.only and args.only not in key:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            try:
                r = scenario(Path(tmp))
            except Exception as exc:  # report and go on: one broken scenario is a result too
                print(f"{key:44} ERROR {type(exc).__name__}: {exc}"[:200])
                continue
        rec = f"{r.recover_s:9.1f}" if r.recover_s is not None else f"{'-':>9}"
        print(f"{r.name[:44]:44} {r.leaked:6d} {r.lost:5d} {r.duplicates:4d} {r.idle_s:7.1f} "
              f"{r.bound_s:6.1f} {rec}  {r.note}", flush=True)
    print(json.dumps({"grace_s": GRACE_S, "lease_s": LEASE_S}))


if __name__ == "__main__":
    main()
