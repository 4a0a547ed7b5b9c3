"""Where a job runs: adopt its instance after a takeover, or rank live offers and rent one.

`Placement`, a collaborator of `orchestrator.engine.runner.JobRunner` over the run's shared
state (`runner_core.RunState`): the providers a job may use (an opt-in provider only when the
job names it), their offers ranked by the scheduler, provisioning with the instance row written
before `create`, and the sweep of instances tagged with the job that no row knows.
"""

from __future__ import annotations

import os
from decimal import ROUND_HALF_EVEN, Decimal

from orchestrator.core import money, offerbook, scheduler, warmfit
from orchestrator.core.planning import (
    constraints_from,
    eval_work,
    extras_for,
    requirements,
    total_tokens,
    workload_from,
)
from orchestrator.core.states import EndReason, RowState
from orchestrator.engine import budget, hostchecks, hubaccess, integrations, market, recovery
from orchestrator.engine.jobinputs import Inputs
from orchestrator.engine.runner_core import (
    LOST,
    JobFailed,
    Placed,
    RunState,
    failpoint,
    log,
)
from orchestrator.engine.teardown import Teardown
from orchestrator.engine.warm import Warm
from orchestrator.records import prices
from orchestrator.records.store import to_micros
from playbooks import images
from providers import catalog, retrying
from providers.answers import merge
from providers.base import (
    AuthError,
    BalanceError,
    Billing,
    CapacityError,
    HubMirror,
    KeepsMachine,
    NotFound,
    Offer,
    OptInOnly,
    PriceChanged,
    Provider,
    ProviderError,
    QuotaError,
    ReportsRejected,
    ReportsSkipped,
    TransientError,
    keeps_machine,
)

# Searches in a row whose chosen offer changed price before the create (issue 23 §5).
REPRICE_ROUNDS = 3


class _Repriced(Exception):
    """Internal: an offer's price moved between the search and the create."""


