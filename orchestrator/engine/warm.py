"""Warm instances: park a finished job's machine, take a parked one, end expired windows.

`Warm`, a collaborator of `orchestrator.engine.runner.JobRunner` over the run's shared state
(`runner_core.RunState`), with `resources.keep_warm` (docs/warm.md):
- at the end of a job that succeeded on a per-second rental, the job's directory is removed
  from the machine (its artifacts are copied back; the model cache stays) and the machine is
  parked for `keep_warm` instead of terminated;
- placement offers the parked machines the job may take (`core.warmfit`) beside the fresh
  offers, and takes one when the scheduler ranks it cheapest (setup included);
- `end_expired` terminates the machines whose window closed (every worker between jobs,
  every placement, and `orch reconcile` when no orch process ran).
Which row owns a machine at each step is the store's (`records.store.warm`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from orchestrator.core import money, scheduler, warmfit
from orchestrator.core.states import EndReason, StopKind, WarmState
from orchestrator.core.utc import iso_z
from orchestrator.engine.jobinputs import Inputs
from orchestrator.engine.runner_core import (
    CANCELLED,
    LOST,
    Placed,
    RunState,
    Stop,
    failpoint,
    log,
)
from orchestrator.engine.teardown import Teardown
from orchestrator.records.store import CancelRequested, Store, WarmInstance, from_micros
from orchestrator.records.store.warm import as_machine
from playbooks import images, ssh
from playbooks.base import StepFailed
from providers import retried
from providers.base import Billing, KeepsMachine, NotFound, Offer, Provider, ProviderError

# Billing kinds whose meter stops at terminate: only those are worth keeping for a while.
METERED = (Billing.PER_SECOND, Billing.PER_MINUTE)


class Warm:
    """Parking and taking warm machines (the ends of an attempt)."""

    def __init__(self, state: RunState, inputs: Inputs, teardown: Teardown) -> None:
        self.state = state
        self.ledger = state.ledger
        self.inputs = inputs
        self.teardown = teardown
        spec = inputs.loaded.spec
        self.keep_s = spec.resources.keep_warm
        # The image a rental is created from (a monthly server would run it in Docker).
        self.image = images.for_host(spec.trainer.image, "container")
        self.model = (spec.base_model.repo, spec.base_model.revision)
        self.parked: WarmInstance | None = None  # the machine this run kept warm

    # --- taking --------------------------------------------------------------------------

    def offers(self, usable: list[str]) -> tuple[list[Offer], frozenset[str]]:
        """The parked machines this job may take, as offers, and those holding its model.

        Windows that closed are ended first (their machines terminated), so nobody pays
        for a machine past its window because no worker was idle to notice.
        """
        end_expired(self.state.store, {n: self.state.providers[n] for n in usable})
        rows, now = self.state.store.parked()
        return warmfit.offers((as_machine(r) for r in rows), providers=usable, image=self.image,
                              disk_gb=self.ledger.disk_gb, model=self.model, now=now)

    def take(self, placement: scheduler.Placement) -> Placed | None:
        """Take the warm machine `placement` stands for; None when another job took it
        first, its window closed, or the machine is gone (the caller tries the next)."""
        offer = placement.offer
        wid = warmfit.warm_id(offer)
        provider = self.state.providers[offer.provider]
        cached = "its base model cached" if placement.duration.model_pull == 0 else "booted"
        job = self.ledger.placing(placement, f"taking warm {offer.provider} {offer.gpu} "
                                  f"x{offer.gpu_count} (warm instance {wid}: running, {cached})")
        got = self.state.store.take_warm(wid, self.state.job_id, job.attempt)
        if got is None:
            self.ledger.event("warm.missed", f"warm instance {wid} was taken by another job "
                              "or its window closed; trying the next placement")
            return None
        row, taken = got
        assert row.id is not None  # flushed by the take; its machine id copied from the warm row
        iid = taken.provider_instance_id
        held = self.state.hold(row.id, offer.provider, iid)
        failpoint("after-take")
        held.offer = warmfit.offer_from_json(taken.offer_json)
        try:
            inst = retried.look_up(provider, iid)
        except NotFound:
            inst = None
        if inst is None or inst.state in LOST:
            self.ledger.event("warm.lost", f"warm {offer.provider} instance {iid} is gone or "
                              "does not answer; trying the next placement")
            self.teardown.release(row.id, EndReason.LOST)
            return None
        price, idle = (money.usd(from_micros(m)) for m in (row.price_per_hour_micros,
                                                           taken.idle_micros))
        self.ledger.event("instance.warm_taken",
                          f"took warm {offer.provider} instance {iid} (parked by job "
                          f"{taken.parked_by_job}; {price}/h; its idle time, {idle}, is "
                          "billed to no job)",
                          {"instance": iid, "warm_id": wid, "parked_by": taken.parked_by_job})
        self.state.store.mark_placed(self.state.job_id)
        return Placed(row.id, provider, inst, warm=True)

    # --- parking -------------------------------------------------------------------------

    def parks(self, placed: Placed) -> bool:
        """Whether this job's machine is kept warm when it succeeds (else terminated)."""
        held = self.state.held.get(placed.row_id)
        provider, offer = placed.provider, None if held is None else held.offer
        return (self.keep_s > 0 and offer is not None and offer.billing in METERED
                and not offer.registered and not isinstance(provider, KeepsMachine))

    def park_or_release(self, placed: Placed) -> None:
        """The job succeeded on `placed`: keep its machine warm (keep_warm), else release.
        A job asked to stop meanwhile has its machine terminated, never parked (Stop)."""
        if not self.parks(placed) or not self._clean(placed):
            self.teardown.release(placed.row_id, EndReason.RELEASED)
            return
        offer = self.state.held[placed.row_id].offer
        assert offer is not None  # `parks` said so
        try:
            warm = self.state.store.park_instance(
                placed.row_id, offer_json=warmfit.offer_json(offer), image=self.image,
                disk_gb=self.ledger.disk_gb, model=self.model, keep_s=self.keep_s)
        except CancelRequested as exc:  # judged in the park's own transaction
            self.teardown.release(placed.row_id, EndReason.CANCELLED)
            raise Stop(StopKind.CANCELLED, CANCELLED) from exc
        self.parked = warm
        self.state.held.pop(placed.row_id, None)
        failpoint("after-park")
        price = from_micros(warm.price_per_hour_micros)
        self.ledger.event("instance.parked",
                          f"{warm.provider} instance {warm.provider_instance_id} kept warm until "
                          f"{warm.expires_at:%H:%M:%S} UTC for the next job that fits it "
                          f"({money.usd(price)}/h while idle, billed to no job; `orch warm` "
                          "lists it, `orch warm release` ends it)",
                          {"instance": warm.provider_instance_id, "warm_id": warm.id,
                           "expires_at": iso_z(warm.expires_at)})

    def unpark(self) -> None:
        """The job was cancelled after this run parked its machine (before it could
        succeed): end the window, terminating the machine, unless a job took it already."""
        warm, self.parked = self.parked, None
        if warm is None or warm.id is None:
            return
        provider = self.state.providers[warm.provider]
        ended = end_one(self.state.store, provider, warm, EndReason.CANCELLED,
                        expired_only=False)
        what = f"{warm.provider} instance {warm.provider_instance_id}"
        if ended is None:
            taker = self.state.store.get_warm(warm.id).taken_by_job
            self.teardown.ended.append(f"{what} was already taken warm by job {taker}")
        elif ended.error is not None:
            self.teardown.ended.append(f"{what} not terminated ({ended.error})")
        else:
            self.teardown.ended.append(f"{what} terminated")

    def _clean(self, placed: Placed) -> bool:
        """Remove the finished job's directory from the machine (artifacts were copied back;
        the model cache stays); False when the machine cannot be reached: not parked."""
        held = self.state.held.get(placed.row_id)
        job_dir = None if held is None else held.job_dir
        row = self.teardown.reachable_row(placed.row_id)
        if job_dir is None or row is None:
            return False
        try:
            host = self.teardown.connect_again(row)
            host.must(["rm", "-rf", "--", job_dir], "removing the finished job's files")
        except (ssh.SSHError, StepFailed) as exc:
            self.ledger.event("warm.not_parked", f"could not clean the machine for the next "
                              f"job ({exc}); terminating it instead")
            return False
        return True


