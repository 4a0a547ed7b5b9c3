"""Issue 39 §Datasets: Hub datasets asked before renting (access, size) and downloaded ON the
GPU host by the real huggingface_hub client, against the Hub emulator.

- the emulator's dataset answers are what huggingface_hub 1.17.0 itself parses (its
  `HfApi.dataset_info` and `list_repo_tree` read them here);
- `engine/hubdatasets.py` refuses gated, missing and unknown-revision datasets with the words
  the real `hf download --repo-type dataset` prints, and sizes a dataset from its card or
  the dataset viewer, naming the source;
- `playbooks/dataset_cache.py` runs the real client through the simulated host's `hf` (its
  dataset downloads are the real client when HF_ENDPOINT names a Hub), once per revision,
  with the token only in a 0600 env file; the simulated trainer then reads the folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import PlaybookHostFactory, Reports
from emulators.hub import HubEmulator, without_request_id

from orchestrator.core.hubsize import HubDatasetRef
from orchestrator.core.spec import SpecError, load_job
from orchestrator.engine import hubdatasets
from playbooks.base import Fault, Layout, PlaybookFailed, run_playbook
from playbooks.dataset_cache import MARKER, DatasetCache
from playbooks.model_cache import classify_download_error

HF = Path(sys.executable).parent / "hf"
GOOD, OTHER, BAD = "hf_good_token_0123", "hf_other_token_4567", "hf_unknown_token"


def jsonl(rows: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


TRAIN = [{"instruction": f"Add {i} and {i}", "input": "", "output": str(2 * i)}
         for i in range(6)]
TEST = [{"instruction": "Add 9 and 9", "input": "", "output": "18"}]
FILES = {"README.md": b"---\nlicense: cc-by-4.0\n---\n# a dataset\n",
         "data/train-00000-of-00001.jsonl": jsonl(TRAIN),
         "data/test-00000-of-00001.jsonl": jsonl(TEST)}
# The card's YAML header as `datasets`' push_to_hub writes it (dataset_info.splits).
CARD = {"license": "cc-by-4.0", "dataset_info": {
    "features": [{"name": n, "dtype": "string"} for n in ("instruction", "input", "output")],
    "splits": [{"name": "train", "num_bytes": 44_400_000, "num_examples": 52_002},
               {"name": "test", "num_bytes": 1000, "num_examples": 10}],
    "download_size": 24_246_862, "dataset_size": 44_401_000}}
# tatsu-lab/alpaca's card has no dataset_info; the dataset viewer sizes it.
VIEWER = {"size": {"dataset": {"dataset": "tatsu-lab/alpaca", "num_rows": 52002},
                   "configs": [], "splits": [
                       {"dataset": "tatsu-lab/alpaca", "config": "default", "split": "train",
                        "num_bytes_parquet_files": 24246862, "num_bytes_memory": 46130238,
                        "num_rows": 52002, "num_columns": 4}]},
          "pending": [], "failed": [], "partial": False}


@pytest.fixture(scope="module")
def hub() -> Iterator[HubEmulator]:
    with HubEmulator(tokens=(GOOD, OTHER)) as emulator:
        emulator.add_repo("org/instruct", FILES, repo_type="dataset", card_data=CARD,
                          revisions=("main", "v1"))
        emulator.add_repo("tatsu-lab/alpaca", FILES, repo_type="dataset",
                          card_data={"license": "cc-by-4.0"}, viewer_size=VIEWER)
        emulator.add_repo("org/gated-data", FILES, repo_type="dataset", gated=True,
                          accepted=(GOOD,))
        emulator.add_repo("org/huge", FILES, repo_type="dataset", siblings=False)
        yield emulator


def hf_download(hub: HubEmulator, tmp: Path, *args: str,
                token: str | None = None) -> subprocess.CompletedProcess[str]:
    """The real `hf download --repo-type dataset ARGS --local-dir tmp/out`."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    environ.update(HF_ENDPOINT=hub.url, HF_HOME=str(tmp / "hf-home"), NO_COLOR="1",
                   HF_HUB_DISABLE_UPDATE_CHECK="1", HF_HUB_DISABLE_PROGRESS_BARS="1")
    if token:
        environ["HF_TOKEN"] = token
    return subprocess.run([str(HF), "download", "--repo-type=dataset", *args,
                           f"--local-dir={tmp / 'out'}"], env=environ, capture_output=True,
                          text=True, timeout=120)


