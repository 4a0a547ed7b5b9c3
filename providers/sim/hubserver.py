"""The simulated Hub's HTTP answers (see `hub.py`): one request to `GET /api/models/...`."""

from __future__ import annotations

import hashlib
import json
from http.server import BaseHTTPRequestHandler
from urllib.parse import unquote, urlsplit


class Handler(BaseHTTPRequestHandler):
    """One request to the simulated Hub."""

    gated: frozenset[str] = frozenset()

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        """Answer the two model API calls the check before renting makes."""
        path = unquote(urlsplit(self.path).path)
        auth = self.headers.get("Authorization") or ""
        token = auth.removeprefix("Bearer ").strip() or None
        rest = path.removeprefix("/api/models/")
        if rest == path:
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

    def _answer(self, status: int, body: object, message: str | None = None,
                code: str | None = None) -> None:
        raw = json.dumps(body).encode()
        self.send_response(status)
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
