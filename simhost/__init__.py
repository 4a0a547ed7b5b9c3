"""A simulated GPU host (real sshd on loopback + stand-in GPU stack) for tests and `sim`.

`SimHost`, `SimHostOptions` and `SimHostError` load on first use, so the stand-in commands
(which import `simhost.standins`) start quickly.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing is not imported at run time: see standins/common.py
if TYPE_CHECKING:
    from typing import Any

    from .host import SimHost, SimHostError, SimHostOptions

__all__ = ["SimHost", "SimHostError", "SimHostOptions"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import host

        return getattr(host, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
