"""docs/team.md as pasted: its env file, cron lines and systemd unit, run as cron and systemd
would run them (issue 25, item 1).

The documented paths are mapped into the test's folder (/etc/orch/env, /var/log/orch,
/srv/sweeps/lr.yml) or onto this checkout (/opt/orch); everything else is the documented text.
The cron lines run under `/bin/sh -c` with cron's environment (PATH=/usr/bin:/bin, HOME of the
user), the unit's ExecStart with the environment systemd's EnvironmentFile= rules give.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import orchfork
import pytest

ROOT = Path(__file__).resolve().parent.parent
TEAM = ROOT / "docs" / "team.md"
VENV_BIN = Path(sys.executable).parent
# Cron's default PATH (Debian's cron(8)): no /usr/local/bin, no venv.
CRON_PATH = "/usr/bin:/bin"


def blocks(lang: str) -> list[str]:
    """The fenced blocks of docs/team.md in `lang`."""
    return re.findall(rf"^```{lang}\n(.*?)^```", TEAM.read_text(), flags=re.S | re.M)


def env_file_text() -> str:
    found = [b for b in blocks("sh") if b.startswith("# /etc/orch/env")]
    assert len(found) == 1, "docs/team.md shows the env file /etc/orch/env once"
    return found[0]


def systemd_env(text: str) -> dict[str, str]:
    """KEY=value lines as systemd's EnvironmentFile= reads them (systemd.exec(5)): lines
    starting with # or ; are comments; nothing after a value is a comment."""
    env = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        key, _, value = line.partition("=")
        env[key.strip()] = value.strip()
    return env


def test_env_file_reads_the_same_in_sh_and_systemd() -> None:
    text = env_file_text()
    by_systemd = systemd_env(text)
    assert "ORCH_DB_URL" in by_systemd
    probe = "; ".join(f'printf "%s=%s\\n" {k} "${k}"' for k in by_systemd)
    out = subprocess.run(["/bin/sh", "-c", f"set -a; . /dev/stdin; set +a; {probe}"],
                         input=text, capture_output=True, text=True, check=True,
                         env={"PATH": CRON_PATH}).stdout
    by_sh = dict(line.split("=", 1) for line in out.splitlines())
    assert by_sh == by_systemd


@pytest.fixture
def team(tmp_path: Path, pg_server: object) -> dict[str, object]:
    """A throwaway PostgreSQL database as the team's, the documented env file pointing at it
    (secrets for real providers left out: no test talks to them), and the sim sweep as
    /srv/sweeps/lr.yml."""
    url = str(pg_server.create_database())  # type: ignore[attr-defined]
    lines = []
    for line in env_file_text().splitlines():
        key = line.partition("=")[0]
        if key == "ORCH_DB_URL":
            lines.append(f"ORCH_DB_URL={url}")
        elif key in ("VAST_API_KEY", "RUNPOD_API_KEY", "HF_TOKEN"):
            continue
        else:
            lines.append(line)
    env_file = tmp_path / "etc" / "env"
    env_file.parent.mkdir()
    env_file.write_text("\n".join(lines) + "\n")
    sweeps = tmp_path / "sweeps"
    shutil.copytree(ROOT / "examples", sweeps)
    shutil.copy(sweeps / "sweep-sim.yml", sweeps / "lr.yml")
    home = tmp_path / "home"
    home.mkdir()
    (tmp_path / "log").mkdir()
    return {"url": url, "tmp": tmp_path, "home": home,
            "paths": {"/etc/orch/env": str(env_file), "/opt/orch": str(ROOT),
                      "/srv/sweeps/lr.yml": str(sweeps / "lr.yml"),
                      "/var/log/orch": str(tmp_path / "log")}}


def mapped(text: str, paths: dict[str, str]) -> str:
    for doc, here in paths.items():
        text = text.replace(doc, here)
    return text


def cron_commands() -> list[str]:
    """The command part of each line of the documented /etc/cron.d file (after the five time
    fields and the user)."""
    (block,) = blocks("cron")
    return [line.split(None, 6)[6] for line in block.splitlines() if line.strip()]


