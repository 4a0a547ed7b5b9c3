"""Vast.ai's REST API, raw: the endpoints orch calls and the typed error for each answer.

Each method is one request returning Vast's answer checked against its model in
`answers.py` (a BadAnswer naming the field when it is not what the API documents);
`compute.py` maps it to offers and instances, and decides what to retry. The API's shapes
and quirks are described in compute.py's docstring and `shared/reference/provider-apis.md`
("Vast.ai").
"""

from __future__ import annotations

import json
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import httpx
from pydantic import BaseModel, ValidationError

from providers.answers import clean, parse
from providers.apiclient import ApiClient
from providers.base import (
    AuthError,
    BalanceError,
    NotFound,
    PriceChanged,
    ProviderError,
    TransientError,
)
from providers.http import retry_after
from providers.vastai.answers import InstancesPage, OneInstance, Outcome, Search

DEFAULT_BASE_URL = "https://console.vast.ai/api/v0"
LIST_PAGE = 25  # the v1 listing's largest page (vast-cli: "max instances per page (1-25)")

M = TypeVar("M", bound=BaseModel)


def v1_url(base_url: str) -> str:
    """The `/api/v1` root next to a `/api/v0` base URL (the paginated instance listing)."""
    parts = urlsplit(base_url)
    return urlunsplit((parts.scheme, parts.netloc, "/api/v1", "", ""))


class VastApi(ApiClient):
    """`https://console.vast.ai/api/v0` (and the v1 instance listing beside it)."""

    label = "Vast.ai"
    key_env = "VAST_API_KEY"

    @property
    def v1(self) -> str:
        """The v1 root (the paginated instance listing)."""
        return v1_url(self.base_url)

    def _answer(self, model: type[M], method: str, path: str, *, root: str | None = None,
                **kwargs: Any) -> M:
        response = self.send(method, path, what=f"{method} {path}", root=root, **kwargs)
        return parse(model, response.content, f"Vast.ai {method} {path}")

    def search(self, query: dict[str, Any]) -> Search:
        """POST /bundles/: offers matching `query` (`{"offers": [...]}`)."""
        return self._answer(Search, "POST", "/bundles/", json=query)

    def rent(self, ask_id: str, body: dict[str, Any]) -> Outcome:
        """PUT /asks/{id}/: create an instance on an offer (`{success, new_contract}`)."""
        return self._answer(Outcome, "PUT", f"/asks/{ask_id}/", json=body)

    def instance(self, instance_id: str) -> OneInstance:
        """GET /instances/{id}/ (`{"instances": {one object}}`)."""
        return self._answer(OneInstance, "GET", f"/instances/{instance_id}/",
                            params={"owner": "me"})

    def instances_page(self, select: dict[str, Any], after: str | None = None) -> InstancesPage:
        """One page of GET /api/v1/instances/ (`{instances, next_token}`), by id."""
        params: dict[str, Any] = {"select_filters": json.dumps(select),
                                  "order_by": json.dumps([{"col": "id", "dir": "asc"}]),
                                  "limit": LIST_PAGE}
        if after is not None:
            params["after_token"] = after
        return self._answer(InstancesPage, "GET", "/instances/", params=params, root=self.v1)

    def destroy(self, instance_id: str) -> Outcome:
        """DELETE /instances/{id}/ (`{success}`, or `success: false` with an error code)."""
        return self._answer(Outcome, "DELETE", f"/instances/{instance_id}/", json=None)

    def error_for(self, response: httpx.Response, what: str) -> ProviderError:
        """The typed error for a non-2xx answer (the server's text redacted, short)."""
        status = response.status_code
        text = self.redact(response.text)  # before any cut, so no part of the key is left
        try:
            doc = Outcome.model_validate_json(text)
            code, msg = doc.error or "", doc.msg or doc.message or doc.error or ""
        except ValidationError:  # not JSON, or not an error object: the text, made safe
            code, msg = "", clean(text)
        detail = (f"{code}: {msg}" if code and msg != code else (msg or code))[:300]
        where = f"Vast.ai {what} → HTTP {status}"
        if status == 401:
            return AuthError(f"{where}: the API key was refused ({detail}); set VAST_API_KEY "
                             "or `vastai = KEY` in the orch credentials file")
        if status == 403:  # a scoped key without the permission this call needs
            return AuthError(f"{where}: the API key may not do this ({detail}); set "
                             "VAST_API_KEY to a key with instance and search permissions")
        if status == 402:
            return BalanceError(f"{where}: not enough Vast.ai credit ({detail}); add credit "
                                "at console.vast.ai")
        if status == 429:
            return TransientError(f"{where}: rate limited ({detail or 'too many requests'})",
                                  retry_after=retry_after(response))
        if status >= 500:
            return TransientError(f"{where}: server error ({detail})",
                                  retry_after=retry_after(response))
        if status == 400 and code == "invalid_price":
            return PriceChanged(f"{where}: the price changed since the search ({detail}); "
                                "search again")
        if status in (404, 410):
            err = NotFound(f"{where}: {detail or 'not found'}")
            err.code = code  # type: ignore[attr-defined]
            return err
        return ProviderError(f"{where}: {detail or 'request rejected'}")
