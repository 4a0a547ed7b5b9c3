"""The events people wait for, told to the job's webhooks (`notify:` and ORCH_NOTIFY_URL).

One `Notices` per run of a job (`JobRunner.run`) or per sweep check: each event is first
written as a job event of its `EventKind` (with the webhook id, `msg_` + uuid4, in its data,
so the history shows what was sent), then queued on the `notify.Notifier`, whose thread
delivers it (signed, retried) without ever blocking or failing the job. A delivery that does
not get through is recorded as a `notify.failed` job event, which `orch show` lists. The run
closes its notices with a bound (`CLOSE_S`): what is still queued then is recorded as not sent.
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from orchestrator.core import notifyspec
from orchestrator.core.jobstatus import FINAL_STATUSES, JobStatus
from orchestrator.core.money import from_micros
from orchestrator.core.notifyspec import NotifyTarget
from orchestrator.core.settings import settings
from orchestrator.core.states import NOTIFIED, EventKind
from orchestrator.core.webhooks import WebhookEvent, summary
from orchestrator.engine.notify import DeliveryFailure, Endpoint, Notifier
from orchestrator.records.columns import document_object
from orchestrator.records.store import Job, Store, utcnow
from providers.base import Instance

log = logging.getLogger(__name__)

# How long the end of a run (`orch submit`, a worker's job) waits for queued deliveries.
CLOSE_S = 10.0


def endpoints(targets: Sequence[NotifyTarget], environ: Mapping[str, str],
              notify_url: str | None, notify_secret_env: str | None) -> list[Endpoint]:
    """The webhooks of `targets` and ORCH_NOTIFY_URL, their URLs and secrets taken from
    `environ` (a target whose variable is unset is skipped: the check before renting
    refused it already, and a takeover must not fail on it)."""
    found = []
    for t in targets:
        url = t.url or environ.get(t.url_env or "") or None
        if url is None or notifyspec.http_problem(url) is not None:
            continue
        secret = environ.get(t.secret_env) if t.secret_env else None
        events = None if t.events is None else frozenset(t.events)
        found.append(Endpoint(url, t.format, secret or None, events))
    if notify_url:
        host = notify_url.split("//", 1)[-1].split("/", 1)[0].split(":", 1)[0]
        fmt = "slack" if host in notifyspec.SLACK_HOSTS else "standard"
        secret = environ.get(notify_secret_env) if notify_secret_env else None
        found.append(Endpoint(notify_url, fmt, secret or None))
    return found


class Notices:
    """A job's (or a sweep's) notifications for one run of it."""

    def __init__(self, store: Store, job_id: str, name: str,
                 targets: Sequence[NotifyTarget], environ: Mapping[str, str] | None = None,
                 **delivery: Any) -> None:
        """`delivery`: `Notifier`'s options (attempts, wait, timeout_s, queue_size)."""
        self.store, self.job_id, self.name = store, job_id, name
        chosen = settings()
        found = endpoints(targets, os.environ if environ is None else environ,
                          chosen.notify_url, chosen.notify_secret_env)
        self.notifier = Notifier(found, self._failed, **delivery)
        self.notifier.on_delivered = self._delivered
        # (event id, endpoint shown) -> event type: queued or being sent, not yet told.
        self._pending: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()
        self._gave_up = False  # close() timed out: later failures were recorded already

    @classmethod
    def of_job(cls, store: Store, job: Job, **delivery: Any) -> Notices:
        """The notices of a recorded job (its `notify:` and ORCH_NOTIFY_URL)."""
        from orchestrator.engine.sweepnotices import sweep_targets

        targets = notifyspec.targets_in(job.spec_json)
        try:
            targets += [t for t in sweep_targets(store, job) if t not in targets]
            notices = cls(store, job.id, job.name, targets, **delivery)
            notices.resend_unsent(job)
        except Exception:  # noqa: BLE001 - the database may refuse; the job runs regardless
            log.warning("job %s: its sweep's webhooks or unsent events could not be read",
                        job.id, exc_info=True)
            notices = cls(store, job.id, job.name, targets, **delivery)
        return notices

    def resend_unsent(self, job: Job) -> None:
        """After a takeover: each event an earlier run recorded but neither delivered nor
        recorded as failed, sent again with its own webhook id (receivers dedupe on it)."""
        events = self.store.events(job.id)
        told = {(d.get("webhook_id"), d.get("endpoint")) for d in (
            document_object(e.data_json) for e in events
            if e.kind in (EventKind.NOTIFY_SENT, EventKind.NOTIFY_FAILED))}
        for e in events:
            data = document_object(e.data_json)
            msg_id = data.pop("webhook_id", None)
            if e.kind not in NOTIFIED or not isinstance(msg_id, str):
                continue
            payload = ({**data, "last_run": job.id} if "sweep_id" in data
                       else {"job_id": job.id, "name": job.name, **data})
            event = WebhookEvent(msg_id, e.kind, e.at, payload)
            left = {p.shown for p in self.notifier.endpoints if p.wants(event)
                    and (msg_id, p.shown) not in told}
            if left:
                with self._lock:
                    self._pending.update({(msg_id, shown): e.kind for shown in left})
                self.notifier.emit(event, only=left)

    def ended(self, job: Job) -> None:
        """`job.succeeded` or `job.failed` (with its reason) for a job in that final state."""
        if job.status == JobStatus.SUCCEEDED:
            self.emit(EventKind.JOB_SUCCEEDED, {"cost_usd": from_micros(job.cost_micros or 0)})
        elif job.status == JobStatus.FAILED:
            self.emit(EventKind.JOB_FAILED, {"reason": job.failure_reason or "",
                                             "cost_usd": from_micros(job.cost_micros or 0)})

    def emit(self, kind: EventKind, data: Mapping[str, Any],
             record: Callable[[Mapping[str, Any]], None] | None = None) -> str:
        """Record `kind` as a job event with a webhook id, then queue it; the id ("" when no
        endpoint wants it: then nothing is recorded).

        `record`: the caller's own recording of the event, given its data (with the webhook
        id when it is sent), called whether or not an endpoint wants it: an event the job's
        history has anyway (a deadline it will miss) is then one event, not two, and its
        errors are the caller's."""
        assert kind in NOTIFIED, kind
        probe = WebhookEvent("", kind.value, utcnow())
        if not any(e.wants(probe) for e in self.notifier.endpoints):
            if record is not None:
                record(data)
            return ""  # nobody to tell: the history keeps what was sent, nothing else
        msg_id = f"msg_{uuid.uuid4().hex}"
        payload = ({**data, "last_run": self.job_id} if "sweep_id" in data
                   else {"job_id": self.job_id, "name": self.name, **data})
        event = WebhookEvent(msg_id, kind.value, utcnow(), payload)
        if record is not None:  # recorded before it is sent, as below
            record({"webhook_id": msg_id, **_plain(data)})
        else:
            try:
                self.store.add_event(self.job_id, kind, summary(event),
                                     {"webhook_id": msg_id, **_plain(data)})
            except Exception:  # noqa: BLE001 - a notice never fails the job
                log.exception("recording %s for job %s", kind, self.job_id)
        with self._lock:
            self._pending.update({(msg_id, e.shown): kind.value
                                  for e in self.notifier.endpoints if e.wants(event)})
        self.notifier.emit(event)
        return msg_id

    def close(self, timeout_s: float = CLOSE_S) -> bool:
        """Deliver what is queued within `timeout_s` (see `Notifier.close`); a delivery still
        under way then is recorded as not confirmed (this process may end before it)."""
        if self.notifier.close(timeout_s):
            return True
        with self._lock:
            left = dict(self._pending)
        for (msg_id, shown), kind in left.items():
            self._failed(DeliveryFailure(msg_id, kind, shown, 0, "not confirmed: orch stopped "
                                         f"waiting after {timeout_s:g} s while retrying"))
        self._gave_up = True
        return False

    def _delivered(self, event: WebhookEvent, endpoint: Endpoint) -> None:
        """On the notifier's thread: recorded, so that a takeover does not send it again."""
        with self._lock:
            self._pending.pop((event.id, endpoint.shown), None)
        self.store.add_event(self.job_id, EventKind.NOTIFY_SENT,
                             f"webhook {event.type} delivered to {endpoint.shown}",
                             {"webhook_id": event.id, "type": event.type,
                              "endpoint": endpoint.shown})

    def _failed(self, failure: DeliveryFailure) -> None:
        """On the notifier's thread: keep the failure in the job's history (once)."""
        with self._lock:
            known = self._pending.pop((failure.event_id, failure.endpoint), None)
        if known is None and self._gave_up:
            return  # recorded as not confirmed when the run stopped waiting
        self.store.add_event(
            self.job_id, EventKind.NOTIFY_FAILED,
            f"webhook {failure.event_type} to {failure.endpoint} not delivered after "
            f"{failure.attempts} attempt(s): {failure.reason}",
            {"webhook_id": failure.event_id, "type": failure.event_type,
             "endpoint": failure.endpoint, "attempts": failure.attempts,
             "reason": failure.reason})


def _plain(data: Mapping[str, Any]) -> dict[str, Any]:
    """`data` as JSON values (money and times as text), for the job event."""
    import json

    return dict(json.loads(WebhookEvent("", "", utcnow(), data).body())["data"])


def placed_on(inst: Instance) -> str:
    """Where an instance runs, for people: `sim RTX 3090 x1`."""
    return f"{inst.provider} {inst.gpu or '?'} x{inst.gpu_count or 1}"


def told(notices: Notices, store: Store, job_id: str) -> None:
    """At the end of a run: tell the job's final state (if it has one) and flush, briefly."""
    from orchestrator.engine.sweepnotices import due

    try:
        job = store.get_job(job_id)
        notices.ended(job)
        for kind, data in due(store, job) if job.status in FINAL_STATUSES else ():
            notices.emit(kind, data)
    except Exception:  # noqa: BLE001 - the database may be what ended the run
        log.info("job %s: its end was not notified", job_id, exc_info=True)
    notices.close()
