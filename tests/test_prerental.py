"""Knowable failures are caught before renting (issue 19 §3): the base model's access on the
Hub, asked from the controller with the user's token.

The texts are checked against the real huggingface_hub 1.17.0 client: the same emulator
answers `HfApi.model_info`/`HfApi.auth_check`, and what orch says the `hf` CLI would print is
what the CLI's own formatter (`huggingface_hub.cli._errors.format_known_exception`) prints
for the exception the real client raises.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from emulators.hub import HubEmulator, without_request_id
from test_engine import Rig, rig  # noqa: F401  (the engine test rig fixture)

from orchestrator.engine import hubaccess

GOOD, OTHER, BAD = "hf_good_token", "hf_other_token", "hf_unknown_token"
# The base model of examples/quickstart.yml (the engine rig's job file).
QUICKSTART_MODEL = "Qwen/Qwen2.5-0.5B"


@pytest.fixture(scope="module")
def hubm() -> Iterator[HubEmulator]:
    with HubEmulator(tokens=(GOOD, OTHER)) as emulator:
        emulator.add_repo("org/model", {"config.json": b"{}"}, revisions=("main", "v1"))
        emulator.add_repo("org/gated", {"config.json": b"{}"}, gated=True, accepted=(GOOD,))
        emulator.add_repo("org/private", {"config.json": b"{}"}, private=True,
                          accepted=(GOOD,))
        yield emulator


def real_client_text(hub: HubEmulator | str, repo: str, revision: str,
                     token: str | None) -> str:
    """What `hf` prints for the first refusal of model_info then auth_check (real client)
    by the Hub `hub` (an emulator or a URL)."""
    from huggingface_hub import HfApi
    from huggingface_hub.cli._errors import format_known_exception

    api = HfApi(endpoint=hub if isinstance(hub, str) else hub.url, token=token or False)
    try:
        api.model_info(repo, revision=revision)
        api.auth_check(repo)
    except Exception as exc:  # the client's own exception types
        text = format_known_exception(exc)
        assert text is not None, exc
        return text
    return ""


CASES = [  # repo, revision, token, words the advice must contain
    ("org/gated", "main", None, ["is gated", "accept its licence", "HF_TOKEN"]),
    ("org/gated", "main", OTHER, ["has no access", "accept the licence"]),
    ("org/private", "main", None, ["no model repo", "private repo needs HF_TOKEN"]),
    ("org/private", "main", OTHER, ["no model repo", "cannot see it"]),
    ("org/missing", "main", GOOD, ["no model repo", "fix the repo id in base_model"]),
    ("org/model", "v2", GOOD, ["has no revision 'v2'", "fix base_model's revision"]),
]


@pytest.mark.parametrize(("repo", "revision", "token", "advice"), CASES)
def test_each_refusal_is_the_hf_cli_text_and_says_what_to_do(
        hubm: HubEmulator, monkeypatch: pytest.MonkeyPatch, repo: str, revision: str,
        token: str | None, advice: list[str]) -> None:
    monkeypatch.setenv("HF_ENDPOINT", hubm.url)
    access = hubaccess.check_model(repo, revision, token)
    assert access.problem is not None and access.unchecked is None
    expected = real_client_text(hubm, repo, revision, token)
    assert expected and access.problem.endswith(f"`hf` says: {expected}")
    for words in advice:
        assert words in access.problem


@pytest.mark.parametrize(("repo", "revision", "token"), [
    ("org/model", "main", None), ("org/model", "v1", GOOD), ("org/gated", "main", GOOD),
    ("org/private", "main", GOOD)])
def test_access_that_the_real_client_grants_passes(hubm: HubEmulator,
                                                   monkeypatch: pytest.MonkeyPatch, repo: str,
                                                   revision: str, token: str | None) -> None:
    monkeypatch.setenv("HF_ENDPOINT", hubm.url)
    assert real_client_text(hubm, repo, revision, token) == ""
    assert hubaccess.check_model(repo, revision, token) == hubaccess.Access()


def test_a_token_the_hub_does_not_know_is_named(hubm: HubEmulator,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_ENDPOINT", hubm.url)
    access = hubaccess.check_model("org/model", "main", BAD)
    assert access.problem is not None and "rejected HF_TOKEN" in access.problem
    # In the real client's words (httpx's for the status; this said "401 Client Error:
    # Unauthorized (...)", the requests-era text, until it was compared).
    # Each answer has its own request id, which both texts carry after their first line.
    real = without_request_id(real_client_text(hubm, "org/model", "main", BAD))
    assert without_request_id(access.problem).endswith(f"`hf` says: {real}")


def test_a_hub_that_does_not_answer_is_no_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    with socket.socket() as sock:  # a loopback port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    access = hubaccess.check_model("org/model", "main", None,
                                   client=httpx.Client(timeout=2.0))
    assert access.problem is None and access.unchecked is not None
    assert "did not answer" in access.unchecked


def test_a_gated_base_model_without_access_fails_before_renting(
        rig: Rig, session_hub: HubEmulator, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """The engine (the same path as `orch submit`/`orch worker`): nothing is rented."""
    monkeypatch.delenv("HF_TOKEN", raising=False)
    repo = QUICKSTART_MODEL
    session_hub.add_repo(repo, {"config.json": b"{}"}, gated=True)
    try:
        cloud = rig.cloud()
        job_id = rig.queue(rig.job_file())
        job = rig.run(cloud, job_id)
    finally:
        del session_hub.repos[("model", repo)]
    assert job.status == "failed"
    reason: Any = job.failure_reason
    assert reason.startswith("before renting: ") and "is gated" in reason
    assert "HF_TOKEN" in reason and f"huggingface.co/{repo}" in reason
    assert rig.store.instances_of(job_id) == [] and cloud.list() == []
    assert rig.states(job_id) == ["provisioning", "failed"]  # the claim's, then this


def test_the_quickstart_on_sim_asks_no_hub_when_none_is_named(
        rig: Rig, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:  # noqa: F811
    """Without HF_ENDPOINT a sim-only job's hosts download from their stand-in: the real Hub
    (unreachable here) is never asked."""
    monkeypatch.delenv("HF_ENDPOINT")
    cloud = rig.cloud()
    job_id = rig.queue(rig.job_file())
    job = rig.run(cloud, job_id)
    assert job.status == "succeeded", job.failure_reason
    assert "hub.unchecked" not in rig.kinds(job_id)


def test_orch_submit_of_a_gated_model_exits_before_renting_with_what_to_do(
        session_hub: HubEmulator, tmp_path: Path) -> None:
    """What the user sees: the foreground `orch submit` fails at once, saying what to do."""
    import os
    import shutil
    import subprocess
    import sys

    examples = Path(__file__).resolve().parent.parent / "examples"
    shutil.copytree(examples / "data", tmp_path / "data")
    job = tmp_path / "job.yml"
    job.write_text((examples / "quickstart.yml").read_text())
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "ORCH_DB_URL")}
    env.update(XDG_DATA_HOME=str(tmp_path / "xdg"), HF_ENDPOINT=session_hub.url)
    repo = QUICKSTART_MODEL
    session_hub.add_repo(repo, {"config.json": b"{}"}, gated=True)
    try:
        done = subprocess.run([str(Path(sys.executable).parent / "orch"), "submit", str(job)],
                              env=env, capture_output=True, text=True, timeout=300)
    finally:
        del session_hub.repos[("model", repo)]
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert "before renting" in out and "is gated" in out and "HF_TOKEN" in out
    assert "renting sim" not in out


# --- issue 36 §2: output.push_to_hub needs a token that may write ----------------------------

READER, FINE_RO, FINE_RW = "hf_read_token", "hf_fine_read_token", "hf_fine_write_token"


@pytest.fixture(scope="module")
def writers() -> Iterator[HubEmulator]:
    with HubEmulator(tokens=(GOOD, READER, FINE_RO, FINE_RW)) as emulator:
        emulator.namespaces.update({GOOD: "alice,my-org", READER: "alice,my-org",
                                    FINE_RO: "alice,my-org", FINE_RW: "alice,my-org"})
        emulator.roles.update({READER: "read", FINE_RO: "fineGrained",
                               FINE_RW: "fineGrained"})
        emulator.scopes[FINE_RO] = [{"entity": {"_id": "1", "type": "org", "name": "my-org"},
                                     "permissions": ["repo.content.read"]}]
        emulator.scopes[FINE_RW] = [{"entity": {"_id": "1", "type": "org", "name": "my-org"},
                                     "permissions": ["repo.content.read", "repo.write"]}]
        yield emulator


def real_client_writes(hub: HubEmulator, repo: str, token: str) -> bool:
    """Whether the real huggingface_hub 1.17.0 client may create `repo` on this Hub, and
    that its whoami reads the role where `hf auth login` reads it (`_login.py`)."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    api = HfApi(endpoint=hub.url, token=token)
    assert api.whoami()["auth"]["accessToken"]["role"] == hub.roles.get(token, "write")
    try:
        api.create_repo(repo, private=True)
    except HfHubHTTPError as exc:
        assert exc.response.status_code == 403, exc
        return False
    finally:
        hub.repos.pop(("model", repo), None)
    return True


