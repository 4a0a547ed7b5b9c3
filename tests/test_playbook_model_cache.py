"""model_cache over real SSH to the simulated host: NVMe discovery, free space, hf download,
completeness, reuse, retries, HF errors, token secrecy and hostile repo/revision values."""

from __future__ import annotations

import json
import os
import shlex
import stat
import threading
from pathlib import Path
from typing import Any

import pytest
from conftest import PlaybookHostFactory, Reports

from playbooks.base import Fault, Host, HostPaths, Layout, PlaybookFailed, run_playbook
from playbooks.model_cache import (
    EXCLUDE,
    PLAYBOOK,
    ModelCache,
    classify_download_error,
    missing_files,
    nvme_mount_points,
    parse_df,
    steps,
)
from playbooks.ssh import ConnectionFactory

REPO = "meta-llama/Llama-3.2-1B"
SIZE = 2_471_645_184  # the simulated repo's size (SimHostOptions.model_size_bytes)
TOKEN = "hf_sEcReT0123456789abcdef"


def cache(repo: str = REPO, revision: str = "main", token: str | None = None,
          layout: Layout | None = None, **kw: Any) -> ModelCache:
    """The playbook under test, without waits between download attempts."""
    return ModelCache(repo, revision, SIZE, layout, token, retry_wait_s=0.0, **kw)


def run(mc: ModelCache, host: Host, reports: Reports) -> dict[str, str]:
    reports.clear()
    run_playbook(PLAYBOOK, mc.steps(), host, reports)
    return reports.outcomes()


def fail(mc: ModelCache, host: Host, reports: Reports) -> PlaybookFailed:
    reports.clear()
    with pytest.raises(PlaybookFailed) as info:
        run_playbook(PLAYBOOK, mc.steps(), host, reports)
    return info.value


def shards_of(model_dir: Path) -> set[str]:
    index = json.loads((model_dir / "model.safetensors.index.json").read_text())
    return set(index["weight_map"].values())


# --- over SSH --------------------------------------------------------------------------------


@pytest.fixture
def playbook_host(playbook_host: PlaybookHostFactory) -> PlaybookHostFactory:
    """Hosts whose OS has `hf` on its PATH (no Docker) unless a test says otherwise: the
    Docker host, where `hf` runs in the trainer image, is tested at the end of the file."""
    def make(options: Any = None, **fields: Any) -> tuple[Any, Host]:
        if options is None:
            fields.setdefault("has_docker", False)
        return playbook_host(options, **fields)

    return make


def test_fresh_download_then_reuse_on_a_new_connection(
        playbook_host: PlaybookHostFactory, reports: Reports,
        ssh_factory: ConnectionFactory) -> None:
    sim, host = playbook_host()
    mc = cache()
    assert run(mc, host, reports) == {"locate-disk": "ok", "free-space": "ok",
                                      "download": "changed"}
    assert sim.nvme_path is not None and mc.mount is not None and mc.mount.nvme
    assert mc.mount.mount_point == str(sim.nvme_path)
    model_dir = Path(mc.model_dir)
    assert model_dir == sim.nvme_path / "orch" / "models" / "meta-llama--Llama-3.2-1B" / "main"
    assert (model_dir / "config.json").is_file() and (model_dir / "tokenizer.json").is_file()
    assert len(shards_of(model_dir)) == 2
    assert all((model_dir / s).is_file() for s in shards_of(model_dir))
    (event,) = sim.events("hf-download")
    assert event["ok"] and event["revision"] == "main" and event["token"] is None
    assert event["xet_high_performance"] and event["hf_home"] == str(sim.nvme_path / "orch/hf-home")

    # A second job: a new playbook object on a new connection finds the cache complete.
    ssh_factory.close(sim.host, sim.port, sim.user)
    conn = ssh_factory.connect(sim.host, sim.port, sim.user, sim.host_key)
    again = cache()
    assert run(again, Host(conn, HostPaths(str(sim.root))), reports) == {
        "locate-disk": "ok", "free-space": "ok", "download": "skipped"}
    assert again.model_dir == mc.model_dir
    assert len(sim.events("hf-download")) == 1
    # The same object run again also skips (nothing stale carried over).
    assert run(mc, host, reports)["download"] == "skipped"
    assert len(sim.events("hf-download")) == 1


