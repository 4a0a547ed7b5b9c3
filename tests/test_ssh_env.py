"""playbooks.ssh.env: numbers from the environment.

The ssh package's place as a leaf (it imports only the retry policy) and the playbooks'
place below the orchestrator core are enforced with every other layer in tests/test_layers.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from playbooks.ssh.env import EnvNumberError, env_float

ROOT = Path(__file__).resolve().parent.parent


def test_env_float_reads_the_number_or_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ORCH_TEST_S", raising=False)
    assert env_float("ORCH_TEST_S", 7.0) == 7.0
    monkeypatch.setenv("ORCH_TEST_S", "  ")
    assert env_float("ORCH_TEST_S", 7.0) == 7.0
    monkeypatch.setenv("ORCH_TEST_S", " 2.5 ")
    assert env_float("ORCH_TEST_S", 7.0) == 2.5
    monkeypatch.setenv("ORCH_TEST_S", "0")
    assert env_float("ORCH_TEST_S", 7.0, positive=False) == 0.0


@pytest.mark.parametrize(("raw", "says"), [
    ("ten", "'ten' is not a number"),
    ("nan", "'nan' is not a finite number"),
    ("inf", "'inf' is not a finite number"),
    ("0", "must be > 0 (got 0)"),
    ("-3", "must be > 0 (got -3)"),
])
def test_env_float_names_the_variable_and_the_fix(
    monkeypatch: pytest.MonkeyPatch, raw: str, says: str
) -> None:
    monkeypatch.setenv("ORCH_TEST_S", raw)
    with pytest.raises(EnvNumberError) as caught:
        env_float("ORCH_TEST_S", 7.0)
    assert "ORCH_TEST_S" in str(caught.value)
    assert says in str(caught.value)
    assert "ORCH_TEST_S=7" in str(caught.value)  # the fix: an example value


@pytest.mark.parametrize("name", ["ORCH_SSH_IO_TIMEOUT_S", "ORCH_SSH_COMMAND_TIMEOUT_S"])
def test_a_bad_ssh_timeout_is_reported_by_name(name: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", "from playbooks import ssh; ssh.run; ssh.read_file"],
        cwd=ROOT, env={"PATH": "/usr/bin:/bin", name: "2m"}, capture_output=True, text=True,
    )
    assert done.returncode != 0
    assert f"{name}='2m' is not a number" in done.stderr


def test_the_env_parser_loads_without_paramiko() -> None:
    code = ("import sys, playbooks.ssh.env; "
            "print([m for m in ('paramiko', 'fabric', 'invoke') if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, check=True)
    assert done.stdout.strip() == "[]"
