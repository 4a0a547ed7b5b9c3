"""`orch reconcile`: make the providers and the database agree, and stop paying for orphans.

For every provider, list the instances tagged as orch's (`orch-<job id>` in their name or
label, set at create time, so even an instance the database never recorded is found):
- its job is unknown, or finished (succeeded / failed / cancelled): terminate it;
- its job is still being driven by a live worker: leave it alone.
- its job was requeued (its worker or foreground `orch submit` died) and no worker adopted it
  within the idle grace period (`orchestrator.engine.recovery.IDLE_GRACE_S`, ORCH_IDLE_GRACE_S):
  terminate it; the job resumes from the checkpoints on its volume when a worker claims it.
Then repair the database: instance rows still open whose instance the provider no longer has
are marked terminated, and jobs whose worker's lease expired are queued again to resume.
With `dry_run`, nothing is changed and the report says what would be done.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from orchestrator.core import money
from orchestrator.core.states import EndReason, ServerStatus
from orchestrator.engine import recovery
from orchestrator.records.store import FINAL_STATUSES, Server, Store, WarmInstance, from_micros
from providers.base import Instance, KeepsMachine, NotFound, Provider, ProviderError


class ActionKind(StrEnum):
    """What reconcile did (or would do) about one machine, row, job or server."""

    TERMINATE = "terminate"
    KEEP = "keep"
    MARK_TERMINATED = "mark-terminated"
    REQUEUE = "requeue"
    SCRUB_SECRETS = "scrub-secrets"
    ERROR = "error"


A = ActionKind


@dataclass(frozen=True)
class Action:
    """One thing reconcile did (or, in a dry run, would do)."""

    kind: ActionKind
    provider: str
    instance_id: str | None
    job_id: str | None
    reason: str


@dataclass
class Report:
    """Everything reconcile decided, in order."""

    dry_run: bool
    actions: list[Action] = field(default_factory=list)

    def of(self, kind: ActionKind) -> list[Action]:
        """Actions of one kind."""
        return [a for a in self.actions if a.kind == kind]


def _verdict(store: Store, inst: Instance, idle: dict[str, float]) -> tuple[ActionKind, str]:
    owner = store.machine_owner(inst.provider, inst.instance_id)
    if isinstance(owner, WarmInstance):
        # Kept warm for the next job; windows that closed were ended before this loop.
        return A.KEEP, (f"kept warm until {owner.expires_at:%Y-%m-%d %H:%M:%S} UTC for the "
                        "next job")
    # A machine taken warm carries the tag of the job that rented it; its owner is the job
    # whose open instance row names it.
    job_id = owner or inst.job_id
    if job_id is None:
        return A.KEEP, "not tagged as orch's"
    job = store.find_job(job_id)
    if job is None:
        return A.TERMINATE, f"job {job_id} is not in the database (crash before it was recorded?)"
    if job.status in FINAL_STATUSES:
        return A.TERMINATE, f"job {job_id} is {job.status}"
    if job_id in idle:
        return A.TERMINATE, (f"job {job_id} has waited over {idle[job_id]:.0f}s for a worker "
                             "since it was requeued; its checkpoints stay on its volume")
    recorded = {r.provider_instance_id for r in store.instances_of(job_id)
                if r.provider == inst.provider}
    # The database's clock (PostgreSQL's): this machine's may be off (issue 23 §6).
    lapsed = job.lease_expires_at is None or job.lease_expires_at < store.now()
    if inst.instance_id not in recorded and lapsed:
        # Created, but the process died before writing its id down, and nobody drives the
        # job now: the next attempt rents a fresh machine, so this one only costs money.
        return A.TERMINATE, (f"job {job_id} never recorded this instance and no worker holds "
                             "the job (crash between create and the database write)")
    return A.KEEP, f"job {job_id} is {job.status}"


def reconcile(store: Store, providers: Mapping[str, Provider], *,
              dry_run: bool = False, idle_grace_s: float | None = None,
              scrub: Callable[[Server], list[str]] | None = None) -> Report:
    """Terminate orphaned instances, close stale instance rows, requeue dead workers' jobs.

    `idle_grace_s` (default `recovery.IDLE_GRACE_S`): how long an instance of a requeued
    job nobody drives is kept for a worker to adopt before it is terminated.
    With `scrub` (a server row -> secret files it removed), every idle registered server
    with a pinned host key is also cleaned of secrets a crashed job left (issue 10 §6).
    """
    report = Report(dry_run)
    live: dict[str, set[str]] = {}
    ended = _end_warm(store, providers, report)  # first: the listing keeps live windows only
    grace = recovery.IDLE_GRACE_S if idle_grace_s is None else idle_grace_s
    idle = {job.id: grace for job in recovery.unowned_idle(store, grace)}
    for name, provider in providers.items():
        try:
            instances = provider.list()
        except ProviderError as exc:
            report.actions.append(Action(A.ERROR, name, None, None, f"cannot list: {exc}"))
            continue
        live[name] = {i.instance_id for i in instances}
        for inst in instances:
            if (name, inst.instance_id) in ended:
                continue
            verdict, reason = _verdict(store, inst, idle)
            if verdict is A.TERMINATE and not dry_run:
                try:
                    provider.terminate(inst.instance_id)
                except ProviderError as exc:
                    report.actions.append(Action(A.ERROR, name, inst.instance_id, inst.job_id,
                                                 f"terminate failed: {exc}"))
                    continue
                owner = store.machine_owner(name, inst.instance_id)
                job_id = owner if isinstance(owner, str) else inst.job_id
                if job_id in idle:  # its row gets the idle time it billed
                    for row in store.instances_of(job_id):
                        if (row.provider, row.provider_instance_id) == (name, inst.instance_id) \
                                and row.terminated_at is None:
                            recovery.close_row(store, row, EndReason.IDLE)
                store.mark_terminated(name, inst.instance_id)
                if inst.job_id and store.find_job(inst.job_id) is not None:
                    store.add_event(inst.job_id, "reconcile.terminated",
                                    f"{name} instance {inst.instance_id} terminated: {reason}")
            report.actions.append(Action(verdict, name, inst.instance_id, inst.job_id, reason))

    for row in store.open_instances():
        if row.provider not in live or row.provider_instance_id is None:
            continue  # provider not configured here, or create never returned an id
        if row.provider_instance_id in live[row.provider]:
            continue
        provider = providers[row.provider]
        try:
            provider.get(row.provider_instance_id)
            continue  # listed under another tag but still there: leave it
        except NotFound:
            pass
        except ProviderError as exc:
            report.actions.append(Action(A.ERROR, row.provider, row.provider_instance_id,
                                         row.job_id, f"cannot check: {exc}"))
            continue
        if not dry_run:
            store.mark_terminated(row.provider, row.provider_instance_id)
        report.actions.append(Action(A.MARK_TERMINATED, row.provider, row.provider_instance_id,
                                     row.job_id, "the provider no longer has it"))

    for job in store.expired_leases():
        reason = f"worker {job.lease_owner or '?'} lost its lease while the job was {job.status}"
        if not dry_run:
            store.requeue(job.id, reason)
        report.actions.append(Action(A.REQUEUE, job.provider or "", None, job.id, reason))
    # Servers the user keeps (a provider that declares KeepsMachine) outlive jobs: a crashed
    # job's secret files are removed from them here.
    kept = next((n for n, p in providers.items() if isinstance(p, KeepsMachine)), None)
    if scrub is not None and kept is not None:
        _scrub_servers(store, scrub, report, kept)
    return report


def _end_warm(store: Store, providers: Mapping[str, Provider],
              report: Report) -> set[tuple[str, str]]:
    """End the warm windows that closed while no orch process ran (docs/warm.md): the
    (provider, instance id) of each machine ended."""
    from orchestrator.engine.warm import end_expired

    done: set[tuple[str, str]] = set()
    for ended in end_expired(store, providers, dry_run=report.dry_run):
        w = ended.warm
        done.add((w.provider, w.provider_instance_id))
        if ended.error is not None:
            report.actions.append(Action(A.ERROR, w.provider, w.provider_instance_id,
                                         w.parked_by_job, f"warm instance {w.id}: "
                                         f"{ended.error}"))
            continue
        until = f"{w.expires_at:%Y-%m-%d %H:%M:%S}"
        report.actions.append(Action(A.TERMINATE, w.provider, w.provider_instance_id,
                                     w.parked_by_job, f"kept warm until {until} UTC and no job "
                                     f"took it (idle cost "
                                     f"{money.usd(from_micros(w.idle_micros))})"))
    return done


def _scrub_servers(store: Store, scrub: Callable[[Server], list[str]], report: Report,
                   provider: str) -> None:
    for server in store.list_servers():
        if server.claimed_by_job or server.status != ServerStatus.IDLE or not server.host_key:
            continue  # a running job still needs its secrets; an unpinned server is unknown
        if report.dry_run:
            report.actions.append(Action(A.SCRUB_SECRETS, provider, server.name, None,
                                         "would remove secret files a job left"))
            continue
        try:
            removed = scrub(server)
        except Exception as exc:  # one unreachable server must not stop the others
            report.actions.append(Action(A.ERROR, provider, server.name, None,
                                         f"cannot remove secret files: {exc}"))
            continue
        if removed:
            report.actions.append(Action(A.SCRUB_SECRETS, provider, server.name, None,
                                         f"removed {len(removed)} secret file(s) a job left"))
