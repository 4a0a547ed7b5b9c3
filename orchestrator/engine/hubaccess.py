"""The base model's access, asked of the Hugging Face Hub from the controller before renting.

A gated or private base model without (or with a refused) `HF_TOKEN`, a repo id that does
not exist, or a revision the repo lacks would otherwise be found by `hf download` on a GPU
that is already billing. Two requests, as huggingface_hub 1.17.0 makes them (`hf_api.py`):

- `GET {endpoint}/api/models/{repo}/revision/{revision}` (`HfApi.model_info`): the repo and
  the revision exist and the token's account can see it (a private repo answers like a
  missing one: 401 without a token, 404 with one);
- `GET {endpoint}/api/models/{repo}/auth-check` (`HfApi.auth_check`): the token may read
  the files (a gated repo's info is public; its files are not).

Each refusal is turned into the text the `hf` CLI prints for it (`cli/_errors.py`:
"Access denied. Model 'x' requires approval.", "Model 'x' not found. If the repo is
private, ...", "Revision not found in model 'x'.") and then into what to do, by the same
`classify_download_error` that reads a failed `hf download` on the host, so the words are
the same before and after renting. The Hub is `HF_ENDPOINT` when set (as for `hf`), else
the Hub the job's hosts download from when its providers have their own
(`providers.base.HubMirror`: the simulated cloud's), else https://huggingface.co. A Hub
that cannot be reached is not a verdict on the job: the check says so and the host's
download decides.

`output.push_to_hub` needs more than read access: `check_write` asks `GET
{endpoint}/api/whoami-v2` (`HfApi.whoami`) for the token's account and role, as `hf auth
login` reads it (huggingface_hub 1.17.0 `_login.py`: `auth.accessToken.role`). A `read`
token cannot create or upload; a `fineGrained` one can where its `fineGrained.scoped` entry
for the namespace (or the repo) has `repo.write`; a write token only in its account's own
namespace or an organisation the account belongs to (`name`, `orgs`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from playbooks.model_cache import classify_download_error

DEFAULT_ENDPOINT = "https://huggingface.co"
TIMEOUT_S = 10.0
# huggingface_hub's own message for a token the Hub does not know (utils/_http.py).
INVALID_TOKEN = "Invalid credentials in Authorization header"


@dataclass(frozen=True)
class Access:
    """The check's answer: `problem` (what to do) when the job cannot download its model,
    `unchecked` (why) when the Hub could not be asked; both None when access is fine."""

    problem: str | None = None
    unchecked: str | None = None


def endpoint() -> str:
    """The Hub orch and `hf` talk to."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def hf_cli_text(response: httpx.Response, repo: str, repo_type: str = "model") -> str | None:
    """What `hf` prints (`Error: ...`) for this refusal of a model's (or, `repo_type`
    "dataset", a dataset's) API, or None when it is no refusal. The repo type in the words
    comes from the URL, as huggingface_hub 1.17.0 takes it (utils/_http.py
    `_parse_repo_info_from_url`)."""
    code = response.headers.get("X-Error-Code")
    message = response.headers.get("X-Error-Message")
    noun = repo_type.capitalize()
    if code == "RevisionNotFound":
        return f"Error: Revision not found in {repo_type} '{repo}'."
    if code == "GatedRepo":
        return f"Error: Access denied. {noun} '{repo}' requires approval."
    if code == "RepoNotFound" or (response.status_code == 401 and message != INVALID_TOKEN):
        return (f"Error: {noun} '{repo}' not found. If the repo is private, make sure you are "
                "authenticated and your token has the required permissions.")
    if response.status_code == 401:
        # httpx's own text for the status, which hf prints for an unmapped 401, with the
        # Hub's request id after its first line (utils/_http.py; compared with the real
        # client's against the Hub emulator: tests/test_prerental.py). The id is what Hugging
        # Face's support asks for; the advice built from this text does not depend on it.
        first = f"Client error '401 Unauthorized' for url '{response.request.url}'"
        rest = ("\nFor more information check: "
                f"https://developer.mozilla.org/en-US/docs/Web/HTTP/Status/401\n\n"
                f"{message or INVALID_TOKEN}")
        return f"Error: {first}{_request_id(response, first + rest)}{rest}"
    return None


def _request_id(response: httpx.Response, text: str) -> str:
    """` (Request ID: ...)` as hf words the first of the headers it looks for, or "" (also
    when `text` already names it, as hf leaves it out then)."""
    for header, label in (("X-Request-Id", "Request ID"), ("X-Amzn-Trace-Id", "Amzn Trace ID"),
                          ("X-Amz-Cf-Id", "Amz CF ID")):
        if value := response.headers.get(header):
            return "" if value.lower() in text.lower() else f" ({label}: {value})"
    return ""


def refused(text: str, repo: str, revision: str, token: str | None,
            field: str = "base_model") -> str | None:
    """What to do about a refusal `hf` words as `text` (`Error: ...`), with its words; None
    when it is no refusal a user can fix."""
    why = classify_download_error(text, 1, repo, revision, has_token=bool(token), field=field)
    return None if why is None else f"{why}: `hf` says: {text.removeprefix('Error: ')}"


