"""How `orch submit` and `orch worker` take SIGTERM and Ctrl-C: as an exception in the main
thread (Terminated, KeyboardInterrupt) that tears the job's instances down, never lost."""

from __future__ import annotations

import _thread
import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any


def _on_sigterm(_signum: int, _frame: Any) -> None:
    from orchestrator.engine.runner import Terminated

    # Second signal while tearing down: ignore it, teardown must finish.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Terminated()


@contextlib.contextmanager
def stops_delivered() -> Iterator[None]:
    """SIGTERM raises Terminated (`_on_sigterm`), Ctrl-C KeyboardInterrupt, and neither is lost.

    Python runs a signal's handler between any two bytecodes of the main thread, also inside
    a weakref callback or a `__del__` that the garbage collector runs (SQLAlchemy's event
    registry has such callbacks), where an exception cannot propagate: it is printed as
    "Exception ignored" and dropped. An idle `orch worker` then went on polling with SIGTERM
    ignored (seen about once in ten stops under load, tests/test_orchfork.py). A stop
    dropped that way reaches `sys.unraisablehook`, which delivers it again 50 ms later from
    another thread: not at once, as the handler would then run inside the hook, where an
    exception is dropped too.
    """
    def hook(unraisable: Any) -> None:
        from orchestrator.engine.runner import Terminated

        if isinstance(unraisable.exc_value, Terminated):
            # Its handler set SIG_IGN for a stop that has not started: set it back.
            signal.signal(signal.SIGTERM, _on_sigterm)
            again = signal.SIGTERM
        elif isinstance(unraisable.exc_value, KeyboardInterrupt):
            again = signal.SIGINT
        else:
            previous_hook(unraisable)
            return
        timer = threading.Timer(0.05, _thread.interrupt_main, (again,))
        timer.daemon = True
        timer.start()

    previous_hook = sys.unraisablehook
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = previous_hook
        signal.signal(signal.SIGTERM, previous)
