"""`orch hosts`: what orch remembers of each physical machine it rented, and what it does
with it next (docs/hostchecks.md, "Host memory").

One line per machine: the stance host memory gives it now (`avoid` until a time, `price` by
what it delivers, `use`, or `report` for a registered server), the latest delivered fraction,
when it was last seen and why (the newest observation's reason). Reads the database only.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

import typer

from orchestrator.cli.common import JsonFlag, open_db, print_json
from orchestrator.cli.tables import table
from orchestrator.cli.term import human_time


def machines(provider: str | None) -> list[dict[str, Any]]:
    """Every remembered machine (of `provider`), with its advice now, newest seen first."""
    from orchestrator.core.hostmemory import advise
    from orchestrator.records.store.hosts import observation

    store = open_db()
    try:
        rows = store.host_observations(provider)
    finally:
        store.close()
    now = datetime.now(UTC)
    grouped: dict[tuple[str, str], list[Any]] = {}
    for row in rows:
        grouped.setdefault((row.provider, row.machine_id), []).append(row)
    found = []
    for (name, machine), seen in grouped.items():
        advice = advise([observation(r) for r in seen], now, kept=name == "dedicated")
        last = seen[-1]
        found.append({
            "provider": name, "machine_id": machine, "stance": advice.stance.value,
            "delivered": round(advice.delivered, 3),
            "until": None if advice.until is None else advice.until.isoformat(),
            "observations": len(seen), "failed_checks": sum(r.failed for r in seen),
            "last_seen": last.at.isoformat(), "last_job": last.job_id,
            "why": advice.reason or last.why})
    return sorted(found, key=lambda m: m["last_seen"], reverse=True)


def register(app: typer.Typer) -> None:
    """Add `orch hosts` to the app."""

    @app.command("hosts")
    def hosts(
        provider: Annotated[str | None, typer.Option(
            "--provider", help="Only this provider's machines (vastai, runpod, sim, ...).")
        ] = None,
        json_out: JsonFlag = False,
    ) -> None:
        """What orch remembers of each machine it rented: checks, measured speed, and why.

        A machine that failed its host check is avoided for a while; one measured slow is
        priced by what it delivers (price / delivered fraction) until the measurement fades
        (docs/hostchecks.md).
        """
        found = machines(provider)
        if json_out:
            print_json({"hosts": found})
            return
        if not found:
            typer.echo("no machine remembered yet: orch checks each fresh rental before "
                       "using it (ORCH_HOST_CHECKS) and remembers what it found")
            return
        typer.echo(table(
            ["provider", "machine", "stance", "delivered", "until", "last seen", "why"],
            [[m["provider"], m["machine_id"], m["stance"], f"{m['delivered']:.0%}",
              human_time(datetime.fromisoformat(m["until"])) if m["until"] else "-",
              human_time(datetime.fromisoformat(m["last_seen"])), m["why"]]
             for m in found]))
