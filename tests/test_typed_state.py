"""Issue 37 §1, typed state: the enums are the stored words, the store's columns read back as
members and refuse other words, the JSON columns read old rows through their models, the
setters write what they say (a closed instance row and its cost together), and what the CLI
prints as JSON is what was stored."""

from __future__ import annotations

import json
import os
import re
import sqlite3
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import orchfork
import pytest
from sqlalchemy.exc import StatementError

from orchestrator.core.jobstatus import JobStatus
from orchestrator.core.states import (
    EndReason,
    Outcome,
    RowState,
    ServerStatus,
    StopKind,
    WarmState,
)
from orchestrator.engine.teardown import END_REASON_OF
from orchestrator.records.columns import (
    event_data,
    placement_record,
    spec_record,
    sweep_spec_record,
)
from orchestrator.records.store import Job, Store, open_store
from orchestrator.records.sweep.rules import DEFAULT_MAX_PARALLEL, max_parallel_of
from playbooks.pipeline import DURABLE, PhaseName
from providers.base import InstanceState

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "orch.db"


@pytest.fixture
def store(db_path: Path) -> Iterator[Store]:
    s = open_store(f"sqlite:///{db_path}")
    yield s
    s.close()


def _job(store: Store, status: JobStatus = JobStatus.QUEUED) -> Job:
    return store.create_job(
        name="j", status=status, method="lora", base_model="m", spec_json="{}",
        spec_hash="a" * 64, placement=None, provider="sim", gpu="H100 SXM", gpu_count=1,
        billing="per_second", interruptible=True, est_hours=1.0, est_cost=Decimal("1"),
        event_kind=str(status), event_message=str(status), event_data=None)


def _raw(db_path: Path, sql: str) -> list[tuple[object, ...]]:
    con = sqlite3.connect(db_path)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


# --- the enums --------------------------------------------------------------------------------


def test_the_provider_states_are_instance_row_states() -> None:
    # An instance row stores what the provider reports (`RowState(inst.state.value)`).
    assert {s.value for s in InstanceState} <= {r.value for r in RowState}


def test_every_phase_that_announces_itself_is_a_job_status() -> None:
    # The engine enters `JobStatus(phase)` when the pipeline announces a phase.
    announced = [p for p in PhaseName if p is not PhaseName.ARTIFACTS]
    assert [JobStatus(p) for p in announced] == [JobStatus.PREPARING, JobStatus.TRAINING,
                                                  JobStatus.MERGING, JobStatus.EVALUATING]
    assert DURABLE == (PhaseName.TRAINING, PhaseName.MERGING, PhaseName.ARTIFACTS,
                       PhaseName.EVALUATING)


def test_each_stop_has_its_outcome_and_each_outcome_ends_its_instances() -> None:
    assert [Outcome.of_stop(k) for k in StopKind] == [
        Outcome.CANCELLED, Outcome.INTERRUPTED, Outcome.STALLED, Outcome.LOST, Outcome.PRUNED,
        Outcome.MOVED, Outcome.BUDGET]
    # What Teardown.release_all writes as each instance's end (others: failed; lost: kept).
    assert END_REASON_OF == {Outcome.SUCCEEDED: EndReason.RELEASED,
                       Outcome.CANCELLED: EndReason.CANCELLED,
                       Outcome.PRUNED: EndReason.RELEASED,
                       # A requeue gives the machine up: not a preemption (the rate).
                       Outcome.REQUEUE: EndReason.REPLACED,
                       Outcome.DATABASE: EndReason.REPLACED}


# --- the columns ------------------------------------------------------------------------------


