"""Base model to local NVMe: find the disk, check free space, `hf download`, verify completeness.

Follows ../shared/reference/pipeline-facts.md ("Base model to local NVMe"). Three steps:

1. `locate-disk` (verification): the mount the cache lives on. A mounted NVMe filesystem
   wins (largest free space first); without one, the usual rental mounts (`/mnt`,
   `/ephemeral`, `/workspace`, `/data`) that exist, again by free space. Nothing is ever
   formatted or mounted; no candidate at all is a `Fault.HOST`. Skipped (no commands) when
   the caller gives a `Layout` (e.g. a network volume).
2. `free-space` (verification): at least `model_bytes × margin` must be free unless the
   model is already complete in the cache (bytes already downloaded count as free).
3. `download`: its check is the completeness test (every shard in
   `model.safetensors.index.json`'s `weight_map`, `config.json` and a tokenizer file), so a
   second job on the same server skips the download entirely; its apply runs
   `hf download REPO --local-dir DIR --revision=R` with `HF_HOME` on the same disk and
   `HF_XET_HIGH_PERFORMANCE=1`, retried a few times (hf resumes and skips complete files).

The HF token never appears on a command line: it is written with `ssh.write_secret_env` to a
0600 file under the layout and sourced by `host.run(..., env_file=...)`. User values (repo,
revision) reach the host only as argv words (quoted by `ssh.run`) or via `safe_name` paths.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from playbooks import ssh
from playbooks.base import CONTAINER_ROOT, Fault, Host, Layout, Step, StepFailed, last_line
from playbooks.hfrepo import repo_id_problem
from providers import retrying

PLAYBOOK = "model_cache"

# Peak disk use of `hf download` is about the model's size: each file is written under
# `.cache/huggingface/download/*.incomplete` and then *renamed* into place, so nothing is
# stored twice. The 10% covers filesystem overhead, the non-weight files, hf's metadata
# and lock files under the local dir and HF_HOME, and an estimate of `model_bytes` that is
# a little short (callers derive it from parameter counts, not from the repo listing).
MARGIN = 1.10

# Where orch looks when no NVMe filesystem is mounted (server paths), in preference order
# for equal free space. These are the mounts GPU rental images put their scratch disk on;
# `/workspace/data` is where orch mounts a RunPod job's volume (sized by the job), which a
# look at `/workspace` alone would miss for the 50 GB container disk.
USUAL_MOUNTS = ("/mnt", "/ephemeral", "/workspace/data", "/workspace", "/data")

# Mount points of an NVMe device that are not a place for a model cache. Inside containers
# lsblk also lists the host disk's bind mounts (/etc/hosts, /etc/resolv.conf).
_NOT_A_CACHE = ("/boot", "/etc", "/proc", "/sys", "/dev", "/run", "/usr", "/snap", "/var/lib")

# Any of these makes a tokenizer loadable (fast tokenizer, sentencepiece, GPT-2 BPE,
# Mistral tekken).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model",
                   "tekken.json")
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"

# Weights training never loads: transformers reads the safetensors index, so these would
# only double download time and disk (Llama repos ship `original/*.pth`, Mistral repos a
# `consolidated.safetensors` next to the shards, many repos PyTorch/TF/Flax/ONNX copies).
EXCLUDE = ("original/*", "*.pth", "*.pt", "*.bin", "*.h5", "*.msgpack", "*.onnx", "*.gguf",
           "*.ot", "consolidated*.safetensors")

DEFAULT_ATTEMPTS = 3
DEFAULT_RETRY_WAIT_S = 5.0
DEFAULT_DOWNLOAD_TIMEOUT_S = 4 * 3600.0

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

# Lists the model directory (files with content, hf's partial downloads left out) and prints
# the index after a marker: one round trip for the whole completeness test. The directory
# is a positional parameter, never part of the script.
_LIST_MARKER = "--orch-index--"
_LIST_SCRIPT = (
    'cd "$1" 2>/dev/null || exit 0\n'
    "find . -path ./.cache -prune -o -type f -size +0c -printf '%P\\n' 2>/dev/null\n"
    f"echo '{_LIST_MARKER}'\n"
    f"cat {INDEX_FILE} 2>/dev/null\n"
    "exit 0\n"
)

# Free bytes on the filesystem that will hold $1 (its nearest existing ancestor: the cache
# directory may not exist yet), then the bytes already under $1 (a resumed download needs
# only the rest).
_SPACE_SCRIPT = (
    'p=$1\n'
    'while [ ! -e "$p" ]; do p=$(dirname "$p"); done\n'
    'df -B1 --output=avail,target "$p" | tail -n 1\n'
    'if [ -d "$1" ]; then du -s -B1 "$1" 2>/dev/null | cut -f1; else echo 0; fi\n'
)

# For each existing candidate directory: its path, then df's row for the filesystem holding
# it. Candidates are positional parameters.
_CANDIDATES_SCRIPT = (
    'for p; do\n'
    '  if [ -d "$p" ]; then\n'
    "    printf 'path %s\\n' \"$p\"\n"
    '    df -B1 --output=source,fstype,size,avail,target "$p" | tail -n 1\n'
    '  fi\n'
    'done\n'
    'exit 0\n'
)

_LSBLK_COLUMNS = "NAME,SIZE,TRAN,FSTYPE"
# util-linux < 2.37 (Ubuntu 20.04) has no MOUNTPOINTS column, only MOUNTPOINT.
_LSBLK_SCRIPT = (
    f"lsblk -J -b -o {_LSBLK_COLUMNS},MOUNTPOINTS 2>/dev/null"
    f" || lsblk -J -b -o {_LSBLK_COLUMNS},MOUNTPOINT"
)
_DF_FIELDS = "--output=source,fstype,size,avail,target"


@dataclass(frozen=True)
class Mount:
    """A mounted filesystem the model cache can live on (`mount_point` is a host path)."""

    mount_point: str
    device: str
    size_bytes: int
    avail_bytes: int
    fstype: str = ""
    nvme: bool = False


def gb(n: int | float) -> str:
    """Bytes as decimal gigabytes, the unit disk sizes are sold in: `12.3 GB`."""
    return f"{n / 1e9:.1f} GB"


# --- disk discovery ----------------------------------------------------------------------


def _int(value: object) -> int:
    # lsblk -b prints sizes as JSON numbers (util-linux >= 2.33) or as strings (older).
    try:
        return int(str(value))
    except ValueError:
        return 0


def nvme_mount_points(lsblk_json: str) -> dict[str, str]:
    """Mount points backed by an NVMe device (TRAN=nvme), mapped to the block device name.

    The transport is set on the disk only; partitions, RAID and LVM volumes below it
    inherit it, which is how an md array or a logical volume on NVMe disks counts as NVMe.
    """
    try:
        devices = json.loads(lsblk_json).get("blockdevices") or []
    except (ValueError, AttributeError):
        return {}
    found: dict[str, str] = {}

    def walk(node: dict[str, object], nvme: bool) -> None:
        nvme = nvme or str(node.get("tran") or "").lower() == "nvme"
        points = node.get("mountpoints", node.get("mountpoint"))
        if not isinstance(points, list):
            points = [points]
        if nvme:
            for point in points:
                if isinstance(point, str) and point.startswith("/"):
                    found.setdefault(point, str(node.get("name") or ""))
        children = node.get("children")
        if isinstance(children, list):
            for child in children:
                if isinstance(child, dict):
                    walk(child, nvme)

    for device in devices:
        if isinstance(device, dict):
            walk(device, False)
    return found


def parse_df(text: str) -> list[Mount]:
    """Rows of `df -B1 --output=source,fstype,size,avail,target` (header lines ignored)."""
    mounts = []
    for line in text.splitlines():
        parts = line.split(None, 4)  # the target is last and may contain spaces
        if len(parts) < 5 or not parts[2].isdigit() or not parts[3].isdigit():
            continue
        source, fstype, size, avail, target = parts
        mounts.append(Mount(target, source, int(size), int(avail), fstype))
    return mounts


def _server_path(host: Host, path: str) -> str:
    """A host path as the server names it (the simulated host keeps its disks in a folder)."""
    root = host.paths.root.rstrip("/")
    if root and (path == root or path.startswith(root + "/")):
        return path[len(root):] or "/"
    return path


def _cache_worthy(host: Host, mount_point: str) -> bool:
    server = _server_path(host, mount_point)
    if server == "/":  # the root filesystem: use one of USUAL_MOUNTS on it instead
        return False
    return not any(server == p or server.startswith(p + "/") for p in _NOT_A_CACHE)


def find_nvme(host: Host) -> Mount:
    """The mount the model cache should live on: NVMe first, else a usual mount; never formats.

    Raises StepFailed (Fault.HOST) when there is neither a mounted NVMe filesystem nor any
    of USUAL_MOUNTS.
    """
    lsblk = host.run(["sh", "-c", _LSBLK_SCRIPT])
    # No lsblk, or one that cannot see the disks (some containers): fall back to the usual
    # mounts rather than failing, since they are where such rentals put the scratch disk.
    nvme = nvme_mount_points(lsblk.stdout) if lsblk.ok else {}
    points = [p for p in nvme if _cache_worthy(host, p)]
    if points:
        df = host.run(["df", "-B1", _DF_FIELDS, *points])
        # df exits 1 when one path fails but still prints the others.
        rows = [m for m in parse_df(df.stdout) if m.mount_point in nvme]
        if rows:
            best = max(rows, key=lambda m: m.avail_bytes)
            return Mount(best.mount_point, best.device, best.size_bytes, best.avail_bytes,
                         best.fstype, nvme=True)
    nvme_devices = {name for name in nvme.values() if name}
    candidates = [host.paths(p) for p in USUAL_MOUNTS]
    result = host.run(["sh", "-c", _CANDIDATES_SCRIPT, "sh", *candidates])
    found: list[Mount] = []
    lines = result.stdout.splitlines()
    for i, line in enumerate(lines[:-1]):
        if not line.startswith("path "):
            continue
        rows = parse_df(lines[i + 1])
        if rows:
            row = rows[0]
            device_name = row.device.rsplit("/", 1)[-1]
            found.append(Mount(line[5:], row.device, row.size_bytes, row.avail_bytes,
                               row.fstype, nvme=device_name in nvme_devices))
    if not found:
        raise StepFailed(
            "no NVMe filesystem is mounted and none of " + ", ".join(USUAL_MOUNTS)
            + " exists on the host: mount a local disk there (orch never formats or mounts "
            "disks) or give the job a volume for the model cache",
            fault=Fault.HOST,
        )
    # max() keeps the first of equal ones, so USUAL_MOUNTS order breaks ties.
    return max(found, key=lambda m: m.avail_bytes)


# --- validation ----------------------------------------------------------------------------


def validate_repo(repo: str) -> None:
    """Raise StepFailed(Fault.USER) unless `repo` is a valid Hugging Face model id."""
    problem = repo_id_problem(repo)
    if problem is not None:
        raise StepFailed(f"not a Hugging Face model id: {problem} (e.g. "
                         "meta-llama/Llama-3.1-8B)", fault=Fault.USER)


def validate_revision(revision: str) -> None:
    """Raise StepFailed(Fault.USER) for a revision no git ref or commit can be."""
    if (
        not revision
        or len(revision) > 255
        or _CONTROL.search(revision)
        or revision.startswith("-")
        or revision != revision.strip()
    ):
        raise StepFailed(
            f"{revision!r} is not a revision: give a branch, tag or commit hash "
            "(e.g. main)",
            fault=Fault.USER,
        )


# --- download errors ------------------------------------------------------------------------


# What `hf download` (huggingface_hub >= 1.0) prints on stderr for the Hub's refusals, as
# `Error: <text>` and exit 1 (cli/_errors.py; checked against the real client in
# tests/test_hf_cli.py). A gated file names no repo: the error comes from a file URL.
_HF_GATED = re.compile(r"^Error: Access denied\. .*requires approval\.", re.M)
_HF_NOT_FOUND = re.compile(r"^Error: (?:Model|Dataset|Space|Repository) (?:'[^']*' )?not found\.",
                           re.M)
_HF_NO_REVISION = re.compile(r"^Error: Revision not found in ", re.M)
_HF_NO_FILE = re.compile(r"^Error: File not found in ", re.M)
_HF_BAD_TOKEN = "Invalid credentials in Authorization header"


def classify_download_error(stderr: str, exit_code: int, repo: str, revision: str, *,
                            has_token: bool = False, field: str = "base_model",
                            repo_type: str = "model") -> StepFailed | None:
    """The permanent failure a failed `hf download` reports, or None when retrying may help.

    `field` names the job file's field holding `repo` (the user fixes it there);
    `has_token` tells a missing token from one whose account lacks access. Anything not
    recognised (a traceback: network errors, a cut connection) is left to the retries.
    """
    text = stderr
    page = f"https://huggingface.co/{'datasets/' if repo_type == 'dataset' else ''}{repo}"
    if exit_code == 127 or "command not found" in text or "hf: not found" in text:
        return StepFailed(
            "the `hf` CLI is not installed on the host: install huggingface_hub >= 1.0 "
            "(`pip install -U huggingface_hub`) in the host image",
            fault=Fault.HOST, stderr=stderr)
    if "No space left on device" in text or "Errno 28" in text:
        return StepFailed(f"the disk filled up while downloading {repo}: free space on the "
                          "model cache disk or use a larger one", fault=Fault.HOST,
                          stderr=stderr)
    if _HF_BAD_TOKEN in text or "Invalid user token" in text:
        return StepFailed(
            "Hugging Face rejected HF_TOKEN (401 Invalid credentials): set HF_TOKEN to a "
            "valid token from https://huggingface.co/settings/tokens", fault=Fault.USER,
            stderr=stderr)
    if (_HF_GATED.search(text) or "GatedRepoError" in text or "gated repo" in text):
        if has_token:
            what = (f"the account of HF_TOKEN has no access to {repo} yet: accept the "
                    f"licence on {page} with that account (gated models may need the "
                    "owner's approval, which can take a while), then run the job again")
        else:
            what = (f"{repo} is gated: accept its licence on {page}, then set HF_TOKEN to "
                    "a token of that account (https://huggingface.co/settings/tokens)")
        return StepFailed(what, fault=Fault.USER, stderr=stderr)
    if _HF_NO_REVISION.search(text) or "RevisionNotFoundError" in text:
        return StepFailed(
            f"{repo} has no revision {revision!r}: fix {field}'s revision (a branch, tag or "
            f"commit hash listed on {page})", fault=Fault.USER, stderr=stderr)
    if _HF_NOT_FOUND.search(text) or "RepositoryNotFoundError" in text:
        private = ("the token's account cannot see it" if has_token
                   else "a private repo needs HF_TOKEN")
        return StepFailed(
            f"no {repo_type} repo {repo!r} on Hugging Face: fix the repo id in {field} "
            f"(or, if it is private, {private})", fault=Fault.USER, stderr=stderr)
    if (_HF_NO_FILE.search(text) or "EntryNotFoundError" in text
            or re.search(r"\b404 Client Error", text)):
        return StepFailed(f"a file of {repo} at {revision!r} is missing on Hugging Face: "
                          f"check {field}", fault=Fault.USER, stderr=stderr)
    if re.search(r"\b40[13] Client Error", text):  # hf < 1.0 printed exception texts
        return StepFailed(f"{repo} is gated or private: set HF_TOKEN to a token of an "
                          f"account with access (accept the licence on {page})",
                          fault=Fault.USER, stderr=stderr)
    return None


# --- the playbook ---------------------------------------------------------------------------


class DownloadFailed(Exception):
    """An `hf download` run that failed for a reason worth another run (not a refusal);
    the model and the dataset downloads (`dataset_cache`) retry on it."""

    def __init__(self, result: ssh.Result) -> None:
        super().__init__(f"exit {result.exit_code}")
        self.result = result


@dataclass
class ModelCache:
    """State shared by the model_cache steps; `model_dir` is what later steps read.

    With `layout=None` the layout is `<mount>/orch` on the mount `find_nvme` picks when the
    playbook runs. `attempts` bounds `hf download` runs per apply (`retry_wait_s × n`
    between them); `download_timeout_s` bounds the whole download step.
    """

    repo: str
    revision: str
    model_bytes: int
    layout: Layout | None = None
    hf_token: str | None = field(default=None, repr=False)
    margin: float = MARGIN
    attempts: int = DEFAULT_ATTEMPTS
    retry_wait_s: float = DEFAULT_RETRY_WAIT_S
    download_timeout_s: float = DEFAULT_DOWNLOAD_TIMEOUT_S
    mount: Mount | None = None
    # On a container rental `hf` is in the trainer image's venv, which `ssh host cmd` does
    # not see: the pipeline passes `train.NativeEnv.wrap` to restore the image's environment.
    wrap: Callable[[Sequence[str]], list[str]] | None = field(default=None, repr=False)
    # On a Docker host (a monthly server) the host OS has no `hf` (Ubuntu ships none): the
    # download runs in a throwaway container of this image (the trainer image, which ships
    # huggingface_hub), with the layout mounted at CONTAINER_ROOT as for training.
    image: str | None = None
    # The result of the last completeness test, used once by the next check that needs it:
    # `free-space` and the runner's re-check after `apply` would otherwise repeat the
    # listing a moment later, one SSH round trip each.
    _missing_cache: list[str] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.model_bytes <= 0:
            raise ValueError(f"model_bytes must be > 0 (got {self.model_bytes})")
        if self.attempts < 1:
            raise ValueError(f"attempts must be >= 1 (got {self.attempts})")

    # -- where things are

    def _layout(self) -> Layout:
        if self.layout is None:
            raise RuntimeError("the model cache's disk is not known yet: run locate-disk first")
        return self.layout

    @property
    def model_dir(self) -> str:
        """Host path of this repo+revision's cache directory (the `--local-dir`)."""
        return self._layout().model_dir(self.repo, self.revision)

    @property
    def hf_home(self) -> str:
        """HF_HOME on the cache disk (hf's xet/lock files stay off the root disk)."""
        return f"{self._layout().base}/hf-home"

    @property
    def env_file(self) -> str:
        """The 0600 file holding HF_TOKEN, sourced by the download command."""
        return f"{self._layout().base}/secrets/hf.env"

    # -- steps

    def steps(self) -> list[Step]:
        """The playbook: locate-disk, free-space, download (see the module docstring)."""
        return [
            Step("locate-disk", self._check_disk, timeout_s=120.0,
                 message="no disk for the model cache", fault=Fault.HOST),
            Step("free-space", self._check_space, timeout_s=120.0,
                 message="not enough free space for the model", fault=Fault.HOST),
            Step("download", self._check_complete, self._download,
                 timeout_s=self.download_timeout_s + 60.0, fault=Fault.TRANSIENT),
        ]

    def _check_disk(self, host: Host) -> bool:
        self._missing_cache = None  # nothing carries over from an earlier run
        # Bad user values fail here, before any command ran with them.
        validate_repo(self.repo)
        validate_revision(self.revision)
        if self.layout is None:
            self.mount = find_nvme(host)
            self.layout = Layout(f"{self.mount.mount_point.rstrip('/')}/orch")
        return True

    def missing(self, host: Host) -> list[str]:
        """Files the cached model still lacks ([] = complete): one listing over SSH."""
        result = host.must(["sh", "-c", _LIST_SCRIPT, "sh", self.model_dir],
                           "listing the model cache")
        listing, _marker, index_text = result.stdout.partition(_LIST_MARKER + "\n")
        return missing_files(set(listing.splitlines()), index_text if _marker else None)

    def _missing_now(self, host: Host) -> list[str]:
        cached, self._missing_cache = self._missing_cache, None
        return cached if cached is not None else self.missing(host)

    def _check_space(self, host: Host) -> bool:
        missing = self.missing(host)
        if not missing:
            self._missing_cache = missing
            return True  # complete already: nothing to download, so no space needed
        result = host.must(["sh", "-c", _SPACE_SCRIPT, "sh", self.model_dir],
                           "measuring free space")
        lines = result.stdout.split("\n")
        avail_text, _, target = lines[0].strip().partition(" ")
        present = _int(lines[1].strip()) if len(lines) > 1 else 0
        if not avail_text.isdigit():
            raise StepFailed(f"could not read free space for {self.model_dir}: "
                             f"{last_line(result.stdout + result.stderr)}", fault=Fault.HOST,
                             stderr=result.stderr)
        avail = int(avail_text)
        need = max(0, math.ceil(self.model_bytes * self.margin) - present)
        if avail < need:
            where = _server_path(host, target.strip() or self.model_dir)
            raise StepFailed(
                f"need {gb(need)} free on {where}, have {gb(avail)} ({self.repo} is about "
                f"{gb(self.model_bytes)}, plus {round((self.margin - 1) * 100)}% headroom): "
                "free space there or pick a host with a larger disk",
                fault=Fault.HOST)
        self._missing_cache = missing
        return True

    def _check_complete(self, host: Host) -> bool:
        return not self._missing_now(host)

    def download_argv(self) -> list[str]:
        """The download command (no secret in it: the token comes from the env file)."""
        layout = self._layout()
        inside = layout.container if self.image is not None else str
        argv = [
            "env",
            f"HF_HOME={inside(self.hf_home)}",
            "HF_XET_HIGH_PERFORMANCE=1",
            # Progress bars would bury the error in the stderr tail of a failed download.
            "HF_HUB_DISABLE_PROGRESS_BARS=1",
            # hf >= 1.x asks PyPI for a newer version on each run and prints a hint.
            "HF_HUB_DISABLE_UPDATE_CHECK=1",
            "hf", "download", self.repo,
            f"--local-dir={inside(self.model_dir)}",
            # `--revision=R` as one word: a value starting with '-' can never become a flag.
            f"--revision={self.revision}",
            *(f"--exclude={pattern}" for pattern in EXCLUDE),
        ]
        if self.image is None:
            return argv
        # `-e HF_TOKEN` passes the sourced env file's value by name, never on the argv.
        token = ["-e", "HF_TOKEN"] if self.hf_token else []
        return ["docker", "run", "--rm", "--label", "orch.role=model-download",
                "-v", f"{layout.base}:{CONTAINER_ROOT}", *token, self.image, *argv]

    def _download(self, host: Host) -> None:
        env_file: str | None = None
        if self.hf_token:
            env_file = self.env_file
            # Rewritten on every download (atomically), so a rotated token takes effect.
            ssh.write_secret_env(host.conn, env_file, {"HF_TOKEN": self.hf_token})
        try:
            self._download_with(host, env_file)
        finally:
            if env_file is not None:
                # The token is needed by the download only: it does not stay on the disk.
                # (A host that stopped answering is scrubbed when the job ends.)
                with contextlib.suppress(ssh.SSHError):
                    ssh.remove_files(host.conn, [env_file],
                                     timeout=min(ssh.io_timeout(host.conn), 60.0))

    def _download_with(self, host: Host, env_file: str | None) -> None:
        argv = self.download_argv()
        if self.wrap is not None:
            argv = self.wrap(argv)

        def once() -> None:
            result = host.run(argv, timeout=self.download_timeout_s, env_file=env_file)
            if result.ok:
                return
            permanent = classify_download_error(result.stderr or result.stdout,
                                                result.exit_code, self.repo, self.revision,
                                                has_token=bool(self.hf_token))
            raise permanent if permanent is not None else DownloadFailed(result)

        # retry_wait_s × n between runs: hf resumes, so each run has less left to fetch.
        try:
            retrying.policy(DownloadFailed, attempts=self.attempts,
                            wait=retrying.steps(self.retry_wait_s, self.retry_wait_s))(once)
        except DownloadFailed as failed:
            last = failed.result
            error = last.stderr or last.stdout
            raise StepFailed(
                f"hf download of {self.repo} failed {self.attempts} times (last exit "
                f"{last.exit_code}): {last_line(error)}; hf resumes where it stopped, so "
                "retrying the job continues the download",
                fault=Fault.TRANSIENT, stderr=error) from None
        missing = self.missing(host)
        if missing:
            raise StepFailed(
                f"hf download of {self.repo} finished but the model is incomplete, missing: "
                + ", ".join(missing[:10]) + (" ..." if len(missing) > 10 else ""),
                fault=Fault.USER if _weights_missing(missing) else Fault.TRANSIENT)
        self._missing_cache = missing  # [] for the runner's re-check


