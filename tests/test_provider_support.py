"""API keys and the shared retry policy."""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx
import pytest

from providers import credentials
from providers.base import AuthError, Instance, InstanceState, TransientError, job_of, tag_for
from providers.http import retry_after, with_retries


def test_api_key_from_env_then_0600_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VAST_API_KEY", raising=False)
    f = tmp_path / "credentials"
    assert credentials.api_key("vastai", f) is None
    f.write_text("runpod = rp-secret\nvastai = \"vast-secret\"\n")
    os.chmod(f, 0o600)
    assert credentials.api_key("vastai", f) == "vast-secret"
    assert credentials.api_key("lambda", f) is None
    monkeypatch.setenv("VAST_API_KEY", "from-env")
    assert credentials.api_key("vastai", f) == "from-env"
    os.chmod(f, 0o644)
    with pytest.raises(credentials.CredentialsError, match="chmod 600"):
        credentials.api_key("runpod", f)


def test_retry_after_header_forms() -> None:
    assert retry_after(httpx.Response(429, headers={"Retry-After": "3"})) == 3.0
    assert retry_after(httpx.Response(429)) is None
    past = "Wed, 21 Oct 2015 07:28:00 GMT"
    assert retry_after(httpx.Response(429, headers={"Retry-After": past})) == 0.0
    assert retry_after(httpx.Response(429, headers={"Retry-After": "soon"})) is None


def test_transient_errors_are_retried_with_the_hinted_wait() -> None:
    calls: list[float] = []

    def flaky() -> str:
        calls.append(time.monotonic())
        if len(calls) < 3:
            raise TransientError("429", retry_after=0.2)
        return "ok"

    assert with_retries(flaky, initial_s=0.01) == "ok"
    assert len(calls) == 3 and calls[2] - calls[1] >= 0.19


def test_other_errors_are_not_retried_and_attempts_are_bounded() -> None:
    calls = []

    def refused() -> None:
        calls.append(1)
        raise AuthError("bad key")

    with pytest.raises(AuthError):
        with_retries(refused, initial_s=0.01)
    assert len(calls) == 1

    def always() -> None:
        calls.append(1)
        raise httpx.ConnectError("refused")

    calls.clear()
    with pytest.raises(TransientError, match="network error"):
        with_retries(always, attempts=3, initial_s=0.01)
    assert len(calls) == 3


def test_tags_round_trip() -> None:
    assert job_of(tag_for("j-1")) == "j-1"
    assert job_of("someone-elses") is None and job_of(None) is None and job_of("orch-") is None
    inst = Instance("x", "1", InstanceState.RUNNING, tag_for("j-2"), ssh_host="h", ssh_port=22)
    assert inst.job_id == "j-2" and inst.reachable
