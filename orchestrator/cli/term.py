"""Terminal conventions shared by every command: timestamps, state colours, terminal width.

One place decides how a time reads to a human (local time with its zone), how a state is
coloured (only on a terminal, never with NO_COLOR), and how wide the terminal is, so no
command drifts. Standard library only (`orch plan` imports it).
"""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime
from typing import TextIO

from orchestrator.core.jobstatus import JobStatus
from orchestrator.core.states import ServerStatus, SweepRunState

# The one human form of a time: local wall-clock time and the zone it is in, to the second
# (`2026-12-03 08:17:44 CET`). --json always carries UTC ISO-8601 instead (iso_utc).
HUMAN_FORMAT = "%Y-%m-%d %H:%M:%S %Z"


def _aware(value: datetime) -> datetime:
    # The store hands back naive datetimes on some dialects; they are UTC by convention.
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def human_time(value: datetime | None) -> str:
    """A time for people: local time with its zone, or `-` when there is none."""
    if value is None:
        return "-"
    return _aware(value).astimezone().strftime(HUMAN_FORMAT)


def human_duration(seconds: int | None) -> str:
    """`45s`, `12m`, `3h 05m`, `2d 04h`: enough precision to compare runs by eye."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 60:
        return f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h {minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours:02d}h"


def iso_utc(value: datetime | None) -> str | None:
    """A time for scripts: UTC ISO-8601 with `Z` (`2026-12-03T07:17:44.123456Z`)."""
    if value is None:
        return None
    from orchestrator.core.utc import iso_z

    return iso_z(value)


def is_tty(stream: TextIO | None = None) -> bool:
    """Whether `stream` (stdout by default) is a terminal."""
    stream = sys.stdout if stream is None else stream
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed or replaced by something without a fd
        return False


def colour_enabled(stream: TextIO | None = None) -> bool:
    """Colour only on a terminal, and never when NO_COLOR is set (https://no-color.org)."""
    return not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb" and is_tty(stream)


def width(stream: TextIO | None = None) -> int:
    """The terminal's columns: COLUMNS if set, else the terminal's size, else 80."""
    stream = sys.stdout if stream is None else stream
    raw = os.environ.get("COLUMNS", "").strip()
    if raw.isdigit() and int(raw) > 0:
        return int(raw)
    # What shutil.get_terminal_size does, without importing shutil (and with it bz2 and
    # lzma) on `orch plan`'s start-up path.
    for s in (stream, sys.__stdout__):
        try:
            return os.get_terminal_size(s.fileno()).columns or 80  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            continue
    return 80


# Green for done, red for gave up, yellow for stopped or waiting, cyan for under way.
_STATE_COLOURS: dict[str, str] = {
    JobStatus.SUCCEEDED: "32", "done": "32", ServerStatus.IDLE: "32",
    JobStatus.FAILED: "31", SweepRunState.NOFIT: "31", "error": "31",
    ServerStatus.DISABLED: "31",
    JobStatus.CANCELLED: "33", JobStatus.INTERRUPTED: "33", JobStatus.QUEUED: "33",
    JobStatus.PLANNED: "33",
    "held": "33", ServerStatus.BUSY: "36",
    "lapsed": "31",  # a job's lease its worker stopped renewing (`orch jobs`)
    "-": "",  # nothing to say: no colour
}
_RUNNING = "36"


def state_colour(state: str) -> str:
    """The ANSI SGR code for a job or run state (running states share one colour)."""
    return _STATE_COLOURS.get(state.split(" ", 1)[0], _RUNNING if state else "")


def paint(text: str, sgr: str, enabled: bool) -> str:
    """`text` wrapped in an ANSI colour when enabled and a colour is given."""
    return f"\x1b[{sgr}m{text}\x1b[0m" if enabled and sgr else text


def sparkline(values: list[float], columns: int) -> str:
    """`values` as one line of block characters, at most `columns` wide (means per bucket)."""
    blocks = "▁▂▃▄▅▆▇█"
    finite = [v for v in values if v == v and abs(v) != float("inf")]
    if not finite or columns < 1:
        return ""
    if len(finite) > columns:  # average consecutive points down to the width
        n = len(finite)
        finite = [sum(finite[i * n // columns:(i + 1) * n // columns])
                  / len(finite[i * n // columns:(i + 1) * n // columns])
                  for i in range(columns)]
    lo, hi = min(finite), max(finite)
    span = hi - lo
    if span == 0:
        return blocks[3] * len(finite)
    return "".join(blocks[min(7, int((v - lo) / span * 8))] for v in finite)


def prose(text: str, indent: str = "  ") -> str:
    """A long line of text wrapped to the terminal's width (continuations indented); piped
    output keeps it on one line, as scripts grep it."""
    if not is_tty() or len(text) <= width():
        return text
    import textwrap

    return textwrap.fill(text, width=max(20, width() - 1), subsequent_indent=indent,
                         break_on_hyphens=False)