@dataclass(frozen=True)
class Ended:
    """One warm machine `end_expired` ended (or could not)."""

    warm: WarmInstance
    error: str | None = None


def end_expired(store: Store, providers: Mapping[str, Provider], *,
                dry_run: bool = False) -> list[Ended]:
    """Terminate the warm machines of `providers` whose window closed (and those left
    `ending` by a crash); each row ends `expired` with its idle cost."""
    done: list[Ended] = []
    for row in store.to_end():
        provider = providers.get(row.provider)
        if provider is None or row.id is None:
            continue  # not configured in this process: another one ends it
        if dry_run:
            done.append(Ended(row))
            continue
        ended = end_one(store, provider, row, EndReason.EXPIRED)
        if ended is not None:
            done.append(ended)
    return done


def end_one(store: Store, provider: Provider, row: WarmInstance, reason: EndReason,
            *, expired_only: bool = True) -> Ended | None:
    """Terminate one warm machine: `ending` first (so no job takes it meanwhile), then the
    provider, then `ended`. None when it was not ours to end (taken meanwhile)."""
    warm_id = row.id
    assert warm_id is not None
    if row.state == WarmState.PARKED:
        claimed = store.begin_ending(warm_id, expired_only=expired_only)
        if claimed is None:
            return None
        row = claimed
    failpoint("warm-ending")
    try:
        retried.terminate(provider, row.provider_instance_id)
    except ProviderError as exc:
        log.warning("warm instance %s: terminate failed: %s", row.id, exc)
        return Ended(row, f"terminate failed: {exc}; `orch reconcile` retries")
    ended = store.finish_ending(warm_id, reason)
    return Ended(ended or row)
