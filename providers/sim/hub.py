"""The simulated cloud's Hugging Face Hub: the model repos it gates (hub.yaml), served over
loopback HTTP with the answers of the Hub's API that orch reads before renting.

Its hosts' `hf` stand-in refuses a gated repo without a token (SimHostOptions
`hf_gated_repos`, set from here unless a test sets its own), and `serve` answers for the
same repos what huggingface.co answers (huggingface_hub 1.17.0 `hf_api.py` `model_info`,
`auth_check`; `utils/_http.py` reads the `X-Error-Code` header), so the engine asks it over
HTTP exactly as it asks the real Hub (orchestrator/engine/hubaccess.py) and refuses a gated
model in huggingface_hub's words:

- `GET /api/models/{repo}/revision/{rev}`: the repo's info (every repo and revision exists
  here: the hosts' stand-in makes up any model), `gated: "manual"` for a gated one;
- `GET /api/models/{repo}/auth-check`: 200, or for a gated repo asked without a token 401
  with `X-Error-Code: GatedRepo`. `sim` has no accounts: any token has accepted every gate.
Anything else is a 404 (it holds no files and takes no uploads).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from providers.datacache import read_yaml

if TYPE_CHECKING:
    from http.server import ThreadingHTTPServer

_DATA = Path(__file__).resolve().parent / "hub.yaml"
_SERVERS: dict[tuple[str, ...], ThreadingHTTPServer] = {}
_LOCK = threading.Lock()


@cache
def gated_repos() -> tuple[str, ...]:
    """The model repos the simulated Hub gates."""
    return tuple(str(r) for r in read_yaml(_DATA)["gated"])


def serve(gated: Sequence[str]) -> str:
    """The base URL of this process's simulated Hub gating `gated` (started when first
    asked for, on a free 127.0.0.1 port; one per gate list, for the process's life)."""
    # Imported here: `orch plan` reads this module (the gates), never the server.
    from http.server import ThreadingHTTPServer

    from providers.sim.hubserver import Handler

    key = tuple(sorted(gated))
    with _LOCK:
        server = _SERVERS.get(key)
        if server is None:
            handler = type("Handler", (Handler,), {"gated": frozenset(key)})
            server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
            server.daemon_threads = True
            threading.Thread(target=server.serve_forever, name="sim-hub", daemon=True).start()
            _SERVERS[key] = server
    host, port = server.server_address[:2]
    return f"http://{host!s}:{port}"
