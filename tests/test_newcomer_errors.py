"""Errors that say what to do (issue 25, items 7-13), run as the user ran the commands."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import orchfork

ROOT = Path(__file__).resolve().parent.parent
ORCH = str(Path(sys.executable).parent / "orch")


def run(tmp: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return orchfork.run(list(args), cwd=ROOT, timeout=300,
                        env={"PATH": os.environ["PATH"], "HOME": str(tmp), **env})


def test_a_budget_too_low_leads_with_the_money(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "examples", tmp_path / "ex")
    job = tmp_path / "ex" / "quickstart.yml"
    text = job.read_text()
    # The budget as written, even below a hundredth of a cent (it once read "$0.0000").
    for budget, command in (("0.0001", "plan"), ("0.0001", "submit"), ("0.00001", "plan")):
        job.write_text(text.replace("  spot: allowed\n",
                                    f"  spot: allowed\n  max_cost: {budget}\n"))
        proc = run(tmp_path, command, str(job))
        assert proc.returncode == 3, proc.stderr
        found = re.match(rf"error: {re.escape(str(job))}: no placement fits resources.max_cost: "
                         rf"the cheapest that fits costs \$(\S+) > max_cost "
                         rf"\${re.escape(budget)} \(", proc.stderr)
        assert found, proc.stderr
        assert "Try resources.max_cost: " in proc.stderr and "GiB" not in proc.stderr


def test_sql_on_an_unknown_table_lists_the_tables_and_views(tmp_path: Path) -> None:
    assert run(tmp_path, "jobs").returncode == 0  # creates and migrates the database
    proc = run(tmp_path, "sql", "SELECT * FROM jobs")
    assert proc.returncode == 2
    db = tmp_path / ".local" / "share" / "orch" / "orch.db"
    import sqlite3

    with sqlite3.connect(db) as con:
        names = {kind: sorted(n for k, n in con.execute(
            "SELECT type, name FROM sqlite_master WHERE name NOT LIKE 'sqlite%' "
            "AND name != 'alembic_version'") if k == kind) for kind in ("table", "view")}
    listed = re.search(r"orch's tables: (.*); views: (.*) \(their columns: docs/schema\.md\)",
                       proc.stderr)
    assert listed, proc.stderr
    assert sorted(listed.group(1).split(", ")) == names["table"]
    assert sorted(listed.group(2).split(", ")) == names["view"]
    assert proc.stderr.startswith("error: query failed: no such table: jobs; ")
    helptext = " ".join(run(tmp_path, "sql", "-h").stdout.split())
    assert all(n in helptext for n in names["table"] + names["view"]), helptext


def test_jobs_status_filter_with_no_match_and_running(tmp_path: Path) -> None:
    from orchestrator.records.store import open_store

    db = f"sqlite:///{tmp_path / 'orch.db'}"
    assert run(tmp_path, "sweep", "examples/sweep-sim.yml", ORCH_DB_URL=db).returncode == 0
    proc = run(tmp_path, "jobs", "--status", "failed", ORCH_DB_URL=db)
    assert (proc.returncode, proc.stdout) == (
        0, "no jobs match --status failed; `orch jobs` lists them all\n")
    store = open_store(db)
    try:
        taken = store.claim_next("worker:test:1", 600)  # as `orch worker` claims a job
        assert taken is not None
    finally:
        store.close()
    listed = run(tmp_path, "jobs", "--status", "running", "--json", ORCH_DB_URL=db)
    assert listed.returncode == 0, listed.stderr
    import json

    assert [j["job_id"] for j in json.loads(listed.stdout)] == [taken.id]


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_servers_hints_paste_and_a_refused_port_fails_at_once(tmp_path: Path) -> None:
    import shlex

    hint = run(tmp_path, "servers", "list").stdout
    pasted = shlex.split(re.search(r"`(orch servers add [^`]+)`", hint).group(1))  # type: ignore[union-attr]
    assert pasted[pasted.index("--gpu") + 1] == "H100 SXM"
    # The hint as pasted, pointed at this machine's closed port instead of the placeholder H.
    args = [a if a != "H" else "127.0.0.1" for a in pasted[1:]]
    proc = run(tmp_path, *args, "--port", str(closed_port()))
    assert proc.returncode == 3, proc.stderr
    # One attempt, and what to check: not eight retries over ~20 s.
    assert ("the connection was refused; check that sshd runs on the server and listens on "
            "port") in proc.stderr
    assert "attempts" not in proc.stderr
    ambiguous = run(tmp_path, "servers", "add", "box", "--host", "127.0.0.1", "--gpu", "H100",
                    "--monthly", "2190")
    assert ambiguous.returncode == 2
    choices = re.findall(r'--gpu "([^"]+)"', ambiguous.stderr)
    assert sorted(choices) == ["H100 PCIe", "H100 SXM"], ambiguous.stderr


def test_help_is_plain_text_and_usage_errors_are_one_line(tmp_path: Path) -> None:
    proc = run(tmp_path, "report", "-h")
    assert "pip install -e '.[report]'" in " ".join(proc.stdout.split())
    for args in (["jobs", "--bogus"], ["sql"], ["jobs", "--limit", "x"], ["nosuchcommand"]):
        bad = run(tmp_path, *args)
        assert bad.returncode == 2, (args, bad.stderr)
        assert bad.stderr.count("\n") == 1 and bad.stderr.startswith("error: "), bad.stderr
        assert "-h`" in bad.stderr and "│" not in bad.stderr
    # Help paragraphs are wrapped as whole paragraphs at the terminal's width: no line of a
    # paragraph but its last ends early (a docstring's own line break kept inside a rewrap).
    worker = run(tmp_path, "worker", "-h", COLUMNS="80").stdout
    description = worker.split("\n\n")[2]
    lines = description.splitlines()
    assert "loses its lease" in " ".join(description.split())
    assert all(60 <= len(line) <= 80 for line in lines[:-1]), lines


def test_problems_the_schema_and_the_name_checks_find_come_at_once(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "examples", tmp_path / "ex")
    job = tmp_path / "ex" / "quickstart.yml"
    text = job.read_text().replace("learning_rate: 2.0e-4", "learning_rate: -1")
    text = text.replace("  spot: allowed\n  providers: [sim]",
                        "  spot: yes\n  providers: [simm]\n  gpus: [H1000]")
    job.write_text(text)
    proc = run(tmp_path, "plan", str(job))
    assert proc.returncode == 2
    lines = proc.stderr.splitlines()
    keys = [re.match(rf"{re.escape(str(job))}:\d+ (\S+):", line) for line in lines[:-1]]
    assert [k.group(1) for k in keys if k] == [
        "training.learning_rate", "resources.spot", "resources.providers[0]",
        "resources.gpus[0]"], proc.stderr
    assert lines[-1] == f"{job}: 4 problems; nothing was done"
