"""SSH fixtures: key pairs, simulated GPU hosts (real sshd on loopback), a connection factory."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from simhost import SimHost, SimHostOptions

# --- running in parallel (pytest-xdist, `bash scripts/test`) -------------------------------

# Modules whose tests share a module-scoped fixture that runs whole simulated jobs (a job
# history the tests read). Under the default `load` distribution every worker that drew one
# of their tests built that fixture again (3 workers: three times the jobs); their tests are
# sent to one worker instead, the biggest groups first. `xdist_group` marks with
# `--dist loadgroup` would say the same, but pytest-xdist 3.8 loses the marks under
# pytest 9.2 (pytest-dev/pytest-xdist#1386): the tests are spread as if unmarked.
ONE_WORKER_MODULES = frozenset({
    "tests/test_schema_docs.py",  # a history on SQLite and one on PostgreSQL
    "tests/test_terminal.py",  # two jobs run from a terminal 80 and 40 columns wide
    "tests/test_report.py",  # a two-run sweep
    "tests/test_show_estimates.py",  # one finished job
})


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under `-n N` (dist `load`): each test on its own, but ONE_WORKER_MODULES as one unit."""
    if config.getoption("dist") != "load":
        return None  # an explicit --dist is left as asked
    from xdist.scheduler import LoadScopeScheduling

    class ModuleFixtureScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if module in ONE_WORKER_MODULES else nodeid

    return ModuleFixtureScheduling(config, log)


@dataclass(frozen=True)
class KeyPair:
    """An ed25519 key: the private key file and the public key line."""

    private: Path
    public: str


def make_keypair(folder: Path, name: str = "id_ed25519") -> KeyPair:
    """Generate an ed25519 key pair with ssh-keygen into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    private = folder / name
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "orch-test", "-f", str(private)],
        check=True,
        capture_output=True,
    )
    return KeyPair(private, private.with_suffix(".pub").read_text().strip())


@pytest.fixture
def keypair_factory(tmp_path: Path) -> Callable[[str], KeyPair]:
    """Make more key pairs: `keypair_factory("stranger")`."""
    return lambda name: make_keypair(tmp_path / "keys" / name)


@pytest.fixture
def ssh_keypair(keypair_factory: Callable[[str], KeyPair]) -> KeyPair:
    """The key the test's hosts authorize."""
    return keypair_factory("authorized")


SimHostFactory = Callable[..., SimHost]


@pytest.fixture
def simhost(tmp_path: Path, ssh_keypair: KeyPair) -> Iterator[SimHostFactory]:
    """Start simulated hosts: `simhost(gpu_count=2)` or `simhost(SimHostOptions(...))`.

    Every host started here is stopped at the end of the test, even when it fails.
    """
    hosts: list[SimHost] = []

    def start(options: SimHostOptions | None = None, **fields: Any) -> SimHost:
        host = SimHost(
            tmp_path / f"host{len(hosts)}",
            ssh_keypair.public,
            options or SimHostOptions(**fields),
            die_with_parent=True,
        )
        hosts.append(host)
        return host.start()

    try:
        yield start
    finally:
        for host in hosts:
            host.stop()


@pytest.fixture
def ssh_factory(ssh_keypair: KeyPair) -> Iterator[Any]:
    """A ConnectionFactory using the test key (short deadlines), closed after the test."""
    from playbooks.ssh import ConnectionFactory

    factory = ConnectionFactory(ssh_keypair.private, connect_timeout=5, connect_deadline=10)
    try:
        yield factory
    finally:
        factory.close_all()


@dataclass
class Reports:
    """Collects what playbooks emit (`emit=reports`), with helpers to assert on it."""

    items: list[Any]

    def __call__(self, report: Any) -> None:
        self.items.append(report)

    def outcomes(self, playbook: str | None = None) -> dict[str, str]:
        """step name -> outcome of the last run of it."""
        return {r.step: r.outcome for r in self.items if playbook in (None, r.playbook)}

    def clear(self) -> None:
        self.items.clear()


@pytest.fixture
def reports() -> Reports:
    """An `emit` callback recording StepReports."""
    return Reports([])


PlaybookHostFactory = Callable[..., tuple[SimHost, Any]]


@pytest.fixture
def playbook_host(simhost: SimHostFactory, ssh_factory: Any) -> PlaybookHostFactory:
    """Start a simulated host and return (SimHost, playbooks.base.Host connected to it)."""
    from playbooks.base import Host, HostPaths

    def make(options: SimHostOptions | None = None, **fields: Any) -> tuple[SimHost, Any]:
        sim = simhost(options, **fields)
        conn = ssh_factory.connect(sim.host, sim.port, sim.user, sim.host_key)
        return sim, Host(conn, HostPaths(str(sim.root)), command_timeout=60)

    return make


@pytest.fixture
def sim_hosts(tmp_path: Path) -> Iterator[Any]:
    """Simulated GPU hosts for emulated cloud instances: `VastEmulator(hosts=sim_hosts)`.

    A `tests/emulators/hosts.SimHostBackend` under tmp_path/"emu-hosts" (set `.options` to
    SimHostOptions fields before creating instances); every host is stopped at teardown.
    """
    from emulators.hosts import SimHostBackend

    backend = SimHostBackend(tmp_path / "emu-hosts")
    try:
        yield backend
    finally:
        backend.stop_all()


# --- the Hugging Face Hub every test's orch asks -------------------------------------------


@pytest.fixture(scope="session", autouse=True)
def session_hub() -> Iterator[Any]:
    """A Hub emulator for the whole session, in `HF_ENDPOINT` (subprocesses inherit it).

    orch asks the Hub about the base model before renting (orchestrator/engine/hubaccess.py);
    without this every engine test would ask huggingface.co. Any model repo is public here
    unless a test adds it (gated, private) with `hub.add_repo`; remove what you add.
    """
    import os

    from emulators.hub import HubEmulator

    with HubEmulator(open_models=True) as emulator:
        before = os.environ.get("HF_ENDPOINT")
        os.environ["HF_ENDPOINT"] = emulator.url
        try:
            yield emulator
        finally:
            if before is None:
                os.environ.pop("HF_ENDPOINT", None)
            else:
                os.environ["HF_ENDPOINT"] = before


# --- databases: SQLite and a real PostgreSQL server --------------------------------------

BACKENDS = ("sqlite", "postgresql")


@pytest.fixture(scope="session")
def pg_server() -> Iterator[Any]:
    """A throwaway PostgreSQL cluster on 127.0.0.1 for the whole test session."""
    import pgserver

    why = pgserver.available()
    if why is not None:
        pytest.fail(f"the PostgreSQL tests need a server: {why}", pytrace=False)
    server = pgserver.start()
    try:
        yield server
    finally:
        server.stop()


def database_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A fresh, empty database of `backend` for one test."""
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'orch.db'}"
    server = request.getfixturevalue("pg_server")
    return str(server.create_database())


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database on each backend in turn (SQLite file, PostgreSQL database)."""
    return database_url(request.param, tmp_path, request)
