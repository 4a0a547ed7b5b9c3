"""Every command, given bad arguments or a bad environment, prints a one-line error and exits
with a documented code, never a traceback (issue 12 §2).

The commands are enumerated from typer's registry, so a new command is covered the day it
is added. They run in-process through CliRunner: an exception escaping a command (which
`orch` would print as a traceback) shows up as `result.exception`.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner, Result

from orchestrator.cli.app import app

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
# README's table: 0 success, 1 error, 2 invalid input, 3 nothing can run it, 4 not found.
DOCUMENTED = {0, 1, 2, 3, 4}


def commands() -> list[tuple[list[str], Any]]:
    def walk(cmd: Any, path: list[str]) -> list[tuple[list[str], Any]]:
        subs = getattr(cmd, "commands", None)
        if subs is None:
            return [(path, cmd)]
        return [found for name, sub in sorted(subs.items()) for found in walk(sub, [*path, name])]

    return walk(typer.main.get_command(app), [])


COMMANDS = commands()
IDS = [" ".join(path) for path, _ in COMMANDS]

# Values for required arguments and options, by parameter name (a new command with a new
# name gets "x": still a bad argument, which is what these tests want).
VALUES = {"file": str(EXAMPLES / "quickstart.yml"), "job_id": "j-000000000000",
          "name": "nosuch", "query": "SELECT count(*) FROM job", "host": "127.0.0.1",
          "gpu": "H100 SXM", "monthly": "2190", "kind": "job"}
# Commands that read no database: they answer from the job file, the catalogs and the
# schema, whatever ORCH_DB_URL says (`orch plan` notes a database it cannot read).
NO_DATABASE = {"models", "offers", "plan", "render", "schema"}
SWEEP_FILE = str(EXAMPLES / "sweep-lr.yml")


def base_args(path: list[str], cmd: Any) -> list[str]:
    """The command with its required parameters filled in, and never a long-running mode."""
    args = list(path)
    for p in cmd.params:
        if p.param_type_name == "argument" and p.required:
            args.append(SWEEP_FILE if path == ["sweep"] else VALUES.get(p.name, "x"))
        elif p.param_type_name == "option" and p.required:
            args += [p.opts[0], VALUES.get(p.name, "x")]
        elif p.name in ("once", "dry_run"):
            args.append(p.opts[0])  # worker --once; submit/sweep start nothing
        elif path == ["warm", "release"] and p.name == "all_parked":
            args.append(p.opts[0])  # release needs ids or --all before it opens anything
    return args


def run(tmp_path: Path, args: list[str], **env: str) -> Result:
    result = CliRunner().invoke(app, args, env={"XDG_DATA_HOME": str(tmp_path / "xdg"),
                                                "ORCH_DB_URL": None, "VAST_API_KEY": "",
                                                "RUNPOD_API_KEY": "", **env})
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"orch {' '.join(args)} raised {result.exception!r}\n{result.output}")
    assert "Traceback" not in result.output
    assert result.exit_code in DOCUMENTED, (args, result.exit_code, result.output)
    return result


def error_lines(result: Result) -> list[str]:
    return [line for line in result.output.splitlines() if line.startswith("error:")]


@pytest.mark.parametrize(("path", "cmd"), COMMANDS, ids=IDS)
def test_unknown_option_is_a_usage_error(tmp_path: Path, path: list[str], cmd: Any) -> None:
    result = run(tmp_path, [*base_args(path, cmd), "--no-such-option"])
    assert result.exit_code == 2, result.output


@pytest.mark.parametrize(("path", "cmd"), COMMANDS, ids=IDS)
def test_garbage_database_url(tmp_path: Path, path: list[str], cmd: Any) -> None:
    result = run(tmp_path, base_args(path, cmd), ORCH_DB_URL="garbage")
    if " ".join(path) in NO_DATABASE:
        assert result.exit_code == 0 and error_lines(result) == [], result.output
        if path == ["plan"]:  # it says so and plans from the catalog
            assert "ORCH_DB_URL" in result.output
        return
    # Every other command needs the database: a URL it cannot parse is invalid input.
    assert result.exit_code == 2, result.output
    lines = error_lines(result)
    assert len(lines) == 1 and "ORCH_DB_URL" in lines[0], result.output


@pytest.mark.parametrize(("path", "cmd"), COMMANDS, ids=IDS)
def test_unreachable_database_server(tmp_path: Path, path: list[str], cmd: Any) -> None:
    # Port 1 on loopback refuses connections (or psycopg is not installed: also one line).
    result = run(tmp_path, base_args(path, cmd),
                 ORCH_DB_URL="postgresql+psycopg://orch:s3cret@127.0.0.1:1/x")
    assert "s3cret" not in result.output  # the password never reaches the terminal
    if " ".join(path) in NO_DATABASE:
        assert result.exit_code == 0 and error_lines(result) == [], result.output
        return
    # A server that refuses the connection is an error (1), said in one line with the URL
    # (password masked), never as a file problem.
    assert result.exit_code == 1, result.output
    lines = error_lines(result)
    assert len(lines) == 1 and "127.0.0.1:1" in lines[0], result.output
    assert "writable file" not in lines[0], lines[0]


def _numeric_options(cmd: Any) -> list[tuple[str, type]]:
    out = []
    for p in cmd.params:
        descriptor = getattr(p, "type_descriptor", None)  # typer >= 0.29 (its own click)
        if descriptor is not None:
            kind = descriptor.annotation
            kind = next((a for a in typing.get_args(kind) if a in (int, float)), kind)
        else:  # click's parameter types
            kind = {"integer": int, "float": float}.get(getattr(p.type, "name", ""))
        if p.param_type_name == "option" and kind in (int, float):
            out.append((p.opts[0], kind))
    return out


@pytest.mark.parametrize(("path", "cmd"), COMMANDS, ids=IDS)
def test_bad_numbers_are_refused(tmp_path: Path, path: list[str], cmd: Any) -> None:
    """A number no option means (not a number, absurdly large, negative, nan, inf) is
    invalid input, refused before anything else is looked at, naming the option."""
    for opt, kind in _numeric_options(cmd):
        bad = ["abc", "9" * 25, "-1"] + (["nan", "inf"] if kind is float else [])
        for value in bad:
            result = run(tmp_path, [*base_args(path, cmd), opt, value])
            assert result.exit_code == 2, (opt, value, result.output)
            assert opt in result.output, (opt, value, result.output)


def test_jobs_with_an_unknown_status(tmp_path: Path) -> None:
    result = run(tmp_path, ["jobs", "--status", "bogus"])
    assert result.exit_code == 2
    assert error_lines(result) and "queued" in error_lines(result)[0]


def test_sql_syntax_error_is_invalid_input(tmp_path: Path) -> None:
    db = tmp_path / "xdg" / "orch" / "orch.db"
    run(tmp_path, ["jobs"])  # creates the database
    assert db.exists()
    result = run(tmp_path, ["sql", "selec 1"])
    assert result.exit_code == 2, result.output
    assert len(error_lines(result)) == 1 and "syntax" in result.output
    result = run(tmp_path, ["sql", "SELECT nosuchcolumn FROM job"])
    assert result.exit_code == 2, result.output
    with sqlite3.connect(db) as con:  # and a read-only refusal is 2 as before
        assert con.execute("SELECT count(*) FROM job").fetchone() == (0,)


def test_a_real_process_prints_no_traceback(tmp_path: Path) -> None:
    """The console script itself (main), not only the Typer app."""
    exe = Path(sys.executable).parent / "orch"
    env = {"PATH": str(exe.parent), "XDG_DATA_HOME": str(tmp_path / "xdg"),
           "HOME": str(tmp_path), "ORCH_DB_URL": "garbage"}
    proc = subprocess.run([str(exe), "jobs"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: ORCH_DB_URL")


def test_worker_poll_nan_is_refused_before_the_loop(tmp_path: Path) -> None:
    result = run(tmp_path, ["worker", "--poll", "nan", "--max-jobs", "1"])
    assert result.exit_code == 2 and "--poll" in result.output


@pytest.mark.parametrize(("path", "cmd"), COMMANDS, ids=IDS)
def test_a_file_that_is_not_a_database(tmp_path: Path, path: list[str], cmd: Any) -> None:
    db = tmp_path / "xdg" / "orch" / "orch.db"
    db.parent.mkdir(parents=True)
    db.write_text("not a database " * 100)
    result = run(tmp_path, base_args(path, cmd))
    if " ".join(path) in NO_DATABASE:
        assert result.exit_code == 0 and error_lines(result) == [], result.output
        if path == ["plan"]:  # it says so and plans from the catalog
            assert "not a database" in result.output
        return
    assert result.exit_code in (1, 2), result.output
    lines = error_lines(result)
    assert len(lines) == 1 and "not a database" in lines[0], result.output
