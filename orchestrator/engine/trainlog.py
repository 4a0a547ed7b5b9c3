"""The trainer's own output, kept on this machine so `orch logs ID --train` works after the
instance is gone.

While a job trains, the engine already reads the log's tail over SSH at every poll (that is
how it sees the step and the loss); each tail is merged here into one file per job under
the data directory, keeping the last MAX_LINES lines. Standard library only.
"""

from __future__ import annotations

import os
from pathlib import Path

from orchestrator.core.paths import PRIVATE_FILE_MODE, data_dir, private_dir

MAX_LINES = 1000


def log_path(job_id: str) -> Path:
    """Where the job's training output is kept: $XDG_DATA_HOME/orch/train-logs/ID.log."""
    return data_dir() / "train-logs" / f"{job_id}.log"


def merge(kept: list[str], tail: list[str]) -> list[str]:
    """The lines of `tail` that come after `kept`: the part past their longest overlap.

    A tail that overlaps nothing (more output than one tail between two polls, or a new
    attempt on a fresh machine) is new in whole.
    """
    for k in range(min(len(kept), len(tail)), 0, -1):
        if kept[-k:] == tail[:k]:
            return tail[k:]
    return tail


def read(job_id: str) -> list[str] | None:
    """The kept lines, or None when nothing was ever recorded for the job."""
    try:
        text = log_path(job_id).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return None
    return text.split("\n")[:-1] if text else []


def _lines(text: str) -> list[str]:
    # A progress bar redraws with \r: keep what the last redraw of each line shows.
    return [line.rsplit("\r", 1)[-1] for line in text.rstrip("\n").split("\n")] if text else []


def save(job_id: str, tail_text: str) -> None:
    """Merge one tail of the training log into the job's file (atomically replaced)."""
    tail = _lines(tail_text)
    if not tail:
        return
    kept = read(job_id) or []
    new = merge(kept, tail)
    if not new and kept:
        return
    lines = (kept + new)[-MAX_LINES:]
    path = log_path(job_id)
    # The trainer's output names hosts and paths: the user's alone, whatever the umask.
    private_dir(path.parent.parent)
    private_dir(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE_MODE)
    with open(fd, "w", encoding="utf-8") as out:
        out.write("".join(f"{line}\n" for line in lines))
    os.replace(tmp, path)
