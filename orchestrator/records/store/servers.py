"""The store's registered servers: add, list, claim for a job, release, check, remove.

A claim is one conditional UPDATE, so two jobs (or two workers) can never share a server.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from sqlalchemy import update
from sqlalchemy.exc import IntegrityError
from sqlmodel import col, select

from orchestrator.core.money import from_micros
from orchestrator.core.states import ServerStatus
from orchestrator.records.store.database import StoreBase
from orchestrator.records.store.tables import (
    AlreadyExists,
    InvalidValueError,
    NotFoundError,
    Server,
    ServerBusyError,
    to_micros,
    utcnow,
)
from providers.dedicated.compute import RegisteredServer


class ServersMixin(StoreBase):
    """Registered monthly servers (part of `store.Store`)."""

    def add_server(
        self,
        name: str,
        host: str,
        port: int,
        user: str,
        gpu: str,
        gpu_count: int,
        monthly_price: Decimal,
    ) -> Server:
        """Register a monthly dedicated server; AlreadyExists if the name is taken."""
        if not name.strip():
            raise InvalidValueError("server name must not be empty")
        if not host.strip():
            raise InvalidValueError(f"server {name!r}: host must not be empty")
        if not 1 <= port <= 65535:
            raise InvalidValueError(f"server {name!r}: port must be 1-65535 (got {port})")
        if gpu_count < 1:
            raise InvalidValueError(f"server {name!r}: gpu_count must be >= 1 (got {gpu_count})")
        micros = to_micros(monthly_price)
        if micros < 0:
            raise InvalidValueError(
                f"server {name!r}: monthly price must be >= 0 (got {monthly_price})"
            )
        server = Server(name=name, host=host, port=port, user=user, gpu=gpu,
                        gpu_count=gpu_count, monthly_price_micros=micros)
        try:
            with self.transaction() as session:
                session.add(server)
        except IntegrityError as exc:
            raise AlreadyExists(
                f"server {name!r} already exists; remove it first with `orch servers remove {name}`"
            ) from exc
        return server

    def list_servers(self) -> list[Server]:
        """All registered servers, by name."""
        with self.session() as session:
            return list(session.exec(select(Server).order_by(col(Server.name))))

    def idle_servers(self) -> list[Server]:
        """Servers free to take a job (idle and unclaimed), by name."""
        with self.session() as session:
            query = (
                select(Server)
                .where(col(Server.status) == ServerStatus.IDLE,
                       col(Server.claimed_by_job).is_(None))
                .order_by(col(Server.name))
            )
            return list(session.exec(query))

    def registered(self) -> list[RegisteredServer]:
        """Every server as plain values (the dedicated provider's registry view)."""
        return [RegisteredServer(s.name, s.gpu, s.gpu_count, from_micros(s.monthly_price_micros),
                                 s.host, s.status, s.port, s.user, s.claimed_by_job,
                                 s.check_error)
                for s in self.list_servers()]

    def record_server_check(self, name: str, *, error: str | None,
                            facts_json: str | None = None) -> None:
        """Store a check's outcome: `error` None clears a failed check (offered again)."""
        values: dict[str, Any] = {"check_error": error, "checked_at": utcnow()}
        if facts_json is not None:
            values["facts_json"] = facts_json
        with self.transaction() as session:
            result = session.execute(update(Server).where(col(Server.name) == name)
                                     .values(**values))
            if not getattr(result, "rowcount", 0):
                raise NotFoundError(f"server {name!r} not found; see `orch servers list`")

    def repin_server_host_key(self, name: str, host_key: str) -> None:
        """Replace a server's pinned host key (after the user confirmed the new one)."""
        with self.transaction() as session:
            result = session.execute(update(Server).where(col(Server.name) == name)
                                     .values(host_key=host_key))
            if not getattr(result, "rowcount", 0):
                raise NotFoundError(f"server {name!r} not found; see `orch servers list`")

    def claim_server(self, name: str, job_id: str) -> bool:
        """Atomically mark an idle server as running `job_id`; False if it was not free.

        One conditional UPDATE, so two jobs (or two workers) can never share a server.
        """
        with self.transaction() as session:
            result = session.execute(
                update(Server)
                .where(col(Server.name) == name, col(Server.status) == ServerStatus.IDLE,
                       col(Server.claimed_by_job).is_(None))
                .values(status=ServerStatus.BUSY, claimed_by_job=job_id)
            )
            return bool(getattr(result, "rowcount", 0))

    def release_server(self, name: str, job_id: str | None = None) -> bool:
        """Mark a busy server idle again (only if `job_id` holds it, when given)."""
        with self.transaction() as session:
            query = update(Server).where(col(Server.name) == name,
                                         col(Server.status) == ServerStatus.BUSY)
            if job_id is not None:
                query = query.where(col(Server.claimed_by_job) == job_id)
            result = session.execute(query.values(status=ServerStatus.IDLE, claimed_by_job=None))
            return bool(getattr(result, "rowcount", 0))

    def remove_server(self, name: str) -> None:
        """Forget a server; NotFoundError if unknown, ServerBusyError while it runs a job."""
        with self.transaction() as session:
            server = session.exec(select(Server).where(Server.name == name)).first()
            if server is None:
                raise NotFoundError(
                    f"server {name!r} not found; see registered servers with `orch servers list`"
                )
            if server.status == ServerStatus.BUSY or server.claimed_by_job is not None:
                job = server.claimed_by_job or "a job"
                raise ServerBusyError(
                    f"server {name!r} is busy running {job}; wait for it to finish "
                    f"(or `orch cancel {server.claimed_by_job or 'JOB'}`) and try again"
                )
            session.delete(server)

    def set_server_host_key(self, name: str, host_key: str) -> None:
        """Pin a registered server's SSH host key (first contact)."""
        with self.transaction() as session:
            session.execute(update(Server).where(col(Server.name) == name,
                                                 col(Server.host_key).is_(None))
                            .values(host_key=host_key))
