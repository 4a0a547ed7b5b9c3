"""`orch sweep cancel NAME`, the cancelled column of `orch sweeps`, edited sweeps (warnings,
unique run names), and the sim sweep example (issue 25, items 2 and 3), run as a user would:
`orch` processes against a real SQLite file or PostgreSQL database, real `orch worker`s on
the simulated cloud where a run must really start.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import orchfork
import pytest
from conftest import BACKENDS, database_url
from sqlmodel import col, select

from orchestrator.records.store import Job, Store, open_store, utcnow

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
ORCH = str(Path(sys.executable).parent / "orch")


@pytest.fixture(params=BACKENDS)
def env(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    home.mkdir()
    return {"PATH": os.environ["PATH"], "HOME": str(home),
            "ORCH_DB_URL": database_url(request.param, tmp_path, request)}


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A copy of examples/ (the sim sweep, its base job and data)."""
    shutil.copytree(EXAMPLES, tmp_path / "ex")
    return tmp_path / "ex"


@pytest.fixture
def store(env: dict[str, str]) -> Iterator[Store]:
    with closing(open_store(env["ORCH_DB_URL"])) as s:
        yield s


def orch(env: dict[str, str], *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return orchfork.run(list(args), env=env, cwd=cwd, timeout=300)


def jobs_of(store: Store) -> list[Job]:
    with store.session() as s:
        return list(s.exec(select(Job).order_by(col(Job.created_at), col(Job.id))))


def test_sweep_cancel_cancels_queued_and_flags_running(env: dict[str, str], folder: Path,
                                                       store: Store) -> None:
    assert orch(env, "sweep", str(folder / "sweep-sim.yml")).returncode == 0
    first = jobs_of(store)[0]
    # A worker holds the first run (as `orch worker` claims it: lease and all).
    assert store.claim_job(first.id, "worker:elsewhere:1", 600) is not None
    proc = orch(env, "sweep", "cancel", "sim-lr-sweep")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("sim-lr-sweep: 3 runs cancelled, 1 running run stopping")
    jobs = {j.id: j for j in jobs_of(store)}
    assert [j.status for j in jobs.values() if j.id != first.id] == ["cancelled"] * 3
    assert jobs[first.id].cancel_requested_at is not None
    # No worker can take a run of the sweep any more, and cron does not queue them again.
    assert store.claim_next("worker:other:2", 600) is None
    again = orch(env, "sweep", str(folder / "sweep-sim.yml"), "--json")
    assert json.loads(again.stdout)["counts"]["new"] == 0
    listing = orch(env, "sweeps").stdout.splitlines()
    header, row = listing[0].split(), listing[1].split()
    assert dict(zip(header, row, strict=False))["cancelled"] == "3"
    as_json = json.loads(orch(env, "sweep", "cancel", "sim-lr-sweep", "--json").stdout)
    assert as_json["cancelled"] == [] and as_json["stopping"] == [first.id]


def test_cancel_with_a_sweep_name_says_what_to_run(env: dict[str, str], folder: Path) -> None:
    assert orch(env, "sweep", str(folder / "sweep-sim.yml")).returncode == 0
    proc = orch(env, "cancel", "sim-lr-sweep")
    assert proc.returncode == 4
    assert proc.stderr == ("error: 'sim-lr-sweep' is a sweep, not a job id; cancel all its "
                           "queued and running runs with `orch sweep cancel sim-lr-sweep`\n")
    unknown = orch(env, "sweep", "cancel", "nope")
    assert unknown.returncode == 4 and unknown.stderr.startswith("error: ")


def test_edited_grid_warns_and_keeps_run_names_unique(env: dict[str, str], folder: Path,
                                                      store: Store) -> None:
    path = folder / "sweep-sim.yml"
    assert orch(env, "sweep", str(path)).returncode == 0
    text = path.read_text()
    path.write_text(text.replace("lora.r: [8, 16]", "lora.r: [8, 32]"))
    proc = orch(env, "sweep", str(path))
    assert proc.returncode == 0, proc.stderr
    assert "2 new" in proc.stdout
    assert proc.stderr == (
        f"warning: {path}: 2 runs recorded earlier are not in the sweep any more "
        "(changed in the sweep file: grid.lora.r: [8, 16] -> [8, 32]): sim-lr-sweep-001, "
        "sim-lr-sweep-003; they stay in this sweep's spent ($0.0000) and best\n")
    names = [j.name for j in jobs_of(store)]
    assert len(names) == 6 and len(set(names)) == 6, names
    assert sorted(names)[-2:] == ["sim-lr-sweep-004", "sim-lr-sweep-005"]
    # The next tick finds every run of the edited file: nothing new, no second copy.
    quiet = orch(env, "sweep", str(path), "--json")
    report = json.loads(quiet.stdout)
    assert report["counts"]["new"] == 0 and len(report["warnings"]) == 1


def test_edited_base_file_warns_that_the_grid_runs_again(env: dict[str, str],
                                                         folder: Path) -> None:
    path = folder / "sweep-sim.yml"
    assert orch(env, "sweep", str(path)).returncode == 0
    base = folder / "quickstart.yml"
    base.write_text(base.read_text().replace("epochs: 1", "epochs: 2"))
    proc = orch(env, "sweep", str(path))
    assert "4 new" in proc.stdout
    assert ("4 runs recorded earlier are not in the sweep any more (changed in the base job "
            "file: training.epochs: 1.0 -> 2.0): sim-lr-sweep-000, ") in proc.stderr


def test_sim_sweep_example_runs_as_the_readme_shows(tmp_path: Path) -> None:
    """The README's sweep line, verbatim, in a fresh HOME (the default SQLite file)."""
    readme = (ROOT / "README.md").read_text()
    start = readme.index("`orch sweep examples/sweep-sim.yml")
    line = readme[start + 1:readme.index("`)", start)].replace("\n", " ")
    assert line == ("orch sweep examples/sweep-sim.yml && orch worker --once && "
                    "orch sweep show sim-lr-sweep")
    env = {"PATH": f"{Path(ORCH).parent}:{os.environ['PATH']}", "HOME": str(tmp_path)}
    proc = subprocess.run(["/bin/sh", "-c", line], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert ": 4 runs: 4 succeeded (budget $1.00, spent $0.00" in proc.stdout
    assert "best (max eval.exact_match): " in proc.stdout


def test_sweep_cancel_stops_real_workers_at_once(tmp_path: Path, folder: Path) -> None:
    """Two `orch worker`s on the sim sweep; `orch sweep cancel` while they run: no run starts
    after the cancel, and every run ends cancelled or (finished before it) succeeded."""
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path),
           "ORCH_DB_URL": f"sqlite:///{tmp_path / 'orch.db'}"}
    assert orch(env, "sweep", str(folder / "sweep-sim.yml")).returncode == 0
    workers = [subprocess.Popen([ORCH, "worker", "--once", "--quiet"], env=env, cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
               for _ in range(2)]
    store = open_store(env["ORCH_DB_URL"])
    try:
        deadline = time.monotonic() + 120
        while not any(j.started_at for j in jobs_of(store)) and time.monotonic() < deadline:
            time.sleep(0.2)
        proc = orch(env, "sweep", "cancel", "sim-lr-sweep")
        cancelled_at = utcnow()
        assert proc.returncode == 0, proc.stderr
        for w in workers:
            w.wait(timeout=300)
        jobs = jobs_of(store)
        assert {j.status for j in jobs} <= {"cancelled", "succeeded"}
        late = [j.name for j in jobs if j.started_at and j.started_at > cancelled_at]
        assert late == []
        assert sum(j.status == "cancelled" for j in jobs) >= 2
    finally:
        store.close()
        for w in workers:
            if w.poll() is None:
                w.kill()


def test_sweep_show_at_80_columns_shows_the_swept_values(tmp_path: Path) -> None:
    from termutil import run_tty, visible

    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "TERM": "xterm",
           "ORCH_DB_URL": f"sqlite:///{tmp_path / 'orch.db'}"}
    assert orch(env, "sweep", "examples/sweep-sim.yml").returncode == 0
    code, raw = run_tty(env, "sweep", "show", "sim-lr-sweep", cols=80)
    assert code == 0
    lines = visible(raw).splitlines()
    header = next(line for line in lines if "job" in line.split())
    assert "training.learnin" in header and "lora.r" in header, header
    rows = [line for line in lines if re.search(r"j-[0-9a-f]{12} ", line)]
    table_lines = [header, *rows]
    assert len(rows) == 4 and all(len(line) <= 80 for line in table_lines), lines
    values = [re.search(r"j-[0-9a-f]{12}\s+(\S+)\s+(\S+)", line).groups()  # type: ignore[union-attr]
              for line in rows]
    assert values == [("0.0001", "8"), ("0.0001", "16"), ("0.0002", "8"), ("0.0002", "16")]
    assert not any("…" in line for line in rows), rows