def test_cron_lines_as_pasted_use_the_team_database(team: dict[str, object]) -> None:
    sweep_line, reconcile_line = cron_commands()
    paths = team["paths"]
    assert isinstance(paths, dict)
    env = {"PATH": CRON_PATH, "HOME": str(team["home"]), "SHELL": "/bin/sh", "LOGNAME": "orch"}
    first = subprocess.run(["/bin/sh", "-c", mapped(sweep_line, paths)], env=env,
                           capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    assert "4 new" in first.stdout
    assert f"database: {team['url']}" in first.stdout
    # Nothing went to the private SQLite file under HOME.
    assert not (Path(str(team["home"])) / ".local" / "share" / "orch" / "orch.db").exists()
    import psycopg

    with psycopg.connect(str(team["url"]).replace("postgresql+psycopg", "postgresql")) as db:
        (queued,) = db.execute("SELECT count(*) FROM job WHERE sweep_id IS NOT NULL").fetchone()
    assert queued == 4
    again = subprocess.run(["/bin/sh", "-c", mapped(sweep_line, paths)], env=env,
                           capture_output=True, text=True, timeout=120)
    assert (again.returncode, again.stdout) == (0, "")  # --quiet: an idle tick prints nothing
    for _ in range(2):
        rec = subprocess.run(["/bin/sh", "-c", mapped(reconcile_line, paths)], env=env,
                             capture_output=True, text=True, timeout=120)
        assert rec.returncode == 0, rec.stderr
    log = Path(paths["/var/log/orch"]) / "reconcile.jsonl"
    objects = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(objects) == 2 and all(o["database"] == team["url"] for o in objects)


def unit_service() -> dict[str, str]:
    """The [Service] section of the documented unit, each line checked as systemd reads it."""
    (block,) = blocks("ini")
    section, service = "", {}
    for line in block.splitlines():
        if not line.strip() or line.lstrip()[0] in "#;":
            continue
        if line.startswith("["):
            section = line.strip()
            continue
        key, _, value = line.partition("=")
        # systemd takes everything after `=` as the value: a `#` there is no comment.
        assert "#" not in value, f"{line!r}: systemd would pass the `#...` on as the value"
        if section == "[Service]":
            service[key.strip()] = value.strip()
    return service


def test_unit_as_pasted_starts_a_worker_naming_its_database(team: dict[str, object]) -> None:
    service = unit_service()
    paths = team["paths"]
    assert isinstance(paths, dict)
    assert service["EnvironmentFile"] == "/etc/orch/env"
    argv = shlex.split(mapped(service["ExecStart"], paths))
    assert Path(argv[0]).is_absolute() and os.access(argv[0], os.X_OK), argv[0]
    env = {"PATH": CRON_PATH, "HOME": str(team["home"]),
           **systemd_env(Path(paths["/etc/orch/env"]).read_text())}
    proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True,
                            stdout=subprocess.DEVNULL)
    try:
        assert proc.stderr is not None
        banner = proc.stderr.readline()
        assert f"database {team['url']}" in banner, banner
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def run_orch(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return orchfork.run(list(args), env=env, timeout=120, cwd=ROOT)


@pytest.mark.parametrize("value", ["", "  "])
def test_empty_orch_db_url_is_an_error(tmp_path: Path, value: str) -> None:
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "ORCH_DB_URL": value}
    for args in (["jobs"], ["sweep", "examples/sweep-sim.yml"],
                 ["plan", "examples/quickstart.yml"]):
        proc = run_orch(env, *args)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert proc.stderr.startswith(f"error: ORCH_DB_URL={value!r}: must be a database URL"), \
            proc.stderr
    assert not (tmp_path / ".local").exists()


