"""A throwaway PostgreSQL cluster on 127.0.0.1 for the tests (Debian's `postgresql` package).

`initdb` refuses to run as root, so under root the cluster belongs to the `postgres` system user
(created by the package) and its commands run through `runuser`. The cluster trusts local
connections: it listens only on loopback and on a socket in its own directory, and lives for
one test session. Each test gets a database of its own (`create_database`).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

ROLE = "orch"


def _bindir() -> Path | None:
    found = shutil.which("pg_ctl")
    if found:
        return Path(found).resolve().parent
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"),
                      key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit()
                      else 0)
    return versions[-1].parent if versions else None


def available() -> str | None:
    """None when a cluster can be started here, else why not (and how to fix it)."""
    if _bindir() is None:
        return "PostgreSQL is not installed (bash scripts/install installs Debian's postgresql)"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install -e '.[test]')"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PgServer:
    """One running cluster: `url(db)` gives a SQLAlchemy URL for a database on it."""

    root: Path
    port: int
    bindir: Path

    @property
    def data(self) -> Path:
        return self.root / "data"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{ROLE}@127.0.0.1:{self.port}/{database}"

    def create_database(self, prefix: str = "t") -> str:
        """A new empty database; returns its URL."""
        import psycopg

        name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(host="127.0.0.1", port=self.port, user=ROLE, dbname="postgres",
                             autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        _run(self, [str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate",
                    "-w", "stop"], check=False)
        shutil.rmtree(self.root, ignore_errors=True)


def _as_owner(argv: list[str]) -> list[str]:
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *argv]
    return argv


def _run(server: PgServer, argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(_as_owner(argv), capture_output=True, text=True, check=check,
                          timeout=120, stdin=subprocess.DEVNULL, cwd=server.root)


def start() -> PgServer:
    """initdb + pg_ctl start on a free loopback port; raises with the server's log on failure."""
    bindir = _bindir()
    if bindir is None:
        raise RuntimeError(available() or "no PostgreSQL")
    root = Path(tempfile.mkdtemp(prefix="orch-pg-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    root.chmod(0o700)
    server = PgServer(root, _free_port(), bindir)
    try:
        _run(server, [str(bindir / "initdb"), "-D", str(server.data), "-U", ROLE,
                      "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync"])
        opts = (f"-h 127.0.0.1 -p {server.port} -k {root} -F "
                "-c max_connections=200 -c shared_buffers=32MB")
        _run(server, [str(bindir / "pg_ctl"), "-D", str(server.data), "-o", opts,
                      "-l", str(root / "server.log"), "-w", "-t", "60", "start"])
    except subprocess.CalledProcessError as exc:
        log = (root / "server.log").read_text() if (root / "server.log").exists() else ""
        shutil.rmtree(root, ignore_errors=True)
        raise RuntimeError(f"cannot start PostgreSQL: {exc.stderr}\n{log}") from exc
    return server
