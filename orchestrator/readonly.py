"""Cheap read-only look-ups for commands that must start fast (`orch plan`).

Importing SQLModel/SQLAlchemy costs ~0.5 s; `orch plan` only needs the registered servers,
so for SQLite it reads them with the standard library. Other databases go through the store.
"""

from __future__ import annotations

import sqlite3
from decimal import Decimal
from pathlib import Path
from urllib.parse import unquote

from providers.dedicated import RegisteredServer


def sqlite_path(url: str) -> Path | None:
    """The file of a `sqlite:///...` URL, or None for other databases / in-memory."""
    prefix = "sqlite:///"
    if not url.startswith(prefix):
        return None
    rest = unquote(url[len(prefix):]).split("?", 1)[0]
    if not rest or rest == ":memory:":
        return None
    return Path(rest if rest.startswith("/") else rest)


def registered_servers(url: str) -> list[RegisteredServer]:
    """Every registered server, without creating or migrating the database."""
    path = sqlite_path(url)
    if path is None:
        if url.startswith("sqlite"):
            return []
        from orchestrator.store import open_store  # non-SQLite: use the store

        return open_store(url).registered()
    if not path.exists():
        return []
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    try:
        rows = con.execute(
            "SELECT name, gpu, gpu_count, monthly_price_micros, host, status, port, user, "
            "claimed_by_job FROM server ORDER BY name"
        ).fetchall()
    except sqlite3.OperationalError:
        return []  # database not migrated yet: no servers registered
    finally:
        con.close()
    return [
        RegisteredServer(name, gpu, int(count), Decimal(int(micros)) / 1_000_000, host, status,
                         int(port), user, claimed)
        for name, gpu, count, micros, host, status, port, user, claimed in rows
    ]
