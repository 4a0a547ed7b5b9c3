"""Every SQL example in docs/schema.md runs against a real history and returns rows.

The history is made by orch itself on the simulated cloud (real sshd on loopback): a job,
a spot H100 PCIe job, a failed job, a two-run sweep run by `orch worker`, a registered
server, and a queued job whose instance row was written before its provider call (what a
crash mid-create leaves). It is made on each backend of conftest.BACKENDS: a SQLite file
and a database on the throwaway PostgreSQL server. The doc's examples are written for
SQLite (`sqlite3` is how it tells users to query); those using SQLite-only functions
(json_extract, printf, strftime, julianday) have a PostgreSQL twin in the doc's
```sql postgresql block, which runs there instead; the others and the views run on both.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import orchfork
import pytest
from conftest import BACKENDS, database_url
from termutil import ROOT

DOC = ROOT / "docs" / "schema.md"
PLACEHOLDER_JOB = "j-3f9a0c1b2d4e"
SQLITE_ONLY = re.compile(r"\b(json_extract|printf|strftime|julianday)\s*\(", re.I)


def examples() -> list[str]:
    """Each query in the doc: ```sql blocks (split per statement) and sqlite3 one-liners."""
    text = DOC.read_text()
    found: list[str] = []
    for block in re.findall(r"```sql\n(.*?)```", text, re.S):
        found += [q.strip() for q in re.split(r";\s*(?:\n|$)", block) if q.strip()]
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        found += re.findall(r'sqlite3 \S+ "(.*?)"\s*$', block, re.M)
    return found


def pg_examples() -> list[str]:
    """The doc's PostgreSQL spellings (```sql postgresql blocks, split per statement)."""
    found: list[str] = []
    for block in re.findall(r"```sql postgresql\n(.*?)```", DOC.read_text(), re.S):
        found += [q.strip() for q in re.split(r";\s*(?:\n|$)", block) if q.strip()]
    return found


def _orch(env: dict[str, str], *args: str, check: bool = True
          ) -> subprocess.CompletedProcess[str]:
    proc = orchfork.run(list(args), env=env, cwd=ROOT, timeout=300)
    if check:
        assert proc.returncode == 0, (args, proc.stderr)
    return proc


def _variant(tmp: Path, name: str, resources: str) -> Path:
    """examples/quickstart.yml under another name and resources (data paths made absolute)."""
    text = (ROOT / "examples" / "quickstart.yml").read_text()
    text = re.sub(r"(?m)^name: .*$", f"name: {name}", text)
    text = text.replace("data/", f"{ROOT / 'examples' / 'data'}/")
    text = text.replace("  providers: [sim]", f"  providers: [sim]\n{resources}")
    path = tmp / f"{name}.yml"
    path.write_text(text)
    return path


def _make_history(backend: str, request: pytest.FixtureRequest,
                  tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("schema")
    url = database_url(backend, tmp, request)
    env = {**os.environ, "XDG_DATA_HOME": str(tmp / "xdg"), "ORCH_DB_URL": url,
           "ORCH_SIM_TRAIN_STEPS": "4", "ORCH_POLL_S": "0.1"}
    _orch(env, "submit", "examples/quickstart.yml")
    h100 = _variant(tmp, "h100-spot", "  gpus: [H100 PCIe]")
    h100.write_text(h100.read_text().replace("spot: allowed", "spot: required"))
    _orch(env, "submit", str(h100))
    failed = _orch({**env, "ORCH_SIM_CAPACITY": "RTX 3090=0"}, "submit",
                   str(_variant(tmp, "no-capacity", "  gpus: [RTX 3090]\n  max_gpus: 1")),
                   check=False)
    assert failed.returncode == 1, failed.stderr
    sweep = tmp / "sweep.yml"
    sweep.write_text(f"name: qs-lr\nbase: {ROOT / 'examples' / 'quickstart.yml'}\n"
                     "grid: {training.learning_rate: [1.0e-4, 3.0e-4]}\n"
                     "objective: {metric: eval.exact_match, goal: max}\n")
    _orch(env, "sweep", str(sweep))
    _orch(env, "worker", "--once", "-q")
    queued = json.loads(_orch(env, "submit", "examples/quickstart.yml", "--detach",
                              "--json").stdout)["job_id"]
    from decimal import Decimal

    from orchestrator.records.store import open_store

    store = open_store(url)
    try:
        # A registered server row (`orch servers add` would first prove the machine over
        # SSH: tests/test_cli_servers.py does that against a simulated host).
        store.add_server(name="box1", host="127.0.0.1", port=22, user="root", gpu="H100 SXM",
                         gpu_count=1, monthly_price=Decimal(2190))
        # The engine writes this row before the provider's create call.
        store.add_instance(queued, provider="sim", offer_id="sim-rtx3090-1", gpu="RTX 3090",
                           gpu_count=1, billing="per_second", interruptible=True,
                           price_per_hour=Decimal("0.074"), attempt=0)
    finally:
        store.close()
    jobs = json.loads(_orch(env, "jobs", "--json").stdout)
    return {"env": env, "url": url, "jobs": jobs}


def sql(history: dict[str, Any], query: str) -> dict[str, Any]:
    proc = _orch(history["env"], "sql", "--json", query, check=False)
    assert proc.returncode == 0, (query, proc.stderr)
    return dict(json.loads(proc.stdout))


def test_the_doc_has_examples() -> None:
    found = examples()
    assert len(found) >= 12
    assert any("$.placement.gpu" in q for q in found)


def test_every_sqlite_only_example_has_a_postgresql_twin() -> None:
    sqlite_only = [q for q in examples() if SQLITE_ONLY.search(q)]
    assert len(pg_examples()) == len(sqlite_only) >= 7
    assert not [q for q in pg_examples() if SQLITE_ONLY.search(q)]


# One history per backend and module (each runs several simulated jobs); tests that check
# both take `history`, the documented examples take the backend they are written for.
@pytest.fixture(scope="module")
def sqlite_history(request: pytest.FixtureRequest,
                   tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _make_history("sqlite", request, tmp_path_factory)


@pytest.fixture(scope="module")
def postgresql_history(request: pytest.FixtureRequest,
                       tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _make_history("postgresql", request, tmp_path_factory)


@pytest.fixture(scope="module", params=BACKENDS)
def history(request: pytest.FixtureRequest) -> dict[str, Any]:
    return dict(request.getfixturevalue(f"{request.param}_history"))


def _runs_on(backend: str, query: str) -> bool:
    # PostgreSQL twins run on PostgreSQL; SQLite-only spellings on SQLite; the rest on both.
    if query in pg_examples():
        return backend != "sqlite"
    return backend == "sqlite" or not SQLITE_ONLY.search(query)


@pytest.mark.parametrize(("backend", "query"), [
    (backend, q) for backend in BACKENDS for q in examples() + pg_examples()
    if _runs_on(backend, q)],
    ids=lambda v: v if v in BACKENDS else " ".join(str(v).split())[:60])
def test_every_example_runs_and_returns_rows(request: pytest.FixtureRequest, backend: str,
                                             query: str) -> None:
    history = request.getfixturevalue(f"{backend}_history")
    real_job = next(j["job_id"] for j in history["jobs"] if j["status"] == "succeeded")
    result = sql(history, query.replace(PLACEHOLDER_JOB, real_job))
    assert result["rows"], f"no rows: {query}"


def test_placement_json_paths_match_the_stored_columns(history: dict[str, Any]) -> None:
    if history["url"].startswith("sqlite"):
        paths = ("json_extract(placement_json, '$.placement.gpu'), "
                 "json_extract(placement_json, '$.placement.gpu_count')")
    else:
        paths = ("placement_json::json->'placement'->>'gpu', "
                 "(placement_json::json->'placement'->>'gpu_count')::int")
    result = sql(history, f"SELECT gpu, gpu_count, {paths} FROM job WHERE gpu IS NOT NULL")
    assert result["rows"] and all(r[0] == r[2] and r[1] == r[3] for r in result["rows"])


def test_documented_gpu_names_are_the_stored_ones(history: dict[str, Any]) -> None:
    from providers import catalog

    text = DOC.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| GPU names |"))
    documented = re.findall(r"`([^`]+)`", row.split("|")[3])
    assert documented and set(documented) <= set(catalog.gpus())
    stored = {r[0] for r in sql(history, "SELECT DISTINCT gpu FROM instance")["rows"]}
    assert stored <= set(catalog.gpus()) and {"RTX 3090", "H100 PCIe"} <= stored
    metric_names = {r[0] for r in sql(history, "SELECT DISTINCT name FROM metric")["rows"]}
    for name in metric_names:
        assert f"`{name}`" in text, f"metric {name} is not in docs/schema.md"
