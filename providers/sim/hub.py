"""The simulated cloud's Hugging Face Hub: which model repos it gates (hub.yaml).

Its hosts' `hf` stand-in refuses a gated repo without a token (SimHostOptions
`hf_gated_repos`, set from here unless a test sets its own), and `refusal` answers what the
Hub's API answers for the same repo, so the engine's check before renting refuses a sim job
with huggingface_hub 1.17.0's words, as it refuses a real one (orchestrator/engine/hubaccess).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from pathlib import Path

import yaml

_DATA = Path(__file__).resolve().parent / "hub.yaml"


@cache
def gated_repos() -> tuple[str, ...]:
    """The model repos the simulated Hub gates."""
    return tuple(str(r) for r in yaml.safe_load(_DATA.read_text())["gated"])


def refusal(repo: str, token: str | None, gated: Sequence[str] | None = None) -> str | None:
    """What `hf` prints when the Hub's API refuses `repo` to `token` (None: it may download),
    as for `GET /api/models/{repo}/auth-check` (huggingface_hub 1.17.0 `cli/_errors.py`)."""
    if repo in (gated_repos() if gated is None else gated) and not token:
        return f"Error: Access denied. Model '{repo}' requires approval."
    return None
