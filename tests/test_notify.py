"""Issue 39 §Notifications: `notify:` in the job and sweep files, Standard Webhooks signing
(checked against the spec's published test vector), Slack's message, and the sender: events
delivered in order to a real HTTP receiver that verifies each signature, retried with the
project's tenacity policy, never blocking the emitter, and a delivery that keeps failing
reported (never lost silently)."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest
from emulators.webhook import WebhookReceiver
from tenacity import wait_none

from orchestrator.core import notifyspec, webhooks
from orchestrator.core.spec import SpecError, load_job
from orchestrator.core.webhooks import WebhookEvent
from orchestrator.engine.notify import DeliveryFailure, Endpoint, Notifier

# 32 random bytes, as the spec asks (24-64), in its serialization.
SECRET = "whsec_" + base64.b64encode(bytes(range(32))).decode()
HEAD = ("name: t\nbase_model: meta-llama/Llama-3.1-8B\nmethod: qlora\n"
        "dataset: {path: d.jsonl}\n")


def event(n: int, kind: str = "job.succeeded", **data: object) -> WebhookEvent:
    return WebhookEvent(f"msg_{n:04d}", kind, datetime(2026, 3, 1, 12, 0, n, tzinfo=UTC),
                        {"job_id": f"j-{n}", "name": f"run-{n}", **data})


def test_the_signature_is_the_specs_published_vector() -> None:
    # standard-webhooks libraries/go/webhook_test.go:199-205 (TestWebhookSign), the same
    # vector in the JavaScript, Java, PHP and C# libraries' tests.
    assert webhooks.sign("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "msg_p5jXN8AQM9LWM0D4loKWxJek",
                         1614265330, b'{"test": 2432232314}') == \
        "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_a_standard_request_has_the_three_headers_and_the_signed_body() -> None:
    e = event(1, cost_usd=Decimal("3.40"))
    headers, body = webhooks.standard(e, SECRET, 1_770_000_000)
    assert json.loads(body) == {"type": "job.succeeded", "timestamp": "2026-03-01T12:00:01Z",
                                "data": {"job_id": "j-1", "name": "run-1", "cost_usd": "3.40"}}
    assert headers["webhook-id"] == "msg_0001" and headers["webhook-timestamp"] == "1770000000"
    assert headers["webhook-signature"] == webhooks.sign(SECRET, "msg_0001", 1_770_000_000,
                                                         body)
    unsigned, _ = webhooks.standard(e, None, 1)
    assert "webhook-signature" not in unsigned


def test_slacks_message_is_text_and_blocks() -> None:
    _, body = webhooks.slack(event(2, "job.failed", reason="out of memory at step 12"))
    message = json.loads(body)
    assert message["text"] == "orch job `run-2` (j-2) failed: out of memory at step 12"
    assert message["blocks"][0] == {"type": "section", "text": {
        "type": "mrkdwn", "text": ":x: orch job `run-2` (j-2) failed: out of memory at step 12"}}
    assert message["blocks"][1]["type"] == "context"
    _, body = webhooks.slack(WebhookEvent("msg_s", "sweep.finished", datetime.now(UTC), {
        "sweep_id": "s-1", "name": "lr", "runs": 6, "metric": "eval.exact_match",
        "best": {"name": "lr-003", "value": 0.81}}))
    assert json.loads(body)["text"] == ("orch sweep `lr` (s-1) finished: 6 runs; best run "
                                        "lr-003 (eval.exact_match = 0.81)")


def test_each_event_says_what_happened_in_its_own_words() -> None:
    # deadline.will_miss's text fell through to the sweep's: "orch sweep `run-3` (j-3)
    # finished: ? runs" for a job that will miss its deadline.
    from orchestrator.core.states import NOTIFIED

    for kind in NOTIFIED:
        line = webhooks.summary(event(3, kind.value))
        assert ("finished:" in line) == (kind.value == "sweep.finished"), (kind, line)
    late = webhooks.summary(event(3, "deadline.will_miss", miss_by_s=1260.0,
                                  fastest="on_demand", reason="2.1 h of work, 1.8 h left"))
    assert late == ("orch job `run-3` (j-3) will miss its deadline by 21 min whatever "
                    "happens (2.1 h of work, 1.8 h left); it goes on on on_demand")
    nan = webhooks.summary(event(3, "train.not_finite", metric="train.loss", step=12,
                                 value="nan", reason="the run has likely diverged"))
    assert nan == ("orch job `run-3` (j-3): train.loss is nan at step 12: the run has likely "
                   "diverged; it trains on (`orch cancel j-3` stops it now)")
    stops = webhooks.summary(event(3, "train.not_finite", metric="train.loss", step=12,
                                   value="nan", reason="diverged", stops_after=3))
    assert stops.endswith("diverged; orch stops it if the loss is nan at 3 logged steps in a "
                          "row, as training.stop_on_nan says (`orch cancel j-3` stops it now)")


# --- the files -------------------------------------------------------------------------------

def load(tmp_path: Path, text: str) -> object:
    (tmp_path / "d.jsonl").write_text('{"instruction": "a", "output": "b"}\n')
    path = tmp_path / "job.yml"
    path.write_text(HEAD + text)
    return load_job(path)


def problems(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(SpecError) as info:
        load(tmp_path, text)
    return info.value.problems


def test_notify_in_the_job_file(tmp_path: Path) -> None:
    job = load(tmp_path, "notify:\n  - {url: 'https://example.com/hooks/orch', secret_env: "
                         "HOOK_SECRET, events: [job.succeeded, job.failed]}\n"
                         "  - {url_env: SLACK_WEBHOOK_URL, format: slack}\n")
    targets = job.spec.notify  # type: ignore[attr-defined]
    assert [t.format for t in targets] == ["standard", "slack"]
    assert targets[0].wants("job.failed") and not targets[0].wants("job.preempted")
    single = load(tmp_path, "notify: {url: 'http://127.0.0.1:9/x'}\n")
    assert len(single.spec.notify) == 1  # type: ignore[attr-defined]


@pytest.mark.parametrize(("text", "words"), [
    ("notify: {url: 'ftp://example.com/x'}",
     "'ftp://example.com/x' is not an http(s) URL"),
    ("notify: {url: 'https://hooks.slack.com/services/T0/B0/XXXX', format: slack}",
     "a Slack webhook URL is a secret"),
    ("notify: {url: 'https://user:pw@example.com/x'}", "do not put credentials in the URL"),
    ("notify: {url_env: SLACK, format: slack, secret_env: S}", "Slack does not check signatures"),
    ("notify: {format: slack}", "give url (an http(s) URL) or url_env"),
    ("notify: {url: 'https://e.com/x', events: [job.done]}",
     "notify[0].events[0]: must be one of job.succeeded, job.failed"),
])
def test_bad_webhooks_are_refused_at_load_with_the_field(tmp_path: Path, text: str,
                                                         words: str) -> None:
    (msg,) = problems(tmp_path, text + "\n")
    assert f"{tmp_path / 'job.yml'}:5 notify" in msg, msg
    assert words in msg, msg


def test_the_environment_is_checked_before_renting() -> None:
    targets = [notifyspec.NotifyTarget(url_env="SLACK_WEBHOOK_URL", format="slack"),
               notifyspec.NotifyTarget(url="https://e.com/x", secret_env="HOOK_SECRET")]
    assert notifyspec.env_problems(targets, {}) == [
        "notify[0].url_env: SLACK_WEBHOOK_URL is not set in the environment of the orch "
        "process that runs the job; set it to the webhook URL",
        "notify[1].secret_env: HOOK_SECRET is not set; set it to the signing secret the "
        "receiver checks (whsec_ + base64)"]
    bad = notifyspec.env_problems(targets, {"SLACK_WEBHOOK_URL": "hooks.slack.com/x",
                                            "HOOK_SECRET": "whsec_c2hvcnQ="})
    assert bad[0].startswith("notify[0].url_env: the value of SLACK_WEBHOOK_URL is not an "
                             "http(s) URL")
    assert "holds 5 bytes; the Standard Webhooks spec asks for 24 to 64" in bad[1]
    assert "SECRET" not in "".join(bad).replace("HOOK_SECRET", "")  # no value echoed
    assert notifyspec.env_problems(targets, {
        "SLACK_WEBHOOK_URL": "https://hooks.slack.com/services/T/B/X",
        "HOOK_SECRET": SECRET}) == []


def test_the_sweep_file_takes_notify_too(tmp_path: Path) -> None:
    from orchestrator.core.sweepspec import SweepSpec

    spec = SweepSpec.model_validate({"name": "s", "base": "b.yml", "notify": {
        "url": "https://e.com/x", "events": ["sweep.finished"]}})
    assert spec.notify[0].events == ["sweep.finished"]


# --- delivery ----------------------------------------------------------------------------------

@pytest.fixture
def hook() -> Iterator[WebhookReceiver]:
    with WebhookReceiver(secret=SECRET) as receiver:
        yield receiver


def notifier(endpoints: list[Endpoint], failures: list[DeliveryFailure],
             **kw: object) -> Notifier:
    return Notifier(endpoints, failures.append, wait=wait_none(), **kw)  # type: ignore[arg-type]


def test_events_arrive_in_order_signed_and_verified(hook: WebhookReceiver) -> None:
    failures: list[DeliveryFailure] = []
    n = notifier([Endpoint(f"{hook.url}/orch", secret=SECRET)], failures)
    kinds = ["job.preempted", "job.replaced", "job.budget_reached", "job.failed"]
    for i, kind in enumerate(kinds):
        n.emit(event(i, kind))
    assert n.close(30)
    got = hook.delivered()
    assert [r.json()["type"] for r in got] == kinds
    assert all(r.verified for r in got), [r.headers for r in got]
    assert [r.headers["webhook-id"] for r in got] == [f"msg_{i:04d}" for i in range(4)]
    assert failures == []


def test_a_failing_receiver_is_retried_with_a_fresh_signature(hook: WebhookReceiver) -> None:
    failures: list[DeliveryFailure] = []
    clock = iter(range(1_770_000_000, 1_770_000_100))
    hook.fail_next = 2
    n = notifier([Endpoint(f"{hook.url}/orch", secret=SECRET)], failures,
                 clock=lambda: float(next(clock)))
    n.emit(event(7))
    assert n.close(30)
    assert [r.status for r in hook.received] == [503, 503, 200]
    assert len({r.headers["webhook-id"] for r in hook.received}) == 1  # the same event
    assert len({r.headers["webhook-timestamp"] for r in hook.received}) == 3  # each attempt's
    assert failures == []


def test_a_delivery_that_keeps_failing_is_reported_not_lost(hook: WebhookReceiver) -> None:
    failures: list[DeliveryFailure] = []
    hook.fail_next, hook.fail_status = 100, 500
    n = notifier([Endpoint(f"{hook.url}/secret-path", secret=SECRET)], failures, attempts=3)
    n.emit(event(1))
    hook_refuses = WebhookReceiver()
    with hook_refuses:
        hook_refuses.fail_next, hook_refuses.fail_status = 100, 404
        m = notifier([Endpoint(f"{hook_refuses.url}/gone")], failures, attempts=3)
        m.emit(event(2))
        assert m.close(30)
        assert len(hook_refuses.received) == 1  # a 404 is not retried
    assert n.close(30)
    assert len(hook.received) == 3
    assert sorted((f.event_id, f.attempts, f.reason) for f in failures) == [
        ("msg_0001", 3, "HTTP 500"), ("msg_0002", 1, "HTTP 404")]
    assert all("secret-path" not in f.endpoint and "/gone" not in f.endpoint
               for f in failures)  # the URL's path may be a secret (Slack's)


def test_emit_never_blocks_the_job(hook: WebhookReceiver) -> None:
    failures: list[DeliveryFailure] = []
    hook.stall_next, hook.stall_s = 1, 1.5
    n = notifier([Endpoint(f"{hook.url}/orch")], failures, timeout_s=5.0, queue_size=2)
    started = time.monotonic()
    for i in range(6):  # the first stalls the thread: the queue fills, the rest is dropped
        n.emit(event(i))
    emitting = time.monotonic() - started
    assert emitting < 1.0, emitting  # the stalled receiver did not hold the emitter
    assert n.close(30)
    dropped = [f for f in failures if "queue is full" in f.reason]
    assert dropped and len(hook.delivered()) + len(dropped) == 6


def test_a_recorders_error_does_not_stop_deliveries(hook: WebhookReceiver) -> None:
    def boom(_failure: DeliveryFailure) -> None:
        raise RuntimeError("database is locked")

    hook.fail_next, hook.fail_status = 1, 400
    n = Notifier([Endpoint(f"{hook.url}/orch")], boom, wait=wait_none())
    n.emit(event(1))
    n.emit(event(2))
    assert n.close(30)
    assert [r.json()["data"]["job_id"] for r in hook.delivered()] == ["j-2"]


def test_slack_format_posts_slacks_message(hook: WebhookReceiver) -> None:
    n = notifier([Endpoint(f"{hook.url}/services/T/B/X", format="slack",
                           events=frozenset({"job.succeeded"}))], [])
    n.emit(event(1, "job.preempted"))  # filtered out
    n.emit(event(2, "job.succeeded", cost_usd=Decimal("1.25")))
    assert n.close(30)
    (got,) = hook.received
    assert got.json()["text"] == "orch job `run-2` (j-2) succeeded, $1.25"
    assert "webhook-signature" not in got.headers


def test_threads_do_not_leak() -> None:
    n = Notifier([Endpoint("http://127.0.0.1:9/x")], None, attempts=1)
    assert n.close(1)  # never started
    before = threading.active_count()
    n.emit(event(1))
    assert n.close(30)
    assert threading.active_count() <= before


def test_events_left_when_orch_stops_are_reported(hook: WebhookReceiver) -> None:
    failures: list[DeliveryFailure] = []
    hook.stall_next, hook.stall_s = 1, 3.0
    n = notifier([Endpoint(f"{hook.url}/orch")], failures, timeout_s=10.0)
    for i in range(3):
        n.emit(event(i))
    assert not n.close(0.5)  # the first is still being sent
    assert [(f.event_id, f.reason) for f in failures] == [
        ("msg_0001", "not sent: orch stopped before delivering it"),
        ("msg_0002", "not sent: orch stopped before delivering it")]


def test_the_schema_event_words_are_the_notified_event_kinds() -> None:
    """`notify.events` accepts exactly the EventKind members webhooks are sent for."""
    from typing import get_args

    from orchestrator.core.states import NOTIFIED, EventKind

    assert set(get_args(notifyspec.EventType)) == {k.value for k in NOTIFIED}
    assert notifyspec.EVENT_TYPES == tuple(k.value for k in NOTIFIED)
    assert all(isinstance(k, EventKind) for k in NOTIFIED)
