"""A stop (SIGTERM, Ctrl-C) that lands where Python cannot raise it is not lost.

Python runs a signal's handler between two bytecodes of the main thread, also inside a
weakref callback that the garbage collector runs, where the handler's exception is printed as
"Exception ignored" and dropped. An idle `orch worker` then polled on with SIGTERM ignored
(SQLAlchemy's event registry has such a callback; tests/test_orchfork.py hung on it about
once in ten stops under load). `orch submit` and `orch worker` run under
`stops_delivered`, which delivers such a stop again; here the signal is sent from inside a
weakref callback, so the handler runs exactly there."""

from __future__ import annotations

import gc
import os
import signal
import time
import weakref

import pytest

from orchestrator.cli.stops import stops_delivered
from orchestrator.engine.runner import Terminated


class _Thing:
    pass


def _signal_inside_a_weakref_callback(sig: int) -> None:
    def callback(_ref: object) -> None:
        os.kill(os.getpid(), sig)
        for _ in range(1000):  # bytecodes at which the handler runs, still in the callback
            pass

    thing = _Thing()
    ref = weakref.ref(thing, callback)
    del thing  # the callback runs now
    assert ref() is None


def _waits_for(exc: type[BaseException]) -> float:
    """Seconds until `exc` reaches this frame (it must within 5 s)."""
    start = time.monotonic()
    with pytest.raises(exc):
        while time.monotonic() - start < 5:
            time.sleep(0.01)
    return time.monotonic() - start


@pytest.mark.parametrize("sig, exc", [(signal.SIGTERM, Terminated),
                                      (signal.SIGINT, KeyboardInterrupt)])
def test_a_stop_raised_inside_a_weakref_callback_is_delivered_again(
        sig: int, exc: type[BaseException]) -> None:
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with stops_delivered():
            _signal_inside_a_weakref_callback(sig)
            assert _waits_for(exc) < 5
            if sig == signal.SIGTERM:  # armed again: the stop that got through ignores more
                assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous_int)
        gc.collect()


def test_other_unraisable_errors_still_go_to_the_previous_hook() -> None:
    import sys

    seen: list[BaseException | None] = []
    previous = sys.unraisablehook
    sys.unraisablehook = lambda u: seen.append(u.exc_value)
    try:
        with stops_delivered():
            def callback(_ref: object) -> None:
                raise ValueError("in a callback")

            thing = _Thing()
            ref = weakref.ref(thing, callback)
            del thing
            assert ref() is None
    finally:
        sys.unraisablehook = previous
    assert [type(e) for e in seen] == [ValueError]