def test_the_real_client_parses_the_emulators_dataset_answers(hub: HubEmulator) -> None:
    from huggingface_hub import HfApi

    api = HfApi(endpoint=hub.url, token=False)
    info = api.dataset_info("org/instruct")  # no revision: GET /api/datasets/{id}
    assert info.sha and info.card_data is not None
    assert info.card_data["dataset_info"]["splits"][0]["num_examples"] == 52_002
    assert {s.rfilename for s in info.siblings or []} == set(FILES)
    assert api.dataset_info("org/instruct", revision="v1").sha != info.sha
    tree = {f.path for f in api.list_repo_tree("org/huge", repo_type="dataset",
                                               recursive=True)}
    assert tree == {*FILES, "data"}


def test_a_repo_without_siblings_downloads_through_the_tree(hub: HubEmulator,
                                                             tmp_path: Path) -> None:
    done = hf_download(hub, tmp_path, "org/huge")
    assert done.returncode == 0, done.stderr
    assert any(r.path == "/api/datasets/org/huge/tree/main" for r in hub.requests)
    for name, content in FILES.items():
        assert (tmp_path / "out" / name).read_bytes() == content


def test_the_size_comes_from_the_card_then_the_viewer(hub: HubEmulator) -> None:
    sizer = hubdatasets.Sizer(None, hub=hub.url, viewer=hub.url)
    card = sizer(HubDatasetRef("org/instruct"))
    assert card is not None and card.rows == 52_002
    assert card.source == "Hub dataset info: 52,002 rows, 44.4 MB in split train of org/instruct"
    viewer = sizer(HubDatasetRef("tatsu-lab/alpaca"))
    assert viewer is not None and viewer.rows == 52_002
    assert viewer.source == ("Hub dataset viewer: 52,002 rows, 46.1 MB in split train of "
                             "tatsu-lab/alpaca")
    before = len(hub.requests)
    sizer(HubDatasetRef("org/instruct", split="test"))  # asked once per repo and revision
    assert len(hub.requests) == before


def test_a_job_file_gets_its_estimate_and_source_from_the_hub(hub: HubEmulator,
                                                             tmp_path: Path) -> None:
    # What `orch plan` prints for a Hub dataset without tokens once the engine's sizer is
    # passed (phase B): the estimate and where it came from.
    job = tmp_path / "job.yml"
    job.write_text("name: t\nbase_model: meta-llama/Llama-3.1-8B\nmethod: qlora\n"
                   "dataset: tatsu-lab/alpaca\n")
    loaded = load_job(job, hub_size=hubdatasets.sizer(None, hub=hub.url, viewer=hub.url))
    assert loaded.dataset.tokens == round(46_130_238 / 4) + 52_002 * 24
    assert loaded.dataset.source.startswith("Hub dataset viewer: 52,002 rows")
    job.write_text(job.read_text().replace("tatsu-lab/alpaca", "org/missing-data"))
    with pytest.raises(SpecError) as info:
        load_job(job, hub_size=hubdatasets.sizer(None, hub=hub.url, viewer=hub.url))
    (msg,) = info.value.problems
    assert "dataset.path.hf: no dataset repo 'org/missing-data' on Hugging Face" in msg, msg


# (case, args, token): each refused the same way by the real client on the host and by the
# check before renting.
REFUSALS = [
    ("missing, no token", "org/missing-data", "main", None),
    ("missing, token", "org/missing-data", "main", GOOD),
    ("unknown revision", "org/instruct", "nope", None),
    ("gated, no token", "org/gated-data", "main", None),
    ("gated, not accepted", "org/gated-data", "main", OTHER),
    ("bad token", "org/instruct", "main", BAD),
]


@pytest.mark.parametrize(("case", "repo", "revision", "token"), REFUSALS,
                         ids=[r[0] for r in REFUSALS])
def test_refusals_before_renting_say_what_the_host_would(
        hub: HubEmulator, tmp_path: Path, case: str, repo: str, revision: str,
        token: str | None) -> None:
    real = hf_download(hub, tmp_path, repo, f"--revision={revision}", token=token)
    assert real.returncode == 1, case
    on_host = classify_download_error(real.stderr, 1, repo, revision, has_token=bool(token),
                                      field="dataset.path.hf", repo_type="dataset")
    assert on_host is not None and on_host.fault is Fault.USER, real.stderr
    found = hubdatasets.check_dataset(repo, revision, token, hub=hub.url)
    assert found.problem is not None and found.problem.startswith(f"{on_host}: `hf` says: "), (
        found.problem, str(on_host))
    said = found.problem.split("`hf` says: ", 1)[1]
    if not case.startswith("gated"):
        # A gated file's URL names no repo: the host's words are the generic ones, the API's
        # name the dataset (huggingface_hub cli/_errors.py `_format_gated_repo`).
        assert f"Error: {without_request_id(said)}" in without_request_id(real.stderr), (
            said, real.stderr)
    assert "Dataset" in said or "dataset" in said or case == "bad token"