def check_model(repo: str, revision: str, token: str | None, *, field: str = "base_model",
                client: httpx.Client | None = None, hub: str | None = None) -> Access:
    """Whether `token` can download `repo` at `revision` (see the module docstring) from
    `hub` (a provider's own Hub, `providers.base.HubMirror`; None: `endpoint()`)."""
    hub = hub or endpoint()
    base = f"{hub}/api/models/{repo}"
    urls = (f"{base}/revision/{quote(revision, safe='')}", f"{base}/auth-check")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    own = client is None
    http = client or httpx.Client(timeout=TIMEOUT_S)
    try:
        for url in urls:
            try:
                response = http.get(url, headers=headers)
            except httpx.HTTPError as exc:
                return Access(unchecked=f"the Hub ({hub}) did not answer: "
                                        f"{type(exc).__name__}: {exc}")
            if response.is_success:
                continue
            text = hf_cli_text(response, repo)
            problem = None if text is None else refused(text, repo, revision, token, field)
            if problem is None:
                return Access(unchecked=f"the Hub answered {response.status_code} for {url}")
            return Access(problem=problem)
    finally:
        if own:
            http.close()
    return Access()


# Roles of classic tokens that may create repos and upload (huggingface.js AccessTokenRole:
# admin | write | contributor | read).
WRITE_ROLES = ("write", "admin", "contributor")
TOKENS_PAGE = "https://huggingface.co/settings/tokens"


def _fine_grained_write(access: dict[str, Any], namespace: str, repo: str) -> bool:
    """Whether a fine-grained token's scopes grant `repo.write` on `namespace` or `repo`."""
    granted = access.get("fineGrained") or {}
    scoped = granted.get("scoped") if isinstance(granted, dict) else None
    for scope in scoped if isinstance(scoped, list) else []:
        entity = scope.get("entity") if isinstance(scope, dict) else None
        permissions = scope.get("permissions") if isinstance(scope, dict) else None
        if (isinstance(entity, dict) and entity.get("name") in (namespace, repo)
                and isinstance(permissions, list) and "repo.write" in permissions):
            return True
    return False


def write_problem(me: dict[str, Any], repo: str) -> str | None:
    """What stops the token `me` (a whoami-v2 answer) from pushing to `repo`, or None;
    raises ValueError when the answer has no role to judge by."""
    namespace = repo.split("/")[0] if "/" in repo else str(me.get("name"))
    access = (me.get("auth") or {}).get("accessToken") or {}
    role = access.get("role")
    name = f" ({access['displayName']})" if access.get("displayName") else ""
    fix = (f"set HF_TOKEN to a token that may write there ({TOKENS_PAGE}: a Write token, or a "
           f"fine-grained one with \"Write access to contents/settings of all repos\" on "
           f"{namespace})")
    if role == "read":
        return (f"output.push_to_hub: HF_TOKEN{name} is a read token: the Hub refuses it any "
                f"write, so {repo} could not be created or uploaded to; {fix}")
    if role == "fineGrained":
        if not _fine_grained_write(access, namespace, repo):
            return (f"output.push_to_hub: HF_TOKEN{name} is a fine-grained token without "
                    f"repo.write on {namespace}: the Hub would refuse to write {repo}; {fix}")
        return None
    if role not in WRITE_ROLES:
        raise ValueError(f"a token role orch does not know: {role!r}")
    orgs = [o.get("name") for o in me.get("orgs") or [] if isinstance(o, dict)]
    if namespace not in (me.get("name"), *orgs):
        mine = ", ".join(str(n) for n in (me.get("name"), *orgs) if n)
        return (f"output.push_to_hub: HF_TOKEN's account ({mine}) has no write access to "
                f"{namespace}: the Hub would refuse to write {repo}; push to a namespace of "
                f"yours (e.g. {me.get('name')}/{repo.split('/')[-1]}) or {fix}")
    return None


def check_write(repo: str, token: str | None, *, client: httpx.Client | None = None) -> Access:
    """Whether `token` may create `repo` and upload to it (see the module docstring)."""
    if not token:
        return Access(problem=f"output.push_to_hub: uploading to {repo} needs HF_TOKEN, a "
                              f"token with write access ({TOKENS_PAGE}); none is set here")
    url = f"{endpoint()}/api/whoami-v2"
    own = client is None
    http = client or httpx.Client(timeout=TIMEOUT_S)
    try:
        response = http.get(url, headers={"Authorization": f"Bearer {token}"})
        if response.status_code == 401:
            return Access(problem=f"output.push_to_hub: the Hub rejected HF_TOKEN "
                                  f"({response.headers.get('X-Error-Message') or 401}); set "
                                  f"a valid token with write access ({TOKENS_PAGE})")
        if not response.is_success:
            return Access(unchecked=f"the Hub answered {response.status_code} for {url}")
        problem = write_problem(response.json(), repo)
    except httpx.HTTPError as exc:
        return Access(unchecked=f"the Hub ({endpoint()}) did not answer: "
                                f"{type(exc).__name__}: {exc}")
    except (ValueError, AttributeError, TypeError) as exc:  # an answer of another shape
        return Access(unchecked=f"the Hub's answer to {url} could not be read ({exc})")
    finally:
        if own:
            http.close()
    return Access(problem=problem)
