"""`notify:` in the job and sweep files: webhooks POSTed on the events people wait for.

Each target is a URL (or the name of the environment variable that holds it: a Slack
incoming-webhook URL is itself a secret, "keep it secret" in Slack's docs, and a job file is
stored in orch's database), a format (`standard`: the Standard Webhooks payload, signed with
the `whsec_` secret in `secret_env`; `slack`: Slack's incoming-webhook message) and which
events it wants. Sending is `orchestrator/engine/notify.py`; the payloads `core/webhooks.py`.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from orchestrator.core.states import NOTIFIED
from orchestrator.core.strictmodel import Strict

EventType = Literal["job.succeeded", "job.failed", "job.preempted", "job.replaced",
                    "job.budget_reached", "sweep.finished", "deadline.will_miss",
                    "train.not_finite"]
# The schema's words are `states.NOTIFIED`'s (tests/test_notify.py checks they agree).
EVENT_TYPES: tuple[str, ...] = tuple(kind.value for kind in NOTIFIED)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
SECRET_PREFIX = "whsec_"
# Standard Webhooks: "Random. Between 24 bytes (192 bits) and 64 bytes (512 bits)"
# (spec/standard-webhooks.md, "Signature scheme" table).
SECRET_BYTES = (24, 64)
SLACK_HOSTS = ("hooks.slack.com", "hooks.slack-gov.com")


def http_problem(value: str, shown: str | None = None) -> str | None:
    """Why `value` is not an http(s) URL (`shown`: how to name it, for a secret one)."""
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return (f"{shown or repr(value)} is not an http(s) URL: a webhook is POSTed over "
                "HTTP, e.g. https://example.com/hooks/orch")
    return None


def url_problem(value: str) -> str | None:
    """Why `value` is not a webhook URL orch may store in a job file, or None."""
    if (bad := http_problem(value)) is not None:
        return bad
    parts = urlsplit(value)
    if parts.username or parts.password:
        return ("do not put credentials in the URL (the job file is stored with the job): "
                "put the URL in an environment variable and name it in url_env")
    if parts.hostname in SLACK_HOSTS:
        return ("a Slack webhook URL is a secret (anyone with it can post to your channel) "
                "and the job file is stored with the job: put it in an environment variable "
                "(e.g. SLACK_WEBHOOK_URL) and give url_env: SLACK_WEBHOOK_URL")
    return None


def _url(value: str) -> str:
    problem = url_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


def _env_name(value: str) -> str:
    if not _ENV_NAME.fullmatch(value):
        raise ValueError(f"{value!r} is not an environment variable name (letters, digits, _)")
    return value


EnvName = Annotated[str, AfterValidator(_env_name)]


class NotifyTarget(Strict):
    """One webhook."""

    url: Annotated[str, AfterValidator(_url)] | None = Field(
        default=None, examples=["https://example.com/hooks/orch"],
        description="Where to POST (http or https); not a secret URL (use `url_env`).")
    url_env: EnvName | None = Field(
        default=None, examples=["SLACK_WEBHOOK_URL"],
        description="The environment variable (of the orch process that runs the job) that "
                    "holds the URL, for URLs that are secrets (Slack's).")
    secret_env: EnvName | None = Field(
        default=None, examples=["WEBHOOK_SECRET"],
        description="`standard` format: the environment variable holding the signing secret "
                    "(`whsec_` + base64 of 24-64 random bytes); each POST is signed as the "
                    "Standard Webhooks spec says (headers webhook-id, webhook-timestamp, "
                    "webhook-signature).")
    format: Literal["standard", "slack"] = Field(
        default="standard", examples=["slack"],
        description="`standard`: a JSON {type, timestamp, data} event (Standard Webhooks); "
                    "`slack`: a Slack incoming-webhook message.")
    events: list[EventType] | None = Field(
        default=None, min_length=1, examples=[["job.succeeded", "job.failed"]],
        description="Which events to send (default: all): " + ", ".join(EVENT_TYPES) + ".")

    @model_validator(mode="after")
    def _one_url(self) -> NotifyTarget:
        if (self.url is None) == (self.url_env is None):
            raise ValueError("give url (an http(s) URL) or url_env (the variable holding it)")
        if self.format == "slack" and self.secret_env is not None:
            raise ValueError("Slack does not check signatures: remove secret_env, or use "
                             "format: standard")
        return self

    def wants(self, event_type: str) -> bool:
        """Whether this target is sent `event_type`."""
        return self.events is None or event_type in self.events


def _targets(value: Any) -> Any:
    # `notify: {url: ...}` is one target; a list is several.
    return [value] if isinstance(value, dict) else value


Targets = Annotated[list[NotifyTarget], BeforeValidator(
    _targets, json_schema_input_type=NotifyTarget | list[NotifyTarget])]


def decode_secret(secret: str) -> bytes:
    """The key bytes of a `whsec_` secret; ValueError (without the secret) when malformed."""
    text = secret.removeprefix(SECRET_PREFIX).rstrip("=")
    try:
        # Unpadded secrets are accepted, as by the reference library (libraries/python/
        # standardwebhooks/webhooks.py: b64decode(whsecret + "==")).
        key = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("is not base64 after its whsec_ prefix") from None
    if not key:
        raise ValueError("is empty")
    return key


def env_problems(targets: Sequence[NotifyTarget], environ: Mapping[str, str],
                 where: str = "notify") -> list[str]:
    """What the targets lack in `environ` (the variables where orch runs), each problem
    naming the field and what to set; checked before anything is rented."""
    found = []
    for i, t in enumerate(targets):
        at = f"{where}[{i}]" if len(targets) > 1 else where
        if t.url_env is not None:
            value = environ.get(t.url_env)
            if not value:
                found.append(f"{at}.url_env: {t.url_env} is not set in the environment of "
                             "the orch process that runs the job; set it to the webhook URL")
            elif (bad := http_problem(value, f"the value of {t.url_env}")) is not None:
                found.append(f"{at}.url_env: {bad}")
        if t.secret_env is not None:
            secret = environ.get(t.secret_env)
            if not secret:
                found.append(f"{at}.secret_env: {t.secret_env} is not set; set it to the "
                             "signing secret the receiver checks (whsec_ + base64)")
                continue
            try:
                size = len(decode_secret(secret))
            except ValueError as exc:
                found.append(f"{at}.secret_env: {t.secret_env} {exc}; a Standard Webhooks "
                             "secret is whsec_ followed by base64")
                continue
            if not SECRET_BYTES[0] <= size <= SECRET_BYTES[1]:
                found.append(f"{at}.secret_env: {t.secret_env} holds {size} bytes; the "
                             f"Standard Webhooks spec asks for {SECRET_BYTES[0]} to "
                             f"{SECRET_BYTES[1]} random bytes")
    return found


def targets_in(spec_json: str | None) -> list[NotifyTarget]:
    """The `notify:` targets of a recorded job or sweep spec (JSON); none when it has none
    or they do not validate (they did at submit: a record orch did not write sends nothing)."""
    try:
        raw = json.loads(spec_json or "{}")
        found = raw.get("notify") if isinstance(raw, dict) else None
        return TypeAdapter(Targets).validate_python(found) if found else []
    except (ValueError, ValidationError):
        return []