@pytest.mark.parametrize(("token", "repo", "words"), [
    (READER, "my-org/tuned", "is a read token"),
    (FINE_RO, "my-org/tuned", "fine-grained token without repo.write on my-org"),
    (GOOD, "someone-else/tuned", "(alice, my-org) has no write access to someone-else"),
    (FINE_RW, "other-org/tuned", "without repo.write on other-org"),
])
def test_a_token_that_cannot_write_is_refused(writers: HubEmulator,
                                              monkeypatch: pytest.MonkeyPatch, token: str,
                                              repo: str, words: str) -> None:
    monkeypatch.setenv("HF_ENDPOINT", writers.url)
    assert not real_client_writes(writers, repo, token)
    access = hubaccess.check_write(repo, token)
    assert access.problem is not None and access.unchecked is None
    assert access.problem.startswith("output.push_to_hub: ") and words in access.problem
    assert "huggingface.co/settings/tokens" in access.problem or "namespace of yours" in \
        access.problem


@pytest.mark.parametrize(("token", "repo"), [(GOOD, "my-org/tuned"), (GOOD, "alice/tuned"),
                                             (FINE_RW, "my-org/tuned")])
def test_a_token_that_can_write_passes(writers: HubEmulator, monkeypatch: pytest.MonkeyPatch,
                                       token: str, repo: str) -> None:
    monkeypatch.setenv("HF_ENDPOINT", writers.url)
    assert real_client_writes(writers, repo, token)
    assert hubaccess.check_write(repo, token) == hubaccess.Access()


