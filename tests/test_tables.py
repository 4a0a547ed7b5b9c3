"""Pure pieces of the terminal output (orchestrator/cli/tables.py tables, term, trainlog)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from orchestrator.cli import term
from orchestrator.cli.tables import table
from orchestrator.engine import trainlog

HEADERS = ["id", "name", "status", "placement", "est. cost", "created"]
ROWS = [["j-3f9a0c1b2d4e", "llama31-8b-alpaca-qlora-long-name", "succeeded",
         "vastai H100 SXM x8", "$12.3400", "2026-12-03 08:17:44 CET"],
        ["j-000000000001", "q", "failed", "sim RTX 3090 x1", "$0.0065",
         "2026-12-03 08:17:45 CET"]]


@pytest.mark.parametrize("columns", [120, 80, 60, 40, 30])
def test_tty_table_fits_and_drops_columns_by_priority(columns: int) -> None:
    out = table(HEADERS, ROWS, right=[4], drop=[5, 4], states=[2], tty=True, columns=columns,
                colour=False)
    lines = out.splitlines()
    assert max(len(ln) for ln in lines) <= columns
    header = lines[0].split()
    if columns >= 120:
        assert "created" in header and "…" not in out
    if columns <= 80:
        assert "created" not in header  # dropped first
    if columns <= 60:
        assert "est." not in header
    assert lines[1].split()[0] == "j-3f9a0c1b2d4e" or lines[1].split()[0].endswith("…")


def test_piped_table_is_tsv_with_full_rows() -> None:
    out = table(HEADERS, ROWS, drop=[5, 4], tty=False, columns=20)
    assert out.splitlines() == ["\t".join(HEADERS), *("\t".join(r) for r in ROWS)]
    assert table(["a"], [["x\ty\nz"]], tty=False).splitlines()[1] == "x y z"


def test_states_coloured_only_when_enabled() -> None:
    out = table(HEADERS, ROWS, states=[2], tty=True, columns=200, colour=True)
    assert "\x1b[32msucceeded" in out and "\x1b[31mfailed" in out
    # Padding is outside the colour, so columns stay aligned.
    assert "\x1b[31mfailed\x1b[0m    " in out
    assert "\x1b[" not in table(HEADERS, ROWS, states=[2], tty=True, columns=200, colour=False)


def test_no_color_and_dumb_terminals(monkeypatch: pytest.MonkeyPatch) -> None:
    class Tty:
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    assert term.colour_enabled(Tty())  # type: ignore[arg-type]
    monkeypatch.setenv("NO_COLOR", "1")
    assert not term.colour_enabled(Tty())  # type: ignore[arg-type]
    monkeypatch.delenv("NO_COLOR")
    monkeypatch.setenv("TERM", "dumb")
    assert not term.colour_enabled(Tty())  # type: ignore[arg-type]


def test_times() -> None:
    t = datetime(2026, 12, 3, 7, 17, 44, 123456, tzinfo=UTC)
    assert term.iso_utc(t) == "2026-12-03T07:17:44.123456Z"
    assert term.iso_utc(t.replace(tzinfo=None)) == "2026-12-03T07:17:44.123456Z"
    assert term.human_time(None) == "-"
    assert term.human_time(t) == t.astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")


def test_sparkline() -> None:
    assert term.sparkline([], 10) == ""
    assert term.sparkline([3.0, 2.0, 1.0], 10) == "█▅▁"
    assert len(term.sparkline([float(i) for i in range(1000)], 40)) == 40
    assert term.sparkline([1.0, float("nan"), 1.0], 5) == "▄▄"


def test_trainlog_merge_keeps_each_line_once() -> None:
    assert trainlog.merge([], ["a", "b"]) == ["a", "b"]
    assert trainlog.merge(["a", "b", "c"], ["b", "c", "d", "e"]) == ["d", "e"]
    assert trainlog.merge(["a", "b", "c"], ["b", "c"]) == []
    assert trainlog.merge(["a", "b"], ["x", "y"]) == ["x", "y"]  # no overlap: all new


def test_trainlog_save_and_read(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert trainlog.read("j-1") is None
    trainlog.save("j-1", "one\ntwo\n")
    trainlog.save("j-1", "two\nthree\r 50%\rthree 100%\n")
    assert trainlog.read("j-1") == ["one", "two", "three 100%"]
    monkeypatch.setattr(trainlog, "MAX_LINES", 2)
    trainlog.save("j-1", "three 100%\nfour\n")
    assert trainlog.read("j-1") == ["three 100%", "four"]
