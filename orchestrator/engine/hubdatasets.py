"""A Hub dataset's access and size, asked of the Hugging Face Hub from the controller before
renting (the model's are `hubaccess.py`; this module reuses its endpoint and answer types).

The requests are huggingface_hub 1.17.0's (`hf_api.py`):

- `GET {endpoint}/api/datasets/{repo}/revision/{revision}` (`HfApi.dataset_info`,
  hf_api.py:3300-3367): the dataset and revision exist and the token's account can see it;
  its `cardData.dataset_info` has rows and bytes per split (`core/hubsize.py`);
- `GET {endpoint}/api/datasets/{repo}/auth-check` (`HfApi.auth_check`, hf_api.py:11584): the
  token may read the files (a gated dataset's info is public, its files are not);
- `GET {viewer}/size?dataset={repo}` (the dataset viewer, https://datasets-server.
  huggingface.co; not in huggingface_hub, documented at huggingface.co/docs/dataset-viewer/
  size): rows and bytes per split for datasets whose card lists none (tatsu-lab/alpaca).

A refusal is turned into the text `hf download --repo-type dataset` prints for it
(huggingface_hub 1.17.0 cli/_errors.py: the repo type comes from the API URL,
utils/_http.py `_parse_repo_info_from_url`): "Dataset 'x' not found. If the repo is private,
...", "Access denied. Dataset 'x' requires approval.", "Revision not found in dataset 'x'.",
and then into what to do by `classify_download_error`, the function that reads a failed
download on the host: the words are the same before and after renting. A Hub that does not
answer is no verdict (`unchecked`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx

from orchestrator.core import hubsize
from orchestrator.core.datafiles import DatasetSize
from orchestrator.core.hubsize import HubDatasetRef, HubSizeError
from orchestrator.engine.hubaccess import TIMEOUT_S, Access, endpoint, hf_cli_text
from playbooks.model_cache import classify_download_error

DATASETS_SERVER = "https://datasets-server.huggingface.co"


def refused(text: str, repo: str, revision: str, token: str | None, field: str) -> str | None:
    """What to do about a refusal `hf` words as `text`, with its words."""
    why = classify_download_error(text, 1, repo, revision, has_token=bool(token), field=field,
                                  repo_type="dataset")
    return None if why is None else f"{why}: `hf` says: {text.removeprefix('Error: ')}"


@dataclass(frozen=True)
class DatasetAccess(Access):
    """`Access` plus the dataset's info (the API's answer) when it could be read."""

    info: dict[str, Any] | None = field(default=None, compare=False)


def check_dataset(repo: str, revision: str, token: str | None, *,
                  field: str = "dataset.path.hf", client: httpx.Client | None = None,
                  hub: str | None = None) -> DatasetAccess:
    """Whether `token` can download dataset `repo` at `revision` (see the module docstring);
    `hub` is the Hub's URL (default: `HF_ENDPOINT` or huggingface.co, as for `hf`)."""
    base = f"{(hub or endpoint()).rstrip('/')}/api/datasets/{repo}"
    urls = (f"{base}/revision/{quote(revision, safe='')}", f"{base}/auth-check")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    own = client is None
    http = client or httpx.Client(timeout=TIMEOUT_S)
    info: dict[str, Any] | None = None
    try:
        for url in urls:
            try:
                response = http.get(url, headers=headers)
            except httpx.HTTPError as exc:
                return DatasetAccess(unchecked=f"the Hub ({hub or endpoint()}) did not answer:"
                                               f" {type(exc).__name__}: {exc}")
            if not response.is_success:
                text = hf_cli_text(response, repo, "dataset")
                problem = None if text is None else refused(text, repo, revision, token, field)
                if problem is None:
                    return DatasetAccess(
                        unchecked=f"the Hub answered {response.status_code} for {url}")
                return DatasetAccess(problem=problem)
            if info is None:
                try:
                    answer = response.json()
                except ValueError:
                    answer = None
                info = answer if isinstance(answer, dict) else {}
    finally:
        if own:
            http.close()
    return DatasetAccess(info=info)


def viewer_size(repo: str, token: str | None, *, client: httpx.Client,
                viewer: str = DATASETS_SERVER) -> dict[str, Any] | None:
    """The dataset viewer's `/size` answer for `repo`, or None when it has none."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = client.get(f"{viewer.rstrip('/')}/size", params={"dataset": repo},
                              headers=headers)
        answer = response.json() if response.is_success else None
    except (httpx.HTTPError, ValueError):
        return None
    return answer if isinstance(answer, dict) else None


@dataclass
class Sizer:
    """The engine's `HubSizer`: a Hub dataset's tokens from its published size, each dataset
    asked once (`orch plan`, the checks before renting and the engine share one)."""

    token: str | None = field(default=None, repr=False)
    client: httpx.Client | None = None
    hub: str | None = None
    viewer: str | None = DATASETS_SERVER  # None: no dataset viewer (a Hub other than HF's)
    where: str = "dataset.path.hf"  # the job file's field that names the dataset
    _seen: dict[tuple[str, str], DatasetAccess] = field(default_factory=dict, repr=False)

    def access(self, repo: str, revision: str) -> DatasetAccess:
        """`check_dataset` of `repo` at `revision`, asked once."""
        key = (repo, revision)
        if key not in self._seen:
            self._seen[key] = check_dataset(repo, revision, self.token, field=self.where,
                                            client=self.client, hub=self.hub)
        return self._seen[key]

    def __call__(self, ref: HubDatasetRef) -> DatasetSize | None:
        found = self.access(ref.repo, ref.revision)
        if found.problem is not None:
            raise HubSizeError("hf", found.problem)
        if found.unchecked is not None:
            return None
        size = hubsize.from_card((found.info or {}).get("cardData"), ref)
        if size is not None or ref.revision != "main" or self.viewer is None:
            # The viewer sizes the default branch only.
            return size
        http = self.client or httpx.Client(timeout=TIMEOUT_S)
        try:
            answer = viewer_size(ref.repo, self.token, client=http, viewer=self.viewer)
        finally:
            if self.client is None:
                http.close()
        return hubsize.from_viewer(answer, ref)


def sizer(token: str | None, **kwargs: Any) -> Callable[[HubDatasetRef], DatasetSize | None]:
    """A `HubSizer` for `spec.load_job(path, hub_size=...)`."""
    return Sizer(token, **kwargs)
