"""Numbers from environment variables, with an error that names the variable and the fix.

A leaf with no third-party imports: the CLI may read its own settings with it without
loading paramiko (importing `playbooks.ssh.env` does not load the rest of the package).
"""

from __future__ import annotations

import math
import os


class EnvNumberError(ValueError):
    """An environment variable holds something other than the number it must be."""


def env_float(name: str, default: float, *, positive: bool = True) -> float:
    """`name`'s value as a float, or `default` when it is unset or blank.

    Raises `EnvNumberError` naming the variable when the value is not a finite number, or
    (with `positive`) is not above 0.
    """
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise EnvNumberError(
            f"{name}={raw!r} is not a number: set it to a number of seconds "
            f"(e.g. {name}={default:g}) or unset it"
        ) from None
    if not math.isfinite(value):
        raise EnvNumberError(f"{name}={raw!r} is not a finite number: set it to a number of "
                             f"seconds (e.g. {name}={default:g}) or unset it")
    if positive and value <= 0:
        raise EnvNumberError(f"{name} must be > 0 (got {raw}): set it to a number of seconds "
                             f"(e.g. {name}={default:g}) or unset it")
    return value
