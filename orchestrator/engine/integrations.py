"""Issue 39's checks before renting: each Hub dataset's access and splits (asked of the Hub the
hosts download from), and what trackers and webhooks need from the environment.

A refusal is a problem that fails the job before anything is billed, in the words `hf`
prints and with what to do (`hubdatasets`); a Hub that does not answer is no verdict (the
host's download decides), recorded as an `unchecked` note.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from orchestrator.core import hubsize, integrationchecks, notifyspec
from orchestrator.core.datafiles import DatasetSize
from orchestrator.core.datasetspec import DatasetSpec
from orchestrator.core.hubsize import HubDatasetRef, HubSizeError
from orchestrator.core.spec import JobSpec
from orchestrator.engine import hubdatasets
from orchestrator.engine.jobinputs import dataset_places


@dataclass
class Verdict:
    """What the checks found: problems fail the job; unchecked notes do not."""

    problems: list[str] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)


def _split_problems(where: str, ds: DatasetSpec, info: Mapping[str, object] | None
                    ) -> list[str]:
    """The training and validation splits the dataset's card rules out (none when the card
    lists no sizes: the download decides)."""
    card = (info or {}).get("cardData")
    splits = hubsize.card_splits(card if isinstance(card, Mapping) else None)
    found = []
    asked = [("path.split", ds.path.split)]
    if ds.validation_split is not None:
        asked.append(("validation_split", ds.validation_split))
    for key, split in asked:
        ref = HubDatasetRef(ds.path.hf or "", ds.path.revision, ds.path.subset, split,
                            ds.format)
        try:
            hubsize.pick(splits, ref)
        except HubSizeError as exc:
            at = f"path.{exc.key}" if exc.key == "subset" else key
            found.append(f"{where}.{at}: {exc}")
    return found


def check_hub_datasets(spec: JobSpec, token: str | None, hub: str | None,
                       client: httpx.Client | None = None) -> Verdict:
    """Each Hub dataset's access and splits on `hub` (None: HF_ENDPOINT or huggingface.co)."""
    verdict = Verdict()
    for where, ds in dataset_places(spec):
        if ds.path.hf is None:
            continue
        access = hubdatasets.check_dataset(ds.path.hf, ds.path.revision, token,
                                           field=f"{where}.path.hf", client=client, hub=hub)
        if access.problem is not None:
            verdict.problems.append(f"{where}.path.hf: {access.problem}")
        elif access.unchecked is not None:
            verdict.unchecked.append(f"{where}.path.hf ({ds.path.hf}): {access.unchecked}")
        else:
            verdict.problems += _split_problems(where, ds, access.info)
    return verdict


def notify_url_problems(url: str | None, secret_env: str | None,
                        environ: Mapping[str, str]) -> list[str]:
    """ORCH_NOTIFY_URL's signing secret, checked as a `notify:` target's is."""
    if url is None or secret_env is None:
        return []
    probe = notifyspec.NotifyTarget(url_env="ORCH_NOTIFY_URL", secret_env=secret_env)
    return [p.replace("ORCH_NOTIFY_URL.secret_env", "ORCH_NOTIFY_SECRET_ENV")
            for p in notifyspec.env_problems([probe], {**environ, "ORCH_NOTIFY_URL": url},
                                             where="ORCH_NOTIFY_URL")]


def environment_problems(spec: JobSpec, environ: Mapping[str, str], notify_url: str | None,
                         notify_secret_env: str | None) -> list[str]:
    """The trackers' keys and the webhooks' URLs and secrets the job lacks where it runs."""
    return (integrationchecks.before_renting(spec, environ)
            + notify_url_problems(notify_url, notify_secret_env, environ))


def planning_hub(providers: Sequence[str] | None, environ: Mapping[str, str]) -> str | None:
    """The Hub `orch plan` asks about a job's datasets, by `hubaccess`'s rule for the hosts:
    HF_ENDPOINT when set; for a job only providers with a Hub of their own may run (the
    simulated cloud: its hosts download the synthetic dataset it describes), that Hub; else
    None, huggingface.co."""
    if environ.get("HF_ENDPOINT"):
        return environ["HF_ENDPOINT"]
    from orchestrator.engine.wiring import mirrored_hub

    return mirrored_hub(providers)


@dataclass
class PlanSizer:
    """The `HubSizer` of `orch plan`/`submit`/`render`: the Hub's published size of a
    dataset, on the Hub `planning_hub` names for the job file's providers (read when first
    asked); a Hub that does not answer is no size: the problem says so and asks for tokens."""

    path: Path
    environ: Mapping[str, str]
    viewer: str | None = None  # ORCH_DATASETS_SERVER_URL
    _sizer: hubdatasets.Sizer | None = field(default=None, repr=False)

    def _get(self) -> hubdatasets.Sizer:
        if self._sizer is None:
            hub = planning_hub(_named_providers(self.path), self.environ)
            viewer = self.viewer or (hubdatasets.DATASETS_SERVER if hub is None else None)
            self._sizer = hubdatasets.Sizer(self.environ.get("HF_TOKEN") or None, hub=hub,
                                            viewer=viewer)
        return self._sizer

    def __call__(self, ref: HubDatasetRef) -> DatasetSize | None:
        sizer = self._get()
        found = sizer.access(ref.repo, ref.revision)
        if found.unchecked is not None:
            raise HubSizeError("hf", f"{found.unchecked}: no verdict and no size; give tokens "
                                     "(the number of tokens in one epoch) to plan without the "
                                     "Hub")
        return sizer(ref)


def _named_providers(path: Path) -> list[str] | None:
    """`resources.providers` of the job file at `path` (None: not given or unreadable)."""
    from orchestrator.core.spec import SpecError, read_mapping

    try:
        raw, _ = read_mapping(path, "name")
    except SpecError:
        return None
    base = raw.get("base")
    if "resources" not in raw and isinstance(base, str):  # a sweep file: its base job's
        return _named_providers(path.parent / base) if base != path.name else None
    resources = raw.get("resources")
    named = resources.get("providers") if isinstance(resources, dict) else None
    return [str(p) for p in named] if isinstance(named, list) else None


def submit_problems(spec: JobSpec, environ: Mapping[str, str], notify_url: str | None,
                    notify_secret_env: str | None) -> list[str]:
    """What `orch submit` (running the job in this process, with this environment) refuses
    before recording anything: the checks the engine makes before renting, asked now."""
    hub = planning_hub(spec.resources.providers, environ)
    found = check_hub_datasets(spec, environ.get("HF_TOKEN") or None, hub).problems
    return found + environment_problems(spec, environ, notify_url, notify_secret_env)
