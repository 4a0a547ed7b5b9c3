"""Plain aligned-column tables for the terminal (kubectl/docker style).

Kept free of rich: drawing a table must not cost `orch plan` the ~30 ms rich's import takes,
and plain columns are easy to read in CI logs and to cut with awk.
"""

from __future__ import annotations

from collections.abc import Sequence


def table(headers: Sequence[str], rows: Sequence[Sequence[object]],
          right: Sequence[int] = (), mark: int | None = None) -> str:
    """Render rows under headers; columns in `right` are right-aligned, row `mark` starred."""
    cells = [[str(c) for c in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for n, row in enumerate(cells):
        parts = [c.rjust(w) if i in right else c.ljust(w)
                 for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        prefix = "* " if mark is not None and n == mark + 1 else "  "
        lines.append((prefix + "  ".join(parts)).rstrip())
    return "\n".join(lines)
