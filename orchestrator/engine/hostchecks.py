"""The pre-flight host check in the engine: which rentals are checked, against what, what is
remembered of each machine, and what becomes of one that fails (issue 40, docs/hostchecks.md).

A fresh rental's first run of the pipeline checks the host before anything is downloaded
(`PipelineJob.host_check`, run by `playbooks.pipeline`): not a machine taken warm (it ran a
job already), not a takeover of an instance this job already checked (its `host.checked`
event says so) nor one past its first phase. A registered monthly server is checked the same
way when its check is due (`core.servercheck.due`: never checked, its last check found
something, or that check is a week old), but not on a takeover of the job there (what the job
runs there would be measured as someone else's); its report kept against the server's name; it is
never released nor replaced: a blocking finding fails the job naming the server, the check
and the fix, a slow one is a warning (`core.servercheck.judge`). Every report is an event
and a `host_observation` row keyed by the provider's machine id; a failing rental is
released at once with `end_reason = host_check_failed` (what it billed stays on its row, in
the job's cost) and the job is placed again, at most `MAX_REJECTED_HOSTS` times. Placement
leaves out offers of machines host memory says to avoid (`screen`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace

from orchestrator.core import checkpointing, hostmemory, servercheck
from orchestrator.core.hostmemory import Observation, Source
from orchestrator.core.planning import host_disk_gb
from orchestrator.core.settings import settings
from orchestrator.core.states import EndReason, EventKind
from orchestrator.engine.jobinputs import Inputs
from orchestrator.engine.runner_core import JobFailed, Ledger, Placed, RunState
from orchestrator.engine.teardown import Teardown
from orchestrator.records import preemptions
from orchestrator.records.store import Store, utcnow
from orchestrator.records.store.hosts import observation
from playbooks.hostcheck import DEFAULT_PULL_BYTES_PER_S, HostCheckSpec, HostRejected
from playbooks.hostreport import HostReport, thresholds
from playbooks.pipeline import PipelineJob
from providers import catalog
from providers.base import Offer, keeps_machine

# Machines that failed their check, per job: then the job fails (the market is mostly bad,
# or the check is wrong for this job), rather than renting on and on.
MAX_REJECTED_HOSTS = 5


def wanted(state: RunState, placed: Placed, kept: bool) -> bool:
    """Whether this run of the pipeline on `placed` checks the host first (see module doc);
    a registered server's due check is said in a `server.check_due` event."""
    if not settings().host_checks or placed.warm:
        return False
    job = state.ledger.job()
    if job.phase_done:
        return False
    iid = placed.inst.instance_id
    if any(e.kind == EventKind.HOST_CHECKED and e.data().instance == iid
           for e in state.store.events(state.job_id)):
        return False
    if not kept:
        return True
    if placed.adopted:
        # A takeover of the job on its registered server (a check not due when it started
        # may be due now): its trainer or eval server may run there, and the check would
        # measure them, its GPU memory most of all, as if they were someone else's.
        return False
    name = server_name(placed)
    why = server_due(state.store, placed.inst.provider, name)
    if why is not None:
        state.ledger.event("server.check_due", f"registered server {name} is host-checked "
                           f"before the job: {why}", {"server": name})
    return why is not None


def server_name(placed: Placed) -> str:
    """The registered server `placed` is (its instance id where the provider keeps none)."""
    keeper = keeps_machine(placed.provider)
    iid = placed.inst.instance_id
    return keeper.server_name(iid) if keeper is not None else iid


def server_due(store: Store, provider: str, name: str) -> str | None:
    """Why registered server `name`'s host check is due now (None: it is not)."""
    rows = store.host_observations(provider, [name])
    return servercheck.due([observation(r) for r in rows], utcnow())


def disk_floor(offer: Offer | None) -> float:
    """Bytes/s: the slowest write a host passes the disk check at (half the offer's planned
    download rate, playbooks/data/hostchecks.yaml), which a checkpoint is estimated at."""
    return thresholds().disk.floor(offer.pull_bytes_per_s if offer is not None
                                   else DEFAULT_PULL_BYTES_PER_S)


def spot_risk(state: RunState, placed: Placed) -> checkpointing.Spot | None:
    """What a spot rental's checkpoint interval is chosen from (None: not spot, or a kept
    server): its provider's GPU preemption rate (the prior, then orch's history) and the
    disk floor."""
    inst = placed.inst
    if not inst.interruptible or keeps_machine(placed.provider) is not None:
        return None
    held = state.held.get(placed.row_id)
    rate = preemptions.rate_of(state.store, inst.provider, inst.gpu or "")
    return checkpointing.Spot(rate.preemptions_per_hour,
                              disk_floor(held.offer if held is not None else None))


def spec_for(state: RunState, inputs: Inputs, pj: PipelineJob,
             placed: Placed) -> HostCheckSpec | None:
    """What the check of `placed` measures against (None: a GPU orch has no rated figure for:
    the check cannot judge it)."""
    gpu = catalog.gpus().get(pj.gpu.model)
    if gpu is None or gpu.bf16_tflops <= 0:
        return None
    held = state.held.get(placed.row_id)
    offer: Offer | None = held.offer if held is not None else None
    pull = offer.pull_bytes_per_s if offer is not None else DEFAULT_PULL_BYTES_PER_S
    # The Hub the host's own model download uses: huggingface.co (the model cache playbook
    # sets no HF_ENDPOINT on the host; orch's own HF_ENDPOINT is where it asks and uploads).
    return HostCheckSpec(job_id=pj.job_id, gpu=pj.gpu, rated_tflops=gpu.bf16_tflops,
                         disk_need_bytes=int(host_disk_gb(inputs.loaded, 1) * 1e9),
                         repo=pj.repo, revision=pj.revision, trainer_image=pj.trainer_image,
                         pull_bytes_per_s=pull, hub_endpoint=None, hf_token=pj.hf_token,
                         # a registered server is not released: it is told everything found
                         complete=keeps_machine(placed.provider) is not None)


