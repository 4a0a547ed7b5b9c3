#!/usr/bin/env python3
"""Rewrite providers/catalog/snapshot.yaml from SkyPilot's published catalogs of Vast.ai and
RunPod (github.com/skypilot-org/skypilot-catalog, `catalogs/<version>/{vast,runpod}/vms.csv`).

Reads a local checkout (the commit and its date come from git), files, or URLs; every row
of the snapshot names its source file, commit and date. Nothing is fetched unless a URL is
given. The columns each file must have, and what orch takes from them, are in
providers/catalog/skypilot.py.

    git clone --depth 1 https://github.com/skypilot-org/skypilot-catalog /tmp/sky
    .venv/bin/python scripts/refresh_catalog.py --catalog /tmp/sky
    .venv/bin/python scripts/refresh_catalog.py --vast vast.csv --runpod runpod.csv \\
        --commit 0123abc... --date 2026-12-06
    .venv/bin/python scripts/refresh_catalog.py \\
        --vast https://raw.githubusercontent.com/skypilot-org/skypilot-catalog/<commit>/catalogs/v8/vast/vms.csv

A file outside a git checkout is cited with --commit (or the commit in its URL) and dated
--date, or today (UTC) as the day it was retrieved.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from providers.catalog import skypilot  # noqa: E402 - after the path above

OUT = ROOT / "providers" / "catalog" / "snapshot.yaml"
DIRS = {"vastai": "vast", "runpod": "runpod"}  # SkyPilot's folder per orch provider
_RAW = re.compile(r"^https://raw\.githubusercontent\.com/skypilot-org/skypilot-catalog/"
                  r"(?P<ref>[^/]+)/(?P<path>.+)$")
_HASH = re.compile(r"^[0-9a-f]{40}$")
_DAY = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def _git(cwd: Path, *args: str) -> str:
    proc = subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True,
                          check=False)
    return proc.stdout.strip() if proc.returncode == 0 else ""


def read(src: str, provider: str, args: argparse.Namespace) -> tuple[str, skypilot.Source]:
    """The text of `src` (a path or URL) and where it came from."""
    path_in_repo = f"catalogs/{args.version}/{DIRS[provider]}/vms.csv"
    commit = getattr(args, f"{provider}_commit") or args.commit or ""
    date, date_is = args.date, "retrieved"
    m = _RAW.match(src)
    if src.startswith(("http://", "https://")):
        import httpx

        try:
            resp = httpx.get(src, timeout=60, follow_redirects=True)
            resp.raise_for_status()
        except httpx.HTTPError as exc:
            fail(f"{src}: {exc}")
        text = resp.text
        if m is not None:
            path_in_repo = m["path"]
            commit = commit or (m["ref"] if _HASH.match(m["ref"]) else "")
    else:
        file = Path(src)
        if not file.is_file():
            fail(f"{src}: no such file")
        text = file.read_text(encoding="utf-8")
        top = _git(file.parent, "rev-parse", "--show-toplevel")
        if top and not commit:
            path_in_repo = file.resolve().relative_to(Path(top).resolve()).as_posix()
            log = _git(Path(top), "log", "-1", "--format=%H %cs", "--", path_in_repo).split()
            if len(log) == 2:
                commit, date, date_is = log[0], date or log[1], "committed"
    if commit and not _HASH.match(commit):
        fail(f"--commit {commit!r}: a full 40-hex commit hash")
    today = datetime.now(UTC).strftime("%Y-%m-%d")
    return text, skypilot.Source(provider, path_in_repo, commit, date or today, date_is)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--catalog", help="a checkout of skypilot-org/skypilot-catalog")
    p.add_argument("--version", default="v8", help="catalog schema folder (default v8)")
    p.add_argument("--vast", help="Vast.ai vms.csv: a path or URL")
    p.add_argument("--runpod", help="RunPod vms.csv: a path or URL")
    p.add_argument("--commit", help="the catalog commit the files are from (both)")
    p.add_argument("--vastai-commit", dest="vastai_commit", help="the Vast file's commit")
    p.add_argument("--runpod-commit", dest="runpod_commit", help="the RunPod file's commit")
    p.add_argument("--date", help="YYYY-MM-DD the files are of (default: the commit's date "
                   "in a checkout, else today as the day retrieved)")
    p.add_argument("--note", action="append", default=[], metavar="PROVIDER=TEXT",
                   help="a note kept in the snapshot beside that provider's rows")
    p.add_argument("--out", default=str(OUT), help=f"where to write (default {OUT})")
    args = p.parse_args(argv)
    if args.date is not None and not _DAY.match(args.date):
        fail(f"--date {args.date!r}: YYYY-MM-DD")
    if args.catalog:
        base = Path(args.catalog) / "catalogs" / args.version
        args.vast = args.vast or str(base / "vast" / "vms.csv")
        args.runpod = args.runpod or str(base / "runpod" / "vms.csv")
    if not (args.vast and args.runpod):
        fail("give --catalog CHECKOUT, or both --vast and --runpod (paths or URLs)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    notes = {}
    for note in args.note:
        provider, sep, text = note.partition("=")
        if not sep or provider not in DIRS:
            fail(f"--note {note!r}: PROVIDER=TEXT with PROVIDER one of {', '.join(DIRS)}")
        notes[provider] = text
    parts = []
    for provider, src, parse in (("vastai", args.vast, skypilot.vast),
                                 ("runpod", args.runpod, skypilot.runpod)):
        text, source = read(src, provider, args)
        try:
            parsed = parse(text, source.path)
        except skypilot.SourceError as exc:
            fail(f"{src}: {exc}")
        if not parsed.rows:
            fail(f"{src}: no row of a GPU orch plans; not rewriting {args.out}")
        parts.append((source, parsed, notes.get(provider)))
        print(f"{provider}: {len(parsed.rows)} rows from {source.cite} ({source.date_is} "
              f"{source.date})")
        for why, n in sorted(parsed.skipped.items()):
            print(f"  left out {n}: {why}")
    Path(args.out).write_text(skypilot.render(parts), encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