def test_retry_failed_says_cancelled_runs_stay_cancelled(tmp_path: Path) -> None:
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path),
           "ORCH_DB_URL": f"sqlite:///{tmp_path / 'orch.db'}"}
    assert orch(env, "sweep", "examples/sweep-sim.yml").returncode == 0
    assert orch(env, "sweep", "cancel", "sim-lr-sweep").returncode == 0
    proc = orch(env, "sweep", "examples/sweep-sim.yml", "--retry-failed")
    assert proc.returncode == 0
    assert ("note: examples/sweep-sim.yml: 4 cancelled runs stay cancelled: --retry-failed "
            "queues failed runs only (a cancel is final)") in proc.stderr


def test_a_hub_dataset_without_its_size_names_the_tokens_key(tmp_path: Path) -> None:
    shutil.copytree(EXAMPLES, tmp_path / "ex")
    job = tmp_path / "ex" / "quickstart.yml"
    job.write_text(job.read_text().replace("path: data/train.jsonl",
                                           "path: {hf: tatsu-lab/alpaca}"))
    # A sim-only job asks the simulated Hub, which publishes a size (issue 39); a Hub that
    # publishes none (here: none answers) leaves the tokens to the job file.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    proc = orch({"PATH": os.environ["PATH"], "HOME": str(tmp_path), "HF_ENDPOINT": dead},
                "plan", str(job))
    assert proc.returncode == 2
    assert "did not answer" in proc.stderr and "give tokens" in proc.stderr, proc.stderr
