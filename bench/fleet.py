"""A fleet of workers against one PostgreSQL: claim throughput, duplicates and queue latency.

A team runs `orch worker` on several machines against one database (docs/team.md). This
starts a throwaway PostgreSQL cluster on 127.0.0.1 (Debian's postgresql, as the tests do) and
measures, side by side for 4, 8, 16 and 32 workers:

- claims: worker processes, each in its own process group (a "host"), loop on
  `Store.claim_next` over M queued jobs and finish each job at once, so what is measured is
  the database's queue: claims per second, duplicate claims (a job taken by two workers;
  must be 0), and queue latency (queued -> claimed: median and worst), and the CPU each
  claim costs: the workers' own, their PostgreSQL backends', and the whole machine's (which
  counts whatever else runs on it);
- the same with each claimed job held `--hold-ms` (250 ms) before it is finished, as a
  worker runs its job between claims: the fleet's rate is then the workers' (N / hold),
  and what the queue must show is that it keeps up: claims/s grows with the workers and
  the wait in `claim_next` stays flat. Back to back, 32 Python workers and their server
  share 2 cores, so the first table measures this machine's CPU as much as the queue;
- end to end (`--e2e`): real `orch worker --once` processes run M queued `sim` jobs with a
  short training each, over SSH to simulated hosts, and the same three numbers are read
  from the history. On 2 cores the simulated hosts, not the database, are the limit.

Asserts nothing (these machines are noisy). Usage:
    python bench/fleet.py [--jobs 800] [--workers 4,8,16,32] [--hold-ms 250] [--e2e]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import pgserver  # noqa: E402

from orchestrator.core.spec import load_job  # noqa: E402
from orchestrator.engine.submission import record_job  # noqa: E402
from orchestrator.records.store import open_store  # noqa: E402

ORCH = shutil.which("orch", path=str(Path(sys.executable).parent)) or "orch"

# One worker process of the claims benchmark: claim, finish at once, until the queue is empty.
CLAIMER = """
import json, sys, time
from orchestrator.records.store import open_store
url, owner, hold = sys.argv[1], sys.argv[2], float(sys.argv[3])
store = open_store(url)
# One whole claim-and-finish cycle before the clock starts (the bench queued one job per
# worker for it): a worker's first use of each statement and ORM path (compilation, caches)
# is part of its start, which a real worker pays once in hours, not the queue's work.
job = store.claim_next(owner, 30)
if job is not None:
    store.set_status(job.id, owner, "succeeded", "bench warm-up", lease_owner=None)
print("ready", flush=True)
sys.stdin.readline()
waits = []  # seconds each claim_next call took: what a worker waits on the queue
while True:
    t = time.perf_counter()
    job = store.claim_next(owner, 30)
    waits.append(time.perf_counter() - t)
    if job is None:
        break
    if hold:
        time.sleep(hold)  # the job runs (a real one for hours): the worker is not claiming
    store.set_status(job.id, owner, "succeeded", "bench", lease_owner=None)
