"""20 jobs on a simulated market where a fifth of the machines are bad: host checks off and on,
side by side, and the same jobs on an all-good market (issue 40).

Three arms, each in a state directory of its own, run the same 20 queued jobs (the quickstart
QLoRA job at 1, 2 and 3 epochs) through 4 workers (the product's own `orch worker` loop,
`engine.worker.work`, one thread each, against one SQLite file):
- off:  `seed=40,bad=0.2` (a fifth of every GPU model's machines bad, each with one fault of
        providers/sim/market.yaml: slow GPU, wrong GPU, slow disk, old driver, no route to
        the Hub, a crawling Hub), ORCH_HOST_CHECKS=off;
- on:   the same market, ORCH_HOST_CHECKS=on (a machine failing its check is released at
        once and the job placed again);
- good: `bad=0`, checks on (what the jobs cost where no machine is bad).
The machines are container rentals (as Vast.ai and RunPod rent them): the check's matmul
runs in the image's environment. Setup and training are scaled down (boot --boot-s, the
model 200 MB: a crawling Hub's machine takes ~70 s to fetch it; --steps x --step-s of
training per epoch), so the check's few seconds weigh far more here than on an hours-long
real job (the "seconds in checks" row says how much). Dollars are the jobs' recorded cost
(every instance they held, the rejected ones included: the sim meter's per-second price);
failed = jobs that ended `failed`. Asserts nothing (machines are noisy). Usage:
    python bench/bad_hosts.py [--jobs 20] [--workers 4] [--market seed=40,bad=0.2]
The last line reads `off_usd=... on_usd=... off_failed=... on_failed=... good_usd=...`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from orchestrator.core.jobstatus import JobStatus  # noqa: E402
from orchestrator.core.money import from_micros  # noqa: E402
from orchestrator.core.spec import load_job  # noqa: E402
from orchestrator.engine.runner_core import Options, owner_id  # noqa: E402
from orchestrator.engine.submission import record_job  # noqa: E402
from orchestrator.engine.worker import Timings, work  # noqa: E402
from orchestrator.records.store import open_store  # noqa: E402
from providers.sim.compute import SimCloud  # noqa: E402
from providers.sim.market import Market  # noqa: E402

RENTAL = "axolotlai/axolotl-cloud:0.18.0-py3.12-cu130-2.12.0"
MODEL_BYTES = 200_000_000


@dataclass
class Arm:
    """One arm's outcome."""

    usd: Decimal
    failed: int
    succeeded: int
    wall_s: float
    rented: int
    rejected: int
    billed_s: int
    check_s: float  # seconds the host checks took (their reports), on every machine
    ends: Counter[str]


def _jobs(folder: Path, count: int) -> list[Path]:
    shutil.copytree(ROOT / "examples" / "data", folder / "data")
    text = (ROOT / "examples" / "quickstart.yml").read_text()
    paths = []
    for n in range(count):
        path = folder / f"job-{n:02d}.yml"
        path.write_text(text.replace("epochs: 1", f"epochs: {1 + n % 3}")
                        .replace("name: quickstart-qwen25-05b", f"name: bad-hosts-{n:02d}"))
        paths.append(path)
    return paths


