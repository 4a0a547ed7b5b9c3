"""orch's settings: one model for every ORCH_* variable, one reader, one error form, exit 2.

The variables are read by orchestrator/core/settings.py only; the SSH layer gets its timeouts
from the engine (through ConnectionFactory) and is tested here against a real sshd.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import orchfork
import pytest

from orchestrator.core import settings as settings_module
from orchestrator.core.settings import Settings, SettingsError, env_name, settings

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("orchestrator", "providers", "playbooks", "simhost")


def _env_reads(tree: ast.AST) -> list[tuple[int, ast.expr | None]]:
    """(line, key) of each os.environ[...] / os.environ.get(...) / os.getenv(...) in `tree`."""
    found: list[tuple[int, ast.expr | None]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ":
            found.append((node.lineno, node.slice))
        elif isinstance(node, ast.Call) and ast.unparse(node.func) in (
                "os.environ.get", "os.getenv", "os.environ.pop", "os.environ.setdefault"):
            found.append((node.lineno, node.args[0] if node.args else None))
    return found


def orch_env_readers(root: Path) -> list[str]:
    """Reads of an ORCH_ variable outside the settings module: a key spelled ORCH_..., or any
    key that is not a constant in a module that names an ORCH_ variable."""
    bad = []
    for pkg in PRODUCT:
        for path in sorted((root / pkg).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel == "orchestrator/core/settings.py":
                continue
            text = path.read_text()
            for line, key in _env_reads(ast.parse(text)):
                spelled = ast.unparse(key) if key is not None else ""
                constant = isinstance(key, ast.Constant)
                if "ORCH_" in spelled or (not constant and "ORCH_" in text):
                    bad.append(f"{rel}:{line}: {spelled}")
    return bad


def test_no_module_but_the_settings_reads_an_orch_variable() -> None:
    assert orch_env_readers(ROOT) == []


def test_the_check_finds_a_reader(tmp_path: Path) -> None:
    (tmp_path / "orchestrator").mkdir()
    (tmp_path / "orchestrator" / "a.py").write_text(
        "import os\nx = os.environ.get('ORCH_LEASE_S')\n")
    (tmp_path / "orchestrator" / "b.py").write_text(
        "import os\n# ORCH_STALL_<PHASE>_S\ndef f(name):\n    return os.environ[name]\n")
    (tmp_path / "orchestrator" / "c.py").write_text("import os\nh = os.getenv('HOME')\n")
    assert orch_env_readers(tmp_path) == ["orchestrator/a.py:2: 'ORCH_LEASE_S'",
                                          "orchestrator/b.py:4: name"]


def test_every_orch_name_the_product_spells_is_a_setting() -> None:
    names = {env_name(f) for f in Settings.model_fields}
    assert len(names) == 37  # 27; issue 39: +3; issue 40: +2; issue 41: +5
    spelled = set()
    for pkg in PRODUCT:
        for path in (ROOT / pkg).rglob("*.py"):
            spelled |= set(re.findall(r"\bORCH_[A-Z0-9_]*", path.read_text()))
    unknown = {s for s in spelled if s not in names
               and not (s.endswith("_") and any(n.startswith(s) for n in names))}
    assert unknown == set()


@pytest.mark.parametrize(("name", "value", "says"), [
    ("ORCH_LEASE_S", "abc", "ORCH_LEASE_S='abc': must be a number of seconds > 0; unset it "
                            "for the default 60 (15 for jobs on the simulated cloud)"),
    ("ORCH_LEASE_S", "0", "ORCH_LEASE_S='0': must be a number of seconds > 0;"),
    ("ORCH_HOST_CHECKS", "maybe", "ORCH_HOST_CHECKS='maybe': must be on or off"),
    ("ORCH_SIM_MARKET", "bad=2", "ORCH_SIM_MARKET='bad=2': must be key=value pairs"),
    ("ORCH_POLL_S", "inf", "ORCH_POLL_S='inf': must be a number of seconds > 0;"),
    ("ORCH_STALL_TRAINING_S", "nan", "ORCH_STALL_TRAINING_S='nan': must be a number of "
                                     "seconds > 0; unset it for the default 7200 (2 h)"),
    ("ORCH_IDLE_GRACE_S", "-1", "ORCH_IDLE_GRACE_S='-1': must be a number of seconds >= 0; "
                                "unset it for the default 600"),
    ("ORCH_SQL_MAX_ROWS", "lots", "ORCH_SQL_MAX_ROWS='lots': must be a whole number of rows "
                                  "> 0; unset it for the default 10000"),
    ("ORCH_DB_LOCK_WAIT_S", "soon", "ORCH_DB_LOCK_WAIT_S='soon': must be a number of seconds "
                                    "> 0; unset it for the default 300"),
    ("ORCH_SSH_IO_TIMEOUT_S", "2m", "ORCH_SSH_IO_TIMEOUT_S='2m': must be a number of seconds "
                                    "> 0; unset it for the default 120"),
    ("ORCH_SIM_CAPACITY", "RTX 3090", "ORCH_SIM_CAPACITY='RTX 3090': must be GPU=COUNT pairs"),
    ("ORCH_SIM_DOWNLOAD_BPS", "fast", "ORCH_SIM_DOWNLOAD_BPS='fast': must be a number of bytes "
                                      "per second > 0;"),
    ("ORCH_DB_URL", " ", "ORCH_DB_URL=' ': must be a database URL, e.g. postgresql+psycopg://"),
    ("ORCH_NOTIFY_URL", "ftp://x/hook", "ORCH_NOTIFY_URL='ftp://x/hook': must be an http(s) URL"),
    ("ORCH_NOTIFY_SECRET_ENV", "MY-SECRET", "ORCH_NOTIFY_SECRET_ENV='MY-SECRET': must be an "
                                            "environment variable's name"),
])
def test_a_bad_value_is_named_in_one_form(monkeypatch: pytest.MonkeyPatch, name: str,
                                          value: str, says: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError) as caught:
        settings()
    assert str(caught.value).startswith(says)
    assert "\n" not in str(caught.value)


def test_every_bad_variable_gets_its_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCH_LEASE_S", "x")
    monkeypatch.setenv("ORCH_SQL_TIMEOUT_S", "-2")
    with pytest.raises(SettingsError) as caught:
        settings()
    assert [line.split("=")[0] for line in str(caught.value).splitlines()] == [
        "ORCH_SQL_TIMEOUT_S", "ORCH_LEASE_S"]


def test_values_blank_is_unset_and_exact_names_only(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.upper().startswith("ORCH_")]:
        monkeypatch.delenv(name)
    defaults = settings()
    assert (defaults.db_url, defaults.lease_s, defaults.db_lock_wait_s,
            defaults.sql_max_rows, defaults.debug) == (None, None, 300.0, 10_000, False)
    monkeypatch.setenv("ORCH_LEASE_S", " 2.5 ")
    monkeypatch.setenv("ORCH_SQL_MAX_ROWS", "  ")  # blank: the default
    monkeypatch.setenv("orch_poll_s", "7")  # not orch's spelling: not read
    monkeypatch.setenv("ORCH_DEBUG", "0")  # any text turns it on, as before
    monkeypatch.setenv("ORCH_SIM_CAPACITY", "RTX 3090=0, H100 PCIe=2")
    monkeypatch.setenv("ORCH_STALL_MERGING_S", "90")
    chosen = settings()
    assert (chosen.lease_s, chosen.sql_max_rows, chosen.poll_s, chosen.debug) == (
        2.5, 10_000, None, True)
    assert chosen.sim_capacity_by_gpu() == {"RTX 3090": 0, "H100 PCIe": 2}
    assert chosen.stall_deadlines() == {"merging": 90.0}


def test_pydantic_settings_reads_the_environment_where_there_is_something_to_read() -> None:
    # Its import is a sixth of `orch plan`'s start-up; with no ORCH_* variable set, the
    # model's own (validated) defaults are the settings.
    code = ("import sys; from orchestrator.core.settings import settings; s = settings(); "
            "print('pydantic_settings' in sys.modules, s.lease_s, type(s).__name__)")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    for extra, says in (({}, "False None Settings"),
                        ({"ORCH_LEASE_S": "7"}, "True 7.0 FromEnvironment")):
        done = subprocess.run([sys.executable, "-c", code], env={**clean, **extra}, cwd=ROOT,
                              capture_output=True, text=True, timeout=120, check=True)
        assert done.stdout.strip() == says


def test_the_defaults_are_what_pydantic_settings_reads_from_an_empty_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("ORCH_")]:
        monkeypatch.delenv(name)
    read = settings_module._from_environment()()
    assert isinstance(read, Settings)

    def typed(s: Settings) -> dict[str, tuple[type, object]]:
        return {k: (type(v), v) for k, v in s.model_dump().items()}
    assert typed(settings()) == typed(read)
    assert type(settings()) is Settings


def test_read_once_and_again_only_after_a_change(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCH_LEASE_S", "3")
    first = settings()
    assert settings() is first
    monkeypatch.setenv("PATH_UNRELATED_TO_ORCH", "x")
    assert settings() is first
    monkeypatch.setenv("ORCH_LEASE_S", "4")
    assert settings() is not first and settings().lease_s == 4.0


def test_documented_defaults_are_the_ones_in_force() -> None:
    from orchestrator.engine import recovery
    from orchestrator.engine.runner_core import Options
    from orchestrator.engine.watchdog import DEFAULT_DEADLINES_S
    from orchestrator.records.store.database import LOCK_WAIT_S
    from playbooks.ssh import limits

    extra = {n: f.json_schema_extra for n, f in Settings.model_fields.items()}

    def says(field: str) -> str:
        info = extra[field]
        assert isinstance(info, dict)
        return str(info["default_text"])

    plain = Options()
    for field in ("poll_s", "watch_s", "lease_s", "boot_deadline_s"):
        assert says(field).split()[0] == f"{getattr(plain, field):g}", field
    quick = settings_module.ENGINE_DEFAULTS
    assert "(0.5 " in quick["poll_s"] and "(0.5 " in quick["watch_s"]
    assert "(15 " in quick["lease_s"]  # cli/jobs.py engine_options(quick=True)
    assert says("idle_grace_s") == f"{recovery.IDLE_GRACE_S:g}"
    for phase, seconds in DEFAULT_DEADLINES_S.items():
        assert says(f"stall_{phase}_s").split()[0] == f"{seconds:g}", phase
    assert Settings.model_fields["db_lock_wait_s"].default == LOCK_WAIT_S
    assert Settings.model_fields["ssh_command_timeout_s"].default == limits.COMMAND_TIMEOUT_S
    assert Settings.model_fields["ssh_io_timeout_s"].default == limits.IO_TIMEOUT_S


def test_the_settings_page_is_generated_from_the_model() -> None:
    spec = importlib.util.spec_from_file_location("settings_doc",
                                                  ROOT / "scripts" / "settings_doc.py")
    assert spec is not None and spec.loader is not None
    doc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(doc)
    assert (ROOT / "docs" / "settings.md").read_text() == doc.render(), (
        "docs/settings.md is stale: run `python scripts/settings_doc.py --write`")
    for name in Settings.model_fields:
        assert f"| `{env_name(name)}` |" in doc.render()


@pytest.mark.parametrize("args", [
    ["jobs"], ["plan", "examples/quickstart.yml"], ["sql", "select 1"], ["reconcile"],
    ["servers", "list"], ["history"], ["sweeps"], ["worker", "--once"],
])
def test_any_command_exits_2_on_a_bad_setting(tmp_path: Path, args: list[str]) -> None:
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "ORCH_LEASE_S": "abc",
           "ORCH_SSH_IO_TIMEOUT_S": "2m"}
    done = orchfork.run(args, env=env, cwd=ROOT, timeout=120)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.splitlines() == [
        "error: ORCH_LEASE_S='abc': must be a number of seconds > 0; unset it for the default "
        "60 (15 for jobs on the simulated cloud)",
        "error: ORCH_SSH_IO_TIMEOUT_S='2m': must be a number of seconds > 0; unset it for the "
        "default 120"]
    assert done.stdout == ""
    assert not (tmp_path / ".local").exists()  # nothing was created


def test_help_needs_no_settings(tmp_path: Path) -> None:
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "ORCH_LEASE_S": "abc"}
    done = orchfork.run(["jobs", "--help"], env=env, cwd=ROOT, timeout=120)
    assert done.returncode == 0 and "List jobs" in done.stdout


def test_the_factory_hands_its_timeouts_to_commands_and_sftp(simhost, ssh_keypair) -> None:  # noqa: ANN001
    from playbooks.ssh import CommandTimeout, ConnectionFactory, command_timeout, io_timeout, run

    host = simhost()
    with ConnectionFactory(ssh_keypair.private, connect_timeout=5, connect_deadline=10,
                           command_timeout_s=0.5, io_timeout_s=7.0) as factory:
        conn = factory.connect(host.host, host.port, host.user, host.host_key)
        assert (command_timeout(conn), io_timeout(conn)) == (0.5, 7.0)
        started = time.monotonic()
        with pytest.raises(CommandTimeout, match="within 0.5s"):
            run(conn, ["sleep", "10"], timeout=None)  # the caller gives none: the factory's
        assert time.monotonic() - started < 9
        assert run(conn, ["true"], timeout=30).ok  # and the connection is still usable
    with ConnectionFactory(ssh_keypair.private, connect_timeout=5, connect_deadline=10) as plain:
        conn = plain.connect(host.host, host.port, host.user, host.host_key)
        assert (command_timeout(conn), io_timeout(conn)) == (3600.0, 120.0)


def test_the_defaults_taken_unvalidated_are_what_validation_gives() -> None:
    """A process with no ORCH_* variable takes `defaults()` (no validator built): the same
    value and type, field by field, as `Settings()` validated."""
    taken, validated = settings_module.defaults(), Settings()
    assert list(Settings.model_fields) and taken == validated
    for name in Settings.model_fields:
        got, want = getattr(taken, name), getattr(validated, name)
        assert (type(got), got) == (type(want), want), name


def test_no_orch_variable_takes_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in [k for k in os.environ if k.startswith("ORCH_")]:
        monkeypatch.delenv(key)
    assert settings() == settings_module.defaults()
    monkeypatch.setenv("ORCH_LEASE_S", "90")
    assert settings().lease_s == 90.0
