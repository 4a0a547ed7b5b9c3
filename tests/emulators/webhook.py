"""A webhook receiver on real HTTP (127.0.0.1): records every POST and verifies Standard
Webhooks signatures the way the spec's reference library does
(github.com/standard-webhooks/standard-webhooks libraries/python/standardwebhooks/
webhooks.py `Webhook.verify`: the three headers present, the timestamp within 5 minutes, a
`v1,` signature equal to base64(HMAC-SHA256(base64-decoded secret, "id.timestamp.body"))),
written here independently of orch's signer. It can answer the next N requests with an error
status, or stall them, to exercise the sender's retries.

    with WebhookReceiver(secret="whsec_...") as hook:
        ... POST to hook.url + "/orch" ...
        hook.received  # [Received(headers, body, verified), ...]
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any

from .hubwrite import read_body
from .serve import Served

TOLERANCE_S = 5 * 60


@dataclass(frozen=True)
class Received:
    """One POST as it arrived."""

    path: str
    headers: dict[str, str]
    body: bytes
    verified: bool | None  # None: no secret to check against
    status: int

    def json(self) -> Any:
        return json.loads(self.body)


def verify(secret: str, headers: dict[str, str], body: bytes, now: float) -> bool:
    """The reference library's check, restated: True when one `v1` signature matches."""
    msg_id = headers.get("webhook-id")
    stamp = headers.get("webhook-timestamp")
    signatures = headers.get("webhook-signature")
    if not (msg_id and stamp and signatures):
        return False
    if abs(now - float(stamp)) > TOLERANCE_S:
        return False
    key = base64.b64decode(secret.removeprefix("whsec_") + "==")
    expected = hmac.new(key, f"{msg_id}.{stamp}.".encode() + body, hashlib.sha256).digest()
    for versioned in signatures.split(" "):
        version, _, signature = versioned.partition(",")
        if version == "v1" and hmac.compare_digest(expected, base64.b64decode(signature)):
            return True
    return False


class WebhookReceiver(Served):
    """Records POSTs; `fail_next` requests get `fail_status`; `stall_next` are held
    `stall_s` before answering (longer than the sender's timeout: a timeout)."""

    METHODS = ("POST",)

    def __init__(self, secret: str | None = None) -> None:
        self.secret = secret
        self.received: list[Received] = []
        self.fail_next = 0
        self.fail_status = 503
        self.stall_next = 0
        self.stall_s = 2.0
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return self.served_url

    def serve(self, h: BaseHTTPRequestHandler) -> None:
        body = read_body(h)
        headers = {k.lower(): v for k, v in h.headers.items()}
        with self._lock:
            failing = self.fail_next > 0
            self.fail_next -= failing
            stalling = not failing and self.stall_next > 0
            self.stall_next -= stalling
        status = self.fail_status if failing else 200
        verified = None if self.secret is None else verify(self.secret, headers, body,
                                                           time.time())
        with self._lock:
            self.received.append(Received(h.path, headers, body, verified, status))
        if stalling:
            time.sleep(self.stall_s)
        raw = b"ok" if status == 200 else b"unavailable"
        try:
            h.send_response(status)
            h.send_header("Content-Length", str(len(raw)))
            h.end_headers()
            h.wfile.write(raw)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the sender gave up waiting

    def delivered(self) -> list[Received]:
        """The POSTs that were answered 200, in arrival order."""
        with self._lock:
            return [r for r in self.received if r.status == 200]