def run_arm(market: str, checks: bool, args: argparse.Namespace) -> Arm:
    """Queue the jobs in a fresh state directory and run them through the workers."""
    with tempfile.TemporaryDirectory(prefix="bad-hosts-") as d:
        tmp = Path(d)
        os.environ["XDG_DATA_HOME"] = str(tmp / "xdg")
        os.environ["ORCH_HOST_CHECKS"] = "on" if checks else "off"
        url = f"sqlite:///{tmp / 'orch.db'}"
        store = open_store(url)
        for path in _jobs(tmp / "jobs", args.jobs):
            record_job(store, load_job(path))
        cloud = SimCloud(tmp / "xdg" / "orch" / "sim", market=Market.parse(market),
                         boot_seconds=args.boot_s,
                         host_options={"container_image": RENTAL, "has_docker": False,
                                       "train_steps": args.steps,
                                       "train_step_seconds": args.step_s,
                                       "model_size_bytes": MODEL_BYTES, "merge_seconds": 0.1,
                                       "vllm_startup_seconds": 0.2})
        options = Options(poll_s=0.5, watch_s=0.5, lease_s=30, boot_deadline_s=120,
                          connect_deadline_s=60)
        timings = Timings(normal=options, quick=options)
        errors: list[BaseException] = []

        def worker(n: int) -> None:
            own = open_store(url)
            try:
                work(own, {"sim": cloud}, owner_id(f"bench{n}"), timings, once=True,
                     max_jobs=0, poll=0.2, say=lambda line, always: None, current=[])
            except BaseException as exc:  # reported after the arm
                errors.append(exc)
            finally:
                own.close()

        started = time.monotonic()
        threads = [threading.Thread(target=worker, args=(n,)) for n in range(args.workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.monotonic() - started
        with contextlib.suppress(Exception):
            cloud.terminate_all()
        if errors:
            raise SystemExit(f"a worker failed: {errors[0]!r}")
        jobs = store.list_jobs(limit=10_000)
        rows = [r for j in jobs for r in store.instances_of(j.id)]
        billed = cloud.billed()
        checks_s = sum(float(json.loads(e.data_json or "{}")["report"]["seconds"])
                       for j in jobs for e in store.events(j.id) if e.kind == "host.checked")
        arm = Arm(usd=sum((from_micros(j.cost_micros) for j in jobs), Decimal(0)),
                  failed=sum(j.status == JobStatus.FAILED for j in jobs),
                  succeeded=sum(j.status == JobStatus.SUCCEEDED for j in jobs),
                  wall_s=wall, rented=len(rows),
                  rejected=sum(r.end_reason == "host_check_failed" for r in rows),
                  billed_s=sum(billed.values()), check_s=round(checks_s, 1),
                  ends=Counter(str(r.end_reason) for r in rows))
        for j in jobs:
            if j.status == JobStatus.FAILED and args.verbose:
                print(f"  {j.name} failed: {(j.failure_reason or '').splitlines()[0][:160]}")
        store.close()
        return arm


def _ratio(value: Decimal | int, base: Decimal | int) -> str:
    return f"{float(value) / float(base):.2f}" if base else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--market", default="seed=40,bad=0.2",
                        help="the bad market (ORCH_SIM_MARKET's form)")
    parser.add_argument("--boot-s", type=float, default=2.0,
                        help="seconds until a simulated machine runs")
    parser.add_argument("--steps", type=int, default=20, help="training steps per epoch")
    parser.add_argument("--step-s", type=float, default=0.5, help="seconds per training step")
    parser.add_argument("--verbose", action="store_true", help="say why each failed job failed")
    args = parser.parse_args()
    good_market = ",".join(p for p in args.market.split(",") if not p.startswith("bad="))
    print(f"{args.jobs} jobs (quickstart QLoRA, 1-3 epochs of {args.steps} x {args.step_s:g} s),"
          f" {args.workers} workers; market {args.market!r}; boot {args.boot_s:g} s, model "
          f"{MODEL_BYTES / 1e6:.0f} MB", flush=True)
    arms = {}
    for name, market, checks in (("off", args.market, False), ("on", args.market, True),
                                 ("good", good_market + ",bad=0", True)):
        arms[name] = run_arm(market.strip(","), checks, args)
        done = arms[name]
        print(f"  {name}: ${done.usd} {done.succeeded} succeeded {done.failed} failed in "
              f"{done.wall_s:.0f} s; {done.rented} machines ({dict(done.ends)})", flush=True)
    off, on, good = arms["off"], arms["on"], arms["good"]
    rows: list[tuple[str, Decimal | int, Decimal | int, Decimal | int]] = [
        ("dollars", off.usd, on.usd, good.usd),
        ("billed seconds", off.billed_s, on.billed_s, good.billed_s),
        ("seconds in checks", Decimal(str(off.check_s)), Decimal(str(on.check_s)),
         Decimal(str(good.check_s))),
        ("failed jobs", off.failed, on.failed, good.failed),
        ("machines rented", off.rented, on.rented, good.rented),
        ("rejected by check", off.rejected, on.rejected, good.rejected),
        ("wall seconds", round(off.wall_s), round(on.wall_s), round(good.wall_s))]
    print(f"{'':<20}{'off':>12}{'on':>12}{'good':>12}{'off/good':>10}{'on/good':>10}")
    for name, a, b, c in rows:
        print(f"{name:<20}{a!s:>12}{b!s:>12}{c!s:>12}{_ratio(a, c):>10}{_ratio(b, c):>10}")
    print(f"off_usd={off.usd} on_usd={on.usd} off_failed={off.failed} on_failed={on.failed} "
          f"good_usd={good.usd}")


if __name__ == "__main__":
    main()
