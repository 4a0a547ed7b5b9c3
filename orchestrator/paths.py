"""Where orch keeps its data (XDG), without importing anything heavy."""

from __future__ import annotations

import os
from pathlib import Path


def data_dir() -> Path:
    """$XDG_DATA_HOME/orch, by default ~/.local/share/orch."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "orch"


def default_db_url() -> str:
    """ORCH_DB_URL if set, else the SQLite file in the data dir."""
    return os.environ.get("ORCH_DB_URL") or f"sqlite:///{data_dir() / 'orch.db'}"
