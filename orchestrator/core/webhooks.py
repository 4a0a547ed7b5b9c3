"""The webhook requests orch sends (pure: the sender is `orchestrator/engine/notify.py`).

`standard`: the Standard Webhooks spec (github.com/standard-webhooks/standard-webhooks,
spec/standard-webhooks.md): the body is `{"type", "timestamp", "data"}` (its "Payload
structure"), and each attempt carries `webhook-id` (the event's id, the same on every retry:
the receiver's idempotency key), `webhook-timestamp` (the attempt's unix seconds) and
`webhook-signature: v1,<base64 of HMAC-SHA256(key, "id.timestamp.body")>`, the key being the
base64 after the secret's `whsec_` prefix ("Signature scheme", "Webhook headers").
`slack`: Slack's incoming-webhook message, `{"text": ..., "blocks": [...]}` (text is the
notification's fallback; blocks are `section` with `mrkdwn` and a `context`), unsigned.

Money is text (Decimal), times are UTC; an event names no secret.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from orchestrator.core import divergence
from orchestrator.core.notifyspec import decode_secret

USER_AGENT = "orch-webhooks/1"
_ICON = {"job.succeeded": ":white_check_mark:", "job.failed": ":x:",
         "job.preempted": ":warning:", "job.replaced": ":arrows_counterclockwise:",
         "job.budget_reached": ":money_with_wings:", "sweep.finished": ":checkered_flag:",
         "deadline.will_miss": ":hourglass:", "train.not_finite": ":warning:"}


@dataclass(frozen=True)
class WebhookEvent:
    """One event: `id` is unique per event (`msg_...`), `at` its UTC time."""

    id: str
    type: str
    at: datetime
    data: Mapping[str, Any] = field(default_factory=dict)

    def body(self) -> bytes:
        """The standard payload, compact JSON (the bytes signed are the bytes sent)."""
        payload = {"type": self.type, "timestamp": _iso(self.at), "data": _plain(self.data)}
        return json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()


def _iso(at: datetime) -> str:
    text = at.isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def _plain(value: Any) -> Any:
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, datetime):
        return _iso(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """`v1,<signature>` of one attempt (ValueError for a malformed secret)."""
    key = decode_secret(secret)
    signed = msg_id.encode() + b"." + str(timestamp).encode() + b"." + body
    digest = hmac.new(key, signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def standard(event: WebhookEvent, secret: str | None, now: int) -> tuple[dict[str, str], bytes]:
    """(headers, body) of one attempt at `now` (unix seconds); signed when `secret` is set."""
    body = event.body()
    headers = {"content-type": "application/json", "user-agent": USER_AGENT,
               "webhook-id": event.id, "webhook-timestamp": str(now)}
    if secret:
        headers["webhook-signature"] = sign(secret, event.id, now, body)
    return headers, body


def summary(event: WebhookEvent) -> str:
    """One line for a person: what happened to which job or sweep."""
    d = event.data
    name = f"`{d.get('name', '?')}` ({d.get('job_id') or d.get('sweep_id') or '?'})"
    if event.type == "job.succeeded":
        cost = f", ${d['cost_usd']}" if d.get("cost_usd") is not None else ""
        return f"orch job {name} succeeded{cost}"
    if event.type == "job.failed":
        return f"orch job {name} failed: {d.get('reason') or 'no reason recorded'}"
    if event.type == "job.preempted":
        return f"orch job {name} lost its machine ({d.get('reason') or 'preempted'})"
    if event.type == "job.replaced":
        return f"orch job {name} was re-placed on {d.get('placement') or 'another machine'}"
    if event.type == "job.budget_reached":
        return (f"orch {d.get('scope', 'job')} {name} reached its budget "
                f"(${d.get('spent_usd')} of ${d.get('budget_usd')})")
    if event.type == "deadline.will_miss":
        late = d.get("miss_by_s")
        by = f" by {late / 60:.0f} min" if isinstance(late, int | float) else ""
        why = f" ({d['reason']})" if d.get("reason") else ""
        return (f"orch job {name} will miss its deadline{by} whatever happens{why}; it goes "
                f"on on {d.get('fastest') or 'the fastest choice'}")
    if event.type == "train.not_finite":
        return f"orch job {name}: " + divergence.told(
            d.get("metric", "the loss"), d.get("value", "nan"), d.get("step", "?"),
            d.get("reason") or "the run may have diverged", d.get("stops_after"),
            d.get("job_id", "ID"))
    best = d.get("best") or {}
    tail = (f"; best run {best.get('name')} ({d.get('metric')} = {best.get('value')})"
            if best else "")
    return f"orch sweep {name} finished: {d.get('runs', '?')} runs{tail}"


def slack(event: WebhookEvent) -> tuple[dict[str, str], bytes]:
    """(headers, body) of Slack's incoming-webhook message for `event`."""
    line = summary(event)
    fields = [f"*{k}*: {_plain(v)}" for k, v in event.data.items()
              if k not in ("name",) and isinstance(v, str | int | float | Decimal)]
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn",
                                     "text": f"{_ICON.get(event.type, '')} {line}".strip()}}]
    if fields:
        blocks.append({"type": "context", "elements": [
            {"type": "mrkdwn", "text": " · ".join(fields)[:2900]}]})
    body = json.dumps({"text": line, "blocks": blocks}, separators=(",", ":")).encode()
    return {"content-type": "application/json", "user-agent": USER_AGENT}, body


def request(event: WebhookEvent, fmt: str, secret: str | None,
            now: int) -> tuple[dict[str, str], bytes]:
    """(headers, body) of one attempt in `fmt` (standard | slack)."""
    return slack(event) if fmt == "slack" else standard(event, secret, now)
