"""Provider calls the engine repeats when a teardown depends on them.

An adapter already retries its own transient HTTP failures (`providers.http.with_retries`).
Ending an attempt asks again on top of that, a few times, for any provider error but
NotFound: a machine that is not terminated keeps billing, and a look-up that fails decides
whether a pipeline error was the machine's loss. NotFound is an answer, not a failure.
"""

from __future__ import annotations

from providers import retrying
from providers.base import Instance, NotFound, Provider, ProviderError

TRIES = 3


def _unanswered(exc: BaseException) -> bool:
    return isinstance(exc, ProviderError) and not isinstance(exc, NotFound)


def look_up(provider: Provider, instance_id: str, *, pause_s: float = 1.0) -> Instance | None:
    """The instance as the provider sees it now; None when it did not answer in TRIES tries,
    1 s apart (the caller then cannot tell). NotFound is raised: the instance is gone."""
    try:
        return retrying.policy(_unanswered, attempts=TRIES, wait=retrying.steps(pause_s, 0.0))(
            lambda: provider.get(instance_id))
    except NotFound:
        raise
    except ProviderError:
        return None


def terminate(provider: Provider, instance_id: str, *, pause_s: float = 1.0) -> None:
    """Terminate `instance_id`, TRIES tries 1 s then 2 s apart; an instance already gone
    (NotFound) counts as terminated. The last ProviderError is raised when all failed."""
    try:
        retrying.policy(_unanswered, attempts=TRIES, wait=retrying.steps(pause_s, pause_s))(
            lambda: provider.terminate(instance_id))
    except NotFound:
        pass