def test_access_is_granted_with_an_accepted_token(hub: HubEmulator) -> None:
    found = hubdatasets.check_dataset("org/gated-data", "main", GOOD, hub=hub.url)
    assert (found.problem, found.unchecked) == (None, None)
    unreachable = hubdatasets.check_dataset("org/x", "main", None, hub="http://127.0.0.1:9")
    assert unreachable.problem is None and "did not answer" in (unreachable.unchecked or "")


# --- on the host -------------------------------------------------------------------------------


def cache(host: Any, repo: str, hub: HubEmulator, **kw: Any) -> DatasetCache:
    return DatasetCache(repo, kw.pop("revision", "main"), Layout(host.paths("/mnt/nvme/orch")),
                        hub_endpoint=hub.url, retry_wait_s=0.0, **kw)


def test_the_host_downloads_with_the_real_client_once(
        hub: HubEmulator, playbook_host: PlaybookHostFactory, reports: Reports) -> None:
    sim, host = playbook_host(has_docker=False)
    dc = cache(host, "org/gated-data", hub, hf_token=GOOD)
    before = len(hub.requests)
    run_playbook("dataset", dc.steps(), host, reports)
    assert reports.outcomes() == {"dataset:org/gated-data": "changed"}
    folder = Path(dc.dir)
    for name, content in FILES.items():
        assert (folder / name).read_bytes() == content
    assert (folder / MARKER).read_text() == "org/gated-data@main\n"
    (event,) = sim.events("hf-download")
    assert event["real_client"] and event["ok"] and event["repo_type"] == "dataset"
    assert GOOD not in " ".join(sim.ssh_commands())
    assert not Path(dc.env_file).exists()  # the token left the disk with the download
    fetched = [r for r in hub.requests[before:]
               if r.path.startswith("/datasets/org/gated-data/")]
    assert fetched and all(r.authorized for r in fetched)
    reports.clear()
    run_playbook("dataset", dc.steps(), host, reports)
    assert reports.outcomes() == {"dataset:org/gated-data": "skipped"}


def test_a_refusal_on_the_host_fails_at_once_with_what_to_do(
        hub: HubEmulator, playbook_host: PlaybookHostFactory, reports: Reports) -> None:
    _sim, host = playbook_host(has_docker=False)
    with pytest.raises(PlaybookFailed) as info:
        run_playbook("dataset", cache(host, "org/gated-data", hub, attempts=3).steps(), host,
                     reports)
    assert info.value.fault is Fault.USER
    assert ("org/gated-data is gated: accept its licence on "
            "https://huggingface.co/datasets/org/gated-data, then set HF_TOKEN") in str(
        info.value)
    assert not any(r.outcome == "changed" for r in reports.items)


def test_without_a_hub_the_simulated_host_writes_a_synthetic_dataset_the_trainer_reads(
        playbook_host: PlaybookHostFactory, reports: Reports) -> None:
    from simhost.standins import datasets as sim_datasets

    sim, host = playbook_host(has_docker=False)
    dc = DatasetCache("tatsu-lab/alpaca", "main", Layout(host.paths("/mnt/nvme/orch")),
                      retry_wait_s=0.0)
    run_playbook("dataset", dc.steps(), host, reports)
    (event,) = sim.events("hf-download")
    assert not event["real_client"]
    for fmt, extra in (("alpaca", {}), ("chat_template", {}), ("completion", {}),
                       ("input_output", {}),
                       ("chat_template", {"field_messages": "conversations",
                                          "message_property_mappings": {"role": "from",
                                                                        "content": "value"}})):
        entry = {"path": dc.dir, "type": fmt, "split": "train", **extra}
        rows = sim_datasets.rows(entry)
        assert len(rows) == 16
        firm, soft = sim_datasets.learned(entry, rows[1])
        if fmt not in ("completion",):
            assert {**firm, **soft}, (fmt, extra)
