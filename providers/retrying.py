"""One retry policy for all of orch, built on tenacity.

Every retry of a call that may fail for a passing reason (an HTTP 5xx, a dropped SSH
connection, a locked database, a provider that did not answer) is built here, so each one
says the same three things and nothing is left unbounded:

- what is transient: a predicate (or exception types); anything else is raised at once;
- the bound: a number of attempts, a total deadline, or both (one is required);
- the wait between attempts: exponential backoff with jitter by default (`backoff`),
  growing steps (`steps`), or full jitter (`full_jitter`). With a deadline, no wait sleeps
  past it, so the last attempt starts by the deadline rather than after it.

The caller gets a tenacity `Retrying` (reraise=True: once the retries are spent, the last
error itself is raised, never tenacity's RetryError) and uses it as tenacity documents:
`policy(...)(call)` or `for attempt in policy(...): with attempt: ...`.

Layer: the bottom one; it imports nothing of orch's, so the SSH layer, the providers, the
playbooks, the store and the engine all use it (tests/test_layers.py). It lives in `providers/`
(an empty package `__init__`), not in `orchestrator/`, so that the layers below `orchestrator`
import it without naming a package above them; it is a layer of its own, below `playbooks.ssh`.
"""

from __future__ import annotations

from collections.abc import Callable

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    stop_any,
    wait_exponential_jitter,
    wait_incrementing,
    wait_random_exponential,
)
from tenacity.before_sleep import before_sleep_nothing
from tenacity.stop import stop_base
from tenacity.wait import wait_base

Wait = wait_base | Callable[[RetryCallState], float]
Transient = Callable[[BaseException], bool] | type[BaseException] | tuple[type[BaseException], ...]


def backoff(first_s: float, max_s: float, jitter_s: float = 0.0) -> wait_base:
    """first_s, 2×, 4×, … capped at max_s, each plus up to jitter_s (so that callers that
    failed together do not retry together)."""
    return wait_exponential_jitter(multiplier=first_s, max=max_s, jitter=jitter_s)


def steps(first_s: float, step_s: float) -> wait_base:
    """first_s, first_s + step_s, first_s + 2·step_s, …"""
    return wait_incrementing(start=first_s, increment=step_s)


def full_jitter(first_s: float, max_s: float) -> wait_base:
    """A random wait up to first_s·2^(n-1), capped at max_s (many waiters on one lock)."""
    return wait_random_exponential(multiplier=first_s, max=max_s)


def _predicate(transient: Transient) -> Callable[[BaseException], bool]:
    if isinstance(transient, type | tuple):
        types = transient
        return lambda exc: isinstance(exc, types)
    return transient


def _within(wait: Wait, deadline_s: float) -> Callable[[RetryCallState], float]:
    def bounded(state: RetryCallState) -> float:
        left = deadline_s - (state.seconds_since_start or 0.0)
        return max(0.0, min(float(wait(state)), left))
    return bounded


def policy(transient: Transient, *, attempts: int | None = None,
           deadline_s: float | None = None, wait: Wait | None = None,
           stop: stop_base | None = None,
           before_sleep: Callable[[RetryCallState], None] | None = None) -> Retrying:
    """A tenacity `Retrying` that retries what `transient` accepts, within `attempts` and/or
    `deadline_s` (plus an extra `stop` condition, if given), waiting `wait` (default:
    `backoff(0.5, 5.0, 0.5)`) between attempts; the last error is raised as itself."""
    if attempts is None and deadline_s is None:
        raise ValueError("a retry needs a bound: attempts, deadline_s or both")
    if attempts is not None and attempts < 1:
        raise ValueError(f"attempts must be >= 1 (got {attempts})")
    stops: list[stop_base] = []
    if attempts is not None:
        stops.append(stop_after_attempt(attempts))
    if deadline_s is not None:
        stops.append(stop_after_delay(deadline_s))
    if stop is not None:
        stops.append(stop)
    pause: Wait = wait if wait is not None else backoff(0.5, 5.0, 0.5)
    if deadline_s is not None:
        pause = _within(pause, deadline_s)
    return Retrying(retry=retry_if_exception(_predicate(transient)), stop=stop_any(*stops),
                    wait=pause, reraise=True, before_sleep=before_sleep or before_sleep_nothing)