def _weights_missing(missing: Sequence[str]) -> bool:
    # A finished download without weights or tokenizer means the repo does not have them
    # in a form training can load (e.g. only .bin or GGUF files).
    return any(m.startswith(("model.safetensors", "a tokenizer")) for m in missing)


def missing_files(present: set[str], index_text: str | None) -> list[str]:
    """What a model directory with files `present` (relative paths) lacks to be complete.

    `index_text` is `model.safetensors.index.json`'s content when it exists; without it a
    single `model.safetensors` must be there.
    """
    missing = []
    if "config.json" not in present:
        missing.append("config.json")
    if not any(name in present for name in TOKENIZER_FILES):
        missing.append("a tokenizer file (" + " / ".join(TOKENIZER_FILES) + ")")
    if INDEX_FILE in present and index_text:
        try:
            weight_map = json.loads(index_text)["weight_map"]
            shards = sorted({str(name) for name in weight_map.values()})
        except (ValueError, KeyError, TypeError, AttributeError):
            return [*missing, f"{INDEX_FILE} (unreadable)"]
        missing.extend(shard for shard in shards if shard not in present)
    elif SINGLE_FILE not in present:
        missing.append(f"{INDEX_FILE} or {SINGLE_FILE}")
    return missing


def steps(repo: str, revision: str, model_bytes: int, layout: Layout | None,
          hf_token: str | None, *, margin: float = MARGIN, attempts: int = DEFAULT_ATTEMPTS,
          retry_wait_s: float = DEFAULT_RETRY_WAIT_S,
          download_timeout_s: float = DEFAULT_DOWNLOAD_TIMEOUT_S) -> list[Step]:
    """The model_cache steps; use `ModelCache` directly to read `model_dir` afterwards."""
    return ModelCache(repo, revision, model_bytes, layout, hf_token, margin=margin,
                      attempts=attempts, retry_wait_s=retry_wait_s,
                      download_timeout_s=download_timeout_s).steps()
