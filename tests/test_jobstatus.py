"""JobStatus: the transition table, enforced by the store on a real database."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from rows import set_job_columns

from orchestrator.core.jobstatus import TRANSITIONS, JobStatus, allowed
from orchestrator.records.store import (
    IllegalTransition,
    InvalidValueError,
    JobUpdate,
    Store,
    open_store,
)
from orchestrator.records.sweep.store import requeue_failed

OWNER = "worker-1"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = open_store(f"sqlite:///{tmp_path / 'orch.db'}")
    yield s
    s.close()


def _claimed(store: Store, status: str = "queued") -> str:
    job = store.create_job(
        name="j", status=status, method="lora", base_model="m", spec_json="{}",
        spec_hash="a" * 64, placement=None, provider="sim", gpu="H100 SXM", gpu_count=1,
        billing="per_second", interruptible=False, est_hours=1.0, est_cost=Decimal("1"),
        event_kind="queued", event_message="queued", event_data=None)
    if status == "queued":
        assert store.claim_job(job.id, OWNER, 60) is not None
    return job.id


def _statuses(store: Store, job_id: str) -> list[Any]:
    return [e.message for e in store.events(job_id) if e.kind == "state"]


def test_statuses_are_the_stored_strings() -> None:
    assert JobStatus.QUEUED == "queued"
    assert set(TRANSITIONS) == set(JobStatus)
    for final in ("succeeded", "cancelled"):
        assert not any(allowed(final, s) for s in JobStatus)
    assert [s for s in JobStatus if allowed("failed", s)] == [JobStatus.QUEUED]
    assert not any(allowed(s, "planned") for s in JobStatus)


def test_an_illegal_transition_is_refused_and_writes_nothing(store: Store) -> None:
    job_id = _claimed(store)
    before = _statuses(store, job_id)
    with pytest.raises(IllegalTransition, match="a provisioning job cannot become planned"):
        store.set_status(job_id, OWNER, "planned")
    assert store.get_job(job_id).status == "provisioning"
    assert _statuses(store, job_id) == before
    # A status change must go through set_status, which checks it: no store setter takes a
    # status, and the one that carries columns with a status change (JobUpdate) has none.
    assert "status" not in JobUpdate.__annotations__
    assert not hasattr(store, "update_job_fields")
    # A word that is no job status is refused before anything is written.
    with pytest.raises(InvalidValueError, match="unknown job status 'running'"):
        store.set_status(job_id, OWNER, "running")  # type: ignore[arg-type]
    assert store.get_job(job_id).status == "provisioning"


def test_a_planned_job_cannot_be_driven(store: Store) -> None:
    job_id = _claimed(store, status="planned")
    set_job_columns(store, job_id, lease_owner=OWNER)
    with pytest.raises(IllegalTransition, match="from planned it may become: cancelled"):
        store.set_status(job_id, OWNER, "training")
    assert store.request_cancel(job_id).status == "cancelled"


# The moves the engine makes (orchestrator/engine/runner.py `_set` calls, in the order a job sees
# them): the happy path with a resume, an interruption and re-placement, a deferral, and the
# ways a worker stops a job.
ENGINE_PATHS: list[list[str]] = [
    ["connecting", "preparing", "training", "training", "merging", "evaluating", "releasing",
     "succeeded"],
    ["connecting", "preparing", "training", "interrupted", "queued", "provisioning",
     "connecting", "preparing", "training", "evaluating", "releasing", "succeeded"],
    ["queued", "provisioning", "failed"],  # deferred (outage), then no offer left
    ["connecting", "preparing", "cancelled"],
    ["training", "failed"],
    ["queued", "cancelled"],  # stopped while re-placing
    ["queued", "queued", "failed"],  # retry wait, then give up
    ["preparing", "interrupted", "queued"],  # worker stopping: requeued to resume
    ["evaluating", "interrupted", "failed"],
]


@pytest.mark.parametrize("path", ENGINE_PATHS, ids=["-".join(p) for p in ENGINE_PATHS])
def test_each_move_the_engine_makes_is_allowed(store: Store, path: list[str]) -> None:
    job_id = _claimed(store)
    for status in path:
        job = store.set_status(job_id, OWNER, status)
        assert job.status == status
        if status == "queued" and path[-1] != "queued":
            # The worker keeps its lease while it re-places the job.
            set_job_columns(store, job_id, lease_owner=OWNER)
    assert store.get_job(job_id).status == path[-1]
    assert _statuses(store, job_id)[-len(path):] == path


def test_the_store_s_own_moves_are_allowed(store: Store) -> None:
    # Expired lease: the reconciler requeues an active job.
    a = _claimed(store)
    store.set_status(a, OWNER, "training")
    assert store.requeue(a, "worker died")
    assert store.get_job(a).status == "queued"
    # `orch cancel` on a queued or interrupted job, and on a job nobody drives.
    b = _claimed(store)
    store.set_status(b, OWNER, "interrupted")
    assert store.request_cancel(b).status == "cancelled"
    c = _claimed(store)
    set_job_columns(store, c, lease_expires_at=None, lease_owner=None)
    assert store.cancel_orphan(c, "torn down")
    assert store.get_job(c).status == "cancelled"
    # `orch sweep --retry-failed`: failed → queued.
    d = _claimed(store)
    store.set_status(d, OWNER, "failed", failure_reason="boom")
    assert requeue_failed(store, d, "retry")
    assert store.get_job(d).status == "queued"