def test_two_revisions_get_two_cache_dirs(playbook_host: PlaybookHostFactory,
                                          reports: Reports) -> None:
    sim, host = playbook_host()
    main, pinned = cache(), cache(revision="0123abcd")
    run(main, host, reports)
    assert run(pinned, host, reports)["download"] == "changed"
    assert main.model_dir != pinned.model_dir
    assert Path(pinned.model_dir).name == "0123abcd"
    assert Path(main.model_dir).parent == Path(pinned.model_dir).parent
    assert [e["revision"] for e in sim.events("hf-download")] == ["main", "0123abcd"]
    pinned_downloads = [c for c in sim.ssh_commands()
                        if "hf download" in c and pinned.model_dir in c]
    # Non-empty first: over no command at all, all() would hold whatever the playbook ran.
    assert pinned_downloads and all("--revision=0123abcd" in c for c in pinned_downloads)


@pytest.mark.parametrize("free", [1_000_000_000, int(SIZE * 1.05)])
def test_full_disk_fails_before_downloading(playbook_host: PlaybookHostFactory,
                                            reports: Reports, free: int) -> None:
    sim, host = playbook_host(disk_free_bytes=free)
    failed = fail(cache(), host, reports)
    assert failed.step == "free-space" and failed.fault is Fault.HOST
    need = f"{SIZE * 1.1 / 1e9:.1f} GB"
    assert f"need {need} free on /mnt/nvme, have {free / 1e9:.1f} GB" in failed.reason
    assert sim.events("hf-download") == []
    assert reports.items[-1].outcome == "failed" and reports.items[-1].fault == "host"


def test_enough_space_with_the_margin_downloads(playbook_host: PlaybookHostFactory,
                                                reports: Reports) -> None:
    _, host = playbook_host(disk_free_bytes=int(SIZE * 1.2))
    assert run(cache(), host, reports)["download"] == "changed"


def test_complete_cache_needs_no_free_space(playbook_host: PlaybookHostFactory,
                                            reports: Reports) -> None:
    # 1.2x free: enough for the first download, then far less than 1.1x is left.
    sim, host = playbook_host(disk_free_bytes=int(SIZE * 1.2))
    run(cache(), host, reports)
    assert run(cache(), host, reports) == {"locate-disk": "ok", "free-space": "ok",
                                           "download": "skipped"}


def test_failed_download_is_retried(playbook_host: PlaybookHostFactory,
                                    reports: Reports) -> None:
    sim, host = playbook_host(download_failures=1)
    mc = cache()
    assert run(mc, host, reports)["download"] == "changed"
    first, second = sim.events("hf-download")
    assert not first["ok"] and first["error"] == "network"
    # hf resumes: the retry skips what the failed run finished.
    assert second["ok"] and second["skipped"] == len(first["downloaded"]) >= 1
    assert not missing_files({p.name for p in Path(mc.model_dir).iterdir()},
                             (Path(mc.model_dir) / "model.safetensors.index.json").read_text())


def test_repeated_download_failure_is_transient(playbook_host: PlaybookHostFactory,
                                                reports: Reports) -> None:
    sim, host = playbook_host(download_failures=10)
    failed = fail(cache(attempts=3), host, reports)
    assert failed.step == "download" and failed.fault is Fault.TRANSIENT
    assert "failed 3 times" in failed.reason and "RemoteProtocolError" in failed.reason
    assert "httpx.RemoteProtocolError" in failed.stderr_tail
    assert "RemoteProtocolError" in reports.items[-1].stderr_tail
    assert len(sim.events("hf-download")) == 3


