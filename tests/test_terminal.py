"""Terminal conventions, with `orch` run as a real process on a pseudo-terminal or a pipe:
--version, -h everywhere, completion, gh-style help, the live status line, tables that fit
the terminal (TSV when piped), one timestamp format, state colours and NO_COLOR.

Two real jobs run on the simulated cloud (a real sshd on loopback), from a real terminal
80 columns wide and one 40 wide; the other tests read the history they leave.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import orchfork
import pytest
import typer.main
from termutil import ROOT, orch_exe, run_tty, visible, widest

TZ = "Asia/Tokyo"  # not UTC, so a time printed in UTC by mistake shows
HUMAN = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d JST")


def piped(env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = orchfork.run(list(args), env=env, cwd=ROOT, timeout=120)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    # Training slow enough, and polled often enough, that several losses are recorded.
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path_factory.mktemp("xdg")), "TZ": TZ,
           "ORCH_SIM_TRAIN_STEPS": "10", "ORCH_SIM_STEP_S": "0.3", "ORCH_POLL_S": "0.1"}
    for name in ("ORCH_DB_URL", "NO_COLOR", "COLUMNS"):
        env.pop(name, None)
    runs = {}
    for cols in (80, 40):
        code, out = run_tty(env, "submit", "examples/quickstart.yml", cols=cols)
        assert code == 0, out
        runs[cols] = out
    jobs = json.loads(piped(env, "jobs", "--json").stdout)
    return {"env": env, "runs": runs, "ids": [j["job_id"] for j in jobs]}


def _commands() -> list[list[str]]:
    from orchestrator.cli.app import app

    root = typer.main.get_command(app)
    found = [[]]
    for name, cmd in root.commands.items():  # type: ignore[attr-defined]
        found.append([name])
        found += [[name, sub] for sub in getattr(cmd, "commands", {})]
    return found


def test_version() -> None:
    from importlib.metadata import version

    from orchestrator.cli.app import DISTRIBUTION

    proc = piped(dict(os.environ), "--version")
    assert proc.stdout.strip() == f"orch {version(DISTRIBUTION)}"


@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_every_command_takes_h_and_help_without_type_labels(flag: str) -> None:
    env = {**os.environ, "COLUMNS": "100"}
    commands = _commands()
    assert ["servers", "add"] in commands and ["history"] in commands
    for cmd in commands:
        proc = piped(env, *cmd, flag)
        assert "Usage: orch" in proc.stdout, (cmd, proc.stdout)
        # gh style: a flag shows no `<bool>`; an option says what it takes, in plain words.
        assert "<bool>" not in proc.stdout and "<int>" not in proc.stdout, (cmd, proc.stdout)
    assert re.search(r"--limit\s+int\s", piped(env, "jobs", flag).stdout)


def test_shell_completion_is_on() -> None:
    env = {**os.environ, "_ORCH_COMPLETE": "complete_bash", "COMP_WORDS": "orch hist",
           "COMP_CWORD": "1"}
    assert piped(env).stdout.split() == ["history"]
    help_text = piped({**os.environ, "COLUMNS": "120"}, "--help").stdout
    assert "--install-completion" in help_text and "--show-completion" in help_text


@pytest.mark.parametrize("cols", [80, 40])
def test_submit_status_line_redraws_in_place(history: dict[str, Any], cols: int) -> None:
    out = history["runs"][cols]
    head, _, rest = out.partition("\n")
    live, _, summary = rest.partition("\n")
    assert head.startswith("j-") and "queued" in head
    # Every refresh returns to the line's start and erases the rest: no new line per refresh,
    # and no refresh as wide as the terminal (it would wrap and could not be redrawn).
    redraws = [part for part in live.split("\r") if part]
    assert len(redraws) > 5, out
    assert all(part.endswith("\x1b[K") for part in redraws)
    assert max(len(visible(part)) for part in redraws) <= cols - 1
    assert visible(redraws[-1]).startswith("succeeded")
    assert summary.startswith("j-") and "succeeded" in summary


def test_submit_piped_prints_one_line_per_event(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path)}
    env.pop("ORCH_DB_URL", None)
    proc = piped(env, "submit", "examples/quickstart.yml")
    assert "\r" not in proc.stderr and "\x1b[" not in proc.stderr + proc.stdout
    lines = proc.stderr.splitlines()
    assert len(lines) > 5 and all(re.match(r"\[\s*\d+\.\ds\] \w", line) for line in lines)


@pytest.mark.parametrize("cols", [80, 60])
@pytest.mark.parametrize("args", [["jobs"], ["history"], ["plan", "examples/qlora-8b.yml"],
                                  ["show", "FIRST"], ["sweeps"]])
def test_tables_fit_the_terminal(history: dict[str, Any], args: list[str], cols: int) -> None:
    args = [history["ids"][0] if a == "FIRST" else a for a in args]
    code, out = run_tty(history["env"], *args, cols=cols)
    assert code == 0, out
    assert widest(out) <= cols, out


def test_piped_tables_keep_full_rows_tab_separated(history: dict[str, Any]) -> None:
    env = {**history["env"], "COLUMNS": "40"}  # a narrow terminal must not cut piped rows
    lines = piped(env, "jobs").stdout.splitlines()
    assert lines[0].split("\t") == ["id", "name", "status", "method", "placement", "est. h",
                                    "est. cost", "cost", "created", "worker", "lease"]
    rows = [line.split("\t") for line in lines[1:]]
    assert sorted(r[0] for r in rows) == sorted(history["ids"])
    # Finished jobs: no worker holds them, no lease runs.
    assert all(len(r) == 11 and r[4] == "sim RTX 3090 x1" and "…" not in "".join(r)
               and r[9] == "-" for r in rows), rows
    history_rows = piped(env, "history").stdout.splitlines()
    assert all(len(line.split("\t")) == 11 for line in history_rows)


def test_one_timestamp_format_everywhere(history: dict[str, Any]) -> None:
    env, job_id = history["env"], history["ids"][0]
    created = json.loads(piped(env, "jobs", "--json").stdout)[0]["created_at"]
    # --json: UTC ISO-8601; people: local time with its zone, the same form in every command.
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", created)
    local = datetime.fromisoformat(created).astimezone(ZoneInfo(TZ)).strftime(
        "%Y-%m-%d %H:%M:%S JST")
    for args in (["jobs"], ["history"], ["show", job_id], ["logs", job_id]):
        out = piped(env, *args).stdout
        stamps = HUMAN.findall(out)
        assert stamps, (args, out)
        assert not re.search(r"\d\d:\d\d:\d\dZ|\+00:00|UTC", out), (args, out)
    assert local in piped(env, "jobs").stdout
    shown = json.loads(piped(env, "show", job_id, "--json").stdout)
    assert shown["created_at"].endswith("Z")
    assert all(e["at"].endswith("Z") for e in shown["events"])


def test_state_colours_on_a_terminal_only(history: dict[str, Any]) -> None:
    env = history["env"]
    _, out = run_tty(env, "jobs", cols=120)
    assert "\x1b[32msucceeded" in out
    _, plain = run_tty({**env, "NO_COLOR": "1"}, "jobs", cols=120)
    assert "\x1b[" not in plain and "succeeded" in plain
    assert "\x1b[" not in piped(env, "jobs").stdout


def test_show_draws_the_loss_curve(history: dict[str, Any]) -> None:
    job_id = history["ids"][0]
    code, out = run_tty(history["env"], "show", job_id, cols=60)
    assert code == 0
    text = visible(out)
    assert "train loss:" in text
    line = next(ln for ln in text.splitlines() if set(ln.strip()) <= set("▁▂▃▄▅▆▇█") and
                ln.strip())
    assert 2 <= len(line.strip()) <= 58
    # The loss falls in the simulated training: the curve starts high and ends low.
    assert line.strip()[0] > line.strip()[-1]


def test_logs_train_shows_the_trainers_output_after_the_instance_is_gone(
        history: dict[str, Any]) -> None:
    env, job_id = history["env"], history["ids"][0]
    out = piped(env, "logs", job_id, "--train").stdout
    assert "{'loss':" in out and "Training completed" in out
    # orch's own events are not in it; they are what plain `orch logs` shows.
    assert "provisioning" not in out
    lines = [json.loads(line) for line in piped(env, "logs", job_id, "--train", "--json")
             .stdout.splitlines()]
    assert lines and all(d["job_id"] == job_id for d in lines)
    # -f on a finished job prints what there is and returns.
    assert piped(env, "logs", job_id, "--train", "-f").stdout == out


def test_logs_train_follows_a_running_job(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path), "ORCH_SIM_TRAIN_STEPS": "12",
           "ORCH_SIM_STEP_S": "0.4", "ORCH_POLL_S": "0.1"}
    env.pop("ORCH_DB_URL", None)
    submit = subprocess.Popen([orch_exe(), "submit", "examples/quickstart.yml", "--json"],
                              env=env, cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)
    try:
        deadline = time.monotonic() + 120
        job: dict[str, Any] = {}
        while time.monotonic() < deadline:  # wait for the condition, not for a time
            found = json.loads(piped(env, "jobs", "--json").stdout)
            if found and found[0]["status"] in ("training", "merging", "evaluating",
                                                "releasing", "succeeded"):
                job = found[0]
                break
            time.sleep(0.2)
        assert job.get("status") == "training", job  # caught while training runs
        follow = piped(env, "logs", job["job_id"], "--train", "-f").stdout
    finally:
        submit.wait(timeout=120)
    assert "Training completed" in follow and follow.count("{'loss':") == 12
    checkpoints = re.findall(r"checkpoint-(\d+)\n", follow)
    assert checkpoints == [str(n) for n in range(1, 13)]  # each line once, in order
