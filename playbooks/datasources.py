"""Where each of a job's training (and eval) datasets comes from, and where the trainer finds it.

`TrainConfigInput.datasets` then `.test_datasets` are the axolotl entries; `sources` holds,
for each in that order, a local file (uploaded to the job's data folder) or a Hub dataset
(downloaded ON the host by `dataset_cache.DatasetCache`, once per repo@revision under the
layout's base, so a container sees it under `/workspace/data/datasets/...`). The engine
builds both (`orchestrator/engine/jobinputs.py`); the pipeline downloads the Hub datasets
after the base model (`fetch`) and the training playbook fills every entry's path (`filled`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from playbooks import images
from playbooks.axolotl import TrainConfigInput
from playbooks.base import Emit, Host, Layout, run_playbook
from playbooks.dataset_cache import DatasetCache, dataset_dir


@dataclass(frozen=True)
class DataSource:
    """One dataset entry's origin: a local file, or a Hub dataset at a revision."""

    local: str | None = None  # the file on this machine
    hub_repo: str | None = None
    hub_revision: str = "main"
    where: str = "dataset.path.hf"  # the job file's field naming it (for errors)

    def host_path(self, layout: Layout, job_id: str) -> str:
        """The file or folder on the host."""
        if self.local is not None:
            return layout.data_file(job_id, upload_name(self.local))
        assert self.hub_repo is not None
        return dataset_dir(layout, self.hub_repo, self.hub_revision)


def upload_name(local: str) -> str:
    """The uploaded file's name: its own (the job's data folder holds one job's files)."""
    return Path(local).name


def local_files(sources: Sequence[DataSource], first: str) -> list[str]:
    """The local files to upload: `first` (the job's dataset file, "" for none) and every
    local source, each once."""
    found = [first] if first else []
    found += [s.local for s in sources if s.local is not None]
    return list(dict.fromkeys(found))


def filled(config: TrainConfigInput, sources: Sequence[DataSource], layout: Layout,
           job_id: str, inside: Callable[[str], str]) -> TrainConfigInput:
    """`config` with every dataset entry's path as the trainer sees it (`inside`)."""
    entries = (*config.datasets, *config.test_datasets)
    if not sources or len(sources) != len(entries):
        return config
    paths = [inside(s.host_path(layout, job_id)) for s in sources]
    n = len(config.datasets)
    return replace(config,
                   datasets=tuple(e._replace(path=p) for e, p in zip(
                       config.datasets, paths[:n], strict=True)),
                   test_datasets=tuple(e._replace(path=p) for e, p in zip(
                       config.test_datasets, paths[n:], strict=True)))


def caches(sources: Sequence[DataSource], layout: Layout, hf_token: str | None,
           hub_endpoint: str | None) -> list[DatasetCache]:
    """One download per Hub dataset (repo@revision) the job names."""
    seen: dict[tuple[str, str], DatasetCache] = {}
    for s in sources:
        if s.hub_repo is not None and (s.hub_repo, s.hub_revision) not in seen:
            seen[(s.hub_repo, s.hub_revision)] = DatasetCache(
                s.hub_repo, s.hub_revision, layout, hf_token=hf_token,
                hub_endpoint=hub_endpoint, where=s.where)
    return list(seen.values())


def fetch(host: Host, sources: Sequence[DataSource], layout: Layout, *, hf_token: str | None,
          hub_endpoint: str | None, trainer_image: str, docker: bool,
          wrap: Callable[[Sequence[str]], list[str]], emit: Emit,
          check: Callable[[], None] | None = None) -> None:
    """Download the job's Hub datasets on the host, where `hf` runs as for the model: a
    throwaway container of the trainer image on a Docker host, the image's environment on a
    container rental (`wrap`)."""
    for cache in caches(sources, layout, hf_token, hub_endpoint):
        if docker:
            cache.image = images.for_host(trainer_image, "docker")
        else:
            cache.wrap = wrap
        run_playbook("dataset_cache", cache.steps(), host, emit, check)
