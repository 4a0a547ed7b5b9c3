"""Where orch keeps its data (XDG) and which database it uses."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from orchestrator.core.settings import settings


def data_dir() -> Path:
    """$XDG_DATA_HOME/orch, by default ~/.local/share/orch."""
    xdg = os.environ.get("XDG_DATA_HOME", "").strip()
    # The XDG spec says relative values are invalid and must be ignored.
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".local" / "share"
    return base / "orch"


def default_db_url() -> str:
    """`ORCH_DB_URL` if set, else SQLite at `$XDG_DATA_HOME/orch/orch.db` (~/.local/share)."""
    return settings().db_url or f"sqlite:///{data_dir() / 'orch.db'}"


def describe_db(url: str | None = None) -> str:
    """The database `url` (default: the one orch uses) for people and logs, without its
    password, and saying when it is the default file because ORCH_DB_URL is not set."""
    chosen = url or default_db_url()
    parts = urlsplit(chosen)
    if parts.password is not None:
        host = parts.netloc.rsplit("@", 1)[1]
        parts = parts._replace(netloc=f"{parts.username or ''}:***@{host}")
        chosen = urlunsplit(parts)
    if url is None and settings().db_url is None:
        return f"{chosen} (the default: ORCH_DB_URL is not set)"
    return chosen


# orch's local files hold host addresses, pinned host keys, job specs and training output:
# they are the user's alone whatever the umask (issue 23 §9).
PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


def private_dir(path: Path, *, fix: bool = True) -> Path:
    """Create `path` (and its parents) with mode 0700; with `fix`, also take group and
    other access away from an existing one (orch's own folders, made by an older orch)."""
    if not path.is_dir():
        # mkdir's mode applies to the last part only, and the umask still masks it.
        path.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR_MODE)
        path.chmod(PRIVATE_DIR_MODE)
    elif fix and _shared_and_mine(path):
        path.chmod(PRIVATE_DIR_MODE)
    return path


def _shared_and_mine(path: Path) -> bool:
    # Another user's file (a shared setup someone chose) is left as it is: not ours to change.
    st = path.stat()
    return bool(st.st_mode & 0o077) and st.st_uid == os.getuid()


def private_sqlite(path: Path) -> None:
    """The database file 0600 before SQLite opens it (SQLite then creates -wal and -shm with
    the database file's permissions), and a folder orch creates for it 0700."""
    folder = path.parent
    # orch's own data folder is made private even if an older orch created it; a folder
    # the user chose for ORCH_DB_URL is only created private, never changed.
    private_dir(folder, fix=folder == data_dir())
    for name in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        if name == path or name.exists():
            private_file(name)


def private_file(path: Path) -> Path:
    """Create `path` empty with mode 0600 if missing, else take group and other access away."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE_MODE)
    except FileExistsError:
        if _shared_and_mine(path):
            path.chmod(PRIVATE_FILE_MODE)
    else:
        os.close(fd)
        path.chmod(PRIVATE_FILE_MODE)  # the umask cannot have added bits, but may have cleared
    return path