class _Failed(Exception):
    """Internal: the provider refused one offer (capacity, or unavailable after retries)."""

    def __init__(self, message: str, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


def _placing(offer: Offer, provider: Provider) -> str:
    """The provisioning message: a registered server is claimed, not rented (issue 12 §4)."""
    if offer.registered:
        kept = keeps_machine(provider)
        name = kept.server_name(offer.offer_id) if kept is not None else offer.offer_id
        return (f"claiming registered server {name} "
                f"({offer.gpu} x{offer.gpu_count}, no marginal cost)")
    return (f"renting {offer.provider} {offer.gpu} x{offer.gpu_count} "
            f"({'spot' if offer.interruptible else 'on-demand'})")


def hourly_rate(offer: Offer) -> Decimal | None:
    """An offer's hourly price; a monthly server's is its amortisation rate."""
    hourly = offer.price_per_hour
    if hourly is None and offer.monthly_price is not None:
        hourly = offer.monthly_price / money.HOURS_PER_MONTH
    return hourly


class Placement:
    """Adopting, ranking and renting (the first part of an attempt)."""

    def __init__(self, state: RunState, inputs: Inputs, teardown: Teardown, warm: Warm) -> None:
        self.state = state
        self.ledger = state.ledger
        self.inputs = inputs
        self.teardown = teardown
        self.warm = warm
        # Offers ranked at what their machine delivers (host memory), as sold, by id.
        self.priced: dict[tuple[str, str], Offer] = {}
        # The deadline policy's choice (engine/deadlines.py): `required` (spot) or `never`
        # (on-demand) narrows the search for this rental; None: resources.spot as written.
        self.spot_rule: str | None = None

    def cheapest(self, spot_rule: str) -> scheduler.Placement | None:
        """The cheapest placement of one kind (`required`: spot, `never`: on-demand) now;
        None when none fits (spot gone, say)."""
        kept, self.spot_rule = self.spot_rule, spot_rule
        try:
            found = self._candidates(1)
        except budget.BudgetSpent:
            raise  # not "none of this kind now": nothing of any kind, ever
        except JobFailed:
            return None
        finally:
            self.spot_rule = kept
        return found[0] if found else None

    def adopt(self) -> Placed | None:
        """After a takeover: reuse the job's instance if it is still running, else clean up."""
        rows = [r for r in self.state.store.instances_of(self.state.job_id)
                if r.terminated_at is None]
        adopted: Placed | None = None
        for row in rows:
            provider = self.state.providers.get(row.provider)
            if provider is None or row.id is None:
                continue
            if row.provider_instance_id is None:
                # Created, maybe, but the id never reached the database: find it by its tag.
                found = self._tagged(provider, row.provider)
                if not found:
                    self.teardown.close_row(row.id, EndReason.FAILED)
                    continue
                row = self.state.store.set_instance_id(row.id, found[0])
            assert row.provider_instance_id is not None and row.id is not None
            try:
                inst = provider.get(row.provider_instance_id)
            except NotFound:
                self.teardown.close_row(row.id, EndReason.INTERRUPTED)
                continue
            except ProviderError:
                inst = None
            self.state.hold(row.id, row.provider, row.provider_instance_id)
            if adopted is None and inst is not None and inst.state not in LOST:
                self.ledger.event("instance.adopted", f"reattaching to {row.provider} instance "
                                  f"{row.provider_instance_id} after a takeover")
                adopted = Placed(row.id, provider, inst, adopted=True)
            else:  # lost, or a second machine of the job: only a lost one was taken
                self.teardown.release(row.id, EndReason.INTERRUPTED if inst is None or
                                      inst.state in LOST else EndReason.REPLACED)
        # Instances tagged with this job that no row knows (a crash inside create). Only
        # the providers this job can use or has used are asked: another provider being down
        # must not stall this job (sweeping those is `orch reconcile`'s work).
        mine = set(self.usable()) | {r.provider for r in rows}
        for name, provider in self.state.providers.items():
            if name in mine:
                self._orphan_sweep(provider, name)
        return adopted

    def usable(self) -> list[str]:
        """The configured providers this job may be placed on."""
        named = constraints_from(self.inputs.loaded).providers
        return [name for name in self.state.providers
                if (named is None or name in named)
                # an opt-in provider (the simulated cloud) only runs jobs that name it
                and not (isinstance(self.state.providers[name], OptInOnly)
                         and (named is None or name not in named))]

    def _tagged(self, provider: Provider, name: str) -> list[str]:
        if isinstance(provider, KeepsMachine):
            return []  # a kept server is claimed, never an orphan to destroy
        if recovery.OUTAGES.down(provider):
            return []  # a provider in an outage is swept by `orch reconcile` later
        try:
            return [i.instance_id for i in provider.list(self.state.job_id)]
        except TransientError:
            recovery.OUTAGES.mark(provider, self.state.opts.backoff_s)
            return []
        except ProviderError:
            return []

    def _candidates(self, k: int) -> list[scheduler.Placement]:
        """The `k` cheapest placements over live offers of the job's providers, cheapest
        first (the retry list: `offerbook.top`, not the full ranking, which only a table
        needs)."""
        loaded = self.inputs.loaded
        constraints = constraints_from(loaded)
        # Nothing is rented once the job's bill has reached resources.max_cost (budget.py).
        budget.check_left(self.state, constraints.max_cost)
        if self.spot_rule is not None:
            constraints = constraints._replace(spot=self.spot_rule)
        named = constraints.providers
        offers: list[Offer] = []
        notes: list[str] = []
        unavailable: list[str] = []
        asked_wait: float | None = None  # the longest Retry-After a provider sent
        for name in self.usable():
            provider = self.state.providers[name]
            down = recovery.OUTAGES.down(provider)
            if down:
                unavailable.append(f"{name}: unavailable (an outage seen moments ago; asked "
                                   f"again in {down:.0f}s)")
                continue
            found, wait = self._offers_of(name, provider, constraints, notes, unavailable)
            offers += found
            if wait is not None:
                asked_wait = max(asked_wait or 0.0, wait)
        for note in notes + unavailable:
            self.ledger.event("offers.note", note)
        # Dedicated servers answer every GPU count they can serve: keep each offer once
        # (a Vast.ai machine's spot and on-demand offers share an id: both are kept).
        offers = list({(o.provider, o.offer_id, o.gpu_count, o.interruptible): o
                       for o in offers}.values())
        prices.record(self.state.store, offers)  # price history (`orch prices`)
        # Machines host memory says to avoid (a failed check, far too slow) are not rented.
        offers = hostchecks.screen(self.state.store, offers, self.ledger, self.priced)
        # Machines kept warm by earlier jobs, priced as running (no boot) and, where they hold
        # this job's base model, without its download: the ranking decides whether one beats
        # a fresh machine with its setup (docs/warm.md).
        warm, cached = self.warm.offers(self.usable())
        offers += warm
        w, tokens, gpus = workload_from(loaded), total_tokens(loaded), catalog.gpus()
        work = eval_work(loaded)  # evaluated on the training machine: it must serve the model
        # Priced as `orch plan` prices it and as the bill counts it: the delivery's hours
        # included (the budget, resources.max_cost, is judged on that).
        extras = extras_for(loaded)
        placements = offerbook.top(w, tokens, offerbook.OfferBook.of(offers, alone=warm), gpus,
                                   k, constraints, cached_on=cached,
                                   measured=self.inputs.measured, evaluation=work,
                                   extras=extras)
        if not placements:
            if unavailable:
                # Not a verdict on the job: what the unavailable providers offer is unknown.
                raise recovery.ProvidersUnavailable("; ".join(unavailable + notes),
                                                    retry_after=asked_wait)
            if not offers:
                which = ", ".join(sorted(named)) if named else ", ".join(
                    n for n in sorted(self.state.providers)
                    if not isinstance(self.state.providers[n], OptInOnly))
                raise JobFailed(f"no offers from {which or 'any provider'}"
                                + (f" ({'; '.join(notes)})" if notes else "")
                                + "; add credentials (VAST_API_KEY, RUNPOD_API_KEY), register "
                                "a server with `orch servers add`, or try the simulated cloud "
                                "with `resources.providers: [sim]`")
            # Why nothing fits needs every offer's reason: the full ranking, on failure only.
            ranking = scheduler.rank(w, tokens, offers, gpus, constraints, cached_on=cached,
                                     measured=self.inputs.measured, evaluation=work,
                                     extras=extras)
            raise JobFailed(scheduler.no_fit_message(w, offers, ranking, constraints))
        return placements

    def _offers_of(self, name: str, provider: Provider, constraints: scheduler.Constraints,
                   notes: list[str], unavailable: list[str]) -> tuple[list[Offer], float | None]:
        """`provider`'s offers for every GPU count the job allows, and the Retry-After it
        asked for (None: none); problems go to `notes` (a verdict) or `unavailable` (an
        outage), GPUs orch does not plan to `notes` by name. An answer orch cannot use
        (`BadAnswer`), or no offer beside invalid rows (one of which might have fitted), is
        an outage: what the provider really offers is unknown, so the job waits."""
        offers: list[Offer] = []
        skipped: dict[str, int] = {}
        rejected: dict[str, int] = {}
        answered, wait = True, None
        for req in requirements(constraints, self.ledger.disk_gb,
                                images.min_cuda(self.inputs.loaded.spec.trainer.image)):
            try:
                offers += provider.offers(req)
                if isinstance(provider, ReportsSkipped):
                    merge(skipped, provider.skipped)
                if isinstance(provider, ReportsRejected):
                    merge(rejected, provider.rejected)
            except (AuthError, BalanceError, QuotaError) as exc:
                notes.append(f"{name}: {exc}")
                break
            except TransientError as exc:  # after the adapter's retries: an outage
                unavailable.append(f"{name}: provider unavailable ({exc})")
                wait = exc.retry_after
                answered = False
                break
            except ProviderError as exc:
                notes.append(f"{name}: offers unavailable ({exc})")
                break
        if rejected and not offers and answered:
            unavailable.append(f"{name}: provider unavailable (no usable offer; "
                               f"{market.rejected_note(name, rejected)})")
            answered = False
        elif rejected:
            notes.append(market.rejected_note(name, rejected))
        if answered:
            recovery.OUTAGES.clear(provider)
        else:
            recovery.OUTAGES.mark(provider, max(self.state.opts.backoff_s, wait or 0.0))
        if skipped:
            notes.append(catalog.skipped_note(name, market.safe_names(skipped)))
        return offers, wait

    def check_before_renting(self) -> None:
        """What can fail the job on any host fails it here, before anything is billed.

        The base model's access on the Hub with the worker's `HF_TOKEN` (gated, private,
        missing, wrong revision: `hubaccess`), and write access to `output.push_to_hub`.
        Only while the job holds no instance and no phase is durable: a takeover's host has
        (or is fetching) the model already.
        """
        rows = self.state.store.instances_of(self.state.job_id)
        if self.ledger.job().phase_done or any(r.terminated_at is None for r in rows):
            return
        usable = [self.state.providers[name] for name in self.usable()]
        spec = self.inputs.loaded.spec
        token = os.environ.get("HF_TOKEN") or None
        # The Hub the hosts download from: HF_ENDPOINT (as for `hf`), else the providers' own
        # when every one the job may use has the same (the simulated cloud's), else the real.
        mirrors = {p.hub_endpoint() for p in usable if isinstance(p, HubMirror)}
        hub = None
        if not os.environ.get("HF_ENDPOINT") and usable and len(mirrors) == 1 and all(
                isinstance(p, HubMirror) for p in usable):
            hub = mirrors.pop()
        access = hubaccess.check_model(spec.base_model.repo, spec.base_model.revision, token,
                                       hub=hub)
        if access.problem is not None:
            raise JobFailed(f"before renting: {access.problem}")
        if access.unchecked is not None:
            self.ledger.event("hub.unchecked", f"base model access not checked before renting: "
                              f"{access.unchecked}; the host's download will tell")
        self._check_integrations(token, hub)
        if spec.output.push_to_hub is not None:
            # The upload comes last, after every paid hour: a token that cannot write is
            # found here (issue 36 §2).
            access = hubaccess.check_write(spec.output.push_to_hub, token)
            if access.problem is not None:
                raise JobFailed(f"before renting: {access.problem}")
            if access.unchecked is not None:
                self.ledger.event("hub.unchecked", f"write access to {spec.output.push_to_hub} "
                                  f"not checked before renting: {access.unchecked}")

    def _check_integrations(self, token: str | None, hub: str | None) -> None:
        """Hub datasets (on the hosts' Hub), trackers' keys and webhooks (issue 39)."""
        from orchestrator.core.settings import settings

        spec, chosen = self.inputs.loaded.spec, settings()
        verdict = integrations.check_hub_datasets(spec, token, hub)
        problems = verdict.problems + integrations.environment_problems(
            spec, os.environ, chosen.notify_url, chosen.notify_secret_env)
        if problems:
            raise JobFailed("before renting: " + "; ".join(problems))
        for note in verdict.unchecked:
            self.ledger.event("hub.unchecked", f"dataset access not checked before renting: "
                              f"{note}; the host's download will tell")

    def place(self, tried: set[tuple[str, str]]) -> Placed:
        """Rent the cheapest fitting placement not `tried`; search again (a bounded number
        of times) when a price changed between the search and the create, so the new
        prices are re-planned within the job's limits (max price, budget)."""
        try:
            # No wait: a new search is the next attempt, with the prices as they are now.
            for attempt in retrying.policy(_Repriced, attempts=REPRICE_ROUNDS,
                                           wait=retrying.steps(0.0, 0.0)):
                with attempt:
                    return self._place_once(tried)
        except _Repriced as exc:
            raise recovery.ProvidersUnavailable(
                f"prices kept changing between search and create ({REPRICE_ROUNDS} searches; "
                f"last: {exc})") from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def _place_once(self, tried: set[tuple[str, str]]) -> Placed:
        """Try the cheapest placements not `tried`: at most `max_placements` fresh offers.

        A parked machine another job took first (or that is gone) is a warm miss, not a
        failed placement: it does not count, and the job falls through to the next
        placement, ranked again when the list ran out of fresh ones (issue 36 §7; before,
        five misses under warm contention failed the job)."""
        failures: list[str] = []
        transient = rented = 0
        first = not tried
        missed = True
        while missed and rented < self.state.opts.max_placements:
            missed = False
            # Enough of the cheapest that `max_placements` remain once those tried are left
            # out.
            placements = [p for p in self._candidates(self.state.opts.max_placements
                                                      + len(tried))
                          if (p.offer.provider, p.offer.offer_id) not in tried]
            if placements and first and not warmfit.is_warm(placements[0].offer):
                self._note_moved(placements[0])
            first = False
            for placement in placements:
                if rented >= self.state.opts.max_placements:
                    break
                offer = placement.offer
                tried.add((offer.provider, offer.offer_id))
                self.state.check_cancel()  # nothing is rented once the job is cancelled
                if warmfit.is_warm(offer):
                    taken = self.warm.take(placement)
                    if taken is not None:
                        return taken
                    missed = True
                    continue
                rented += 1
                try:
                    return self._rent(placement, tried)
                except _Failed as exc:
                    failures.append(str(exc))
                    transient += exc.transient
        if failures and transient == len(failures):
            raise recovery.ProvidersUnavailable("no placement could be provisioned, the "
                                                "providers are unavailable: "
                                                + "; ".join(failures))
        raise JobFailed("no placement could be provisioned: " + "; ".join(failures)
                        if failures else "no placement left to try (all failed before)")

    def _rent(self, placement: scheduler.Placement, tried: set[tuple[str, str]]) -> Placed:
        """Rent (or claim) `placement`'s offer, its instance row written first; _Failed
        when the provider refused it for a reason the next offer may not have."""
        # Rented as sold (ranked, maybe, at what its machine delivers: `hostchecks.screen`).
        offer = self.priced.get((placement.offer.provider, placement.offer.offer_id),
                                placement.offer)
        provider = self.state.providers[offer.provider]
        job = self.ledger.placing(placement, _placing(offer, provider))
        hourly = hourly_rate(offer)  # a monthly server's: its amortisation rate
        row = self.state.store.add_instance(
            self.state.job_id, provider=offer.provider, offer_id=offer.offer_id, gpu=offer.gpu,
            gpu_count=offer.gpu_count, billing=offer.billing.value,
            interruptible=offer.interruptible, price_per_hour=hourly or Decimal(0),
            attempt=job.attempt)
        assert row.id is not None
        self.state.hold(row.id, offer.provider, offer=offer)
        try:
            # A rental is created from the image it runs: the cloud variant (sshd on
            # PUBLIC_KEY); a monthly server ignores it and runs the trainer in Docker.
            inst = provider.create(offer, self.state.public_key, self.state.job_id,
                                   image=images.for_host(
                                       self.inputs.loaded.spec.trainer.image, "container"),
                                   disk_gb=self.ledger.disk_gb)
        except CapacityError as exc:
            self.ledger.event("provision.capacity", f"{offer.provider} {offer.gpu} "
                              f"x{offer.gpu_count}: {exc}; trying the next offer")
            self.teardown.close_row(row.id, EndReason.CAPACITY)
            raise _Failed(f"{offer.provider} {offer.offer_id}: {exc}") from exc
        except TransientError as exc:
            self.ledger.event("provision.transient", f"{offer.provider}: {exc} (after "
                              "retries); trying the next offer")
            self._orphan_sweep(provider, offer.provider)
            self.teardown.close_row(row.id, EndReason.FAILED)
            raise _Failed(f"{offer.provider} {offer.offer_id}: {exc}", transient=True) from exc
        except PriceChanged as exc:
            raise self._repriced(row.id, offer, tried, exc) from exc
        except (AuthError, BalanceError, QuotaError) as exc:
            self.teardown.close_row(row.id, EndReason.FAILED)
            raise JobFailed(f"{offer.provider}: {exc}") from exc
        failpoint("after-create")
        price = inst.price_per_hour if inst.price_per_hour is not None else hourly
        if offer.billing is Billing.MONTHLY:
            price = hourly  # the rent is paid: the row keeps the amortisation rate
        self.state.store.record_created(
            row.id, inst.instance_id, RowState(inst.state.value),
            to_micros(price or Decimal(0), rounding=ROUND_HALF_EVEN))
        self.state.hold(row.id, offer.provider, inst.instance_id)
        self.ledger.event("instance.created",
                          f"registered server {inst.instance_id} claimed (rent already paid: "
                          f"no marginal cost; {money.usd(price)}/h amortised)"
                          if offer.registered else f"{offer.provider} instance "
                          f"{inst.instance_id} at {money.usd(price)}/h",
                          {"instance": inst.instance_id, "price_per_hour": str(price)})
        # Placed: the outage (if any) is over, and phases done on an earlier instance
        # are not on this one.
        self.state.store.mark_placed(self.state.job_id)
        return Placed(row.id, provider, inst)

    def _note_moved(self, first: scheduler.Placement) -> None:
        """Say so when the cheapest placement now is not the one `orch plan`/`submit`
        recorded: the market moved (or the plan ranked the price catalogs)."""
        planned = self.ledger.job().placement().placement
        o = first.offer
        if planned is None or not planned.model_fields_set or (
                planned.provider, planned.offer_id) == (o.provider, o.offer_id):
            return
        self.ledger.event("placement.changed",
                          f"the market moved since the plan: planned {planned.provider} "
                          f"{planned.gpu} x{planned.gpu_count} at "
                          f"{money.usd(planned.est_cost)}, now {o.provider} {o.gpu} "
                          f"x{o.gpu_count} at {money.usd(first.est_cost)}",
                          {"planned": planned.as_stored(), "now": first.to_dict()})

    def _repriced(self, row_id: int, offer: Offer, tried: set[tuple[str, str]],
                  exc: PriceChanged) -> _Repriced:
        """The offer's price moved before the create: close the row, search again."""
        # Not a verdict on the offer: it may still be the cheapest at its new price.
        tried.discard((offer.provider, offer.offer_id))
        self.teardown.close_row(row_id, EndReason.PRICE_CHANGED)
        self.ledger.event("provision.price_changed", f"{offer.provider} {offer.gpu} "
                          f"x{offer.gpu_count}: {exc}; searching the offers again")
        return _Repriced(str(exc))

    def _orphan_sweep(self, provider: Provider, name: str) -> None:
        """Terminate instances tagged with this job that no instance row knows: a create
        that failed after retries, or a crash inside create, may still have rented one."""
        known = {r.provider_instance_id for r in self.state.store.instances_of(self.state.job_id)}
        for iid in self._tagged(provider, name):
            if iid not in known:
                self.ledger.event("instance.orphan", f"terminating untracked {name} instance "
                                  f"{iid} tagged with this job")
                try:
                    provider.terminate(iid)
                except ProviderError as exc:
                    # Still rented, still billed: say so; `orch reconcile` sweeps it by tag.
                    log.warning("job %s: cannot terminate untracked %s instance %s: %s",
                                self.state.job_id, name, iid, exc)
                    self.ledger.event("instance.orphan_left", f"could not terminate untracked "
                                      f"{name} instance {iid}: {exc}; it may still be billed: run "
                                      "`orch reconcile` (it retries), or terminate it in the "
                                      f"{name} console", {"instance": iid, "provider": name})