print(json.dumps({"claimed": len(waits) - 1, "waits": waits[:-1]}), flush=True)
sys.stdin.readline()  # stay connected until the bench has read this worker's and its backend's CPU
"""


def _t(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _queue(url: str, n: int) -> set[str]:
    store = open_store(url)
    loaded = load_job(ROOT / "examples" / "quickstart.yml")
    ids = {record_job(store, loaded)[0].id for _ in range(n)}
    store.close()
    return ids


def _claims_of(url: str, left_out: set[str] = frozenset()) -> tuple[int, int, list[float]]:
    """(jobs claimed, duplicate claims, queue latencies in s) read from the events, the jobs
    `left_out` (the workers' warm-up) not counted."""
    store = open_store(url)
    with store.engine.connect() as conn:
        created = {jid: _t(at) for jid, at in conn.exec_driver_sql(
            "SELECT id, created_at FROM job") if jid not in left_out}
        claims: dict[str, list[float]] = {}
        for jid, at, data in conn.exec_driver_sql(
                "SELECT job_id, at, data_json FROM event WHERE kind = 'state' ORDER BY id"):
            if jid in created and json.loads(data or "{}").get("status") == "provisioning":
                claims.setdefault(jid, []).append(_t(at))
    store.close()
    # A job resumed after an interruption is claimed again legitimately; in these runs
    # nothing is interrupted, so any second claim is a duplicate.
    dupes = sum(len(v) - 1 for v in claims.values())
    latency = [min(v) - created[j] for j, v in claims.items()]
    return len(claims), dupes, latency


def _busy_s() -> float:
    """CPU seconds this machine has spent busy (all processes, PostgreSQL's included)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields) - idle) / os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process `pid` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _backends(url: str) -> list[int]:
    """The pids of the PostgreSQL backends serving the workers (the server is local)."""
    store = open_store(url)
    with store.engine.connect() as conn:
        pids = [int(pid) for (pid,) in conn.exec_driver_sql(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND backend_type = 'client backend' AND pid <> pg_backend_pid()")]
    store.close()
    return pids


def claims(server: pgserver.PgServer, jobs: int, workers: int, hold_s: float = 0.0) -> str:
    url = server.create_database("fleet")
    open_store(url).close()  # the schema, before the workers open it
    warm_up = _queue(url, workers)  # one job each, claimed and finished before the clock
    procs = [subprocess.Popen([sys.executable, "-c", CLAIMER, url, f"bench:host{n}:w{n}",
                               str(hold_s)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              cwd=ROOT, start_new_session=True)
             for n in range(workers)]
    for p in procs:
        assert p.stdout is not None
        assert p.stdout.readline().strip() == "ready"
    # Queued once every worker is connected and warm (its first statements compiled), and
    # timed until each has said how many it claimed, not past its exit: a worker's start
    # and end are not the queue's work, and with 32 workers and few jobs they dominated.
    _queue(url, jobs)
    backends = _backends(url)
    mine = [p.pid for p in procs] + backends
    before = {pid: _cpu_s(pid) for pid in mine}
    started, busy = time.monotonic(), _busy_s()
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    said = [json.loads(p.stdout.readline()) for p in procs if p.stdout is not None]
    done = sum(s["claimed"] for s in said)
    waits = sorted(w for s in said for w in s["waits"])
    wall, cpu = time.monotonic() - started, _busy_s() - busy
    used = {pid: _cpu_s(pid) - before[pid] for pid in mine}
    client = sum(used[p.pid] for p in procs)
    backend = sum(used[pid] for pid in backends)
    for p in procs:
        p.communicate(timeout=600)
    claimed, dupes, latency = _claims_of(url, warm_up)
    # CPU per claim: on a machine with fewer cores than workers, claims/s can only hold if
    # this does. The workers' and their backends' own CPU says whether the queue's work
    # grows with the workers; the machine's also counts the kernel's switching between them
    # and anything else running here (on a shared machine, other people's work).
    per = 1000 / max(done, 1)
    # Holding each job, a worker cannot claim more than 1 / hold per second.
    bound = f" ({done / wall / (workers / hold_s):4.0%} of N/hold)" if hold_s else ""
    return (f"  {workers:3d} workers  {done:5d} claims in {wall:6.2f}s = {done / wall:7.1f}/s"
            f"{bound}  "
            f"cpu ms/claim: workers {client * per:5.2f} + server {backend * per:5.2f} = "
            f"{(client + backend) * per:5.2f}, machine {cpu * per:5.2f} ({cpu / wall:4.2f} cores)  "
            f"duplicates {dupes}  unclaimed {jobs - claimed}  queue latency median "
            f"{statistics.median(latency):5.2f}s worst {max(latency):5.2f}s  claim_next median "
            f"{statistics.median(waits) * 1000:5.1f} ms p95 "
            f"{waits[int(len(waits) * .95)] * 1000:5.1f} ms")


def e2e(server: pgserver.PgServer, jobs: int, workers: int) -> str:
    url = server.create_database("e2e")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        env = {**os.environ, "XDG_DATA_HOME": str(tmp), "ORCH_DB_URL": url,
               "ORCH_SIM_TRAIN_STEPS": "4", "ORCH_SIM_STEP_S": "0.1", "ORCH_LEASE_S": "30"}
        for key in ("VAST_API_KEY", "RUNPOD_API_KEY"):
            env.pop(key, None)
        os.environ["XDG_DATA_HOME"] = str(tmp)
        _queue(url, jobs)
        started = time.monotonic()
        procs = [subprocess.Popen([ORCH, "worker", "--once", "--quiet", "--poll", "0.2"],
                                  env=env, cwd=ROOT, start_new_session=True)
                 for _ in range(workers)]
        for p in procs:
            p.wait(timeout=1800)
        wall = time.monotonic() - started
        from providers.sim.compute import SimCloud

        SimCloud(tmp / "orch" / "sim").terminate_all()
    claimed, dupes, latency = _claims_of(url)
    store = open_store(url)
    with store.engine.connect() as conn:
        status = dict(conn.exec_driver_sql("SELECT status, count(*) FROM job GROUP BY status")
                      .all())
    store.close()
    return (f"  {workers:3d} workers  {claimed:3d} jobs in {wall:6.1f}s = "
            f"{claimed / wall * 60:5.1f} jobs/min  duplicates {dupes}  {status}  queue latency "
            f"median {statistics.median(latency):6.1f}s worst {max(latency):6.1f}s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=800, help="queued jobs, back-to-back runs")
    ap.add_argument("--hold-ms", type=float, default=250,
                    help="how long each worker holds a job it claimed in the second table "
                         "(0 leaves that table out)")
    ap.add_argument("--held-jobs", type=int, default=20,
                    help="queued jobs per worker in the second table")
    ap.add_argument("--workers", default="4,8,16,32")
    ap.add_argument("--e2e", action="store_true", help="also run real sim jobs end to end")
    ap.add_argument("--e2e-jobs", type=int, default=12)
    ap.add_argument("--e2e-workers", default="2,4")
    args = ap.parse_args()
    why = pgserver.available()
    if why is not None:
        sys.exit(f"fleet: {why}")
    server = pgserver.start()
    try:
        print(f"claims: {args.jobs} queued jobs, one PostgreSQL on 127.0.0.1:{server.port}")
        for n in (int(x) for x in args.workers.split(",")):
            print(claims(server, args.jobs, n), flush=True)
        if args.hold_ms:
            print(f"claims: {args.held_jobs} queued jobs per worker, each held "
                  f"{args.hold_ms:g} ms by the worker that claimed it")
            for n in (int(x) for x in args.workers.split(",")):
                print(claims(server, args.held_jobs * n, n, args.hold_ms / 1000), flush=True)
        if args.e2e:
            print(f"end to end: {args.e2e_jobs} sim jobs (4 steps x 0.1 s) per run")
            for n in (int(x) for x in args.e2e_workers.split(",")):
                print(e2e(server, args.e2e_jobs, n), flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
