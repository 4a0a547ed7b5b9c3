"""Reading the files a user names (job and sweep files, config.json, datasets, eval sets).

Only regular files are read: a FIFO would block `open()` forever and /dev/zero would fill
memory, so a path is opened non-blocking and checked with fstat before a byte is read. Whole
files are read only up to a cap (a job file is a few KiB); JSONL files are streamed line by
line with a cap per line, so one enormous line cannot exhaust memory either.
"""

from __future__ import annotations

import codecs
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

MIB = 1024 * 1024
# Job and sweep files are a few KiB; a MiB is a generated file gone wrong.
MAX_SPEC_BYTES = 1 * MIB
# A Hugging Face config.json is a few KiB even for multimodal models.
MAX_CONFIG_BYTES = 4 * MIB
# One JSONL row: 16 MiB of text is ~4M tokens, past the largest sequence_len a job allows.
MAX_LINE_BYTES = 16 * MIB


class UserFileError(ValueError):
    """The path is not a regular file, is too large, or is not UTF-8 text; says which."""


def open_regular(path: Path) -> BinaryIO:
    """Open `path` for reading; UserFileError unless it is a regular file.

    FileNotFoundError (and other OSErrors) propagate for the caller's own wording.
    """
    # O_NONBLOCK: opening a FIFO with no writer returns at once instead of blocking.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = ("a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode)
                    else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                    else "a socket" if stat.S_ISSOCK(mode) else "not a file")
            raise UserFileError(f"is {kind}, not a regular file; give the path of a file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_text(path: Path, limit: int, what: str) -> str:
    """The whole file as UTF-8 text (a BOM is dropped); UserFileError past `limit` bytes."""
    with open_regular(path) as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise UserFileError(f"larger than {_size(limit)}; a {what} is far smaller, check the "
                            "path")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UserFileError(f"not UTF-8 text (byte {exc.start}); save it as UTF-8") from None


def lines(path: Path, limit: int = MAX_LINE_BYTES) -> Iterator[str]:
    """The file's lines as text (invalid UTF-8 replaced); UserFileError on a line past `limit`
    bytes. A BOM at the start is dropped: editors on Windows write one."""
    decoder = codecs.getincrementaldecoder("utf-8-sig")(errors="replace")
    with open_regular(path) as fh:
        while True:
            raw = fh.readline(limit + 1)
            if not raw:
                return
            if len(raw) > limit and not raw.endswith(b"\n"):
                raise UserFileError(f"a line is longer than {_size(limit)}; is this a JSONL "
                                    "file?")
            yield decoder.decode(raw)


def _size(n: int) -> str:
    return f"{n // MIB} MiB" if n >= MIB else f"{n:,} bytes"
