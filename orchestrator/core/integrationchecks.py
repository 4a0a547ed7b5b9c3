"""What a job's trackers and webhooks need from the environment, checked before renting
(pure: the engine passes `os.environ`, or the settings model's view of it, in phase B).

Each problem names the job file's field and the variable to set; no value is ever echoed.
The Hub datasets' access is asked of the Hub (`engine/hubdatasets.py`), not here.
"""

from __future__ import annotations

from collections.abc import Mapping

from orchestrator.core import notifyspec, trackingspec
from orchestrator.core.spec import JobSpec


def before_renting(spec: JobSpec, environ: Mapping[str, str]) -> list[str]:
    """The job's tracker and webhook problems given the environment where orch runs it."""
    present = {name for name, value in environ.items() if value}
    return (trackingspec.env_problems(spec.tracking, present)
            + notifyspec.env_problems(spec.notify, environ))
