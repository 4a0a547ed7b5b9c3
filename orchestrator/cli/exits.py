"""Which documented exit code an error maps to (README, "Exit codes").

Kept apart from the commands so that every command maps an error the same way.
"""

from __future__ import annotations

EXIT_ERROR = 1
EXIT_INVALID = 2


def exit_code(exc: BaseException) -> int:
    """2 when the user's input is at fault (an argument, ORCH_DB_URL, an SQL query), else 1.

    Follows the `raise ... from` chain: the history readers wrap the store's errors.
    """
    from orchestrator.records.history import QueryError, ReadOnlyError
    from orchestrator.records.store import InvalidValueError

    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, InvalidValueError | QueryError | ReadOnlyError):
            return EXIT_INVALID
        seen = seen.__cause__
    return EXIT_ERROR