def test_no_token_and_an_unknown_token_are_refused(writers: HubEmulator,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_ENDPOINT", writers.url)
    missing = hubaccess.check_write("my-org/tuned", None).problem
    assert missing is not None and "needs HF_TOKEN" in missing
    unknown = hubaccess.check_write("my-org/tuned", BAD).problem
    assert unknown is not None and "rejected HF_TOKEN" in unknown


def test_a_read_token_pushing_fails_before_renting(
        rig: Rig, session_hub: HubEmulator, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """The engine: a job whose upload would be refused after training rents nothing."""
    monkeypatch.setenv("HF_TOKEN", READER)
    session_hub.roles[READER] = "read"
    try:
        cloud = rig.cloud()
        path = rig.job_file()
        path.write_text(path.read_text() + "output: {push_to_hub: my-org/tuned}\n")
        job_id = rig.queue(path)
        job = rig.run(cloud, job_id)
    finally:
        session_hub.roles.pop(READER, None)
    assert job.status == "failed"
    reason: Any = job.failure_reason
    assert reason.startswith("before renting: output.push_to_hub: HF_TOKEN") and \
        "is a read token" in reason
    assert rig.store.instances_of(job_id) == [] and cloud.list() == []


# --- issue 36 §6: `sim` refuses a gated model without HF_TOKEN, as the Hub would -----------


def gated_job(rig: Rig) -> Path:  # noqa: F811
    """The rig's quickstart job on Meta's Llama-3.2-1B, gated on huggingface.co."""
    path = rig.job_file()
    path.write_text(path.read_text().replace(f"base_model: {QUICKSTART_MODEL}",
                                             "base_model: meta-llama/Llama-3.2-1B"))
    return path


def test_sim_refuses_a_gated_model_without_a_token_before_renting(
        rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """Without HF_ENDPOINT a sim job's model is judged by the simulated cloud's Hub, which
    gates what huggingface.co gates; the words are the real check's and huggingface_hub's."""
    from providers.sim.hub import gated_repos

    monkeypatch.delenv("HF_ENDPOINT")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    assert "meta-llama/Llama-3.2-1B" in gated_repos()
    cloud = rig.cloud()
    job_id = rig.queue(gated_job(rig))
    job = rig.run(cloud, job_id)
    assert job.status == "failed"
    reason: Any = job.failure_reason
    assert reason == (
        "before renting: meta-llama/Llama-3.2-1B is gated: accept its licence on "
        "https://huggingface.co/meta-llama/Llama-3.2-1B, then set HF_TOKEN to a token of that "
        "account (https://huggingface.co/settings/tokens): `hf` says: Access denied. Model "
        "'meta-llama/Llama-3.2-1B' requires approval.")
    assert rig.store.instances_of(job_id) == [] and cloud.list() == []
    # With a token the same job runs (sim has no accounts: any token is one that accepted).
    monkeypatch.setenv("HF_TOKEN", "hf_" + "x" * 30)
    job = rig.run(cloud, rig.queue(gated_job(rig)))
    assert job.status == "succeeded", job.failure_reason


def test_the_sim_hub_answers_the_gate_as_the_real_hub_does(hubm: HubEmulator) -> None:
    """The simulated cloud's Hub answers over HTTP what the Hub answers: huggingface_hub
    1.17.0 itself prints the same for a gated model asked without a token (model_info, then
    auth_check), and the check before renting, asking it as it asks the real Hub, gives the
    same advice; with a token (sim has no accounts) and for a repo it does not gate,
    nothing is refused."""
    from providers.sim.hub import serve

    sim = serve(("org/gated",))
    assert real_client_text(sim, "org/gated", "main", None) == \
        real_client_text(hubm, "org/gated", "main", None) != ""
    assert hubaccess.check_model("org/gated", "main", None, hub=sim) == \
        hubaccess.check_model("org/gated", "main", None, hub=hubm.url)
    assert real_client_text(sim, "org/gated", "main", GOOD) == ""
    assert real_client_text(sim, "org/model", "v1", None) == ""
    assert hubaccess.check_model("org/model", "v1", None, hub=sim) == hubaccess.Access()


def test_sim_hosts_refuse_a_gated_download_without_a_token(
        rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """Where the check before renting is not made (HF_ENDPOINT names another Hub, which
    lets it through), the simulated host's `hf` still refuses it, as huggingface.co's files
    are refused."""
    monkeypatch.delenv("HF_TOKEN", raising=False)
    cloud = rig.cloud()
    job = rig.run(cloud, rig.queue(gated_job(rig)))
    assert job.status == "failed"
    assert "meta-llama/Llama-3.2-1B is gated" in (job.failure_reason or "")
    assert "This repository requires approval" in (job.failure_reason or "")
