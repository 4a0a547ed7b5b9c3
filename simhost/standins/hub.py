"""huggingface.co as the simulated hosts reach it over HTTP (`curl`), beside `hf`'s own.

`GET https://huggingface.co/{repo}/resolve/{revision}/{file}` answers what the Hub answers
(tests/emulators/hub.py follows the real Hub's codes): a missing repo is a 401 without a
token and a 404 with one, a gated repo's files a 401 without a token, a wrong token a 401,
a missing revision or file a 404. The files are `hf`'s (standins/hf.py `repo_files`), so a
shard is as large as the model says; a ranged GET (`Range: bytes=A-B`) returns that many
bytes, at the host's `download_bytes_per_second` (a 10 Gbit/s link when it sets none). The
body is only as real as the file's content: a large shard's bytes beyond its tiny real
content are counted and timed, not produced. `hub_unreachable` hosts cannot resolve the name.
"""

from __future__ import annotations

import re
import time

from .common import Host
from .hf import repo_files

HUB_HOST = "huggingface.co"
# What a ranged GET of a large file reaches when the host sets no speed (10 Gbit/s).
DEFAULT_BPS = 1.25e9
_RESOLVE = re.compile(r"^https://huggingface\.co/(?P<repo>[^/]+/[^/]+)/resolve/"
                      r"(?P<rev>[^/]+)/(?P<file>.+)$")
_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


class Answer:
    """One HTTP answer: status, the real body bytes, how many bytes it stands for, and how
    many of them arrived before the client's `--max-time` (None: all)."""

    __slots__ = ("status", "body", "size", "received")

    def __init__(self, status: int, body: bytes, size: int | None = None,
                 received: int | None = None) -> None:
        self.status, self.body = status, body
        self.size = len(body) if size is None else size
        self.received = received


def is_hub(url: str) -> bool:
    """Whether `url` is on huggingface.co."""
    return re.match(rf"^https?://{re.escape(HUB_HOST)}(/|$)", url) is not None


def _refusal(host: Host, repo: str, revision: str, token: str | None) -> Answer | None:
    opts = host.options
    if opts["hf_token"] is not None and token is not None and token != opts["hf_token"]:
        return Answer(401, b'{"error":"Invalid credentials in Authorization header"}')
    if repo in opts["hf_repos_not_found"]:
        return Answer(404 if token else 401, b'{"error":"Repository not found"}')
    if revision in opts["hf_revisions_not_found"]:
        return Answer(404, f'{{"error":"Invalid rev id: {revision}"}}'.encode())
    if repo in opts["hf_gated_repos"] and token is None:
        return Answer(401, f'{{"error":"Access to model {repo} is restricted. You must have '
                      'access to it and be authenticated to access it. Please log in."}'
                      .encode())
    return None


def get(host: Host, url: str, headers: dict[str, str], max_time: float) -> Answer:
    """The Hub's answer to `GET url` with `headers` (Authorization, Range), after the time
    the transfer takes on this host, or after `max_time` with what arrived by then."""
    found = _RESOLVE.match(url)
    if found is None:
        return Answer(404, b'{"error":"Not found"}')
    auth = headers.get("Authorization", "")
    token = auth[len("Bearer "):] if auth.startswith("Bearer ") else None
    refused = _refusal(host, found["repo"], found["rev"], token)
    if refused is not None:
        return refused
    files = {name: (content, logical) for name, content, logical in repo_files(host, found["repo"])}
    if found["file"] not in files:
        return Answer(404, b'{"error":"Entry not found"}')
    content, logical = files[found["file"]]
    status, start, end = 200, 0, logical - 1
    wanted = _RANGE.match(headers.get("Range", ""))
    if wanted is not None:
        status, start = 206, int(wanted[1])
        end = min(logical - 1, int(wanted[2])) if wanted[2] else logical - 1
        if start >= logical:
            return Answer(416, b"")
    size = end - start + 1
    speed = float(host.options.get("download_bytes_per_second") or DEFAULT_BPS)
    if size / speed > max_time:
        time.sleep(max_time)
        return Answer(status, b"", size, int(speed * max_time))
    time.sleep(size / speed)
    return Answer(status, content[start:end + 1], size)
