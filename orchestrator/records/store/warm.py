"""The store's warm instances: park a finished job's machine, take it, end it (docs/warm.md).

One row owns a live machine at any time (issue 22): the job's instance row, then the
`warm_instance` row while it is `parked` or `ending`, then the instance row of the job that
took it. Each hand-over is one write transaction, so a crash (kill -9) anywhere leaves one
owner, never two and never none:
- `park`: the parker's instance row is closed (end_reason `parked`, its cost up to now) and
  the warm row inserted, together;
- `take`: a conditional UPDATE (`parked`, window still open, by the database's clock) that
  at most one job wins, and the taker's instance row, together;
- `begin_ending`: `parked` -> `ending` (conditional), before the provider is asked to
  terminate; `finish_ending` closes it after. A crash between the two leaves `ending`, which
  `orch reconcile` and every worker terminate again (terminating twice is harmless).
Times are the database's (`db_now`), so clocks of different machines never decide a window.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import update
from sqlmodel import col, select

from orchestrator.core import money
from orchestrator.core.states import WARM_OWNING, EndReason, RowState, WarmState
from orchestrator.core.warmfit import WarmMachine, offer_from_json
from orchestrator.records.store.database import StoreBase, db_now
from orchestrator.records.store.tables import (
    CancelRequested,
    Instance,
    InvalidValueError,
    Job,
    NotFoundError,
    WarmInstance,
    to_micros,
)
from providers.base import Billing

# The states in which the warm row owns the machine, in a fixed order (for SQL `IN`).
OWNING = tuple(s for s in WarmState if s in WARM_OWNING)


def as_machine(row: WarmInstance) -> WarmMachine:
    """A warm row as the planner sees it (`core.warmfit`)."""
    assert row.id is not None
    model = (row.model_repo, row.model_revision or "main") if row.model_repo else None
    return WarmMachine(warm_id=row.id, offer=offer_from_json(row.offer_json),
                       price_per_hour=money.from_micros(row.price_per_hour_micros),
                       image=row.image, disk_gb=row.disk_gb, model=model,
                       parked_by=row.parked_by_job, expires_at=row.expires_at,
                       instance_id=row.provider_instance_id)


def idle_micros(row: WarmInstance, until: datetime) -> int:
    """What the machine's idle time from parking to `until` cost, in micro-dollars."""
    return money.idle_micros(row.price_per_hour_micros, row.billing, row.parked_at, until)


