"""A warm miss is not a failed placement (issue 36 §7, docs/warm.md): when the parked machine
a job ranked first is taken by another worker before the job adopts it (or is gone), the job
falls through to a fresh rental instead of using up `max_placements` and failing.

The race is made deterministic: a trigger in the (real SQLite) database takes the parked
machine for another job at the exact moment the job records the placement it is about to
adopt, between the ranking and the take, as another worker's `take_warm` would.
"""

from __future__ import annotations

import sqlite3

from test_warm import Rig, rig  # noqa: F401  (the warm test rig fixture)

from orchestrator.engine.runner import JobRunner, Options, owner_id
from orchestrator.records.store import Job


def _run(rig: Rig, job_id: str) -> Job:  # noqa: F811
    """Drive `job_id` with one placement allowed: a single miss used to be the end of it."""
    owner = owner_id("test")
    options = Options(poll_s=0.2, watch_s=0.2, lease_s=5, boot_deadline_s=30,
                      connect_deadline_s=20, ssh_key=rig.key.private, max_placements=1)
    assert rig.store.claim_job(job_id, owner, 5) is not None
    return JobRunner(rig.store, {"sim": rig.cloud}, owner, options).run(job_id)


def _parked(rig: Rig) -> tuple[int, str]:  # noqa: F811
    first = rig.queue(rig.job_file())
    assert rig.run(first).status == "succeeded"
    (warm,) = rig.store.warm_instances()
    assert warm.state == "parked" and warm.id is not None
    return warm.id, warm.provider_instance_id


def _fresh_rental(rig: Rig, job: Job) -> None:  # noqa: F811
    assert job.status == "succeeded", job.failure_reason
    kinds = rig.kinds(job.id)
    assert "warm.missed" in kinds or "warm.lost" in kinds
    assert "instance.created" in kinds and "instance.warm_taken" not in kinds
    rows = rig.store.instances_of(job.id)
    fresh = [r for r in rows if not (r.offer_id or "").startswith("warm:")]
    assert len(fresh) == 1 and fresh[0].end_reason in ("released", "parked")


def test_a_machine_taken_between_ranking_and_adoption_falls_through(rig: Rig) -> None:  # noqa: F811
    warm_id, _ = _parked(rig)
    job_id = rig.queue(rig.job_file(keep_warm="0"))
    other = rig.queue(rig.job_file(keep_warm="0"))
    # When the job records that it is taking the warm machine (its ranking chose it, the
    # take comes next), another worker's job takes the machine first.
    with sqlite3.connect(str(rig.store.engine.url.database)) as conn:
        conn.execute(f"""CREATE TRIGGER another_worker AFTER INSERT ON event
                         WHEN NEW.job_id = '{job_id}' AND NEW.kind = 'state'
                              AND NEW.message LIKE 'taking warm %'
                         BEGIN UPDATE warm_instance SET state = 'taken',
                                      taken_by_job = '{other}', taken_at = NEW.at
                               WHERE id = {warm_id} AND state = 'parked'; END""")
    job = _run(rig, job_id)
    planned = [e for e in rig.store.events(job_id) if e.kind == "state"
               and "taking warm" in e.message]
    assert planned, "the job did not rank the warm machine first"
    _fresh_rental(rig, job)
    assert rig.store.get_warm(warm_id).taken_by_job == other


def test_a_parked_machine_that_is_gone_falls_through(rig: Rig) -> None:  # noqa: F811
    warm_id, instance = _parked(rig)
    rig.cloud.terminate(instance)  # behind orch's back: the provider lost it
    job = _run(rig, rig.queue(rig.job_file(keep_warm="0")))
    _fresh_rental(rig, job)
    assert rig.store.get_warm(warm_id).state != "parked"