@pytest.mark.parametrize(
    ("repo", "token", "expect"),
    [
        ("org/gated", None, "org/gated is gated: accept its licence on "
                            "https://huggingface.co/org/gated, then set HF_TOKEN"),
        ("org/gated", "hf_wrong", "Hugging Face rejected HF_TOKEN"),
        ("org/missing", None, "no model repo 'org/missing' on Hugging Face: fix the repo id"),
    ],
)
def test_hf_refusals_are_user_faults(playbook_host: PlaybookHostFactory, reports: Reports,
                                     repo: str, token: str | None, expect: str) -> None:
    sim, host = playbook_host(hf_gated_repos=("org/gated",), hf_repos_not_found=("org/missing",),
                              hf_token=TOKEN)
    failed = fail(cache(repo, token=token), host, reports)
    assert failed.step == "download" and failed.fault is Fault.USER
    assert expect in failed.reason and failed.stderr_tail.startswith("Error: ")
    # A refusal is not retried (it never gets as far as an hf-download event).
    assert sum("hf download" in c for c in sim.ssh_commands()) == 1


def test_a_missing_revision_stops_at_once(playbook_host: PlaybookHostFactory,
                                          reports: Reports) -> None:
    sim, host = playbook_host(hf_revisions_not_found=("v9",))
    failed = fail(cache(revision="v9"), host, reports)
    assert failed.step == "download" and failed.fault is Fault.USER
    assert f"{REPO} has no revision 'v9': fix base_model's revision" in failed.reason
    assert failed.stderr_tail == f"Error: Revision not found in model '{REPO}'.\n"
    assert sum("hf download" in c for c in sim.ssh_commands()) == 1


