"""Where orch keeps its data (XDG), without importing anything heavy."""

from __future__ import annotations

import os
from pathlib import Path


def data_dir() -> Path:
    """$XDG_DATA_HOME/orch, by default ~/.local/share/orch."""
    xdg = os.environ.get("XDG_DATA_HOME", "").strip()
    # The XDG spec says relative values are invalid and must be ignored.
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".local" / "share"
    return base / "orch"


def default_db_url() -> str:
    """`ORCH_DB_URL` if set, else SQLite at `$XDG_DATA_HOME/orch/orch.db` (~/.local/share)."""
    url = os.environ.get("ORCH_DB_URL", "").strip()
    return url or f"sqlite:///{data_dir() / 'orch.db'}"
