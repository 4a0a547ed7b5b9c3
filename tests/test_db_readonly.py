"""A role or user that may only read the database gets one line saying so from the commands
that record (issue 36 §6: `orch submit` printed "internal error (ProgrammingError ...)" with
the SQL, `orch sweep` the SQL and "run it again").

PostgreSQL: docs/team.md's read-only role (`GRANT SELECT` only), refused with
insufficient_privilege (SQLSTATE 42501). SQLite: the file opened read-only (`mode=ro`), which
SQLite refuses as it refuses a user who may only read the file: SQLITE_READONLY, "attempt to
write a readonly database".
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

import orchfork
import pytest
from conftest import BACKENDS, database_url

ROOT = Path(__file__).resolve().parent.parent


def orch(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return orchfork.run(list(args), env=env, cwd=ROOT, timeout=120)


def reader_url(backend: str, url: str, pg_server: Any) -> str:
    """The same database as a reader: a role granted SELECT only, or the file read-only."""
    if backend == "sqlite":
        return url.replace("sqlite:///", "sqlite:///file:") + "?mode=ro&uri=true"
    import psycopg
    from pgserver import ROLE

    role = f"ro_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(host="127.0.0.1", port=pg_server.port, user=ROLE,
                         dbname=url.rsplit("/", 1)[1], autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")
        conn.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}")
    return url.replace(f"{ROLE}@", f"{role}@")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_reader_is_told_it_cannot_write(tmp_path: Path, request: pytest.FixtureRequest,
                                          backend: str) -> None:
    shutil.copytree(ROOT / "examples", tmp_path / "ex")
    url = database_url(backend, tmp_path, request)
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "ORCH_DB_URL": url,
           "HF_ENDPOINT": os.environ["HF_ENDPOINT"]}
    assert orch(env, "jobs").returncode == 0  # the schema, made by a writer
    pg = request.getfixturevalue("pg_server") if backend == "postgresql" else None
    reader = {**env, "ORCH_DB_URL": reader_url(backend, url, pg)}
    words = ("is read-only for this user (attempt to write a readonly database)"
             if backend == "sqlite" else
             "does not let this role write (permission denied for table")
    for args in (["submit", "ex/quickstart.yml", "--detach"], ["submit", "ex/quickstart.yml"],
                 ["sweep", "ex/sweep-sim.yml"]):
        proc = orch(reader, *[str(tmp_path / a) if a.startswith("ex/") else a for a in args])
        assert proc.returncode == 1, (args, proc.stderr)
        lines = proc.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (args, proc.stderr)
        assert words in lines[0], (args, proc.stderr)
        assert "insufficient_privilege 42501" in lines[0] or backend == "sqlite"
        for raw in ("internal error", "INSERT INTO", "[SQL", "run it again", "Traceback"):
            assert raw not in proc.stderr, (args, proc.stderr)
    # Nothing was recorded, and reading still works for the reader.
    listed = orch(reader, "jobs", "--json")
    assert listed.returncode == 0 and listed.stdout.strip() == "[]", listed.stderr
    assert not (ROOT / "file:").exists()  # a URI filename is no folder to make
