"""One key per concept in --json, money as a decimal string everywhere, booleans as
true/false in CSV (issue 25, item 14), across the commands a script reads after a real run
on the simulated cloud."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import orchfork

ROOT = Path(__file__).resolve().parent.parent
ORCH = str(Path(sys.executable).parent / "orch")
MONEY = re.compile(r"(^|_)(cost|price|spent|budget|amortised|savings|usd|rent)($|_)")


def money_values(value: Any, key: str = "") -> list[tuple[str, Any]]:
    """(key, value) of every money field in a JSON document (`*_micros` are integers by
    design: the database's own unit)."""
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in money_values(v, k)]
    if isinstance(value, list):
        return [p for v in value for p in money_values(v, key)]
    return [(key, value)] if MONEY.search(key) and not key.endswith("micros") else []


def test_json_keys_money_and_csv_booleans(tmp_path: Path) -> None:
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "ORCH_SIM_TRAIN_STEPS": "4",
           "ORCH_SIM_STEP_S": "0.1"}

    def orch(*args: str) -> str:
        return orchfork.run(list(args), env=env, cwd=ROOT, check=True, timeout=300).stdout

    submitted = json.loads(orch("submit", "examples/quickstart.yml", "--json"))
    job_id = submitted["job_id"]
    documents = {"submit": submitted, "jobs": json.loads(orch("jobs", "--json"))[0],
                 "history": json.loads(orch("history", "--json"))[0],
                 "show": json.loads(orch("show", job_id, "--json")),
                 "cancel": json.loads(orch("cancel", job_id, "--json"))}
    for name, doc in documents.items():
        assert doc.get("job_id") == job_id and "id" not in doc, (name, sorted(doc))
    priced = {k: v for k, v in documents.items() if k != "cancel"}  # cancel names no money
    for name, doc in {**priced, "cost": json.loads(orch("cost", "--json")),
                      "plan": json.loads(orch("plan", "examples/quickstart.yml", "--json"))
                      }.items():
        found = money_values(doc)
        assert found, name
        for key, value in found:
            assert value is None or (isinstance(value, str)
                                     and re.fullmatch(r"-?\d+(\.\d+)?", value)), \
                (name, key, value)
    rows = list(csv.DictReader(io.StringIO(orch("history", "--csv"))))
    assert rows[0]["job_id"] == job_id and rows[0]["spot"] in ("true", "false")


TIME_LIKE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d")
ONE_FORM = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z")


def times(value: Any, where: str = "") -> list[tuple[str, str]]:
    """(where, text) of every string in a JSON document that starts like an ISO time."""
    if isinstance(value, dict):
        return [t for k, v in value.items() for t in times(v, f"{where}.{k}")]
    if isinstance(value, list):
        return [t for i, v in enumerate(value) for t in times(v, f"{where}[{i}]")]
    if isinstance(value, str) and value.startswith("{"):
        try:  # an event's data, as `orch logs --json` gives it
            return times(json.loads(value), where)
        except ValueError:
            pass
    return [(where, value)] if isinstance(value, str) and TIME_LIKE.match(value) else []


def test_every_json_time_has_one_form(tmp_path: Path) -> None:
    """Issue 36 §6: `--json` wrote `+00:00` in some places and `Z` in others; every time is
    now UTC as the database stores it, `YYYY-MM-DDTHH:MM:SS.ffffffZ` (docs/schema.md)."""
    import shutil

    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "ORCH_SIM_TRAIN_STEPS": "4",
           "ORCH_SIM_STEP_S": "0.1", "HF_ENDPOINT": os.environ["HF_ENDPOINT"]}
    shutil.copytree(ROOT / "examples", tmp_path / "ex")
    job = tmp_path / "ex" / "quickstart.yml"
    # Kept warm afterwards: `orch warm`, `plan` and the job's events then carry its window.
    job.write_text(job.read_text().replace("  spot: allowed\n", "  spot: allowed\n"
                                           "  keep_warm: 15m\n"))

    def orch(*args: str) -> Any:
        return json.loads(orchfork.run(list(args), env=env, cwd=tmp_path, check=True,
                                       timeout=300).stdout)

    try:
        check_every_json_time(orch, env, tmp_path, job)
    finally:  # the machine the job left warm: released, as `orch warm release` does
        from providers.sim.compute import SimCloud

        SimCloud(tmp_path / ".local" / "share" / "orch" / "sim").terminate_all()


def check_every_json_time(orch: Any, env: dict[str, str], tmp_path: Path, job: Path) -> None:
    """Run the job, then read every --json document a script reads for times."""
    from datetime import UTC, datetime
    from decimal import Decimal

    from orchestrator.records import prices
    from orchestrator.records.store import open_store
    from providers.base import Billing, Offer

    submitted = orch("submit", str(job), "--json")
    job_id = submitted["job_id"]
    store = open_store(f"sqlite:///{tmp_path / '.local' / 'share' / 'orch' / 'orch.db'}")
    try:  # what `orch prices` and `orch servers list` read, as searches and checks write it
        prices.record(store, [Offer("vastai", "1", "RTX 4090", 1, 24 << 30, Billing.PER_SECOND,
                                    True, Decimal("0.3"))],
                      at=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC))
        store.add_server("box1", "203.0.113.7", 22, "root", "H100 SXM", 1, Decimal("2190"))
        store.record_server_check("box1", error=None)
    finally:
        store.close()
    documents = {
        "submit": submitted, "jobs": orch("jobs", "--json"), "show": orch("show", job_id, "--json"),
        "history": orch("history", "--json"), "warm": orch("warm", "--all", "--json"),
        "plan": orch("plan", str(job), "--json"), "prices": orch("prices", "RTX 4090", "--json"),
        "servers": orch("servers", "list", "--json"),
        "sweep": orch("sweep", str(tmp_path / "ex" / "sweep-sim.yml"), "--json"),
        "sweeps": orch("sweeps", "--json"), "sweep show": orch("sweep", "show", "sim-lr-sweep",
                                                                "--json"),
        "reconcile": orch("reconcile", "--dry-run", "--json")}
    logs = orchfork.run(["logs", job_id, "--json"], env=env, cwd=tmp_path, check=True,
                        timeout=300).stdout
    documents["logs"] = [json.loads(line) for line in logs.splitlines()]
    found = {name: times(doc) for name, doc in documents.items()}
    for name in ("submit", "jobs", "show", "history", "warm", "plan", "prices", "servers",
                 "sweeps", "sweep show", "logs"):
        assert found[name], f"{name}: no time to check"
    assert any(w.endswith("expires_at") for w, _ in found["plan"]), found["plan"]
    bad = [(name, where, text) for name, items in found.items() for where, text in items
           if not ONE_FORM.fullmatch(text)]
    assert bad == []
    released = orch("warm", "release", "--all", "--json")["released"]
    assert [r["result"] for r in released] == ["terminated"], released
