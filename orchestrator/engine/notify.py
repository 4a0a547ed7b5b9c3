"""Webhook delivery: never blocks or fails the job that emits an event.

`Notifier.emit(event)` only puts the event on a bounded queue; one daemon thread POSTs each
event to each endpoint that wants it, in the order emitted (a receiver sees a job's events in
order), retrying what may pass (a connection error, a timeout, 429, 5xx) with the project's
retry policy (tenacity, `providers.retrying`), each attempt signed afresh (the Standard
Webhooks spec: a retry gets a new `webhook-timestamp`, the same `webhook-id`). Any other
answer (a 4xx: the URL or the receiver refuses it) fails at once. A delivery that does not
get through, or an event dropped because the queue is full, is given to `on_failure` (the
engine records it; `orch show` shows it: phase B) and logged without the URL's path (a
Slack URL's path is its secret).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx

from orchestrator.core import webhooks
from orchestrator.core.webhooks import WebhookEvent
from providers import retrying

log = logging.getLogger(__name__)

DEFAULT_ATTEMPTS = 5
DEFAULT_TIMEOUT_S = 10.0  # per attempt; the Standard Webhooks spec suggests a short one
DEFAULT_QUEUE = 256


@dataclass(frozen=True)
class Endpoint:
    """Where one target's events go (resolved from `notify:` and the environment)."""

    url: str = field(repr=False)  # may be a secret (Slack's): never logged or recorded
    format: str = "standard"  # standard | slack
    secret: str | None = field(default=None, repr=False)
    events: frozenset[str] | None = None  # None: every event

    @property
    def shown(self) -> str:
        """The URL as it may be logged and recorded: scheme and host only."""
        parts = urlsplit(self.url)
        return f"{parts.scheme}://{parts.hostname}{':' + str(parts.port) if parts.port else ''}"

    def wants(self, event: WebhookEvent) -> bool:
        """Whether this endpoint is sent `event`."""
        return self.events is None or event.type in self.events


@dataclass(frozen=True)
class DeliveryFailure:
    """An event an endpoint did not get: what, where (host only), how many tries, why."""

    event_id: str
    event_type: str
    endpoint: str
    attempts: int
    reason: str


class _Retry(Exception):
    """An attempt that failed for a reason that may pass."""


class _Refused(Exception):
    """An answer that another attempt would not change."""


def _transient(status: int) -> bool:
    return status == 429 or status >= 500 or status == 408


class Notifier:
    """Sends events to endpoints from a background thread (see the module docstring)."""

    def __init__(self, endpoints: Sequence[Endpoint],
                 on_failure: Callable[[DeliveryFailure], None] | None = None, *,
                 attempts: int = DEFAULT_ATTEMPTS, wait: retrying.Wait | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S, queue_size: int = DEFAULT_QUEUE,
                 clock: Callable[[], float] = time.time) -> None:
        self.endpoints = list(endpoints)
        self.on_failure = on_failure
        self.attempts = attempts
        self.wait = wait if wait is not None else retrying.backoff(1.0, 30.0, 1.0)
        self.timeout_s = timeout_s
        self.clock = clock
        # Called on the thread after each delivery that got through (who waits for them).
        self.on_delivered: Callable[[WebhookEvent, Endpoint], None] | None = None
        # None: stop after what is queued before it.
        self._queue: queue.Queue[tuple[Endpoint, WebhookEvent] | None] = queue.Queue(
            maxsize=queue_size)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def emit(self, event: WebhookEvent, only: Collection[str] | None = None) -> None:
        """Queue `event` for every endpoint that wants it (`only`: those of these `shown`
        names); returns at once, never raises."""
        targets = [e for e in self.endpoints
                   if e.wants(event) and (only is None or e.shown in only)]
        if not targets:
            return
        self._start()
        for endpoint in targets:
            try:
                self._queue.put_nowait((endpoint, event))
            except queue.Full:
                self._failed(DeliveryFailure(event.id, event.type, endpoint.shown, 0,
                                             "not sent: the notification queue is full"))

    def close(self, timeout_s: float = 30.0) -> bool:
        """Deliver what is queued (at most `timeout_s`), then stop; False when time ran out:
        the events still queued are then reported to `on_failure` as not sent (the one being
        sent, if any, goes on in the background)."""
        with self._lock:
            thread = self._thread
        if thread is None:
            return True
        deadline = time.monotonic() + timeout_s
        try:
            self._queue.put(None, timeout=max(0.01, timeout_s))
            thread.join(max(0.0, deadline - time.monotonic()))
        except queue.Full:
            pass
        if not thread.is_alive():
            return True
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                self._queue.put_nowait(None)  # the thread stops after what it is sending
                return False
            if item is not None:
                endpoint, event = item
                self._failed(DeliveryFailure(event.id, event.type, endpoint.shown, 0,
                                             "not sent: orch stopped before delivering it"))

    # -- the thread

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="orch-notify",
                                                daemon=True)
                self._thread.start()

    def _run(self) -> None:
        with httpx.Client(timeout=self.timeout_s, follow_redirects=False) as client:
            while True:
                item = self._queue.get()
                if item is None:
                    return
                endpoint, event = item
                try:
                    self._deliver(client, endpoint, event)
                except Exception as exc:  # noqa: BLE001 - the thread must outlive any bug
                    log.exception("webhook delivery to %s crashed", endpoint.shown)
                    self._failed(DeliveryFailure(event.id, event.type, endpoint.shown, 0,
                                                 f"{type(exc).__name__}: {exc}"))

    def _deliver(self, client: httpx.Client, endpoint: Endpoint, event: WebhookEvent) -> None:
        tries = 0

        def attempt() -> None:
            nonlocal tries
            tries += 1
            headers, body = webhooks.request(event, endpoint.format, endpoint.secret,
                                             int(self.clock()))
            try:
                answer = client.post(endpoint.url, content=body, headers=headers)
            except httpx.HTTPError as exc:
                raise _Retry(f"{type(exc).__name__}: {exc}") from None
            if answer.is_success:
                return
            reason = f"HTTP {answer.status_code}"
            if _transient(answer.status_code):
                raise _Retry(reason)
            raise _Refused(reason)

        try:
            retrying.policy(_Retry, attempts=self.attempts, wait=self.wait)(attempt)
        except (_Retry, _Refused) as exc:
            self._failed(DeliveryFailure(event.id, event.type, endpoint.shown, tries,
                                         str(exc)))
            return
        if self.on_delivered is not None:
            try:
                self.on_delivered(event, endpoint)
            except Exception:  # noqa: BLE001 - a recorder's bug is not a failed delivery
                log.exception("recording a webhook delivery failed")

    def _failed(self, failure: DeliveryFailure) -> None:
        log.warning("webhook %s (%s) to %s not delivered after %d attempt(s): %s",
                    failure.event_id, failure.event_type, failure.endpoint, failure.attempts,
                    failure.reason)
        if self.on_failure is None:
            return
        try:
            self.on_failure(failure)
        except Exception:  # noqa: BLE001 - a recorder's bug must not stop deliveries
            log.exception("recording a webhook delivery failure failed")