def test_default_database_is_named_with_why(tmp_path: Path) -> None:
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    proc = run_orch(env, "reconcile", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    db = tmp_path / ".local" / "share" / "orch" / "orch.db"
    assert f"database: sqlite:///{db} (the default: ORCH_DB_URL is not set)" in proc.stdout
    sqlite3.connect(db).close()


def test_password_is_never_shown(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "ORCH_DB_URL": url}
    out = json.loads(run_orch(env, "reconcile", "--json").stdout)
    assert out["database"] == url
    from orchestrator.core.paths import describe_db

    assert describe_db("postgresql+psycopg://orch:s3cret@db:5432/orch") == \
        "postgresql+psycopg://orch:***@db:5432/orch"


# --- issue 36 §6: the set-up commands run as pasted on a root machine ------------------------


def setup_blocks() -> dict[str, list[str]]:
    """The command lines of the sh blocks of sections 1 (the database) and 2 (each machine)
    and the checks after the env file, by section."""
    text = TEAM.read_text()
    found = {}
    for key, start, end in (("database", "## 1. The database", "## 2."),
                            ("machine", "## 2. Each machine", "`/etc/orch/env` holds"),
                            ("check", "Check the set-up as the services", "An empty")):
        part = text[text.index(start):text.index(end, text.index(start))]
        (block,) = re.findall(r"^```sh\n(.*?)^```", part, flags=re.S | re.M)
        found[key] = [ln for ln in block.splitlines() if ln.strip() and not ln.startswith("#")]
    return found


def test_setup_commands_need_no_sudo_and_start_what_they_use() -> None:
    blocks = setup_blocks()
    for key, lines in blocks.items():
        syntax = subprocess.run(["sh", "-n"], input="\n".join(lines), text=True,
                                capture_output=True)
        assert syntax.returncode == 0, (key, syntax.stderr)
        assert not [ln for ln in lines if re.search(r"(^|[;&|]\s*)sudo\b", ln)], key
    database = blocks["database"]
    started = next(i for i, ln in enumerate(database) if ln.startswith("service postgresql start"))
    assert started < next(i for i, ln in enumerate(database) if "createuser" in ln)
    machine = " ".join(blocks["machine"])
    assert machine.index("ORCH_REPO=") < machine.index('"$ORCH_REPO"')
    assert "/usr/bin/python3 -m venv /opt/orch/.venv" in machine
    assert "'/opt/orch[postgres,report]'" in machine
    # The check runs as the account, with its own HOME (a login shell), not root's.
    assert all(ln.startswith("runuser -l orch -c '") for ln in blocks["check"])


def test_the_service_account_can_run_sim_jobs() -> None:
    """The doc's `orch` account has a login shell the simulated hosts' sshd can run commands
    with (a nologin one made every `sim` job fail: the product now says so)."""
    import pwd

    from simhost.host import login_shell_problem

    (useradd,) = [ln for ln in setup_blocks()["machine"] if ln.startswith("useradd ")]
    argv = shlex.split(useradd)
    shell, home = argv[argv.index("--shell") + 1], argv[argv.index("--home-dir") + 1]
    assert argv[-1] == "orch" and "--system" in argv
    entry = pwd.struct_passwd(("orch", "x", 999, 999, "", home, shell))
    assert login_shell_problem(entry) is None, login_shell_problem(entry)


def test_clone_and_venv_as_pasted_give_the_account_a_venv_it_can_run(tmp_path: Path) -> None:
    """`ORCH_REPO` defaults to the checkout the commands are run in; the venv is made from
    the system Python, whose files every account may read (one made from a pyenv or uv
    Python under /root does not start for the `orch` account)."""
    lines = setup_blocks()["machine"]
    steps = [ln for ln in lines if ln.startswith(("ORCH_REPO=", "git clone"))]
    venv = next(ln for ln in lines if "-m venv" in ln).split(" && ")[0]
    script = "\n".join([*steps, venv]).replace("/opt/orch", str(tmp_path / "opt-orch"))
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    done = subprocess.run(["sh", "-ec", script], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "opt-orch" / "pyproject.toml").is_file()
    python = (tmp_path / "opt-orch" / ".venv" / "bin" / "python").resolve()
    assert not str(python).startswith("/root/")
    assert python.stat().st_mode & 0o005 == 0o005, f"{python}: others may not run it"
    for folder in python.parents:
        assert folder.stat().st_mode & 0o001, f"{folder}: others may not enter it"
    # The extras the doc installs exist.
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert {"postgres", "report"} <= set(extras)
