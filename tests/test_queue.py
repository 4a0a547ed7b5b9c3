"""The team queue under load (issue 23 §11): 32 claimers at once take every job exactly once
and a sweep never runs more than its max_parallel, on SQLite and PostgreSQL; on PostgreSQL
the head of the queue is claimed in one statement that writes what the ORM claim writes.
"""

from __future__ import annotations

import json
import re
import threading
from collections import Counter
from typing import Any

from sqlalchemy import event as sa_event
from sqlmodel import select

from orchestrator.records.store import Event, Job, Store, Sweep, open_store
from orchestrator.records.store.tables import dumps

CLAIMERS = 32
TIME_TEXT = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


def _job(store: Store, name: str, sweep_id: str | None = None) -> Job:
    return store.create_job(
        name=name, status="queued", method="lora", base_model="m", spec_json="{}",
        spec_hash="0" * 64, placement=None, provider=None, gpu=None, gpu_count=None,
        billing=None, interruptible=None, est_hours=None, est_cost=None, event_kind="queued",
        event_message="", event_data=None, sweep_id=sweep_id,
        sweep_key=None if sweep_id is None else f"{sweep_id}:{name}")


def _sweep(store: Store, max_parallel: int) -> str:
    with store.transaction() as session:
        sweep = Sweep(name="grid", spec_json=json.dumps({"max_parallel": max_parallel}))
        session.add(sweep)
    return sweep.id


def _claims(store: Store) -> Counter[str]:
    """How many `provisioning` state events (claims) each job has."""
    with store.session() as session:
        rows = session.exec(select(Event).where(Event.kind == "state")).all()
    return Counter(e.job_id for e in rows
                   if json.loads(e.data_json or "{}").get("status") == "provisioning")


def test_32_claimers_take_every_job_once_and_a_sweep_at_most_max_parallel(
        db_url: str) -> None:
    setup = open_store(db_url)
    sweep_id = _sweep(setup, max_parallel=2)
    plain, in_sweep = [], []
    for n in range(60):
        # Sweep jobs among the others, some at the head of the queue.
        if n % 10 == 0:
            in_sweep.append(_job(setup, f"s{n}", sweep_id).id)
        else:
            plain.append(_job(setup, f"p{n}").id)
    barrier = threading.Barrier(CLAIMERS)
    took: list[tuple[str, str]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def claimer(n: int) -> None:
        owner = f"worker:test:{n}"
        store = open_store(db_url)
        try:
            barrier.wait(timeout=120)
            while (job := store.claim_next(owner, 600)) is not None:
                with lock:
                    took.append((job.id, owner))
                assert job.status == "provisioning" and job.lease_owner == owner
                if job.sweep_id is None:  # sweep jobs stay running: the limit must hold
                    store.set_status(job.id, owner, "succeeded", "done", lease_owner=None)
        except BaseException as exc:  # reported below, with the thread's traceback
            errors.append(exc)
        finally:
            store.close()

    threads = [threading.Thread(target=claimer, args=(n,), daemon=True)
               for n in range(CLAIMERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    try:
        assert not [t for t in threads if t.is_alive()], "a claimer hung"
        assert not errors, errors
        ids = [job_id for job_id, _ in took]
        assert sorted(set(ids)) == sorted(ids), "a job was claimed twice"
        assert set(plain) <= set(ids), "a job outside the sweep was never claimed"
        running = [job_id for job_id in ids if job_id in in_sweep]
        assert len(running) == 2, f"max_parallel 2, {len(running)} sweep jobs started"
        # What the database recorded agrees: one claim event per claimed job.
        assert _claims(setup) == Counter(ids)
        assert {setup.get_job(j).status for j in plain} == {"succeeded"}
    finally:
        setup.close()


def test_a_claim_on_postgresql_is_one_statement_that_writes_what_the_orm_claim_does(
        pg_server: Any) -> None:
    store = open_store(pg_server.create_database())
    try:
        by_orm, by_head = _job(store, "a"), _job(store, "b")
        owner = 'worker:hôst:1:"x"'
        assert store.claim_job(by_orm.id, owner, 90) is not None  # the ORM path
        statements: list[str] = []

        def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
            statements.append(statement)

        sa_event.listen(store.engine, "before_cursor_execute", count)
        try:
            got = store.claim_next(owner, 90)
        finally:
            sa_event.remove(store.engine, "before_cursor_execute", count)
        assert got is not None and got.id == by_head.id
        assert len(statements) == 1, statements
        # The job returned is the row as stored, and both paths wrote the same fields.
        stored = store.get_job(by_head.id)
        assert got.model_dump() == stored.model_dump()
        other = store.get_job(by_orm.id)
        for job in (stored, other):
            assert (job.status, job.lease_owner, job.attempt) == ("provisioning", owner, 0)
            assert job.lease_expires_at is not None and job.started_at is not None
            assert (job.lease_expires_at - job.updated_at).total_seconds() == 90
            assert job.started_at == job.updated_at
        with store.engine.connect() as conn:
            rows = conn.exec_driver_sql(
                "SELECT job_id, at, message, data_json, lease_expires_at FROM event "
                "JOIN job ON job.id = event.job_id WHERE kind = 'state'").all()
        events = {r[0]: r for r in rows}
        for job_id in (by_orm.id, by_head.id):
            _, at, message, data, until = events[job_id]
            assert message == f"provisioning (claimed by {owner})"
            assert data == dumps({"attempt": 0, "owner": owner, "status": "provisioning"})
            assert TIME_TEXT.match(at) and TIME_TEXT.match(until), (at, until)
        assert events[by_head.id][1] == stored.updated_at.isoformat(
            timespec="microseconds").replace("+00:00", "Z")
        # Claimed again after a requeue: the next attempt, the first start kept.
        assert store.requeue(by_head.id, "its worker died")
        again = store.claim_next("worker:other:2", 90)
        assert again is not None and again.id == by_head.id
        assert again.attempt == 1 and again.started_at == stored.started_at
        assert store.claim_next("worker:other:2", 90) is None
    finally:
        store.close()


def test_a_sweep_job_at_the_head_on_postgresql_is_still_gated(pg_server: Any) -> None:
    store = open_store(pg_server.create_database())
    try:
        sweep_id = _sweep(store, max_parallel=1)
        first, second = _job(store, "s1", sweep_id), _job(store, "s2", sweep_id)
        plain = _job(store, "p")
        assert (got := store.claim_next("w1", 60)) is not None and got.id == first.id
        # The sweep is at its limit: its next job is passed over, the plain one taken.
        assert (got := store.claim_next("w2", 60)) is not None and got.id == plain.id
        assert store.claim_next("w3", 60) is None
        assert store.get_job(second.id).status == "queued"
    finally:
        store.close()
