"""The one retry policy (providers/retrying.py) and the sites that were hand-written loops.

Each converted site is shown retrying a transient fault and giving up at once on a
permanent one, against real parts: the eval scorer against an HTTP server on loopback, the
engine's teardown calls against the Vast.ai adapter and its emulator. (The model download's
retries are tested on a simulated host in tests/test_playbook_model_cache.py:
`test_failed_download_is_retried`, `test_repeated_download_failure_is_transient`,
`test_a_missing_revision_stops_at_once`.)
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler

import pytest
from emulators.serve import LoopbackServer
from emulators.vast import VastEmulator
from tenacity import RetryCallState

from playbooks.base import Fault, StepFailed
from playbooks.evalscore import score_eval_set
from providers import retried, retrying
from providers.base import InstanceState, NotFound, Requirements, TransientError
from providers.vastai.compute import VastAI

KEY = "vast-retry-key-0123456789"
PUBKEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOrchTestKey orch-test"


class Flaky:
    """A call that fails with `error` `fails` times, then answers "ok"."""

    def __init__(self, fails: int, error: BaseException) -> None:
        self.fails, self.error, self.calls = fails, error, 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.fails:
            raise self.error
        return "ok"


# -- the helper ----------------------------------------------------------------------------

def test_a_transient_error_is_retried_until_the_call_answers() -> None:
    call = Flaky(2, ConnectionError("reset"))
    assert retrying.policy(ConnectionError, attempts=3, wait=retrying.steps(0, 0))(call) == "ok"
    assert call.calls == 3


def test_a_permanent_error_is_raised_at_once_as_itself() -> None:
    call = Flaky(5, PermissionError("denied"))
    with pytest.raises(PermissionError, match="denied"):
        retrying.policy(ConnectionError, attempts=5, wait=retrying.steps(0, 0))(call)
    assert call.calls == 1


def test_the_last_error_itself_is_raised_when_the_attempts_are_spent() -> None:
    call = Flaky(9, ConnectionError("still down"))
    with pytest.raises(ConnectionError, match="still down"):
        retrying.policy(lambda e: isinstance(e, ConnectionError), attempts=4,
                        wait=retrying.steps(0, 0))(call)
    assert call.calls == 4


def test_a_deadline_bounds_the_retries_and_no_wait_sleeps_past_it() -> None:
    slept: list[float] = []
    policy = retrying.policy(ConnectionError, deadline_s=0.3, wait=retrying.steps(10.0, 0))
    policy.sleep = slept.append  # tenacity's own hook; the deadline clock still runs
    call = Flaky(10**6, ConnectionError("down"))
    with pytest.raises(ConnectionError):
        # A 10 s wait is cut to what is left of 0.3 s, so the call is tried again (at the
        # deadline) instead of after 10 s; with sleeps recorded, not slept, the loop ends
        # when the deadline has passed by the clock.
        for attempt in policy:
            with attempt:
                time.sleep(0.01)
                call()
    assert slept and all(0 <= s <= 0.3 for s in slept)
    assert call.calls >= 2


def test_an_extra_stop_condition_ends_the_retries_early() -> None:
    from tenacity import stop_after_attempt

    call = Flaky(10, ConnectionError("down"))
    with pytest.raises(ConnectionError):
        retrying.policy(ConnectionError, attempts=10, stop=stop_after_attempt(2),
                        wait=retrying.steps(0, 0))(call)
    assert call.calls == 2


def test_every_retry_needs_a_bound() -> None:
    with pytest.raises(ValueError, match="needs a bound"):
        retrying.policy(ConnectionError)
    with pytest.raises(ValueError, match="attempts must be >= 1"):
        retrying.policy(ConnectionError, attempts=0)


def _state(n: int) -> RetryCallState:
    state = RetryCallState(retrying.policy(OSError, attempts=9), fn=None, args=(), kwargs={})
    state.attempt_number = n
    return state


def test_the_waits() -> None:
    steps = retrying.steps(1.0, 1.0)
    assert [steps(_state(n)) for n in (1, 2, 3)] == [1.0, 2.0, 3.0]
    plain = retrying.backoff(0.25, 4.0)
    assert [plain(_state(n)) for n in (1, 2, 3, 5, 9)] == [0.25, 0.5, 1.0, 4.0, 4.0]
    jittered = retrying.backoff(0.25, 4.0, 0.25)
    for n, low in ((1, 0.25), (2, 0.5), (3, 1.0), (9, 4.0)):
        assert low <= jittered(_state(n)) <= min(4.0, low + 0.25)
    full = retrying.full_jitter(0.05, 1.0)
    assert all(0 <= full(_state(n)) <= min(1.0, 0.05 * 2 ** (n - 1)) for n in (1, 4, 9))


# -- the eval scorer (playbooks/evalscore.py) ----------------------------------------------

class Completions:
    """POST /v1/completions on loopback: `statuses` answered in turn, then 200 with "4"."""

    def __init__(self, statuses: list[int]) -> None:
        self.statuses, self.seen = list(statuses), 0
        self.lock = threading.Lock()
        self.server = LoopbackServer(self._handle, methods=("POST",))

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        h.rfile.read(int(h.headers.get("Content-Length") or 0))
        with self.lock:
            self.seen += 1
            status = self.statuses.pop(0) if self.statuses else 200
        body = (json.dumps({"choices": [{"text": "4"}]}) if status == 200
                else json.dumps({"error": f"status {status}"})).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)


@pytest.fixture
def completions() -> Iterator[type[Completions]]:
    made: list[Completions] = []

    def make(statuses: list[int]) -> Completions:
        made.append(Completions(statuses))
        return made[-1]

    yield make  # type: ignore[misc]
    for c in made:
        c.server.close()


ROW = [{"prompt": "2+2=", "expected": "4"}]


def test_the_scorer_retries_a_5xx(completions: type[Completions]) -> None:
    server = completions([503, 500])
    scores = score_eval_set(server.server.url, ROW, "ft", retries=2)
    assert scores.metrics["eval.exact_match"] == 1.0
    assert server.seen == 3


def test_the_scorer_gives_up_after_its_retries_as_a_transient_fault(
        completions: type[Completions]) -> None:
    server = completions([502] * 5)
    with pytest.raises(StepFailed, match=r"failed 2 times: HTTP 502") as failed:
        score_eval_set(server.server.url, ROW, "ft", retries=1)
    assert failed.value.fault is Fault.TRANSIENT
    assert server.seen == 2


def test_the_scorer_does_not_retry_a_refusal(completions: type[Completions]) -> None:
    server = completions([400])
    with pytest.raises(StepFailed, match="returned 400") as failed:
        score_eval_set(server.server.url, ROW, "ft", retries=3)
    assert failed.value.fault is Fault.HOST
    assert server.seen == 1


# -- the engine's teardown calls (providers/retried.py, used by engine/teardown.py) --------

@pytest.fixture
def vast() -> Iterator[tuple[VastEmulator, VastAI, str]]:
    with VastEmulator(api_key=KEY) as emu:
        emu.add_offer(id=1, gpu_name="RTX 4090", dph_base=0.35, min_bid=0.18)
        # One HTTP attempt per call: the adapter's own retries are not what is tested here.
        api = VastAI(KEY, base_url=emu.url, attempts=1, initial_s=0.01, max_wait_s=0.01)
        offer = api.offers(Requirements(gpu_count=1, min_gpu_memory_bytes=20 * 1024**3,
                                        interruptible=True))[0]
        yield emu, api, api.create(offer, PUBKEY, "job-retry").instance_id


def test_terminate_is_retried_after_a_provider_error(
        vast: tuple[VastEmulator, VastAI, str]) -> None:
    emu, api, iid = vast
    emu.fail_next(2, 500, method="DELETE")
    retried.terminate(api, iid, pause_s=0.01)
    assert len(emu.requests_to("DELETE", "/api/v0/instances/")) == 3
    assert not emu.instances


def test_terminate_gives_up_after_three_tries_with_the_provider_error(
        vast: tuple[VastEmulator, VastAI, str]) -> None:
    emu, api, iid = vast
    emu.fail_next(10, 503, method="DELETE")
    with pytest.raises(TransientError):
        retried.terminate(api, iid, pause_s=0.01)
    assert len(emu.requests_to("DELETE", "/api/v0/instances/")) == retried.TRIES
    assert emu.instances  # still there: the caller records teardown.failed for reconcile


def test_terminate_of_an_instance_already_gone_is_done_in_one_call(
        vast: tuple[VastEmulator, VastAI, str]) -> None:
    emu, api, iid = vast
    retried.terminate(api, iid, pause_s=0.01)
    before = len(emu.requests_to("DELETE", "/api/v0/instances/"))
    retried.terminate(api, iid, pause_s=0.01)
    assert len(emu.requests_to("DELETE", "/api/v0/instances/")) == before + 1


def test_look_up_is_retried_then_answers(vast: tuple[VastEmulator, VastAI, str]) -> None:
    emu, api, iid = vast
    emu.fail_next(2, 500, method="GET")
    inst = retried.look_up(api, iid, pause_s=0.01)
    assert inst is not None and inst.instance_id == iid
    assert inst.state is not InstanceState.TERMINATED


def test_look_up_without_an_answer_is_none_and_a_gone_instance_is_notfound(
        vast: tuple[VastEmulator, VastAI, str]) -> None:
    emu, api, iid = vast
    emu.fail_next(retried.TRIES, 500, method="GET")
    assert retried.look_up(api, iid, pause_s=0.01) is None
    assert len(emu.requests_to("GET", f"/api/v0/instances/{iid}/")) == retried.TRIES
    api.terminate(iid)
    with pytest.raises(NotFound):
        retried.look_up(api, iid, pause_s=0.01)
