"""RunPod's REST v2 API, raw: the endpoints orch calls and the typed error for each answer.

Each method is one request returning RunPod's answer checked against its model in
`answers.py` (a BadAnswer naming the field when it is not what the API documents);
`compute.py` maps it to offers and instances, and decides what to retry. Errors are
RFC 9457 problem documents `{title, status, detail, errors?}`, mapped by status in
`error_for`. Shapes: `shared/reference/provider-apis.md` ("RunPod REST v2").
"""

from __future__ import annotations

import re
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from providers.answers import clean, parse
from providers.apiclient import ApiClient
from providers.base import (
    AuthError,
    BalanceError,
    CapacityError,
    NotFound,
    ProviderError,
    TransientError,
)
from providers.http import retry_after
from providers.runpod.answers import Catalog, Pod, Pods, Problem

DEFAULT_BASE_URL = "https://api.runpod.io/v2"
M = TypeVar("M", bound=BaseModel)


class RateLimited(TransientError):
    """A 429: the request was refused before doing anything (safe to re-send as is)."""


def ratelimit_reset(response: httpx.Response) -> float | None:
    """Seconds until the window resets, from an IETF `RateLimit` header (`t=` or `reset=`)."""
    value = response.headers.get("RateLimit", "")
    match = re.search(r"(?:^|[;,\s])(?:t|reset)=(\d+(?:\.\d+)?)", value)
    return float(match.group(1)) if match else None


def segment(instance_id: str) -> str:
    """A pod id as one URL path segment (ids are alphanumeric; refuse anything else)."""
    if not re.fullmatch(r"[A-Za-z0-9_-]+", instance_id):
        raise NotFound(f"not a RunPod pod id: {instance_id!r}")
    return instance_id


class RunPodApi(ApiClient):
    """`https://api.runpod.io/v2`: GPU catalog, pods."""

    label = "RunPod"
    key_env = "RUNPOD_API_KEY"

    def _answer(self, model: type[M], method: str, path: str, *, what: str,
                **kwargs: Any) -> M:
        response = self.send(method, path, what=what, **kwargs)
        return parse(model, response.content, f"RunPod {what}")

    def gpus(self, params: dict[str, str]) -> Catalog:
        """GET /catalog/gpus: GPU types with prices and availability (`{"gpus": [...]}`)."""
        return self._answer(Catalog, "GET", "/catalog/gpus", what="offers", params=params)

    def create_pod(self, name: str, body: dict[str, Any]) -> Pod:
        """POST /pods (201, a Pod in PROVISIONING)."""
        return self._answer(Pod, "POST", "/pods", what=f"create {name}", json=body)

    def pod(self, instance_id: str) -> Pod:
        """GET /pods/{id}."""
        return self._answer(Pod, "GET", f"/pods/{segment(instance_id)}",
                            what=f"get {instance_id}")

    def pods(self) -> Pods:
        """GET /pods (`{"pods": [...]}`)."""
        return self._answer(Pods, "GET", "/pods", what="list")

    def delete_pod(self, instance_id: str) -> None:
        """DELETE /pods/{id} (204, no body)."""
        self.send("DELETE", f"/pods/{segment(instance_id)}", what=f"terminate {instance_id}")

    def error_for(self, response: httpx.Response, what: str) -> ProviderError:
        """The typed error the engine acts on for a non-2xx RFC 9457 answer.

        400 (rule violation / no capacity) and 403 (no access to that pool) on `create` are
        CapacityError: the engine moves on to the next offer. Elsewhere 400 is a plain
        ProviderError and 403 an AuthError (the key lacks a permission). 401 AuthError,
        402 BalanceError, 404 NotFound, 422 ProviderError (never retried), 429 and 5xx
        TransientError with the server's `Retry-After` (or the `RateLimit` reset).
        """
        status = response.status_code
        message = self._problem(response, what)
        if status == 401:
            return AuthError(f"{message}; set RUNPOD_API_KEY (or `runpod = KEY` in the "
                             "orch credentials file) to a valid RunPod API key")
        if status == 402:
            return BalanceError(f"{message}; RunPod requires at least one hour of credit for "
                                "the pod's hourly price before it deploys: add credit")
        if status == 404:
            return NotFound(message)
        if status == 429 or status >= 500:
            hint = retry_after(response)
            if hint is None and status == 429:
                hint = ratelimit_reset(response)
            if status == 429:
                return RateLimited(message, retry_after=hint)
            return TransientError(message, retry_after=hint)
        if what.startswith("create"):
            if status == 400:
                return CapacityError(message)
            if status == 403:
                return CapacityError(f"{message} (no access to this pool: skipped)")
        if status == 403:
            return AuthError(f"{message}; the RunPod API key lacks this permission")
        return ProviderError(message)  # 400 outside create, 409, 422 validation, ...

    def _problem(self, response: httpx.Response, what: str) -> str:
        """`RunPod <what>: <status> <title>: <detail> [errors]`, scrubbed of the key and of
        control characters."""
        text = self.redact(response.text)  # before any cut, so no part of the key is left
        try:
            body = Problem.model_validate_json(text)
            title, detail = body.title or "", body.detail or ""
            errors = "; ".join(f"{e.field}: {e.message}" if e.field else (e.message or "")
                               for e in body.errors or [] if e is not None)
        except ValidationError:  # not a problem document: its text, made safe
            title, detail, errors = "", clean(text, 200), ""
        out = f"RunPod {what}: HTTP {response.status_code}"
        if title:
            out += f" {title}"
        if detail:
            out += f": {detail}"
        if errors:
            out += f" [{errors}]"
        return out
