"""Tables for the terminal (kubectl/gh style): aligned and fitted on a TTY, TSV when piped.

Kept free of rich: drawing a table must not cost `orch plan` the ~30 ms rich's import takes.
On a terminal the table fits its width: columns in `drop` go first (least important first),
then the widest columns are cut with `…`; state columns are coloured unless NO_COLOR.
Piped (not a TTY), every row is printed whole, tab-separated under a header row, so
`awk -F'\t'` fields never shift, whatever spaces a cell holds.
"""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.cli import term


def table(headers: Sequence[str], rows: Sequence[Sequence[object]],
          right: Sequence[int] = (), mark: int | None = None, drop: Sequence[int] = (),
          states: Sequence[int] = (), tty: bool | None = None,
          columns: int | None = None, colour: bool | None = None) -> str:
    """Render rows under headers; columns in `right` are right-aligned, row `mark` starred.

    `tty`/`columns`/`colour` default to stdout's; callers writing elsewhere pass them.
    """
    cells = [[str(c) for c in headers]] + [[_cell(c) for c in row] for row in rows]
    if tty is None:
        tty = term.is_tty()
    if not tty:
        return "\n".join("\t".join(row) for row in cells)
    limit = term.width() if columns is None else columns
    keep = list(range(len(headers)))
    widths = {i: max(len(r[i]) for r in cells) for i in keep}

    def total() -> int:
        return 2 + sum(widths[i] for i in keep) + 2 * (len(keep) - 1)

    for i in drop:
        if total() <= limit or len(keep) <= 1:
            break
        keep.remove(i)
    while total() > limit:
        # Cut the widest column (its header too, if need be), never below 4 characters.
        widest = max(keep, key=lambda i: widths[i])
        if widths[widest] <= 4:
            break
        widths[widest] -= 1
    if colour is None:
        colour = term.colour_enabled()
    lines = []
    for n, row in enumerate(cells):
        parts = []
        for i in keep:
            text = _cut(row[i], widths[i])
            pad = " " * (widths[i] - len(text))
            if n and i in states:  # colour the word, not the padding
                text = term.paint(text, term.state_colour(row[i]), colour)
            parts.append(pad + text if i in right else text + pad)
        prefix = "* " if mark is not None and n == mark + 1 else "  "
        lines.append((prefix + "  ".join(parts)).rstrip())
    return "\n".join(lines)


def _cell(value: object) -> str:
    # A tab or newline inside a cell would break both layouts.
    return str(value).replace("\t", " ").replace("\n", " ")


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:max(0, width - 1)] + "…"
