"""The simulated Hub's HTTP answers (see `hub.py`): one request to `GET /api/models/...` or
`GET /api/datasets/...`.

A dataset's info carries a card with the published sizes (`cardData.dataset_info.splits`, as
`datasets`' push_to_hub writes them) of what the hosts' `hf` writes for a dataset without a
Hub (`simhost/standins/hf.py` SYNTHETIC_SPLITS): `orch plan` sizes a sim-only job's Hub dataset
from them, and a split the hosts would not have is refused before renting."""

from __future__ import annotations

import hashlib
import json
from email.message import Message
from http.server import BaseHTTPRequestHandler
from urllib.parse import unquote, urlsplit


def request_id(headers: Message) -> str:
    """The `X-Request-Id` the Hub answers a request with these headers with (the shape is the
    simulated host's `hf`'s: simhost/standins/hf.py `hub_request_id`)."""
    from simhost.standins.hf import hub_request_id

    return hub_request_id(headers.get("X-Amzn-Trace-Id"))


class Handler(BaseHTTPRequestHandler):
    """One request to the simulated Hub."""

    gated: frozenset[str] = frozenset()

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        """Answer the two model API calls the check before renting makes."""
        path = unquote(urlsplit(self.path).path)
        auth = self.headers.get("Authorization") or ""
        token = auth.removeprefix("Bearer ").strip() or None
        rest = path.removeprefix("/api/models/")
        if path.startswith("/api/datasets/"):
            self._dataset(path.removeprefix("/api/datasets/"), token)
        elif rest == path:
            self._answer(404, {"error": "Not Found"})
        elif rest.endswith("/auth-check"):
            repo = rest.removesuffix("/auth-check")
            if repo in self.gated and token is None:
                message = (f"Access to model {repo} is restricted. You must have access to it "
                           "and be authenticated to access it. Please log in.")
                self._answer(401, {"error": message}, message, "GatedRepo")
            else:
                self._answer(200, {"accessRequest": None})
        elif "/revision/" in rest:
            repo, _, revision = rest.partition("/revision/")
            sha = hashlib.sha1(f"{repo}@{revision}".encode()).hexdigest()
            self._answer(200, {"id": repo, "private": False, "disabled": False, "sha": sha,
                               "gated": "manual" if repo in self.gated else False})
        else:
            self._answer(404, {"error": "Not Found"})

    def _dataset(self, rest: str, token: str | None) -> None:
        """A dataset's info or auth-check: every dataset exists, gated as a model would be."""
        from simhost.standins.hf import SYNTHETIC_SPLITS, synthetic_rows

        if rest.endswith("/auth-check"):
            repo = rest.removesuffix("/auth-check")
            if repo in self.gated and token is None:
                message = (f"Access to dataset {repo} is restricted. You must have access to "
                           "it and be authenticated to access it. Please log in.")
                self._answer(401, {"error": message}, message, "GatedRepo")
            else:
                self._answer(200, {"accessRequest": None})
            return
        repo, _, revision = rest.partition("/revision/")
        if repo.count("/") != 1:
            self._answer(404, {"error": "Not Found"})
            return
        splits = [{"name": split, "num_examples": n, "num_bytes": sum(
            len(json.dumps(r)) + 1 for r in synthetic_rows(split, n))}
            for split, n in SYNTHETIC_SPLITS.items()]
        sha = hashlib.sha1(f"{repo}@{revision or 'main'}".encode()).hexdigest()
        self._answer(200, {"id": repo, "private": False, "disabled": False, "sha": sha,
                           "gated": "manual" if repo in self.gated else False,
                           "cardData": {"dataset_info": {"splits": splits}}})

    def _answer(self, status: int, body: object, message: str | None = None,
                code: str | None = None) -> None:
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("X-Request-Id", request_id(self.headers))
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(raw)))
        if message is not None:
            self.send_header("X-Error-Message", message)
        if code is not None:
            self.send_header("X-Error-Code", code)
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base's name
        """Quiet: a request is not worth a line on orch's stderr."""
