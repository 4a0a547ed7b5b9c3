"""Copy a job's results from the GPU host to a local directory, verified and idempotent.

What is copied: everything in the job's output directory on the host (the adapter's
`adapter_model.safetensors` and `adapter_config.json`, or a full fine-tune's weights,
tokenizer files, trainer logs), and `merged/` only when asked. Never copied: `checkpoint-*`
directories (they stay on the volume/NVMe for resume), axolotl's `prepared/` dataset cache,
hidden files and directories (temporary `.part`/`.incomplete` files, caches), and symlinks
(a link could point anywhere on the host).

Every file is listed with `find -printf` (NUL-separated, so names with spaces, quotes or
newlines survive), hashed with `sha256sum` on the host, copied over SFTP, and verified by
size and sha256 locally. A file already present locally with the same checksum is not copied
again. `manifest.json` in the local directory lists every file with its size and sha256.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from playbooks import ssh
from providers import retrying

from .base import Fault, Host, StepFailed, last_line

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
MERGED = "merged"
# Top-level directories of the output dir that are never results.
_NEVER_TOP = ("prepared",)
_HASH_BATCH = 100  # files per sha256sum call (keeps the command line short)
_HASH_TIMEOUT_S = 3600.0  # merged shards are many GB


@dataclass(frozen=True)
class RemoteFile:
    """A file in the job's output directory: path relative to it, size, sha256."""

    path: str
    size: int
    sha256: str


@dataclass
class FetchResult:
    """What `fetch` did."""

    local_dir: Path
    files: list[RemoteFile] = field(default_factory=list)  # everything in the manifest
    copied: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # already present with the same sha256
    manifest: Path | None = None


def _find_argv(include_merged: bool) -> list[str]:
    """`find` over the output dir (run after cd), pruning what is never copied."""
    prune = ["-name", ".*", "-o", "-name", "*checkpoint-*"]
    for name in _NEVER_TOP if include_merged else (*_NEVER_TOP, MERGED):
        prune += ["-o", "-path", f"./{name}"]
    # Paths are relative (`-printf %P`): the remote dir's own name never reaches a pattern.
    return ["find", ".", "-mindepth", "1", "(", "-type", "d", "(", *prune, ")", ")",
            "-prune", "-o", "-type", "f", "!", "-name", ".*", "-printf", "%s %P\\0"]


def _in_dir(remote_dir: str, argv: Sequence[str]) -> list[str]:
    # cd first, so every path is relative and `remote_dir` is a positional parameter.
    return ["sh", "-c", 'cd "$1" && shift && exec "$@"', "sh", remote_dir, *argv]


def list_remote(host: Host, remote_dir: str, include_merged: bool) -> list[tuple[str, int]]:
    """(relative path, size) of every file `fetch` copies, sorted by path."""
    result = host.run(_in_dir(remote_dir, _find_argv(include_merged)))
    if not result.ok:
        raise StepFailed(f"listing {remote_dir} on the host failed: "
                         f"{last_line(result.stderr)}", fault=Fault.HOST, stderr=result.stderr)
    files: list[tuple[str, int]] = []
    for entry in filter(None, result.stdout.split("\0")):
        size, _, rel = entry.partition(" ")
        _check_relative(rel)
        files.append((rel, int(size)))
    return sorted(files)


def _check_relative(rel: str) -> None:
    parts = PurePosixPath(rel).parts
    if not parts or rel.startswith("/") or ".." in parts:
        raise StepFailed(f"unexpected path from the host: {rel!r}", fault=Fault.HOST)


def remote_sha256(host: Host, remote_dir: str, paths: Sequence[str]) -> dict[str, str]:
    """sha256 of each relative path, computed on the host with `sha256sum`."""
    sums: dict[str, str] = {}
    for start in range(0, len(paths), _HASH_BATCH):
        batch = list(paths[start:start + _HASH_BATCH])
        # `./` keeps a name starting with '-' from being read as an option.
        result = host.run(_in_dir(remote_dir, ["sha256sum", "--", *(f"./{p}" for p in batch)]),
                          timeout=_HASH_TIMEOUT_S)
        if not result.ok:
            raise StepFailed(f"sha256sum in {remote_dir} failed: {last_line(result.stderr)}",
                             fault=Fault.HOST, stderr=result.stderr)
        # One line per file, in argument order. A name with '\' or a newline is escaped and
        # the line starts with '\'; the digest is the first 64 characters either way.
        lines = result.stdout.split("\n")[:len(batch)]
        if len(lines) != len(batch):
            raise StepFailed(f"sha256sum in {remote_dir}: expected {len(batch)} lines, got "
                             f"{len(lines)}", fault=Fault.HOST)
        for rel, line in zip(batch, lines, strict=True):
            digest = line.removeprefix("\\")[:64]
            if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
                raise StepFailed(f"sha256sum: unexpected line {line[:100]!r}", fault=Fault.HOST)
            sums[rel] = digest
    return sums