def test_gated_repo_with_token_keeps_the_token_secret(playbook_host: PlaybookHostFactory,
                                                      reports: Reports) -> None:
    # Slow enough (~1 s) that the process list can be sampled while hf runs.
    sim, host = playbook_host(hf_gated_repos=("org/gated",), hf_token=TOKEN,
                              download_bytes_per_second=SIZE * 1.5)
    mc = cache("org/gated", token=TOKEN)
    seen: list[str] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            for pid in sim.processes():
                try:
                    seen.append(Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"))
                except OSError:
                    pass
            done.wait(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        assert run(mc, host, reports)["download"] == "changed"
    finally:
        done.set()
        sampler.join()
    (event,) = sim.events("hf-download")
    assert event["ok"] and event["token"] == "env"  # hf read it from HF_TOKEN
    assert any("hf\0download" in c for c in seen), "the sampler never saw hf running"
    assert not any(TOKEN in c for c in seen)
    assert not any(TOKEN in c for c in sim.ssh_commands())
    assert TOKEN not in json.dumps([r.data() | {"m": r.message} for r in reports.items])
    env_file = Path(mc.env_file)
    assert env_file.is_relative_to(sim.nvme_path or "/nonexistent")
    assert stat.S_IMODE(env_file.parent.stat().st_mode) == 0o700
    # The token was needed by the download only: neither the file nor a temporary copy of
    # it stays on the host (issue 10 §6).
    assert not env_file.exists() and list(env_file.parent.iterdir()) == []


def test_no_nvme_is_a_clear_host_error_then_falls_back_to_a_usual_mount(
        playbook_host: PlaybookHostFactory, reports: Reports) -> None:
    sim, host = playbook_host(nvme_mount=None)
    failed = fail(cache(), host, reports)
    assert failed.step == "locate-disk" and failed.fault is Fault.HOST
    assert "no NVMe filesystem is mounted" in failed.reason and "/workspace" in failed.reason
    assert "never formats" in failed.reason

    sim.path("/workspace").mkdir()
    mc = cache()
    assert run(mc, host, reports)["download"] == "changed"
    assert mc.mount is not None and not mc.mount.nvme
    assert mc.mount.mount_point == str(sim.path("/workspace"))
    assert mc.model_dir.startswith(str(sim.path("/workspace/orch/models")) + "/")


def test_a_given_layout_is_used_without_disk_discovery(playbook_host: PlaybookHostFactory,
                                                       reports: Reports) -> None:
    sim, host = playbook_host()
    layout = Layout(host.paths("/data/volume/orch"))
    mc = cache(layout=layout)
    assert run(mc, host, reports)["download"] == "changed"
    assert mc.model_dir.startswith(layout.base) and mc.mount is None
    assert not any("lsblk" in c for c in sim.ssh_commands())


HOSTILE_REVISIONS = ["x;touch pwned1", "$(touch pwned2)", "`touch pwned3`",
                     "a'b\"c;touch pwned4 #"]
HOSTILE_REPOS = ["org/a;touch pwned", "$(touch pwned)", "org/'x'", "org/a\ntouch pwned",
                 "../../etc", "org/--x", "-rf"]


def test_hostile_revisions_are_one_argv_word(playbook_host: PlaybookHostFactory,
                                             reports: Reports) -> None:
    # Git refs may contain ; $ ( ) ` and quotes, so these reach hf, quoted.
    sim, host = playbook_host()
    for revision in HOSTILE_REVISIONS:
        mc = cache(revision=revision)
        assert run(mc, host, reports)["download"] == "changed"
        assert sim.events("hf-download")[-1]["revision"] == revision
        models = sim.path("/mnt/nvme/orch/models/meta-llama--Llama-3.2-1B")
        assert Path(mc.model_dir).parent == models
    downloads = [shlex.split(c) for c in sim.ssh_commands() if "hf download" in c]
    assert len(downloads) == len(HOSTILE_REVISIONS)
    for words, revision in zip(downloads, HOSTILE_REVISIONS, strict=True):
        assert f"--revision={revision}" in words
    assert not list(sim.dir.rglob("pwned*"))


def test_hostile_repos_are_refused_before_anything_runs(playbook_host: PlaybookHostFactory,
                                                        reports: Reports) -> None:
    sim, host = playbook_host()
    for repo in HOSTILE_REPOS:
        failed = fail(cache(repo), host, reports)
        assert failed.step == "locate-disk" and failed.fault is Fault.USER, repo
        assert "not a Hugging Face model id" in failed.reason
    assert sim.ssh_commands() == [] and sim.events("hf-download") == []
    assert not list(sim.dir.rglob("pwned*"))


def test_impossible_revisions_are_refused(playbook_host: PlaybookHostFactory,
                                          reports: Reports) -> None:
    sim, host = playbook_host()
    for revision in ["", "a\nb", "--force-download", " main"]:
        failed = fail(cache(revision=revision), host, reports)
        assert failed.fault is Fault.USER and "not a revision" in failed.reason, revision
    assert sim.ssh_commands() == []


def test_steps_function_and_single_file_model(playbook_host: PlaybookHostFactory,
                                              reports: Reports) -> None:
    sim, host = playbook_host(model_shards=1)
    layout = Layout(host.paths("/mnt/nvme/orch"))
    run_playbook(PLAYBOOK, steps(REPO, "main", SIZE, layout, None, retry_wait_s=0), host,
                 reports)
    assert reports.outcomes()["download"] == "changed"
    assert (Path(layout.model_dir(REPO)) / "model.safetensors").is_file()
    downloads = [shlex.split(c) for c in sim.ssh_commands() if "hf download" in c]
    assert downloads and all(f"--exclude={p}" in argv for argv in downloads for p in EXCLUDE)


def test_deleted_shard_is_downloaded_again(playbook_host: PlaybookHostFactory,
                                           reports: Reports) -> None:
    sim, host = playbook_host()
    mc = cache()
    run(mc, host, reports)
    shard = sorted(shards_of(Path(mc.model_dir)))[-1]
    os.remove(Path(mc.model_dir) / shard)
    assert run(cache(), host, reports)["download"] == "changed"
    assert sim.events("hf-download")[-1]["downloaded"] == [shard]


# --- parsing (no host) -----------------------------------------------------------------------


def test_nvme_mount_points_follow_partitions_raid_and_old_lsblk() -> None:
    text = json.dumps({"blockdevices": [
        {"name": "sda", "size": "480103981056", "tran": "sata", "fstype": None,
         "mountpoints": [None], "children": [
             {"name": "sda1", "size": 1, "tran": None, "fstype": "ext4", "mountpoints": ["/"]}]},
        {"name": "nvme0n1", "size": 3840755982336, "tran": "nvme", "fstype": None,
         "mountpoints": [None], "children": [
             {"name": "nvme0n1p1", "size": 1, "tran": None, "fstype": "ext4",
              "mountpoints": ["/mnt/local", "/etc/hosts"]}]},
        {"name": "nvme1n1", "size": 1, "tran": "nvme", "fstype": "linux_raid_member",
         "mountpoint": None, "children": [
             {"name": "md0", "size": 2, "tran": None, "fstype": "xfs", "mountpoint": "/data"}]},
        {"name": "nvme2n1", "size": 1, "tran": "nvme", "mountpoints": ["[SWAP]"]},
    ]})
    assert nvme_mount_points(text) == {"/mnt/local": "nvme0n1p1", "/etc/hosts": "nvme0n1p1",
                                       "/data": "md0"}
    assert nvme_mount_points("not json") == {}


def test_parse_df_keeps_spaces_in_targets() -> None:
    out = ("Filesystem Type 1B-blocks Avail Mounted on\n"
           "/dev/nvme0n1p1 ext4 3840755982336 3000000000000 /mnt/my disk\n")
    (row,) = parse_df(out)
    assert (row.device, row.size_bytes, row.avail_bytes, row.mount_point) == (
        "/dev/nvme0n1p1", 3840755982336, 3_000_000_000_000, "/mnt/my disk")


def test_missing_files() -> None:
    index = json.dumps({"weight_map": {"a": "m-1.safetensors", "b": "m-2.safetensors"}})
    full = {"config.json", "tokenizer.json", "model.safetensors.index.json", "m-1.safetensors",
            "m-2.safetensors"}
    assert missing_files(full, index) == []
    assert missing_files(full - {"m-2.safetensors"}, index) == ["m-2.safetensors"]
    assert missing_files(full, "{broken") == ["model.safetensors.index.json (unreadable)"]
    assert missing_files({"config.json", "tokenizer.model", "model.safetensors"}, None) == []
    assert len(missing_files(set(), None)) == 3


def test_classify_download_errors() -> None:
    def fault(text: str, code: int = 1) -> Fault | None:
        exc = classify_download_error(text, code, "o/r", "main")
        return exc.fault if exc else None

    assert fault("sh: 1: hf: not found", 127) is Fault.HOST
    assert fault("OSError: [Errno 28] No space left on device") is Fault.HOST
    assert fault("GatedRepoError: 403 Client Error. Cannot access gated repo") is Fault.USER
    assert fault("RevisionNotFoundError: 404 Client Error.") is Fault.USER
    assert fault("httpx.ConnectError: [Errno 104] Connection reset by peer") is None
    assert fault("downloaded 4040401 bytes then 503 Server Error") is None
    # hf >= 1.0's own texts (tests/test_hf_cli.py checks them against the real client).
    assert fault("Error: Access denied. This repository requires approval.") is Fault.USER
    assert fault("Error: Access denied. Model 'o/r' requires approval.") is Fault.USER
    assert fault("Error: Revision not found in model 'o/r'.") is Fault.USER
    assert fault("Error: File not found in model 'o/r'.") is Fault.USER


# --- a Docker host: no `hf` on the host OS ---------------------------------------------------

IMAGE = "axolotlai/axolotl:0.18.0-py3.12-cu130-2.12.0"


def test_a_docker_host_has_no_hf_and_downloads_in_the_trainer_image(
        playbook_host: PlaybookHostFactory, reports: Reports) -> None:
    """Ubuntu ships no `hf`: bare, the download fails; in the trainer image it works, with
    the token passed by name from the sourced env file (never on the command line)."""
    sim, host = playbook_host(has_docker=True, hf_gated_repos=(REPO,), hf_token=TOKEN)
    assert host.run(["hf", "version"]).exit_code == 127
    error = fail(cache(token=TOKEN, attempts=1), host, reports)
    assert error.step == "download" and "`hf` CLI is not installed" in error.reason

    mc = cache(token=TOKEN, image=IMAGE)
    assert run(mc, host, reports)["download"] == "changed"
    argv = mc.download_argv()
    assert argv[:3] == ["docker", "run", "--rm"] and IMAGE in argv
    assert mc.layout is not None
    inside = mc.layout.container(mc.model_dir)
    assert inside.startswith("/workspace/data/models/") and f"--local-dir={inside}" in argv
    assert ["-e", "HF_TOKEN"] == argv[argv.index("-e"):argv.index("-e") + 2]
    assert TOKEN not in " ".join(sim.ssh_commands())
    assert not mc.missing(host)
