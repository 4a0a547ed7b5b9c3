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