def local_sha256(path: Path) -> str:
    """sha256 of a local file."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _same(path: Path, want: RemoteFile) -> bool:
    try:
        if not path.is_file() or path.is_symlink() or path.stat().st_size != want.size:
            return False
    except OSError:
        return False
    return local_sha256(path) == want.sha256


def fetch(host: Host, remote_dir: str, local_dir: str | Path, include_merged: bool = False,
          *, attempts: int = 2) -> FetchResult:
    """Copy the job's output files (and `merged/` when asked) to `local_dir`, verified.

    Idempotent: files present with the right sha256 are skipped, so a second fetch copies
    nothing. A copy that arrives with the wrong size or checksum is fetched again, up to
    `attempts` times, then fails (TRANSIENT). Writes `manifest.json` last.
    """
    remote_dir = remote_dir.rstrip("/") or "/"
    if not host.run(["test", "-d", remote_dir]).ok:
        raise StepFailed(f"no output directory {remote_dir} on the host: nothing to fetch",
                         fault=Fault.HOST)
    target = Path(local_dir)
    listed = list_remote(host, remote_dir, include_merged)
    # Our manifest lives at the top of local_dir: a host file of that name would clash.
    if any(rel == MANIFEST for rel, _ in listed):
        log.warning("not fetching %s/%s: the local manifest uses that name", remote_dir, MANIFEST)
        listed = [(rel, size) for rel, size in listed if rel != MANIFEST]
    if include_merged and not any(rel.startswith(f"{MERGED}/") for rel, _ in listed):
        log.warning("%s has no %s/ directory (a full fine-tune is not merged)", remote_dir,
                    MERGED)
    sums = remote_sha256(host, remote_dir, [rel for rel, _ in listed])
    result = FetchResult(target, [RemoteFile(rel, size, sums[rel]) for rel, size in listed])
    target.mkdir(parents=True, exist_ok=True)
    for item in result.files:
        local = target.joinpath(*PurePosixPath(item.path).parts)
        if _same(local, item):
            result.skipped.append(item.path)
            continue
        _copy(host, f"{remote_dir}/{item.path}", local, item, attempts)
        result.copied.append(item.path)
    result.manifest = write_manifest(target, remote_dir, result.files)
    log.info("fetched %s: %d copied, %d already present", remote_dir, len(result.copied),
             len(result.skipped))
    return result


def _copy(host: Host, remote: str, local: Path, want: RemoteFile, attempts: int) -> None:
    local.parent.mkdir(parents=True, exist_ok=True)
    if local.is_symlink() or local.is_dir():
        raise StepFailed(f"{local} exists and is not a regular file: move it away",
                         fault=Fault.USER)

    def once() -> None:
        try:
            ssh.get_file(host.conn, remote, local)
        except ssh.ConnectionLost:
            raise  # the connection is gone: the engine reconnects, not this loop
        except ssh.SSHError as exc:
            raise _CopyFailed(str(exc)) from exc
        size = local.stat().st_size
        if size != want.size:
            raise _CopyFailed(f"size {size}, expected {want.size}")
        if (digest := local_sha256(local)) != want.sha256:
            raise _CopyFailed(f"sha256 {digest}, expected {want.sha256}")

    # At once again: a short read or a torn file is not a busy server to wait out.
    try:
        retrying.policy(_CopyFailed, attempts=max(1, attempts),
                        wait=retrying.steps(0.0, 0.0))(once)
    except _CopyFailed as exc:
        raise StepFailed(f"copying {remote} to {local} failed: {exc}",
                         fault=Fault.TRANSIENT) from None


class _CopyFailed(Exception):
    """One copy that failed or arrived different from the host's file (worth another)."""


def write_manifest(local_dir: Path, remote_dir: str, files: Sequence[RemoteFile]) -> Path:
    """Write `manifest.json` (source dir; each file's path, size, sha256) atomically."""
    path = local_dir / MANIFEST
    body = {
        "source": remote_dir,
        "files": [{"path": f.path, "size": f.size, "sha256": f.sha256}
                  for f in sorted(files, key=lambda f: f.path)],
    }
    text = json.dumps(body, indent=2, ensure_ascii=False) + "\n"
    if path.is_file() and path.read_text(encoding="utf-8") == text:
        return path  # unchanged: leave the file (and its mtime) alone
    tmp = path.with_name(f".{MANIFEST}.{os.getpid()}.part")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path


def read_manifest(local_dir: str | Path) -> list[RemoteFile]:
    """The files recorded by the last fetch into `local_dir`."""
    body = json.loads((Path(local_dir) / MANIFEST).read_text(encoding="utf-8"))
    return [RemoteFile(f["path"], int(f["size"]), f["sha256"]) for f in body["files"]]
