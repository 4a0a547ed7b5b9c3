"""The secret files orch scrubs from a kept server are named once (`playbooks.secrets`
`SECRET_NAMES`): the shell script that deletes them is generated from that list, and the
list names every env file a playbook writes a token to (issue 37 §2)."""

from __future__ import annotations

import ast
import fnmatch
import re
import shlex
import subprocess
from pathlib import Path

from playbooks import secrets

ROOT = Path(__file__).resolve().parent.parent


def test_the_scrub_script_deletes_exactly_the_listed_names() -> None:
    words = shlex.split(secrets._SCRUB.split("find", 1)[1].split("-print")[0])
    names = [words[i + 1] for i, w in enumerate(words) if w == "-name"]
    assert names == list(secrets.SECRET_NAMES)


def test_the_script_run_by_a_real_shell_removes_secrets_and_nothing_else(
        tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    kept = [jobs / "j-1" / "train.jsonl", jobs / "j-1" / "secrets.env.bak", tmp_path / "x"]
    gone = [tmp_path / "secrets" / "hf.env", jobs / "j-1" / "secrets.env",
            jobs / "j-1" / "upload.env", jobs / "j-1" / ".upload.env.1a2b3c4d.tmp"]
    for path in kept + gone:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("HF_TOKEN=x\n")
    out = subprocess.run(["sh", "-c", secrets._SCRUB, "sh", str(tmp_path / "secrets"),
                          str(jobs)], capture_output=True, text=True, check=True).stdout
    assert sorted(out.split()) == sorted(str(p) for p in gone)
    assert [p for p in kept if p.exists()] == kept


def _env_files_written() -> set[str]:
    """Basenames of every `*.env` path a playbook spells (a string or an f-string's end)."""
    found: set[str] = set()
    for path in (ROOT / "playbooks").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.update(re.findall(r"(?:^|/)([\w.-]+\.env)$", node.value))
    return found - {"rp_environment"}


def test_every_env_file_a_playbook_writes_is_scrubbed() -> None:
    assert _env_files_written() == set(secrets.SECRET_FILES)
    # ssh.write_secret_env writes through `.<name>.<8 hex>.tmp`: a leftover one matches.
    source = (ROOT / "playbooks" / "ssh" / "secret_env.py").read_text()
    assert 'f".{target.name}.{uuid.uuid4().hex[:8]}.tmp"' in source
    for name in secrets.SECRET_FILES:
        assert any(fnmatch.fnmatch(f".{name}.0123abcd.tmp", p) for p in secrets.SECRET_NAMES)