def test_stored_text_is_the_word_and_reads_back_as_the_member(store: Store,
                                                                db_path: Path) -> None:
    job = _job(store)
    row = store.add_instance(job.id, provider="sim", offer_id="o-1", gpu="H100 SXM",
                             gpu_count=1, billing="per_second", interruptible=True,
                             price_per_hour=Decimal("3.6"), attempt=0)
    assert row.id is not None
    store.close_instance(row.id, EndReason.CAPACITY, row.created_at + timedelta(seconds=10))
    store.add_server("box", "10.0.0.1", 22, "root", "H100 SXM", 1, Decimal("2000"))
    assert _raw(db_path, "SELECT status FROM job") == [("queued",)]
    assert _raw(db_path, "SELECT kind FROM event") == [("queued",)]
    assert _raw(db_path, "SELECT state, end_reason FROM instance") == [("terminated",
                                                                         "capacity")]
    assert _raw(db_path, "SELECT status FROM server") == [("idle",)]
    assert store.get_job(job.id).status is JobStatus.QUEUED
    closed = store.instances_of(job.id)[0]
    assert (closed.state, closed.end_reason) == (RowState.TERMINATED, EndReason.CAPACITY)
    assert isinstance(closed.state, RowState) and isinstance(closed.end_reason, EndReason)
    assert store.list_servers()[0].status is ServerStatus.IDLE


def test_rows_written_in_the_words_read_as_members(store: Store, db_path: Path) -> None:
    # Rows from before the enums (or written by hand with sqlite3) hold the same words.
    job = _job(store)
    con = sqlite3.connect(db_path)
    con.execute("UPDATE job SET status = 'interrupted' WHERE id = ?", (job.id,))
    con.commit()
    con.close()
    assert store.get_job(job.id).status is JobStatus.INTERRUPTED
    assert [j.id for j in store.list_jobs(status="running")] == [job.id]


def test_a_word_outside_the_enum_is_refused_and_nothing_is_written(store: Store,
                                                                    db_path: Path) -> None:
    job = _job(store)
    with pytest.raises(StatementError, match="'running' is not a valid JobStatus"):
        with store.transaction() as session:
            row = session.get(Job, job.id)
            assert row is not None
            row.status = "running"  # type: ignore[assignment]
    assert _raw(db_path, "SELECT status FROM job") == [("queued",)]


def test_close_instance_writes_the_end_and_the_cost_together(store: Store,
                                                              db_path: Path) -> None:
    # Was two writes (the end, then the cost): a database that refused the second left a
    # closed row that cost nothing.
    job = _job(store)
    row = store.add_instance(job.id, provider="sim", offer_id="o-1", gpu="H100 SXM",
                             gpu_count=1, billing="per_second", interruptible=True,
                             price_per_hour=Decimal("3.6"), attempt=0)
    assert row.id is not None
    closed = store.close_instance(row.id, EndReason.RELEASED,
                                  row.created_at + timedelta(seconds=100))
    assert closed.cost_micros == 100_000  # $3.60/h = $0.001/s, 100 s
    assert _raw(db_path, "SELECT state, end_reason, cost_micros, terminated_at IS NOT NULL "
                         "FROM instance") == [("terminated", "released", 100_000, 1)]


def test_the_warm_states_are_the_stored_words() -> None:
    assert [s.value for s in WarmState] == ["parked", "taken", "ending", "ended"]


# --- the JSON columns ---------------------------------------------------------------------------


def test_a_placement_reads_from_old_and_odd_rows() -> None:
    stored = {"placement": {"provider": "vastai", "offer_id": "7", "gpu": "RTX 4090",
                            "gpu_count": 1, "est_cost": "0.1230", "est_training_hours": 0.5,
                            "a_field_from_a_newer_orch": [1, {"x": 2}]},
              "alternatives": [{"provider": "runpod", "gpu_count": "two"}],
              "job_file": "/jobs/a.yml", "why": "cheapest"}
    record = placement_record(json.dumps(stored, sort_keys=True))
    chosen = record.placement
    assert chosen is not None
    assert (chosen.provider, chosen.gpu_count, chosen.est_cost) == ("vastai", 1,
                                                                   Decimal("0.1230"))
    assert chosen.est_training_hours == 0.5 and record.job_file == "/jobs/a.yml"
    # Shown whole (`orch show --json`): as stored, the newer orch's field kept.
    assert chosen.as_stored() == stored["placement"]
    # A value of the wrong shape reads as absent; the rest of the row still reads.
    assert [p.provider for p in record.ranked()] == ["vastai", "runpod"]
    assert record.ranked()[1].gpu_count is None
    # An old row without the plan's newer fields, a dry run's, and text that is not JSON.
    assert placement_record('{"placement": {"gpu": "A100"}}').ranked()[0].est_cost is None
    for text in (None, "", "null", "[1, 2]", "{not json"):
        assert placement_record(text).ranked() == [] and placement_record(text).job_file is None


