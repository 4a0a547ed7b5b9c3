"""tests/orchfork.py runs `orch` commands as the console script does; what it relies on holds."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import orchfork
import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_orch_reads_only_the_listed_variables_when_imported() -> None:
    # The fork server imports every module before any command's environment is set: a module
    # reading e.g. ORCH_DB_URL or XDG_DATA_HOME at import would see the server's. Only the
    # READ_AT_IMPORT variables are, and a command setting one of them is not forked.
    code = textwrap.dedent("""
        import os, sys
        sys.path.insert(0, sys.argv[2])
        import orchfork
        roots = tuple(os.path.join(sys.argv[1], p) for p in orchfork.PACKAGES)
        reads = []

        class Spy(type(os.environ)):
            def __getitem__(self, key):
                # The reader: past os.getenv and the Mapping methods (get, in) that call this.
                frame = sys._getframe(1)
                while frame.f_code.co_filename.endswith(
                        ("os>", "/os.py", "_collections_abc>", "/_collections_abc.py")):
                    frame = frame.f_back
                if frame.f_code.co_filename.startswith(roots):
                    reads.append((key, frame.f_code.co_filename))
                return super().__getitem__(key)

        env = os.environ
        os.environ = Spy(env._data, env.encodekey, env.decodekey, env.encodevalue,
                         env.decodevalue)
        orchfork.import_all()  # what the fork server imports
        print(len(sys.modules), sorted({key for key, _ in reads}))
    """)
    out = subprocess.run([sys.executable, "-c", code, str(ROOT), str(ROOT / "tests")], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    count, names = out.stdout.split(" ", 1)
    assert int(count) > 500  # the walk imported the whole product
    assert names.strip() == repr(sorted(orchfork.READ_AT_IMPORT))


def test_a_command_that_sets_a_variable_read_at_import_is_not_forked() -> None:
    assert orchfork.forks(dict(os.environ))  # what the server was started with
    for name in orchfork.READ_AT_IMPORT:
        assert not orchfork.forks({**os.environ, name: "2m"})  # the console script refuses it


@pytest.mark.parametrize("bare", [False, True], ids=["environment", "PATH and HOME only"])
@pytest.mark.parametrize("args, stdin", [
    (["--help"], None),
    (["plan", "examples/qlora-8b.yml"], None),
    (["plan", "--json", "examples/nope.yml"], None),  # exit 2, one error line
    (["nosuchcommand"], None),
    (["jobs", "--json"], None),  # opens (creates) the database under the given XDG_DATA_HOME
    (["sql", "select 40 + 2 as answer"], None),
    (["servers", "trust", "nosuch"], "y\n"),  # reads no answer: no such server
])
def test_a_forked_command_says_and_exits_what_the_console_script_does(
        tmp_path: Path, args: list[str], stdin: str | None, bare: bool) -> None:
    # "PATH and HOME only" (no LANG: the C locale, which Python coerces to UTF-8 at start-up)
    # and TZ far from UTC: what a process takes from its environment when it starts.
    said = []
    for way in ("console script", "forked"):
        base = {k: os.environ[k] for k in ("PATH", "HOME")} if bare else dict(os.environ)
        env = {**base, "XDG_DATA_HOME": str(tmp_path / way), "TZ": "Asia/Tokyo"}
        env.pop("ORCH_DB_URL", None)
        if args[0] == "sql":  # it reads an existing database
            subprocess.run([orchfork.ORCH, "jobs"], env=env, cwd=ROOT, check=True,
                           capture_output=True, timeout=120)
        if way == "forked":
            said.append(orchfork.run(args, env=env, cwd=ROOT, input=stdin, timeout=120))
        else:
            said.append(subprocess.run([orchfork.ORCH, *args], env=env, cwd=ROOT, input=stdin,
                                       capture_output=True, text=True, timeout=120))
    real, forked = (subprocess.CompletedProcess(
        p.args, p.returncode, p.stdout.replace(str(tmp_path / way), "DATA"),
        p.stderr.replace(str(tmp_path / way), "DATA"))
        for p, way in zip(said, ("console script", "forked"), strict=True))
    assert (forked.returncode, forked.stdout, forked.stderr) == \
        (real.returncode, real.stdout, real.stderr)
    if args[0] == "jobs":
        assert (tmp_path / "forked" / "orch" / "orch.db").is_file()
    if args[0] == "sql":
        assert "42" in forked.stdout


def test_a_forked_command_that_runs_past_its_timeout_is_killed(tmp_path: Path) -> None:

    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path)}
    env.pop("ORCH_DB_URL", None)
    with pytest.raises(subprocess.TimeoutExpired) as raised:
        # `orch worker` on an empty queue polls until it is stopped.
        orchfork.run(["worker", "--quiet", "--poll", "0.5"], env=env, cwd=ROOT, timeout=4)
    pid = raised.value.pid  # type: ignore[attr-defined]
    for _ in range(50):
        if not Path(f"/proc/{pid}").exists():
            break
        time.sleep(0.1)
    assert not Path(f"/proc/{pid}").exists()


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130),
                                       (signal.SIGKILL, -9)])
def test_a_spawned_command_takes_signals_and_ends_as_the_console_script_does(
        tmp_path: Path, sig: int, code: int) -> None:
    """`orchfork.spawn` (a worker the test signals): the forked process's pid takes the
    signal, and it says and exits what the console script's process does."""
    said = []
    for way in ("console script", "forked"):
        env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / way)}
        env.pop("ORCH_DB_URL", None)
        if way == "forked":
            proc: Any = orchfork.spawn(["worker", "--poll", "0.2"], env=env, cwd=ROOT)
            assert isinstance(proc, orchfork.Spawned)
        else:
            # SIGINT's default handler, as a terminal gives it: a pytest started in the
            # background (`cmd &` in a script) passes SIGINT on ignored, and Python then
            # installs no KeyboardInterrupt handler, so the worker would never stop.
            proc = subprocess.Popen([orchfork.ORCH, "worker", "--poll", "0.2"], env=env,
                                    cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, preexec_fn=_default_sigint)
        try:
            first = proc.stderr.readline()  # started, and polling the empty queue
            assert "database" in first
            proc.send_signal(sig)
            out, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
        if sig != signal.SIGKILL:  # its worker id names its own pid, the one signalled
            assert f":{proc.pid}:" in first, first
        # Its first and last lines (the notes between them come as the providers are read:
        # a signal may come before or after them).
        lines = re.sub(r"worker:[^:]+:\d+:[0-9a-f]+", "WORKER", first + err).splitlines()
        said.append((proc.returncode, out, lines[0].replace(str(tmp_path / way), "DATA"),
                     lines[-1] if sig != signal.SIGKILL else ""))
    assert said[1] == said[0]
    assert said[1][0] == code
    if sig != signal.SIGKILL:
        assert said[1][3].startswith("worker stopped ("), said
