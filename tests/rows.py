"""Test set-up that puts a row in a state the product reaches only over time (a worker's
lease, an outage that began hours ago): columns written directly, in one transaction.

The store's own setters each say what they set (`Store.set_status`, `mark_placed`, ...);
tests that need a row as a crash or a long wait would leave it use this instead.
"""

from __future__ import annotations

from typing import Unpack

from orchestrator.records.store import Job, JobUpdate, Store


def set_job_columns(store: Store, job_id: str, **fields: Unpack[JobUpdate]) -> None:
    """Write `fields` to job `job_id` (no status change: that is `Store.set_status`'s)."""
    with store.transaction() as session:
        job = session.get(Job, job_id)
        assert job is not None, job_id
        for key, value in fields.items():
            setattr(job, key, value)