class WarmMixin(StoreBase):
    """Warm instances (part of `store.Store`)."""

    def park_instance(self, row_id: int, *, offer_json: str, image: str | None, disk_gb: int,
                      model: tuple[str, str] | None, keep_s: float) -> WarmInstance:
        """Close the job's instance row `row_id` and keep its machine warm for `keep_s`;
        CancelRequested (nothing written) when the job was asked to stop: a cancelled
        job's machine is terminated, never parked."""
        with self.transaction() as session:
            now = db_now(session)
            row = session.get(Instance, row_id)
            if row is None:
                raise NotFoundError(f"instance row {row_id} not found")
            job = session.get(Job, row.job_id, with_for_update=True)
            if job is not None and job.cancel_requested_at is not None:
                raise CancelRequested(f"job {row.job_id}: cancel requested; its machine is "
                                      "not kept warm")
            if row.terminated_at is not None or row.provider_instance_id is None:
                raise InvalidValueError(f"instance row {row_id} is closed or has no instance "
                                        "id: nothing to park")
            if row.billing == Billing.MONTHLY.value:
                raise InvalidValueError("a monthly server is kept, never parked")
            row.terminated_at, row.state, row.end_reason = now, RowState.PARKED, EndReason.PARKED
            charged, amortised = money.instance_cost(row, now)
            row.cost_micros, row.amortised_micros = to_micros(charged), to_micros(amortised)
            warm = WarmInstance(
                provider=row.provider, provider_instance_id=row.provider_instance_id,
                offer_json=offer_json, gpu=row.gpu, gpu_count=row.gpu_count,
                billing=row.billing, interruptible=row.interruptible,
                price_per_hour_micros=row.price_per_hour_micros, image=image, disk_gb=disk_gb,
                model_repo=model[0] if model else None,
                model_revision=model[1] if model else None, host=row.host, port=row.port,
                ssh_user=row.ssh_user, host_key=row.host_key, parked_by_job=row.job_id,
                parked_at=now, expires_at=now + timedelta(seconds=keep_s),
                state=WarmState.PARKED)
            session.add(row)
            session.add(warm)
            session.flush()
            return warm

    def take_warm(self, warm_id: int, job_id: str,
                  attempt: int) -> tuple[Instance, WarmInstance] | None:
        """Hand the parked machine `warm_id` to `job_id`: its new instance row and the warm row
        as taken, or None when it is no longer parked (another job took it, or it is ending)
        or its window closed."""
        with self.transaction() as session:
            now = db_now(session)
            result = session.execute(
                update(WarmInstance)
                .where(col(WarmInstance.id) == warm_id,
                       col(WarmInstance.state) == WarmState.PARKED,
                       col(WarmInstance.expires_at) > now)
                .values(state=WarmState.TAKEN, taken_by_job=job_id, taken_at=now))
            if not getattr(result, "rowcount", 0):
                return None
            warm = session.get(WarmInstance, warm_id)
            assert warm is not None
            session.refresh(warm)  # the UPDATE bypassed the session's copy
            warm.idle_micros = idle_micros(warm, now)
            row = Instance(job_id=job_id, provider=warm.provider,
                           provider_instance_id=warm.provider_instance_id,
                           offer_id=f"warm:{warm_id}", gpu=warm.gpu, gpu_count=warm.gpu_count,
                           billing=warm.billing, interruptible=warm.interruptible,
                           price_per_hour_micros=warm.price_per_hour_micros, state=RowState.RUNNING,
                           host=warm.host, port=warm.port, ssh_user=warm.ssh_user,
                           host_key=warm.host_key, created_at=now, attempt=attempt)
            session.add(warm)
            session.add(row)
            session.flush()
            return row, warm

    def begin_ending(self, warm_id: int, *, expired_only: bool = True) -> WarmInstance | None:
        """`parked` -> `ending` before its machine is terminated (only once its window has
        closed, unless `expired_only` is False: `orch warm release`); None if it was not
        parked (taken meanwhile, or another process ends it)."""
        with self.transaction() as session:
            now = db_now(session)
            query = update(WarmInstance).where(col(WarmInstance.id) == warm_id,
                                               col(WarmInstance.state) == WarmState.PARKED)
            if expired_only:
                query = query.where(col(WarmInstance.expires_at) <= now)
            result = session.execute(query.values(state=WarmState.ENDING))
            if not getattr(result, "rowcount", 0):
                return None
            warm = session.get(WarmInstance, warm_id)
            assert warm is not None
            session.refresh(warm)
            return warm

    def finish_ending(self, warm_id: int, reason: EndReason) -> WarmInstance | None:
        """An owning row whose machine is gone (terminated, or lost): `ended`, with the idle
        time's cost; None if it no longer owned one."""
        with self.transaction() as session:
            now = db_now(session)
            warm = session.get(WarmInstance, warm_id)
            if warm is None or warm.state not in WARM_OWNING:
                return None
            warm.state, warm.ended_at, warm.end_reason = WarmState.ENDED, now, reason
            warm.idle_micros = idle_micros(warm, now)
            session.add(warm)
            return warm

    def get_warm(self, warm_id: int) -> WarmInstance:
        """One warm row; NotFoundError if there is none."""
        with self.session() as session:
            warm = session.get(WarmInstance, warm_id)
            if warm is None:
                raise NotFoundError(f"warm instance {warm_id} not found; see `orch warm`")
            return warm

    def warm_instances(self, states: tuple[WarmState, ...] | None = None
                       ) -> list[WarmInstance]:
        """Warm rows (in `states`, default all), newest first."""
        with self.session() as session:
            query = select(WarmInstance)
            if states is not None:
                query = query.where(col(WarmInstance.state).in_(states))
            return list(session.exec(query.order_by(col(WarmInstance.id).desc())))

    def parked(self) -> tuple[list[WarmInstance], datetime]:
        """The parked rows whose window is still open, and the database's time now."""
        with self.session() as session:
            now = db_now(session)
            query = select(WarmInstance).where(col(WarmInstance.state) == WarmState.PARKED,
                                               col(WarmInstance.expires_at) > now)
            return list(session.exec(query.order_by(col(WarmInstance.id)))), now

    def to_end(self) -> list[WarmInstance]:
        """Rows whose machine must be terminated: parked past their window, or `ending`."""
        with self.session() as session:
            now = db_now(session)
            query = select(WarmInstance).where(
                (col(WarmInstance.state) == WarmState.ENDING)
                | ((col(WarmInstance.state) == WarmState.PARKED)
                   & (col(WarmInstance.expires_at) <= now)))
            return list(session.exec(query.order_by(col(WarmInstance.id))))

    def machine_owner(self, provider: str, instance_id: str) -> WarmInstance | str | None:
        """Who owns a live machine now: its warm row (parked or ending), the job whose open
        instance row names it, or None (an orphan, or created but never recorded).

        Both looks in one snapshot (SQLite's deferred transaction; REPEATABLE READ on
        PostgreSQL): a park or a take between two separate reads could otherwise show a
        machine with no owner, and `orch reconcile` would terminate it.
        """
        with self.session() as session:
            if self.engine.dialect.name != "sqlite":
                session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
            warm = session.exec(select(WarmInstance).where(
                col(WarmInstance.provider) == provider,
                col(WarmInstance.provider_instance_id) == instance_id,
                col(WarmInstance.state).in_(OWNING))).first()
            if warm is not None:
                return warm
            row = session.exec(select(Instance).where(
                col(Instance.provider) == provider,
                col(Instance.provider_instance_id) == instance_id,
                col(Instance.terminated_at).is_(None)).order_by(col(Instance.id).desc())).first()
            return None if row is None else row.job_id