def _why(report: HostReport) -> str:
    failures = report.failures
    if not failures:
        return "passed"
    return "; ".join(f"{check.value}: {reason}" for check, reason in failures.items())


def checked(ledger: Ledger, placed: Placed, report: HostReport, kept: bool = False,
            image: str = "the trainer image") -> None:
    """Record a check's report: an event, and the machine's host-memory row (a registered
    server's: keyed by its name). On a registered server, raise JobFailed when the report
    blocks the job (`servercheck.judge`), and warn when it only slows it."""
    inst = placed.inst
    machine = server_name(placed) if kept else inst.machine_id
    verdict = servercheck.judge(machine or inst.instance_id, report, image) if kept else None
    said = ("passed" if report.passed else "failed") if verdict is None else verdict.outcome
    ledger.event(EventKind.HOST_CHECKED,
                 f"host check of {inst.provider} instance {inst.instance_id}"
                 + (f" (machine {machine})" if machine and not kept else "")
                 + f" {said} in {report.seconds:.1f}s: {_why(report)}",
                 {"instance": inst.instance_id, "machine_id": machine,
                  "passed": report.passed, "report": json.loads(report.model_dump_json())})
    if machine:
        ledger.store.record_host_observation(
            inst.provider, machine, Source.CHECK, failed=not report.passed,
            delivered=report.delivered_fraction, why=_why(report), job_id=ledger.job_id,
            report_json=report.model_dump_json())
    if verdict is not None:
        _judged(ledger, verdict)


def _judged(ledger: Ledger, verdict: servercheck.ServerVerdict) -> None:
    """A registered server's check: JobFailed when it blocks the job, else a warning for
    each slow finding not warned of yet in this job (the GPUs measured after the set-up
    complete a report that warned already)."""
    if verdict.blocking:
        message = verdict.failure_message()
        ledger.event("server.check_failed", message,
                     {"server": verdict.server,
                      "findings": [f.to_dict() for f in verdict.blocking]})
        raise JobFailed(message)
    warned = {f.check for e in ledger.store.events(ledger.job_id)
              if e.kind == "server.slow" for f in e.data().findings or ()}
    new = [f for f in verdict.slow if f.check.value not in warned]
    if new:
        warn = replace(verdict, findings=tuple(new))
        ledger.event("server.slow", warn.warning(),
                     {"server": verdict.server, "findings": [f.to_dict() for f in new]})


def ran(ledger: Ledger, placed: Placed, planned_s: float | None, seconds: float,
        tokens: int) -> None:
    """A training finished uninterrupted on a rented machine: remember its speed against the
    plan's (the plan's training seconds over the measured ones) for that machine."""
    machine = placed.inst.machine_id
    if not machine or not planned_s or seconds <= 0:
        return
    delivered = planned_s / seconds
    ledger.store.record_host_observation(
        placed.inst.provider, machine, Source.RUN, failed=False, delivered=round(delivered, 4),
        why=f"trained {tokens / seconds:,.0f} tokens/s, {delivered:.0%} of its plan's",
        job_id=ledger.job_id)


def rejected(state: RunState, teardown: Teardown, placed: Placed, exc: HostRejected,
             tried: set[tuple[str, str]]) -> None:
    """`placed` failed its check: release it now and let the job be placed again (JobFailed
    after `MAX_REJECTED_HOSTS` machines)."""
    held = state.held.get(placed.row_id)
    offer = held.offer if held is not None else None
    state.clear_stop(unwatch=True)
    state.factory.close_all()
    teardown.release(placed.row_id, EndReason.HOST_CHECK_FAILED)
    if offer is not None and offer.machine_id is None:
        # Sold by model: the provider picks the machine, so the same offer may give another.
        tried.discard((offer.provider, offer.offer_id))
    store, job_id = state.store, state.job_id
    count = sum(1 for r in store.instances_of(job_id)
                if r.end_reason == EndReason.HOST_CHECK_FAILED)
    inst = placed.inst
    state.ledger.event("host.rejected", f"{inst.provider} instance {inst.instance_id} failed "
                       f"its host check and was released ({exc.reason}); {count} of at most "
                       f"{MAX_REJECTED_HOSTS} machines rejected for this job",
                       {"instance": inst.instance_id, "machine_id": inst.machine_id,
                        "rejected": count})
    if count >= MAX_REJECTED_HOSTS:
        raise JobFailed(f"{count} machines failed their host check ({exc.reason}); the "
                        "market may be mostly bad for this job: see `orch hosts`, or set "
                        "ORCH_HOST_CHECKS=off to run unchecked")


def screen(store: Store, offers: Sequence[Offer], ledger: Ledger,
           priced: dict[tuple[str, str], Offer]) -> list[Offer]:
    """`offers` as host memory ranks them (`hostmemory.screen`: those of machines to avoid
    left out, those to price at what they deliver repriced, the offer as sold kept in
    `priced` by (provider, offer id) for the rental); a `hosts.avoided` event says which."""
    named = {(o.provider, o.machine_id) for o in offers if o.machine_id and not o.registered}
    if not named:
        return list(offers)
    seen: dict[tuple[str, str], list[Observation]] = {}
    for provider in {p for p, _ in named}:
        rows = store.host_observations(provider, [m for p, m in named if p == provider])
        for row in rows:
            seen.setdefault((row.provider, row.machine_id), []).append(observation(row))
    result = hostmemory.screen(offers, seen, utcnow())
    priced.update(result.sold)
    if result.notes:
        ledger.event("hosts.avoided", "; ".join(result.notes))
    return result.offers
