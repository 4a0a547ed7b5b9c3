"""The one form of a time orch writes for scripts and the database (issue 36 §6: `--json`
had both `+00:00` and `Z`): UTC, `YYYY-MM-DDTHH:MM:SS.ffffffZ`, always 27 characters, so
that comparing or sorting the text compares the times (docs/schema.md, "Times")."""

from __future__ import annotations

from datetime import UTC, datetime

FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"


def iso_z(value: datetime) -> str:
    """`value` in UTC as `2026-12-03T07:17:44.123456Z` (a naive time is taken as UTC, the
    convention of every time orch stores)."""
    aware = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    return aware.astimezone(UTC).strftime(FORMAT)
