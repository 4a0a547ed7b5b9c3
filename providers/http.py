"""One retry policy for every provider API call: back off on TransientError only.

Adapters turn each HTTP response into a typed error (`providers.base`); this module retries
the transient ones (429, 5xx, network errors) with exponential backoff and jitter, honouring
`Retry-After` when the provider sends it, and gives up after a deadline. Auth, balance,
quota, capacity and not-found errors are never retried. A `Retry-After` longer than
`MAX_RETRY_AFTER_S` or than what is left of the deadline is not slept through: the error is
raised at once (carrying `retry_after`), so the caller can requeue the work instead of
blocking for up to an hour.

Every request also has a TOTAL deadline (issue 23 §4): httpx's timeouts are per network
operation, so an answer dripping one byte per read never trips them (a job sat in
`provisioning` past 240 s on a drip of one byte every 2 s). `send` reads the body in chunks
and gives up once the request has taken longer than the smaller of `REQUEST_DEADLINE_S` and
what is left of `with_retries`' deadline: a TransientError, so the 120 s promise holds for a
whole round of retries. The check runs between reads, and each read's timeout is capped at
that deadline too, so a body ends at most one (capped) read past it; the status line and
headers are bounded per read only (h11 refuses headers over 16 KiB).

Every answer is also capped in SIZE (issue 36 §7: a 400 MB body took 1.8 GB of memory):
`send` refuses one whose `Content-Length` is over `MAX_ANSWER_BYTES` without reading it,
and stops reading any other once its decoded bytes pass the cap (a gzip bomb is counted
after decompression; each read decompresses at most one network chunk, so the cap is
overshot by at most that). Orch's largest answers are a search of 64 offers and the GPU
catalog, some hundreds of KiB; an answer over the cap is a `BadAnswer`, not retried.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Callable
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, TypeVar

import httpx
from tenacity import RetryCallState

from providers import retrying
from providers.base import BadAnswer, TransientError

T = TypeVar("T")

MAX_ATTEMPTS = 6
DEADLINE_S = 120.0
MAX_RETRY_AFTER_S = 60.0
REQUEST_DEADLINE_S = DEADLINE_S  # one request, whole answer included
MAX_ANSWER_BYTES = 8 * 1024 * 1024  # one answer, decoded (see the module docstring)
# Headers that describe the body as sent; the body `send` returns is decoded and whole.
_BODY_HEADERS = frozenset({"content-encoding", "content-length", "transfer-encoding"})

# The monotonic time by which the current `with_retries` round must end (this thread's).
_ROUND_ENDS: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "orch_http_round_ends", default=None)


def request_deadline_s(now: float | None = None) -> float:
    """Seconds the next request may take: REQUEST_DEADLINE_S, or less when the current
    `with_retries` round ends sooner (never under 0.1 s)."""
    limit = REQUEST_DEADLINE_S
    ends = _ROUND_ENDS.get()
    if ends is not None:
        limit = min(limit, ends - (time.monotonic() if now is None else now))
    return max(0.1, limit)


def _capped(timeout: httpx.Timeout, limit: float) -> httpx.Timeout:
    def cap(value: float | None) -> float:
        return limit if value is None else min(value, limit)
    return httpx.Timeout(connect=cap(timeout.connect), read=cap(timeout.read),
                         write=cap(timeout.write), pool=cap(timeout.pool))


def send(client: httpx.Client, method: str, url: str, api_key: str, what: str,
         **kwargs: Any) -> httpx.Response:
    """One request with the Bearer key in its header only, read whole within its deadline
    and `MAX_ANSWER_BYTES`.

    Network errors and an answer not complete within `request_deadline_s()` are transient;
    an answer over the size cap is a BadAnswer. No retry here (see `with_retries`); the
    caller maps non-2xx statuses to typed errors.
    """
    headers = {"Authorization": f"Bearer {api_key}", "Accept": "application/json"}
    limit = request_deadline_s()
    started = time.monotonic()
    # No single network operation may outlast the whole request's deadline either.
    kwargs.setdefault("timeout", _capped(client.timeout, limit))
    try:
        with client.stream(method, url, headers=headers, **kwargs) as streamed:
            _check_length(streamed, what)
            body: list[bytes] = []
            size = 0
            for chunk in streamed.iter_bytes():
                body.append(chunk)
                size += len(chunk)
                if size > MAX_ANSWER_BYTES:
                    raise BadAnswer(f"{what}: the answer is larger than "
                                    f"{MAX_ANSWER_BYTES // 2**20} MiB; stopped reading it")
                if time.monotonic() - started > limit:
                    raise TransientError(f"{what}: no complete answer within {limit:.0f}s "
                                         "(the provider is answering too slowly)")
            if time.monotonic() - started > limit:
                raise TransientError(f"{what}: no complete answer within {limit:.0f}s")
            kept = [(k, v) for k, v in streamed.headers.multi_items()
                    if k.lower() not in _BODY_HEADERS]
            return httpx.Response(streamed.status_code, headers=kept, content=b"".join(body),
                                  request=streamed.request)
    except httpx.DecodingError:
        raise BadAnswer(f"{what}: the answer's content encoding is broken") from None
    except httpx.TransportError as exc:
        raise TransientError(f"{what}: network error ({type(exc).__name__})") from None


def _check_length(response: httpx.Response, what: str) -> None:
    """BadAnswer when the answer announces more than MAX_ANSWER_BYTES (nothing is read)."""
    announced = response.headers.get("Content-Length", "")
    if announced.isdigit() and int(announced) > MAX_ANSWER_BYTES:
        raise BadAnswer(f"{what}: the answer announces {int(announced)} bytes, over the "
                        f"{MAX_ANSWER_BYTES // 2**20} MiB cap; not read")


def redact(text: str, secret: str) -> str:
    """`text` with every occurrence of `secret` (an API key a server echoed) replaced."""
    return text.replace(secret, "***") if secret else text


def retry_after(response: httpx.Response) -> float | None:
    """Seconds from a `Retry-After` header (delta-seconds or an HTTP date), if any."""
    value = response.headers.get("Retry-After")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def _wait(fallback: Callable[[RetryCallState], float]) -> Callable[[RetryCallState], float]:
    def wait(state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        hinted = getattr(exc, "retry_after", None)
        if hinted is not None:
            return min(float(hinted), MAX_RETRY_AFTER_S)
        return fallback(state)
    return wait


def with_retries(call: Callable[[], T], *, attempts: int = MAX_ATTEMPTS,
                 deadline_s: float = DEADLINE_S, initial_s: float = 0.5,
                 max_wait_s: float = 20.0) -> T:
    """Run `call`, retrying it while it raises TransientError (or a network error)."""

    def guarded() -> T:
        try:
            return call()
        except httpx.TransportError as exc:  # connect/read errors, timeouts
            raise TransientError(f"network error: {type(exc).__name__}") from exc

    started = time.monotonic()
    outer = _ROUND_ENDS.get()
    ends = started + deadline_s if outer is None else min(outer, started + deadline_s)

    def worth_waiting(exc: BaseException) -> bool:
        if not isinstance(exc, TransientError) or isinstance(exc, BadAnswer):
            return False
        hinted = exc.retry_after
        left = deadline_s - (time.monotonic() - started)
        return hinted is None or hinted <= min(MAX_RETRY_AFTER_S, left)

    policy = retrying.policy(worth_waiting, attempts=attempts, deadline_s=deadline_s,
                             wait=_wait(retrying.backoff(initial_s, max_wait_s, initial_s)))
    token = _ROUND_ENDS.set(ends)
    try:
        return policy(guarded)
    finally:
        _ROUND_ENDS.reset(token)
