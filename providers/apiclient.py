"""The HTTP side every provider API client shares, and what its adapter shares over it.

`ApiClient` holds one httpx client (closed only when it made it), sends the API key in the
`Authorization` header of each request and nowhere else, scrubs the key from every text a
server echoes back, and runs calls under the one retry policy of `providers.http`
(`with_retries`: TransientError only, deadline, jitter, `Retry-After`). A provider's client
(`providers/<name>/api_client.py`) adds its endpoints, each one request returning the
provider's JSON as it comes, and `error_for`: the typed error (`providers.base`) for a
non-2xx answer, which is what differs between providers. Its adapter
(`providers/<name>/compute.py`) maps that JSON to offers and instances and decides which
calls retry as a unit (a create that first looks for the instance a lost answer made).

`ApiProvider` is the adapter's side: `close`, the context manager and a `repr` that never
shows the key, delegated to its client.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, Generic, Self, TypeVar

import httpx

from providers.base import AuthError, ProviderError
from providers.http import DEADLINE_S, MAX_ATTEMPTS, redact, send, with_retries

T = TypeVar("T")


class _Session(ABC):
    """`with` closes it; its repr names the base URL, never the key."""

    @property
    @abstractmethod
    def base_url(self) -> str:
        """The API's root URL."""

    @abstractmethod
    def close(self) -> None:
        """Release the HTTP connections."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(base_url={self.base_url!r})"


class ApiClient(_Session):
    """One provider's REST API over httpx: key, retries, redaction, typed errors, close."""

    label = "provider"  # how messages name the provider ("Vast.ai", "RunPod")
    key_env = "API_KEY"  # the variable a missing key is asked for in

    def __init__(self, api_key: str, base_url: str, client: httpx.Client | None = None, *,
                 timeout_s: float = 30.0, attempts: int = MAX_ATTEMPTS,
                 deadline_s: float = DEADLINE_S, initial_s: float = 0.5,
                 max_wait_s: float = 20.0) -> None:
        """`client` may be shared; the key is sent per request, never set on the client."""
        if not api_key:
            raise AuthError(f"no {self.label} API key: set {self.key_env}")
        self._key = api_key
        self._base_url = base_url.rstrip("/")
        self._client = client or httpx.Client(timeout=timeout_s)
        self._owns_client = client is None
        self._attempts, self._deadline_s = attempts, deadline_s
        self._backoff = (initial_s, max_wait_s)

    @property
    def base_url(self) -> str:
        return self._base_url

    @abstractmethod
    def error_for(self, response: httpx.Response, what: str) -> ProviderError:
        """The typed error for a non-2xx `response` to the call described by `what`."""

    def redact(self, text: str) -> str:
        """`text` with the API key scrubbed out (a server may echo it back)."""
        return redact(text, self._key)

    def send(self, method: str, path: str, *, what: str, root: str | None = None,
             **kwargs: Any) -> httpx.Response:
        """One request to `root` (default the base URL) + `path`, no retry; a non-2xx
        answer raises `error_for`'s error."""
        response = send(self._client, method, f"{root or self.base_url}{path}", self._key,
                        f"{self.label} {what}", **kwargs)
        if not response.is_success:
            raise self.error_for(response, what)
        return response

    def retrying(self, call: Callable[[], T]) -> T:
        """`call` under the retry policy, with this client's attempts, deadline and backoff."""
        return with_retries(call, attempts=self._attempts, deadline_s=self._deadline_s,
                            initial_s=self._backoff[0], max_wait_s=self._backoff[1])

    def close(self) -> None:
        """Close the HTTP client if this object created it."""
        if self._owns_client:
            self._client.close()


Client = TypeVar("Client", bound=ApiClient)


class ApiProvider(_Session, Generic[Client]):
    """An adapter over an `ApiClient`: closing it closes the client; its repr has no key."""

    _api: Client

    @property
    def base_url(self) -> str:
        return self._api.base_url

    def close(self) -> None:
        """Close the HTTP client if the adapter's API client created it."""
        self._api.close()
