"""The real `hf` CLI (huggingface_hub, pinned to what axolotl 0.18.0 ships) against the Hub
emulator: the exact texts it prints for each refusal, that `classify_download_error` turns
each into a user error saying what to do, that network faults stay transient (retried,
resumed), and that the simulated host's `hf` stand-in prints the very same texts.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import PlaybookHostFactory
from emulators.hub import HubEmulator, without_request_id
from hypothesis import given, settings
from hypothesis import strategies as st

from playbooks.base import Fault
from playbooks.hfrepo import repo_id_problem
from playbooks.model_cache import classify_download_error

HF = Path(sys.executable).parent / "hf"
GOOD, OTHER, BAD = "hf_good_token", "hf_other_token", "hf_unknown_token"
FILES = {"config.json": b'{"model_type": "llama"}', "tokenizer.json": b"{}",
         "model.safetensors": b"\0" * 300_000}
HINT = "Set HF_DEBUG=1 as environment variable for full traceback.\n"
NOT_FOUND = ("Error: Model 'org/missing' not found. If the repo is private, make sure you are "
             "authenticated and your token has the required permissions.\n")


@pytest.fixture(scope="module")
def hub() -> Iterator[HubEmulator]:
    with HubEmulator(tokens=(GOOD, OTHER)) as emulator:
        emulator.add_repo("org/model", FILES, revisions=("main", "v1"))
        emulator.add_repo("org/gated", FILES, gated=True, accepted=(GOOD,))
        emulator.add_repo("org/data", {"train.jsonl": b'{"text": "a"}\n'}, repo_type="dataset")
        yield emulator


def hf_download(hub: HubEmulator, tmp: Path, *args: str,
                token: str | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    """`hf download ARGS --local-dir tmp/out` with the real client, through HF_ENDPOINT."""
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith(("HF_", "HUGGING_FACE_"))}
    environ.update(HF_ENDPOINT=hub.url, HF_HOME=str(tmp / "hf-home"), NO_COLOR="1",
                   HF_HUB_DISABLE_UPDATE_CHECK="1", HF_HUB_DISABLE_PROGRESS_BARS="1", **env)
    if token:
        environ["HF_TOKEN"] = token
    return subprocess.run([str(HF), "download", *args, f"--local-dir={tmp / 'out'}"],
                          env=environ, capture_output=True, text=True, timeout=120)


def test_the_pinned_client_is_what_axolotl_ships() -> None:
    from huggingface_hub import __version__

    from simhost.standins.hf import VERSION

    assert __version__ == VERSION == "1.17.0"


def test_a_download_works_and_sends_the_token(hub: HubEmulator, tmp_path: Path) -> None:
    before = len(hub.requests)
    done = hf_download(hub, tmp_path, "org/gated", token=GOOD)
    assert done.returncode == 0, done.stderr
    # The info call, then a HEAD and a GET per file, each with HF_TOKEN as a Bearer token.
    seen = hub.requests[before:]
    assert [r.method for r in seen].count("GET") == 1 + len(FILES)
    assert all(r.authorized and r.status == 200 for r in seen)
    assert {p.name for p in (tmp_path / "out").iterdir()} >= set(FILES)
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == FILES["model.safetensors"]


# (case, repo args, token, stderr, what classify_download_error tells the user)
REFUSALS = [
    ("gated, no token", ["org/gated"], None,
     "Error: Access denied. This repository requires approval.\n",
     "org/gated is gated: accept its licence on https://huggingface.co/org/gated, then set "
     "HF_TOKEN"),
    ("gated, licence not accepted", ["org/gated"], OTHER,
     "Error: Access denied. This repository requires approval.\n",
     "the account of HF_TOKEN has no access to org/gated yet: accept the licence"),
    ("missing repo, no token", ["org/missing"], None, NOT_FOUND,
     "no model repo 'org/missing' on Hugging Face: fix the repo id in base_model (or, if it "
     "is private, a private repo needs HF_TOKEN)"),
    ("missing repo, token", ["org/missing"], GOOD, NOT_FOUND,
     "fix the repo id in base_model (or, if it is private, the token's account cannot see it)"),
    ("bad revision", ["org/model", "--revision=nope"], None,
     "Error: Revision not found in model 'org/model'.\n",
     "org/model has no revision 'nope': fix base_model's revision"),
    ("bad token", ["org/model"], BAD,
     "Error: Client error '401 Unauthorized' for url '{url}/api/models/org/model/revision/main'"
     " (Request ID: <id>)\nFor more information check: https://developer.mozilla.org/en-US/docs/Web/HTTP/Status/401"
     "\n\nInvalid credentials in Authorization header\n",
     "Hugging Face rejected HF_TOKEN (401 Invalid credentials): set HF_TOKEN to a valid token"),
]


@pytest.mark.parametrize(("case", "args", "token", "stderr", "advice"), REFUSALS,
                         ids=[r[0] for r in REFUSALS])
def test_refusals_print_friendly_texts_that_stop_at_once(
        hub: HubEmulator, tmp_path: Path, case: str, args: list[str], token: str | None,
        stderr: str, advice: str) -> None:
    result = hf_download(hub, tmp_path, *args, token=token)
    assert (result.returncode, result.stdout) == (1, HINT), case
    # On a loaded machine the real client may first say it waits for its cache's file lock
    # ("Still waiting to acquire lock on .../.gitignore.lock (elapsed: 0.3 seconds)"): not
    # part of the refusal, and classified with it below.
    said = "".join(line for line in result.stderr.splitlines(keepends=True)
                   if not line.startswith("Still waiting to acquire lock on "))
    assert without_request_id(said) == stderr.format(url=hub.url)
    revision = args[1].partition("=")[2] if len(args) > 1 else "main"
    failure = classify_download_error(result.stderr, result.returncode, args[0], revision,
                                      has_token=token is not None)
    assert failure is not None and failure.fault is Fault.USER
    assert advice in str(failure)


@pytest.mark.parametrize(("case", "args", "token", "stderr", "advice"), REFUSALS,
                         ids=[r[0] for r in REFUSALS])
def test_a_refusal_after_a_file_lock_wait_is_classified_the_same(
        case: str, args: list[str], token: str | None, stderr: str, advice: str) -> None:
    waited = ("Still waiting to acquire lock on /root/.cache/huggingface/.gitignore.lock "
              "(elapsed: 0.3 seconds)\n" + stderr.format(url="http://127.0.0.1:1"))
    revision = args[1].partition("=")[2] if len(args) > 1 else "main"
    failure = classify_download_error(waited, 1, args[0], revision,
                                      has_token=token is not None)
    assert failure is not None and failure.fault is Fault.USER, case
    assert advice in str(failure)


def test_a_dataset_repo_downloads_with_repo_type_and_names_its_kind(
        hub: HubEmulator, tmp_path: Path) -> None:
    done = hf_download(hub, tmp_path, "org/data", "--repo-type=dataset")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / "train.jsonl").is_file()
    # Without --repo-type the id is looked up among models.
    wrong = hf_download(hub, tmp_path / "2", "org/data")
    assert wrong.stderr.startswith("Error: Model 'org/data' not found.")
    missing = hf_download(hub, tmp_path / "3", "org/nodata", "--repo-type=dataset")
    assert missing.stderr.startswith("Error: Dataset 'org/nodata' not found.")
    failure = classify_download_error(missing.stderr, 1, "org/nodata", "main",
                                      field="dataset.path.hf", repo_type="dataset")
    assert failure is not None and failure.fault is Fault.USER
    assert "no dataset repo 'org/nodata' on Hugging Face: fix the repo id in " \
           "dataset.path.hf" in str(failure)


def test_a_stalled_body_is_resumed_by_the_client(hub: HubEmulator, tmp_path: Path) -> None:
    hub.slow, hub.stall_s = 1, 2.5
    try:
        done = hf_download(hub, tmp_path, "org/model", HF_HUB_DOWNLOAD_TIMEOUT="1")
    finally:
        hub.slow = 0
    assert done.returncode == 0, done.stderr
    assert "Trying to resume download..." in done.stderr
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == FILES["model.safetensors"]


def test_a_cut_connection_is_transient_and_the_next_run_resumes(
        hub: HubEmulator, tmp_path: Path) -> None:
    hub.truncated = 1
    try:
        cut = hf_download(hub, tmp_path, "org/model", HF_HUB_DOWNLOAD_TIMEOUT="5")
    finally:
        hub.truncated = 0
    assert cut.returncode == 1 and cut.stdout == ""
    assert cut.stderr.startswith("Traceback (most recent call last):")
    assert cut.stderr.rstrip().splitlines()[-1].startswith(
        "httpx.RemoteProtocolError: peer closed connection without sending complete message "
        "body (received ")
    assert classify_download_error(cut.stderr, 1, "org/model", "main") is None  # retried
    again = hf_download(hub, tmp_path, "org/model")
    assert again.returncode == 0, again.stderr
    for name, content in FILES.items():
        assert (tmp_path / "out" / name).read_bytes() == content


STAND_IN_CASES = [
    ("gated, no token", ["org/gated"], None),
    ("missing repo", ["org/missing"], None),
    ("bad revision", ["org/model", "--revision=nope"], None),
    ("bad token", ["org/model"], BAD),
]


@pytest.mark.parametrize(("case", "args", "token"), STAND_IN_CASES,
                         ids=[c[0] for c in STAND_IN_CASES])
def test_the_stand_in_prints_what_the_real_client_prints(
        hub: HubEmulator, tmp_path: Path, playbook_host: PlaybookHostFactory, case: str,
        args: list[str], token: str | None) -> None:
    real = hf_download(hub, tmp_path, *args, token=token)
    sim, host = playbook_host(has_docker=False, hf_gated_repos=("org/gated",),
                              hf_repos_not_found=("org/missing",),
                              hf_revisions_not_found=("nope",), hf_token=GOOD)
    env = [f"HF_ENDPOINT={hub.url}"] + ([f"HF_TOKEN={token}"] if token else [])
    stand_in = host.run(["env", *env, "hf", "download", *args,
                         f"--local-dir={sim.root}/out"])
    # Each answer has its own request id (in a 401's first line): the rest is the same.
    assert (stand_in.exit_code, stand_in.stdout, without_request_id(stand_in.stderr)) == (
        real.returncode, real.stdout, without_request_id(real.stderr)), case


def test_the_stand_in_cut_download_ends_like_the_real_one(
        playbook_host: PlaybookHostFactory) -> None:
    sim, host = playbook_host(download_failures=1, has_docker=False)
    cut = host.run(["env", "HF_HUB_DISABLE_PROGRESS_BARS=1", "hf", "download", "org/model",
                    f"--local-dir={sim.root}/out"])
    assert cut.exit_code == 1 and cut.stdout == ""
    assert cut.stderr.startswith("Traceback (most recent call last):")
    assert cut.stderr.rstrip().splitlines()[-1].startswith(
        "httpx.RemoteProtocolError: peer closed connection without sending complete message "
        "body (received ")


# --- repo ids ---------------------------------------------------------------------------------

@settings(deadline=None)
@given(st.text(alphabet="ab9_-./", min_size=1, max_size=12))
def test_repo_id_rules_match_huggingface_hub(repo: str) -> None:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo)
        valid = True
    except HFValidationError:
        valid = False
    assert (repo_id_problem(repo) is None) == valid, repo


def test_long_names_and_git_endings() -> None:
    assert repo_id_problem("o/" + "a" * 96) is None
    assert repo_id_problem("o/" + "a" * 97) is not None
    assert "'.git'" in (repo_id_problem("org/model.git") or "")
    assert repo_id_problem("org/mödel") is not None  # the Hub's names are ASCII



def test_the_stand_in_success_output_is_the_real_one(
        hub: HubEmulator, tmp_path: Path, playbook_host: PlaybookHostFactory) -> None:
    real = hf_download(hub, tmp_path, "org/model")
    sim, host = playbook_host(has_docker=False)
    out = f"{sim.root}/out"
    stand_in = host.run(["env", "HF_HUB_DISABLE_PROGRESS_BARS=1", "hf", "download",
                         "org/model", f"--local-dir={out}"])
    assert (stand_in.exit_code, stand_in.stderr) == (real.returncode, real.stderr) == (0, "")
    assert stand_in.stdout == real.stdout.replace(str(tmp_path / "out"), out)


def test_orchs_own_download_command_runs_on_the_real_client(
        hub: HubEmulator, tmp_path: Path) -> None:
    # The exact argv model_cache runs on a host (env, flags, --exclude patterns), given to
    # the real hf: it must be accepted, honour the excludes, and print nothing on stderr.
    from playbooks.base import Layout
    from playbooks.model_cache import ModelCache

    files = {**FILES, "original/consolidated.00.pth": b"pth", "pytorch_model.bin": b"bin"}
    hub.add_repo("org/full", files, revisions=("main", "v1"))
    mc = ModelCache("org/full", "v1", 1_000, Layout(str(tmp_path / "orch")))
    argv = mc.download_argv()
    argv[argv.index("hf")] = str(HF)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    done = subprocess.run(argv, env={**environ, "HF_ENDPOINT": hub.url},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    got = {p.relative_to(mc.model_dir).as_posix() for p in Path(mc.model_dir).rglob("*")
           if p.is_file() and ".cache" not in p.parts}
    assert got == set(FILES)
