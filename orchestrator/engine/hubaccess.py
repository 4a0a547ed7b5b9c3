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
https://huggingface.co. A Hub that cannot be reached is not a verdict on the job: the
check says so and the host's download decides.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
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


def hf_cli_text(response: httpx.Response, repo: str) -> str | None:
    """What `hf` prints (`Error: ...`) for this refusal of a model repo's API, or None."""
    code = response.headers.get("X-Error-Code")
    message = response.headers.get("X-Error-Message")
    if code == "RevisionNotFound":
        return f"Error: Revision not found in model '{repo}'."
    if code == "GatedRepo":
        return f"Error: Access denied. Model '{repo}' requires approval."
    if code == "RepoNotFound" or (response.status_code == 401 and message != INVALID_TOKEN):
        return (f"Error: Model '{repo}' not found. If the repo is private, make sure you are "
                "authenticated and your token has the required permissions.")
    if response.status_code == 401:
        return f"Error: 401 Client Error: Unauthorized ({INVALID_TOKEN})"
    return None


def check_model(repo: str, revision: str, token: str | None, *, field: str = "base_model",
                client: httpx.Client | None = None) -> Access:
    """Whether `token` can download `repo` at `revision` (see the module docstring)."""
    base = f"{endpoint()}/api/models/{repo}"
    urls = (f"{base}/revision/{quote(revision, safe='')}", f"{base}/auth-check")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    own = client is None
    http = client or httpx.Client(timeout=TIMEOUT_S)
    try:
        for url in urls:
            try:
                response = http.get(url, headers=headers)
            except httpx.HTTPError as exc:
                return Access(unchecked=f"the Hub ({endpoint()}) did not answer: "
                                        f"{type(exc).__name__}: {exc}")
            if response.is_success:
                continue
            text = hf_cli_text(response, repo)
            refused = None if text is None else classify_download_error(
                text, 1, repo, revision, has_token=bool(token), field=field)
            if text is None or refused is None:
                return Access(unchecked=f"the Hub answered {response.status_code} for {url}")
            return Access(problem=f"{refused}: `hf` says: {text.removeprefix('Error: ')}")
    finally:
        if own:
            http.close()
    return Access()