def test_the_spec_and_event_fields_read_back() -> None:
    spec = spec_record('{"method": "full", "resources": {"deadline_hours": 2, '
                       '"providers": ["sim"], "max_price": "1"}}')
    assert (spec.method, spec.resources.deadline_hours, spec.resources.providers) == (
        "full", 2.0, ["sim"])
    assert spec_record('{"resources": {"deadline_hours": "soon"}}').resources.deadline_hours \
        is None
    assert spec_record("{}").resources.providers is None
    data = event_data('{"index": 3, "param_order": ["lr", "r"], "params": {"r": 8, "lr": 1},'
                      ' "places": [{"what": "adapter", "where": "local", "location": "/a"}]}')
    assert data.index == 3 and list(data.ordered_params()) == ["lr", "r"]
    assert data.places is not None and data.places[0].as_stored() == {
        "location": "/a", "what": "adapter", "where": "local"}
    assert event_data('{"status": "queued"}').status == "queued"


def test_a_sweep_file_that_lacks_or_garbles_max_parallel_gets_the_default() -> None:
    for text in ('{"max_parallel": 2}', '{"max_parallel": "2"}'):
        assert max_parallel_of(sweep_spec_record(text)) == 2
    for text in ("{}", '{"max_parallel": "many"}', '{"max_parallel": null}', "[]", "{x"):
        assert max_parallel_of(sweep_spec_record(text)) == DEFAULT_MAX_PARALLEL
    assert max_parallel_of(sweep_spec_record('{"max_parallel": 0}')) == DEFAULT_MAX_PARALLEL


# --- what the CLI prints is what was stored ------------------------------------------------------


def test_show_and_logs_print_the_plan_as_stored(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "xdg")}
    env.pop("ORCH_DB_URL", None)

    def orch(*args: str) -> str:
        proc = orchfork.run(list(args), env=env, cwd=ROOT, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    submitted = json.loads(orch("submit", "--dry-run", "--json", "examples/quickstart.yml"))
    job_id = submitted["job_id"]
    assert submitted["status"] == "planned"
    shown = json.loads(orch("show", job_id, "--json"))
    assert shown["status"] == "planned"
    assert shown["placements"] == [submitted["placement"], *submitted["alternatives"]]
    assert shown["est_training_hours"] == submitted["placement"]["est_training_hours"]
    first = json.loads(orch("logs", job_id, "--json").splitlines()[0])
    assert first["kind"] == "planned"
    assert first["data"]["placement"] == submitted["placement"]
    db = Path(env["XDG_DATA_HOME"]) / "orch" / "orch.db"
    assert _raw(db, "SELECT status FROM job") == [("planned",)]


# --- the schema's documentation lists every word -----------------------------------------------


def _doc_row(table: str, column: str) -> str:
    """The Meaning cell of `column` in docs/schema.md's table of `table`."""
    doc = (ROOT / "docs" / "schema.md").read_text()
    section = doc.split(f"### `{table}`", 1)[1].split("\n### ", 1)[0]
    row = next(line for line in section.splitlines() if line.startswith(f"| `{column}` |"))
    return re.split(r"(?<!\\)\|", row)[4]  # `\|` inside a cell is a pipe, not a border


def test_the_schema_doc_lists_every_stored_word() -> None:
    words = {(t, c): _doc_row(t, c) for t, c in (
        ("instance", "state"), ("instance", "end_reason"), ("warm_instance", "state"),
        ("warm_instance", "end_reason"), ("server", "status"))}
    assert all(f"`{s}`" in words["instance", "state"] for s in RowState)
    assert all(f"`{r}`" in words["instance", "end_reason"] for r in EndReason
               if r is not EndReason.EXPIRED)
    assert all(f"`{s}`" in words["warm_instance", "state"] for s in WarmState)
    assert all(f"`{r}`" in words["warm_instance", "end_reason"]
               for r in (EndReason.EXPIRED, EndReason.RELEASED, EndReason.CANCELLED))
    assert all(f"`{s}`" in words["server", "status"] for s in ServerStatus)
